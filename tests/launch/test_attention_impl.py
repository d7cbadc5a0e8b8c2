"""model.attention_impl from each launch: which fused-attention kernel the framework will run."""
from __future__ import annotations

from .helpers import parse_in
from .test_nemo import CONF as NEMO_CONF
from .test_nemo import HEAD as NEMO_HEAD
from .test_nemo import LAUNCH as NEMO_LAUNCH
from .test_torchtitan import HEAD as TT_HEAD
from .test_torchtitan import LAUNCH as TT_LAUNCH
from .test_torchtitan import TOML

NEOX = """pipe_parallel_size: 1
model_parallel_size: 1
num_layers: 12
hidden_size: 768
num_attention_heads: 12
seq_length: 2048
max_position_embeddings: 2048
train_micro_batch_size_per_gpu: 4
train_iters: 100
attention_config: [[["flash"], 12]]
"""


def test_neox_flash_is_the_flash_attn_package(tmp_path):
    res = parse_in(tmp_path, "#!/bin/bash\n#SBATCH -N 1 --gres=gpu:4\npython deepy.py train.py n.yml\n",
                   {"n.yml": NEOX})
    assert res.error is None, res.error
    assert (res.job.model.attention, res.job.model.attention_impl) == ("flash", "flash2")
    assert res.provenance["model.attention_impl"].endswith("n.yml:10")


def test_torchtitan_flex_attention_is_a_triton_kernel(tmp_path):
    plain = parse_in(tmp_path, TT_HEAD + TT_LAUNCH + "\n", {"cfg.toml": TOML})
    assert plain.job.model.attention_impl == ""           # SDPA: the framework's default
    flex = TOML.replace('flavor = "70B"', 'flavor = "70B"\nuse_flex_attn = true')
    res = parse_in(tmp_path, TT_HEAD + TT_LAUNCH + "\n", {"cfg.toml": flex})
    assert res.error is None, res.error
    assert res.job.model.attention_impl == "triton"


def test_nemo_legacy_flash_and_mcore_environment(tmp_path):
    conf = NEMO_CONF.replace("  use_flash_attention: False", "  use_flash_attention: True")
    res = parse_in(tmp_path, NEMO_HEAD + NEMO_LAUNCH + "model.ffn_hidden_size=8192\n", {"conf/gpt.yaml": conf})
    assert res.error is None, res.error
    assert res.job.model.attention_impl == "flash2"       # NeMo's own attention, not Transformer Engine's
    mcore = conf + "  mcore_gpt: True\n"
    res = parse_in(tmp_path, NEMO_HEAD + "export NVTE_FLASH_ATTN=0\n" + NEMO_LAUNCH + "model.ffn_hidden_size=8192\n",
                   {"conf/gpt.yaml": mcore})
    assert res.error is None, res.error
    assert res.job.model.attention_impl == "cudnn"
