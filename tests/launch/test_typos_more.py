"""No typo is silent, continued: values outside a framework's choices, misspelt precision keys,
unknown launcher options, duplicate config keys and near-miss Hydra additions."""
from __future__ import annotations

import json

import pytest

from .conftest import DATA
from .helpers import parse_in
from .test_nemo import CONF as NEMO_CONF
from .test_nemo import HEAD as NEMO_HEAD
from .test_moe_and_keys import NEOX_YML as KEYS_NEOX_YML
from .test_nemo import LAUNCH as NEMO_LAUNCH
from .test_typos import _megatron

MPT7B = (DATA / "llmfoundry" / "mpt-7b-h100.yaml").read_text()
FOUNDRY_HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
COMPOSER = "srun composer --world_size 16 -n 8 scripts/train/train.py mpt.yaml\n"


def _foundry(tmp_path, yaml: str, body: str = COMPOSER):
    return parse_in(tmp_path, FOUNDRY_HEAD + body, {"mpt.yaml": yaml})


def _with_norm(norm: str) -> str:
    return MPT7B.replace("  vocab_size: 50368\n", f"  vocab_size: 50368\n  norm_type: {norm}\n")


# ---- A. llm-foundry norm_type against its norm registry
@pytest.mark.parametrize("typo, meant", [("layernrom", "layernorm"), ("rmsnrom", "rmsnorm"),
                                         ("low_precison_rmsnorm", "low_precision_rmsnorm")])
def test_llmfoundry_norm_type_typo_stops(tmp_path, typo, meant):
    res = _foundry(tmp_path, _with_norm(typo))
    assert res.job is None
    assert f"did you mean {meant}?" in res.error and "norm registry" in res.error
    assert res.error.endswith("mpt.yaml:21)"), res.error


def test_llmfoundry_unknown_norm_type_is_warned(tmp_path):
    res = _foundry(tmp_path, _with_norm("banana"))
    assert res.job is not None, res.error
    assert any("'banana'" in w and "norm registry" in w and "mpt.yaml:21" in w for w in res.warnings), res.warnings


@pytest.mark.parametrize("norm, want", [("low_precision_layernorm", "layernorm"), ("RMSNorm", "rmsnorm"),
                                        ("triton_rmsnorm", "rmsnorm"), ("layernorm", "layernorm")])
def test_llmfoundry_registered_norms_say_nothing(tmp_path, norm, want):
    res = _foundry(tmp_path, _with_norm(norm))
    assert res.job is not None, res.error
    assert res.job.model.norm == want
    assert not [w for w in res.warnings if "norm registry" in w]


# ---- B. DeepSpeed fp16 / bf16 keys
def _ds(tmp_path, text: str):
    ds = tmp_path / "ds.json"
    ds.write_text(text)
    return _megatron(tmp_path, f"--deepspeed --deepspeed_config {ds}")


@pytest.mark.parametrize("sect, typo", [("fp16", "enable"), ("bf16", "enabld")])
def test_deepspeed_misspelt_enabled_stops(tmp_path, sect, typo):
    res = _ds(tmp_path, '{\n  "train_micro_batch_size_per_gpu": 1,\n  "%s": {\n    "%s": true\n  }\n}\n' % (sect, typo))
    assert res.job is None
    assert "did you mean 'enabled'?" in res.error and f"DeepSpeed {sect} key" in res.error
    assert res.error.endswith("ds.json:4)"), res.error


def test_deepspeed_other_precision_key_typo_is_warned(tmp_path):
    res = _ds(tmp_path, json.dumps({"train_micro_batch_size_per_gpu": 1,
                                    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_powr": 12}}))
    assert res.job is not None, res.error
    assert any("initial_scale_powr" in w and "initial_scale_power" in w for w in res.warnings), res.warnings


def test_deepspeed_documented_precision_keys_say_nothing(tmp_path):
    res = _ds(tmp_path, json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {
        "enabled": True, "auto_cast": False, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
        "hysteresis": 2, "consecutive_hysteresis": False, "min_loss_scale": 1}, "bf16": {"enabled": False}}))
    assert res.job is not None, res.error
    assert not [w for w in res.warnings if "DeepSpeed fp16" in w or "DeepSpeed bf16" in w], res.warnings


# ---- C. Megatron choice flags
@pytest.mark.parametrize("flag, value, meant", [
    ("--attention-backend", "flsh", "flash"),
    ("--normalization", "RMSNrom", "RMSNorm"),
    ("--normalization", "LayerNrom", "LayerNorm"),
    ("--fp8-format", "hybird", "hybrid"),
])
def test_megatron_value_outside_its_choices_stops(tmp_path, flag, value, meant):
    res = _megatron(tmp_path, f"{flag} {value}")
    assert res.job is None
    assert f"{flag} {value}" in res.error and f"did you mean {meant}?" in res.error
    assert "refuse this value at start" in res.error and res.error.endswith("job.sbatch:5)"), res.error


@pytest.mark.parametrize("extra", ["--attention-backend flash", "--attention-backend auto", "--normalization RMSNorm",
                                   "--normalization rmsnorm", "--fp8-format e4m3", "--fp8-format hybrid"])
def test_megatron_values_in_its_choices_pass(tmp_path, extra):
    res = _megatron(tmp_path, extra)
    assert res.job is not None, res.error


# ---- G. NeMo `+key=` additions that look like misspellings
@pytest.mark.parametrize("override, meant", [("+model.context_paralel_size=2", "+model.context_parallel_size"),
                                             ("+model.num_layer=16", "model.num_layers")])
def test_nemo_plus_near_miss_is_warned(tmp_path, override, meant):
    res = parse_in(tmp_path, NEMO_HEAD + NEMO_LAUNCH + override + "\n", {"conf/gpt.yaml": NEMO_CONF})
    assert res.job is not None, res.error
    key = override.split("=")[0]
    assert any(w.startswith(key + ":") and f"did you mean {meant}?" in w and "job.sbatch:3" in w
               for w in res.warnings), res.warnings


def test_nemo_plus_of_a_new_key_says_nothing(tmp_path):
    res = parse_in(tmp_path, NEMO_HEAD + NEMO_LAUNCH + "+model.context_parallel_size=1 +model.brand_new_key=3\n",
                   {"conf/gpt.yaml": NEMO_CONF})
    assert res.job is not None, res.error
    assert not [w for w in res.warnings if "does not read" in w], res.warnings


# ---- F. duplicate keys, and JSON only YAML reads
def test_deepspeed_duplicate_key_stops_as_deepspeed_does(tmp_path):
    res = _ds(tmp_path, '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 1},\n'
                        '  "zero_optimization": {"stage": 3}\n}\n')
    assert res.job is None
    assert "duplicate key 'zero_optimization'" in res.error and "first at line 3" in res.error
    assert res.error.endswith("ds.json:4)"), res.error


def test_deepspeed_trailing_comma_stops_as_json_load_does(tmp_path):
    res = _ds(tmp_path, '{\n  "train_micro_batch_size_per_gpu": 1,\n  "bf16": {"enabled": true},\n}\n')
    assert res.job is None
    assert "not valid JSON" in res.error and "json.load" in res.error and res.error.endswith("ds.json:4)"), res.error


def test_deepspeed_sed_template_placeholder_is_still_read(tmp_path):
    res = _ds(tmp_path, '{\n  "train_micro_batch_size_per_gpu": MICRO,\n  "bf16": {"enabled": true}\n}\n')
    assert res.error is None or "not valid JSON" not in res.error


def test_llmfoundry_duplicate_key_stops_as_omegaconf_does(tmp_path):
    res = _foundry(tmp_path, MPT7B + "global_train_batch_size: 512\n")
    assert res.job is None
    assert "duplicate key 'global_train_batch_size'" in res.error and "OmegaConf" in res.error, res.error
    assert res.error.endswith(f"mpt.yaml:{MPT7B.count(chr(10)) + 1})"), res.error


def test_nemo_duplicate_key_stops(tmp_path):
    conf = NEMO_CONF.replace("  num_layers: 24\n", "  num_layers: 24\n  num_layers: 12\n")
    res = parse_in(tmp_path, NEMO_HEAD + NEMO_LAUNCH + "\n", {"conf/gpt.yaml": conf})
    assert res.job is None and "duplicate key 'model.num_layers'" in res.error, res.error


# test_moe_and_keys' NeoX config with its last key (bf16, line 11) turned into a second num_layers.
NEOX_YML = KEYS_NEOX_YML.replace('"bf16": {"enabled": true},', '"num_layers": 12,')


def test_neox_duplicate_key_in_one_file_is_warned(tmp_path):
    res = parse_in(tmp_path, "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=4 --ntasks-per-node=1\n"
                             "python deepy.py train.py m.yml\n", {"m.yml": NEOX_YML})
    assert res.job is not None, res.error
    assert res.job.model.layers == 12          # PyYAML keeps the last
    assert any("duplicate key 'num_layers'" in w and "m.yml:11" in w and "first at line 4" in w
               for w in res.warnings), res.warnings


# ---- D. #SBATCH long options
def _directives(line: str):
    from slurm_plugin.launch.sbatch import read_directives
    return read_directives(f"#!/bin/bash\n#SBATCH --nodes=2\n{line}\nsrun true\n", "job.sbatch")


def test_sbatch_unknown_option_is_warned_with_did_you_mean():
    d = _directives("#SBATCH --gpus-per-ndoe=8")
    assert d.request.gpus_per_node is None
    assert any("--gpus-per-ndoe" in w and "did you mean --gpus-per-node?" in w and "job.sbatch:3" in w
               for w in d.warnings), d.warnings


def test_sbatch_takes_an_unambiguous_prefix_as_getopt_does():
    d = _directives("#SBATCH --gpus-per-no=8 --ntasks-per-n 4")
    assert (d.request.gpus_per_node, d.request.ntasks_per_node) == (8, 4) and not d.warnings, d.warnings
    d = _directives("#SBATCH --gpus-per=8")
    assert d.request.gpus_per_node is None and any("ambiguous" in w for w in d.warnings), d.warnings


def test_sbatch_known_options_say_nothing():
    d = _directives("#SBATCH --exclusive --mem=0 --time=01:00:00 -A proj -N 2 --job-name=x --output=o.%j")
    assert not d.warnings, d.warnings


# ---- E. torchrun options
TORCHRUN = ("#!/bin/bash\n#SBATCH --nodes=4 --ntasks-per-node=1 --gpus-per-node=8\n"
            "srun torchrun {opts} pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 "
            "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 512 "
            "--train-iters 1000 --bf16\n")


def test_torchrun_prefix_is_the_option_it_names(tmp_path):
    res = parse_in(tmp_path, TORCHRUN.format(opts="--nnode 4 --nproc-per 8 --standal"))
    assert res.job is not None, res.error
    assert res.job.layout.dp == 32, res.job.layout


def test_torchrun_unknown_option_stops_naming_it(tmp_path):
    res = parse_in(tmp_path, TORCHRUN.format(opts="--nnodes 4 --nprocs_per_node 8"))
    assert res.job is None
    assert "--nprocs_per_node is not a torchrun option" in res.error and "did you mean --nproc-per-node?" in res.error
    assert res.error.endswith("job.sbatch:3)"), res.error


def test_torchrun_ambiguous_prefix_stops(tmp_path):
    res = parse_in(tmp_path, TORCHRUN.format(opts="--nnodes 4 --nproc_per_node 8 --master 1234"))
    assert res.job is None and "ambiguous" in res.error, res.error


def test_torchrun_option_list_is_the_installed_torchruns():
    """An option torchrun has and the list lacks would stop a job that runs: the list is checked
    against torch's own parser wherever torch is installed (the calibrate extra)."""
    run = pytest.importorskip("torch.distributed.run", reason="torch is not installed")
    from slurm_plugin.launch.launchers import _TORCHRUN_FLAGS, _TORCHRUN_LONG
    parser = run.get_args_parser()
    theirs = {s[2:] for a in parser._actions for s in a.option_strings if s.startswith("--")}
    assert theirs <= _TORCHRUN_LONG, sorted(theirs - _TORCHRUN_LONG)
    flags = {s[2:] for a in parser._actions if a.nargs == 0 for s in a.option_strings if s.startswith("--")}
    assert flags <= _TORCHRUN_FLAGS, sorted(flags - _TORCHRUN_FLAGS)


def test_torchrun_options_of_recent_torch_are_read(tmp_path):
    opts = "--nnodes 4 --nproc-per-node 8 --virtual-local-rank --shutdown-timeout 30"
    res = parse_in(tmp_path, TORCHRUN.format(opts=opts))
    assert res.job is not None and res.job.layout.dp == 32, res.error


def test_sbatch_cluster_alias_and_removed_workdir():
    """sbatch 22.05 takes --cluster (an alias beside --clusters) and refuses --workdir."""
    assert not _directives("#SBATCH --cluster=c1").warnings
    assert any("--workdir" in w for w in _directives("#SBATCH --workdir=/tmp").warnings)


def test_neox_null_where_neox_needs_a_number_is_warned(tmp_path):
    """model_parallel_size: null used to read as tp 1 without a word; NeoX keeps None there."""
    yml = NEOX_YML.replace('"model_parallel_size": 1,', '"model_parallel_size": null,')
    assert '"model_parallel_size": null' in yml
    res = parse_in(tmp_path, "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=4 --ntasks-per-node=1\n"
                             "python deepy.py train.py m.yml\n", {"m.yml": yml})
    assert res.job is not None, res.error
    assert res.job.layout.tp == 1
    assert any("model_parallel_size is null" in w and "m.yml:3" in w for w in res.warnings), res.warnings


def test_an_integer_flag_written_as_a_float_is_warned_and_read(tmp_path):
    """--train-iters 2e5: Megatron's argparse int() refuses it; it used to be read silently."""
    res = parse_in(tmp_path, TORCHRUN.format(opts="--nnodes 4 --nproc-per-node 8").replace(
        "--train-iters 1000", "--train-iters 2e5"))
    assert res.job is not None and res.job.run.train_iters == 200000, res.error
    assert any("--train-iters '2e5'" in w and "int()" in w and "job.sbatch:3" in w for w in res.warnings), res.warnings
    plain = parse_in(tmp_path, TORCHRUN.format(opts="--nnodes 4 --nproc-per-node 8"))
    assert not any("int()" in w for w in plain.warnings)


def test_megatron_rampup_with_train_iters_stops_as_megatron_does(tmp_path):
    """examples/gpt3/train_gpt3_175b_distributed.sh: Megatron's validate_args refuses a batch-size
    rampup in iteration-based training; it used to be predicted for 500,000 iterations."""
    script = TORCHRUN.format(opts="--nnodes 4 --nproc-per-node 8").replace(
        "--global-batch-size 512", "--global-batch-size 512 --rampup-batch-size 16 16 5859375")
    res = parse_in(tmp_path, script)
    assert res.job is None and "--rampup-batch-size with --train-iters" in res.error, res.error
    samples = script.replace("--train-iters 1000", "--train-samples 1000000")
    ok = parse_in(tmp_path, samples)
    assert ok.job is not None, ok.error


def test_torchtitan_async_tp_is_said_not_modelled(tmp_path):
    """llama3_405b.toml sets enable_async_tensor_parallel; it was read as a known key and said nothing."""
    src = DATA / "corpus" / "33_torchtitan_llama3_8b"
    toml = (src / "llama3_8b.toml").read_text().replace("tensor_parallel_degree = 1",
                                                        "tensor_parallel_degree = 1\nenable_async_tensor_parallel = true")
    assert "enable_async_tensor_parallel" in toml
    res = parse_in(tmp_path, (src / "job.sbatch").read_text(), {"llama3_8b.toml": toml})
    assert res.job is not None and res.job.layout.tp == 2, res.error
    assert any("enable_async_tensor_parallel is not modelled" in w for w in res.warnings), res.warnings
    plain = parse_in(tmp_path, (src / "job.sbatch").read_text(), {"llama3_8b.toml": (src / "llama3_8b.toml").read_text()})
    assert not any("async" in w for w in plain.warnings)


def test_an_sbatch_line_after_the_first_command_is_said_ignored():
    from slurm_plugin.launch.sbatch import read_directives
    text = "#!/bin/bash\n#SBATCH -N 1\n\nmodule load x\n#SBATCH --gpus-per-node=8\n#SBATCH --time=1:00:00\nsrun x\n"
    d = read_directives(text, "job.sbatch")
    assert d.request.gpus_per_node is None          # as sbatch reads it: not the job's
    assert d.warnings == ["#SBATCH line after the script's first command (job.sbatch:4) is ignored by sbatch: "
                          "move it above that command (job.sbatch:5)"]


@pytest.mark.parametrize("text", [
    "#!/bin/bash\n#SBATCH -N 1\nsrun x\n",                                      # none after
    "#!/bin/bash\n#SBATCH -N 1\ncat > job2.sh <<EOF\n#!/bin/bash\n#SBATCH -N 2\nEOF\n",   # a heredoc's
    "#!/bin/bash\nsbatch <<EOF\n#!/bin/bash\n#SBATCH -N 2\nsrun x\nEOF\n",
    "#!/bin/bash\n#SBATCH -N 1\necho\n#SBATCHX not a directive\n",
])
def test_sbatch_lines_that_are_not_the_jobs_say_nothing(text):
    from slurm_plugin.launch.sbatch import read_directives
    assert not [w for w in read_directives(text, "job.sbatch").warnings if "first command" in w]
