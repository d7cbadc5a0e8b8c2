"""Mixture-of-experts launches are refused; misspelt config keys are never silent."""
from __future__ import annotations

import json
import pathlib
import re

import pytest

from slurm_plugin.launch.limits import MAX_KEY_SUGGESTIONS
from slurm_plugin.launch.neox_keys import NEOX_KEYS, suggest

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --gpus-per-node=4 --ntasks-per-node=1\n"
MEGATRON = ("srun torchrun --nproc_per_node 4 --nnodes 2 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
            "--num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 --global-batch-size 64 "
            "--train-iters 100 --bf16 ")
NEOX_YML = """{
  "pipe_parallel_size": 2,
  "model_parallel_size": 1,
  "num_layers": 8,
  "hidden_size": 1024,
  "num_attention_heads": 16,
  "seq_length": 2048,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "train_iters": 1000,
  "bf16": {"enabled": true},
}
"""


def _run(tmp_path: pathlib.Path, script: str, files: dict[str, str] | None = None):
    return parse_in(tmp_path, HEAD + script, files)


def _err(res) -> str:
    assert res.job is None, res.job_dict
    assert res.error and res.error.startswith("cannot predict: ") and "\n" not in res.error
    return res.error


# ---------------------------------------------------------------- 1. mixture of experts
@pytest.mark.parametrize("extra, where", [
    ("--num-experts 8 --moe-router-topk 2", "--num-experts 8"),
    ("--num-experts=64", "--num-experts 64"),
    ("--num-experts 1 16", "--num-experts 16"),            # Megatron-DeepSpeed: a list of counts
    ("--moe-grouped-gemm --moe-router-topk 2", "--moe-grouped-gemm"),
    ("--expert-model-parallel-size 4", "--expert-model-parallel-size"),
])
def test_megatron_moe_is_refused(tmp_path, extra, where):
    err = _err(_run(tmp_path, MEGATRON + extra + "\n"))
    assert "mixture-of-experts models are not modelled yet" in err
    assert where in err
    assert re.search(r"job\.sbatch:3\)$", err)


def test_megatron_one_expert_is_dense(tmp_path):
    res = _run(tmp_path, MEGATRON + "--num-experts 1 --moe-expert-parallel-size 1\n")
    assert res.error is None and res.job is not None
    assert any("dense model" in w for w in res.warnings)


@pytest.mark.parametrize("extra, what", [
    ('  "moe_num_experts": 8,\n', "moe_num_experts = 8"),
    ('  "moe_type": "megablocks",\n', "moe_type = megablocks"),
])
def test_neox_moe_is_refused(tmp_path, extra, what):
    yml = NEOX_YML.replace('  "bf16"', extra + '  "bf16"')
    err = _err(_run(tmp_path, "python deepy.py train.py m.yml\n", {"m.yml": yml}))
    assert "mixture-of-experts" in err and what in err
    assert re.search(r"m\.yml:\d+\)$", err)


def test_neox_one_expert_is_dense(tmp_path):
    yml = NEOX_YML.replace('  "bf16"', '  "moe_num_experts": 1,\n  "bf16"')
    res = _run(tmp_path, "python deepy.py train.py m.yml\n", {"m.yml": yml})
    assert res.error is None and res.job.layout.pp == 2


def test_mixtral_style_deepspeed_config_is_refused(tmp_path):
    ds = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "num_local_experts": 8}
    err = _err(_run(tmp_path, MEGATRON.replace("--bf16", "--deepspeed --deepspeed_config ds.json") + "\n",
                    {"ds.json": json.dumps(ds, indent=1)}))
    assert "mixture-of-experts" in err and "num_local_experts = 8" in err and "ds.json:" in err


# ---------------------------------------------------------------- 2. misspelt keys
def test_neox_misspelt_pipe_parallel_size_stops(tmp_path):
    yml = NEOX_YML.replace('"pipe_parallel_size": 2', '"pipe_paralel_size": 2')
    err = _err(_run(tmp_path, "python deepy.py train.py m.yml\n", {"m.yml": yml}))
    assert "'pipe_paralel_size'" in err and "did you mean 'pipe_parallel_size'" in err
    assert err.endswith("m.yml:2)")


def test_neox_misspelt_heads_names_file_and_key(tmp_path):
    yml = NEOX_YML.replace('"num_attention_heads"', '"num_attenion_heads"')
    err = _err(_run(tmp_path, "python deepy.py train.py m.yml\n", {"m.yml": yml}))
    assert "did you mean 'num_attention_heads'" in err and err.endswith("m.yml:6)")


def test_neox_dash_spelling_is_not_a_misspelling(tmp_path):
    yml = NEOX_YML.replace('"pipe_parallel_size"', '"pipe-parallel-size"')
    res = _run(tmp_path, "python deepy.py train.py m.yml\n", {"m.yml": yml})
    assert res.error is None and res.job.layout.pp == 2


def test_neox_unknown_harmless_key_warns_with_line(tmp_path):
    yml = NEOX_YML.replace('  "bf16"', '  "wandb_projekt": "x",\n  "my_own_note": 3,\n  "bf16"')
    res = _run(tmp_path, "python deepy.py train.py m.yml\n", {"m.yml": yml})
    assert res.error is None
    assert any("'wandb_projekt'" in w and "m.yml:11" in w and "did you mean 'wandb_project'" in w
               for w in res.warnings), res.warnings
    assert any("'my_own_note'" in w and "m.yml:12" in w for w in res.warnings)


def test_deepspeed_misspelt_batch_key_stops(tmp_path):
    ds = '{\n "train_micro_batch_size_per_gpu": 2,\n "gradient_acumulation_steps": 4,\n "bf16": {"enabled": true}\n}\n'
    err = _err(_run(tmp_path, MEGATRON.replace("--bf16", "--deepspeed --deepspeed_config ds.json") + "\n",
                    {"ds.json": ds}))
    assert "did you mean 'gradient_accumulation_steps'" in err and err.endswith("ds.json:3)")


def test_deepspeed_unknown_key_warns(tmp_path):
    ds = '{\n "train_micro_batch_size_per_gpu": 1,\n "stepz_per_print": 4,\n "bf16": {"enabled": true}\n}\n'
    res = _run(tmp_path, MEGATRON.replace("--bf16", "--deepspeed --deepspeed_config ds.json") + "\n",
               {"ds.json": ds})
    assert res.error is None
    assert any("'stepz_per_print'" in w and "ds.json:3" in w and "steps_per_print" in w for w in res.warnings)


def test_many_unknown_keys_are_bounded(tmp_path):
    keys = "".join(f'  "zz_custom_key_{i}": {i},\n' for i in range(5000))
    yml = NEOX_YML.replace('  "bf16"', keys + '  "bf16"')
    res = _run(tmp_path, "python deepy.py train.py m.yml\n", {"m.yml": yml})
    assert res.error is None
    per_key = [w for w in res.warnings if "zz_custom_key_" in w]
    assert len(per_key) == MAX_KEY_SUGGESTIONS
    assert any(f"{5000 - MAX_KEY_SUGGESTIONS} more keys" in w for w in res.warnings)


def test_suggest():
    assert suggest("pipe_paralel_size", NEOX_KEYS) == "pipe_parallel_size"
    assert suggest("x" * 500, NEOX_KEYS) is None
    assert suggest("completely_unrelated", NEOX_KEYS) is None


def test_megatron_unknown_expert_count_is_refused(tmp_path):
    err = _err(_run(tmp_path, MEGATRON + "--num-experts $(cat /nonexistent/experts) --moe-router-topk 2\n"))
    assert "--num-experts is unknown" in err and "mixture-of-experts" in err
