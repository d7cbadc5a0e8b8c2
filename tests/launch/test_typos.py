"""No typo is silent: a misspelt flag or key of any reader either stops the prediction (it names a
value the prediction uses) with file:line and a did-you-mean, or is a warning that says so."""
from __future__ import annotations

import json

import pytest

from slurm_plugin.launch.megatron_flags import MEGATRON_LM, MEGATRON_LM_SOURCE

from .helpers import parse_in
from .test_nemo import CONF as NEMO_CONF
from .test_nemo import HEAD as NEMO_HEAD
from .test_nemo import LAUNCH as NEMO_LAUNCH
from .test_torchtitan import HEAD as TT_HEAD
from .test_torchtitan import LAUNCH as TT_LAUNCH
from .test_torchtitan import TOML

MEGATRON = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8\n"
            "srun python pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \\\n"
            "  --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 512 \\\n"
            "  --train-iters 1000 --bf16 {extra}\n")


def _megatron(tmp_path, extra):
    return parse_in(tmp_path, MEGATRON.format(extra=extra))


def test_flag_list_is_megatrons_own():
    assert len(MEGATRON_LM) > 500 and "Megatron-LM" in MEGATRON_LM_SOURCE
    for flag in ("--tensor-model-parallel-size", "--global-batch-size", "--attention-backend",
                 "--rl-partial-rollouts", "--no-rl-partial-rollouts"):     # BooleanOptionalAction: both
        assert flag in MEGATRON_LM


@pytest.mark.parametrize("typo, meant", [
    ("--tensor-model-paralel-size 2", "--tensor-model-parallel-size"),
    ("--global_batch_size 256", "--global-batch-size"),          # argparse takes no underscores for dashes
    ("--tensor-model-parallel 2", "--tensor-model-parallel-size"),   # allow_abbrev=False: no prefixes
    ("--pipeline-model-parallel-sise=2", "--pipeline-model-parallel-size"),
])
def test_megatron_typo_of_a_flag_it_uses_stops_with_file_line(tmp_path, typo, meant):
    res = _megatron(tmp_path, typo)
    assert res.job is None
    assert f"did you mean {meant}?" in res.error and "Megatron will refuse this flag at start" in res.error
    assert res.error.endswith("job.sbatch:5)"), res.error
    assert typo.split()[0].split("=")[0] in res.error


def test_megatron_typo_of_another_flag_is_a_warning(tmp_path):
    res = _megatron(tmp_path, "--log-intervall 10 --my-site-flag 3")
    assert res.job is not None, res.error
    near = [w for w in res.warnings if w.startswith("--log-intervall")]
    assert near and "did you mean --log-interval?" in near[0] and "refuse this flag at start" in near[0]
    assert "job.sbatch:5" in near[0]
    own = [w for w in res.warnings if w.startswith("--my-site-flag")]
    assert own and "unless the training script adds it" in own[0]


def test_megatron_known_flags_say_nothing(tmp_path):
    res = _megatron(tmp_path, "--log-interval 10 --lr 3e-4 --no-rl-partial-rollouts --use-distributed-optimizer")
    assert res.job is not None, res.error
    assert not [w for w in res.warnings if "not a Megatron" in w], res.warnings


def test_megatron_deepspeed_own_flags_are_not_called_misspellings(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}))
    res = _megatron(tmp_path, f"--deepspeed --deepspeed_config {ds} --zero-stage 1 --sitewide-thing 2")
    assert res.job is not None, res.error
    assert res.framework == "megatron-deepspeed"
    assert not [w for w in res.warnings if "not a Megatron" in w], res.warnings


def _nemo(tmp_path, overrides, conf=NEMO_CONF):
    return parse_in(tmp_path, NEMO_HEAD + NEMO_LAUNCH + overrides + "\n", {"conf/gpt.yaml": conf})


@pytest.mark.parametrize("override, meant", [
    ("model.tensor_model_paralel_size=2", "model.tensor_model_parallel_size"),
    ("trainer.max_step=75000", "trainer.max_steps"),
])
def test_nemo_override_of_a_key_the_config_lacks_stops_as_hydra_does(tmp_path, override, meant):
    res = _nemo(tmp_path, override)
    assert res.job is None
    assert f"did you mean {meant}?" in res.error and "Hydra refuses" in res.error
    assert res.error.endswith("job.sbatch:3)"), res.error


def test_nemo_plus_adds_and_plus_on_an_existing_key_stops(tmp_path):
    assert _nemo(tmp_path, "+model.brand_new_key=3").job is not None
    res = _nemo(tmp_path, "+model.num_layers=12")
    assert res.job is None and "already in" in res.error and "++model.num_layers" in res.error
    res = _nemo(tmp_path, "~model.not_there")
    assert res.job is None and "delete" in res.error


def test_nemo_config_with_defaults_list_warns_for_keys_it_may_compose(tmp_path):
    conf = "defaults:\n  - optional tp_overlap@model.ub_tp_comm_overlap_cfg:\n" + NEMO_CONF
    res = _nemo(tmp_path, "model.some_composed_key=1", conf)
    assert res.job is not None, res.error
    assert any("some_composed_key" in w and "defaults list" in w for w in res.warnings), res.warnings
    res = _nemo(tmp_path, "model.tensor_model_paralel_size=2", conf)    # still a typo of a key it reads
    assert res.job is None and "did you mean model.tensor_model_parallel_size?" in res.error


def _titan(tmp_path, toml, extra=""):
    return parse_in(tmp_path, TT_HEAD + TT_LAUNCH + extra + "\n", {"cfg.toml": toml})


def test_torchtitan_typo_of_a_key_it_uses_stops_with_file_line(tmp_path):
    res = _titan(tmp_path, TOML.replace("tensor_parallel_degree = 4", "tensor_paralel_degree = 4"))
    assert res.job is None
    assert "did you mean [parallelism] tensor_parallel_degree?" in res.error
    assert res.error.endswith("cfg.toml:12)"), res.error
    res = _titan(tmp_path, TOML, "--training.stepz 10")
    assert res.job is None and "did you mean [training] steps?" in res.error


def test_torchtitan_other_unknown_keys_are_warnings(tmp_path):
    res = _titan(tmp_path, TOML + "\n[metrics]\nlog_frequ = 5\n\n[mystuff]\nx = 1\n")
    assert res.job is not None, res.error
    assert any("log_frequ" in w and "did you mean [metrics] log_freq?" in w for w in res.warnings), res.warnings
    assert any("[mystuff] is not a section" in w for w in res.warnings), res.warnings
    clean = _titan(tmp_path, TOML)
    assert not [w for w in clean.warnings if "TorchTitan config key" in w or "not a section" in w]


def test_deepspeed_zero_stage_typo_stops(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text('{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {\n    "stgae": 3\n  }\n}\n')
    res = _megatron(tmp_path, f"--deepspeed --deepspeed_config {ds}")
    assert res.job is None and "did you mean 'stage'?" in res.error
    assert res.error.endswith("ds.json:4)"), res.error
    ds.write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1, "overlap_com": true}}')
    res = _megatron(tmp_path, f"--deepspeed --deepspeed_config {ds}")
    assert res.job is not None, res.error
    assert any("overlap_com" in w and "overlap_comm" in w for w in res.warnings), res.warnings
