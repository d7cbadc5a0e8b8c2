"""Megatron arguments that change the job: sequence parallelism at TP 1, --disable-bias-linear,
NullTokenizer's vocabulary; and sliding-window attention as Megatron, NeMo, GPT-NeoX and llm-foundry
write it (model.attention_window: keys per query, the query itself included)."""
from __future__ import annotations

import pathlib

import pytest

from slurm_plugin.launch import parse_script
from slurm_plugin.launch.megatron import window_layers

from .conftest import DATA
from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=8 --ntasks-per-node=1\n"
BASE = ("srun torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
        "--num-attention-heads 32 --seq-length 8192 --micro-batch-size 1 --global-batch-size 64 "
        "--train-iters 100 --bf16 ")


def _megatron(tmp_path: pathlib.Path, extra: str):
    return parse_in(tmp_path, HEAD + BASE + extra + "\n")


def _ok(res):
    assert res.error is None, res.error
    return res.job


# ----------------------------------------------------------------------- sequence parallelism
@pytest.mark.parametrize("tp", ["", "--tensor-model-parallel-size 1 "])
def test_sequence_parallel_is_off_at_tensor_parallel_size_1(tmp_path, tp):
    res = _megatron(tmp_path, tp + "--sequence-parallel")
    job = _ok(res)
    assert job.layout.tp == 1 and job.layout.sequence_parallel is False
    assert res.to_dict()["job"]["layout"]["sequence_parallel"] is False        # what --json says
    assert "tensor-parallel size 1" in res.provenance["layout.sequence_parallel"]
    assert any("--sequence-parallel with" in w and "job.sbatch:3" in w for w in res.warnings), res.warnings


def test_sequence_parallel_stays_on_with_tensor_parallelism(tmp_path):
    res = _megatron(tmp_path, "--tensor-model-parallel-size 2 --sequence-parallel")
    assert _ok(res).layout.sequence_parallel is True
    assert not any("--sequence-parallel with" in w for w in res.warnings)


def test_tp_comm_overlap_at_tp_1_is_dropped_with_sequence_parallelism(tmp_path):
    res = _megatron(tmp_path, "--sequence-parallel --tp-comm-overlap")
    job = _ok(res)
    assert job.layout.sequence_parallel is False and job.layout.tp_comm_overlap is False
    assert any("--tp-comm-overlap" in w and "needs sequence parallelism" in w for w in res.warnings)


# ----------------------------------------------------------------------- linear biases
def test_disable_bias_linear_removes_the_biases(tmp_path):
    from predictor.recipe import layer_parameters
    on = _ok(_megatron(tmp_path, "--normalization RMSNorm"))
    res = _megatron(tmp_path, "--normalization RMSNorm --disable-bias-linear")
    off = _ok(res)
    assert on.model.linear_bias is True and off.model.linear_bias is False
    assert res.provenance["model.linear_bias"].endswith("job.sbatch:3")
    h, f = 4096, 4 * 4096
    # QKV (3h) and MLP-up (f) biases split over tp, attention-out and MLP-down (h each) whole
    assert layer_parameters(on.model) - layer_parameters(off.model) == 3 * h + h + f + h


def test_megatron_layernorm_model_keeps_biases_by_default(tmp_path):
    job = _ok(_megatron(tmp_path, ""))
    assert job.model.norm == "layernorm" and job.model.linear_bias is True


def test_add_qkv_bias_beside_disable_bias_linear_is_said(tmp_path):
    res = _megatron(tmp_path, "--disable-bias-linear --add-qkv-bias")
    assert _ok(res).model.linear_bias is False
    assert any("--add-qkv-bias" in w for w in res.warnings)


# ----------------------------------------------------------------------- NullTokenizer
def test_null_tokenizer_adds_its_end_of_document_token(tmp_path):
    res = _megatron(tmp_path, "--tokenizer-type NullTokenizer --vocab-size 32000")
    job = _ok(res)
    assert job.model.vocab == 32001
    assert "NullTokenizer" in res.provenance["model.vocab"]
    from predictor.recipe import padded_vocab
    assert padded_vocab(job.model.vocab, 1) == 32128          # then padded to 128 as Megatron does


def test_other_tokenizers_keep_vocab_size(tmp_path):
    res = _megatron(tmp_path, "--tokenizer-type HuggingFaceTokenizer --tokenizer-model x --vocab-size 32000")
    assert _ok(res).model.vocab == 32000


# ----------------------------------------------------------------------- Megatron --window-size
@pytest.mark.parametrize("value", ["4095,0", "'(4095,0)'", "4095,-1"])
def test_megatron_window_size(tmp_path, value):
    res = _megatron(tmp_path, f"--window-size {value}")
    job = _ok(res)
    assert job.model.attention_window == 4096            # left 4095 + the query itself
    assert res.provenance["model.attention_window"].startswith(str(tmp_path / "job.sbatch") + ":3")


def test_megatron_window_right_side_is_cut_by_the_causal_mask(tmp_path):
    res = _megatron(tmp_path, "--window-size 1023,16")
    assert _ok(res).model.attention_window == 1024
    assert any("right side (16)" in w for w in res.warnings)


def test_megatron_unbounded_window_is_full_attention(tmp_path):
    res = _megatron(tmp_path, "--window-size -1,0")
    assert _ok(res).model.attention_window == 0
    assert any("unbounded" in w for w in res.warnings)


@pytest.mark.parametrize("value, why", [("0,0", "not a sliding window"), ("-5,0", "not a sliding window"),
                                        ("4096", "not a pair"), ("a,b", "not a pair")])
def test_megatron_bad_window_stops_naming_the_flag(tmp_path, value, why):
    res = _megatron(tmp_path, f"--window-size {value}")
    assert res.error is not None and why in res.error and "--window-size" in res.error
    assert "job.sbatch:3" in res.error


@pytest.mark.parametrize("skip, window", [("4", 0), ("'[1,1,1,0]*8'", 0), ("64", 4096), ("'[1]*32'", 4096),
                                          ("1", 0), ("'[0]*32'", 0)])
def test_megatron_window_skip_freq_is_costed_conservatively(tmp_path, skip, window):
    res = _megatron(tmp_path, f"--window-size 4095,0 --window-attn-skip-freq {skip}")
    assert _ok(res).model.attention_window == window
    if window == 0:
        assert any("--window-attn-skip-freq" in w for w in res.warnings), res.warnings


def test_window_layers_reads_megatron_patterns():
    assert window_layers(None, 32) == "all"
    assert window_layers("4", 32) == "some" and window_layers("33", 32) == "all" and window_layers("1", 32) == "none"
    assert window_layers("[1,1,1,0]*3", 12) == "some" and window_layers("[1,1]", 2) == "all"
    assert window_layers("[0,0]*2", 4) == "none" and window_layers("0", 4) is None
    assert window_layers("__import__('os')", 4) is None and window_layers("[1,x]", 4) is None


# ----------------------------------------------------------------------- NeMo model.window_size
NEMO_CONF = """trainer:
  devices: 8
  num_nodes: 1
  precision: bf16-mixed
  max_steps: 100
model:
  mcore_gpt: True
  micro_batch_size: 1
  global_batch_size: 64
  tensor_model_parallel_size: 2
  encoder_seq_length: 8192
  num_layers: 8
  hidden_size: 2048
  num_attention_heads: 16
  window_size: [4095, 0]
  optim:
    name: fused_adam
"""
NEMO = ("#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=8 --gpus-per-node=8\n"
        "srun python /opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py "
        "--config-path=$PWD/conf --config-name=gpt ")


def test_nemo_window_size(tmp_path):
    res = parse_in(tmp_path, NEMO + "\n", {"conf/gpt.yaml": NEMO_CONF})
    assert _ok(res).model.attention_window == 4096
    assert "gpt.yaml:15" in res.provenance["model.attention_window"]


def test_nemo_window_size_override_and_skip(tmp_path):
    conf = NEMO_CONF.replace("  window_size: [4095, 0]\n", "")
    res = parse_in(tmp_path, NEMO + "+model.window_size=[1023,0]\n", {"conf/gpt.yaml": conf})
    assert _ok(res).model.attention_window == 1024
    res = parse_in(tmp_path, NEMO + "+model.window_attn_skip_freq=2\n", {"conf/gpt.yaml": NEMO_CONF})
    assert _ok(res).model.attention_window == 0
    assert any("model.window_attn_skip_freq" in w for w in res.warnings)


def test_nemo_window_size_of_a_legacy_model_is_ignored(tmp_path):
    res = parse_in(tmp_path, NEMO + "\n", {"conf/gpt.yaml": NEMO_CONF.replace("mcore_gpt: True", "mcore_gpt: False")})
    assert _ok(res).model.attention_window == 0
    assert any("model.window_size" in w and "mcore_gpt" in w for w in res.warnings)


# ----------------------------------------------------------------------- GPT-NeoX sliding_window_width
def _neox(tmp_path, extra: str):
    (tmp_path / "m.yml").write_text(
        '{"num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 8192,'
        ' "attention_config": [[["flash"], "all"]], "train_micro_batch_size_per_gpu": 1, "train_iters": 1'
        + extra + "}")
    (tmp_path / "j.sbatch").write_text("#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\npython deepy.py train.py m.yml\n")
    return parse_script(str(tmp_path / "j.sbatch"))


def test_neox_sliding_window_width(tmp_path):
    res = _neox(tmp_path, ', "sliding_window_width": 4096')
    assert _ok(res).model.attention_window == 4097          # flash window_size (W, -1): W back + itself
    assert "m.yml" in res.provenance["model.attention_window"]
    assert _ok(_neox(tmp_path, ', "sliding_window_width": null')).model.attention_window == 0
    assert _ok(_neox(tmp_path, "")).model.attention_window == 0


@pytest.mark.parametrize("value", ["0", "-1", '"wide"'])
def test_neox_bad_sliding_window_width_stops(tmp_path, value):
    res = _neox(tmp_path, f', "sliding_window_width": {value}')
    assert res.error is not None and "sliding_window_width" in res.error and "m.yml" in res.error


def test_neox_misspelt_sliding_window_width_stops(tmp_path):
    res = _neox(tmp_path, ', "sliding_window_widht": 4096')
    assert res.error is not None and "sliding_window_width" in res.error


# ----------------------------------------------------------------------- llm-foundry sliding_window_size
MPT7B = (DATA / "llmfoundry" / "mpt-7b-h100.yaml").read_text()
COMPOSER = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
            "srun composer --world_size 16 --node_rank $SLURM_NODEID --master_addr node1 -n 8 "
            "scripts/train/train.py mpt.yaml model.attn_config.attn_impl=flash ")


def test_llmfoundry_sliding_window_size(tmp_path):
    res = parse_in(tmp_path, COMPOSER + "model.attn_config.sliding_window_size=2047\n", {"mpt.yaml": MPT7B})
    assert _ok(res).model.attention_window == 2048
    assert "(override model.attn_config.sliding_window_size)" in res.provenance["model.attention_window"]
    res = parse_in(tmp_path, COMPOSER + "model.attn_config.sliding_window_size=-1\n", {"mpt.yaml": MPT7B})
    assert _ok(res).model.attention_window == 0                      # llm-foundry's default: no window


@pytest.mark.parametrize("extra, why", [("model.attn_config.sliding_window_size=0", "at least 1"),
                                        ("model.attn_config.sliding_window_size=-3", "at least 1"),
                                        ("model.attn_config.attn_impl=torch model.attn_config.sliding_window_size=64",
                                         "only implemented with flash")])
def test_llmfoundry_bad_sliding_window_stops(tmp_path, extra, why):
    res = parse_in(tmp_path, COMPOSER + extra + "\n", {"mpt.yaml": MPT7B})
    assert res.error is not None and why in res.error and "sliding_window_size" in res.error


# ----------------------------------------------------------------------- GPT-NeoX use_bias_in_*
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_neox_bias_keys_decide_the_linear_biases_whatever_the_norm(tmp_path, norm):
    res = _neox(tmp_path, f', "norm": "{norm}", "use_bias_in_attn_linear": false, "use_bias_in_mlp": false')
    assert _ok(res).model.linear_bias is False
    assert "m.yml" in res.provenance["model.linear_bias"]
    on = _neox(tmp_path, f', "norm": "{norm}", "use_bias_in_attn_linear": true, "use_bias_in_mlp": true')
    assert _ok(on).model.linear_bias is True
    assert not any("use_bias_in" in w for w in res.warnings + on.warnings)


def test_neox_without_bias_keys_leaves_the_norm_to_decide(tmp_path):
    assert _ok(_neox(tmp_path, ', "norm": "rmsnorm"')).model.linear_bias is False
    assert _ok(_neox(tmp_path, "")).model.linear_bias is True
    # One key alone: the other is NeoX's default, true.
    assert _ok(_neox(tmp_path, ', "norm": "rmsnorm", "use_bias_in_mlp": true')).model.linear_bias is True


def test_neox_bias_keys_that_disagree_follow_the_mlp_and_say_so(tmp_path):
    res = _neox(tmp_path, ', "use_bias_in_attn_linear": false')
    assert _ok(res).model.linear_bias is True                 # use_bias_in_mlp: NeoX's default
    assert any("use_bias_in_attn_linear false with use_bias_in_mlp true" in w and "m.yml" in w
               for w in res.warnings), res.warnings
    res = _neox(tmp_path, ', "use_bias_in_attn_linear": true, "use_bias_in_mlp": false')
    assert _ok(res).model.linear_bias is False
    assert any("modelled without biases" in w for w in res.warnings), res.warnings


def test_neox_bias_key_that_is_not_a_boolean_is_said(tmp_path):
    res = _neox(tmp_path, ', "norm": "rmsnorm", "use_bias_in_mlp": "sometimes", "use_bias_in_attn_linear": true')
    assert _ok(res).model.linear_bias is True
    assert any("use_bias_in_mlp is 'sometimes', not a boolean" in w and "m.yml" in w for w in res.warnings), \
        res.warnings
