"""TorchTitan: TOML config + flavor table + command-line overrides; FSDP is ZeRO-3."""
from __future__ import annotations

import pathlib

import pytest

from slurm_plugin.launch.torchtitan import FLAVORS, ffn_dim

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
TOML = """[model]
name = "llama3"
flavor = "70B"

[training]
local_batch_size = 8
seq_len = 4096
steps = 300

[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = 4
pipeline_parallel_degree = 2
pipeline_parallel_microbatch_size = 2

[activation_checkpoint]
mode = "full"

[checkpoint]
enable_checkpoint = true
interval = 100

[validation]
enabled = true
freq = 50
steps = 10
"""
LAUNCH = "srun torchrun --nnodes 2 --nproc_per_node 8 -m torchtitan.train --job.config_file cfg.toml "


def _run(tmp_path: pathlib.Path, body: str, toml: str | None = TOML):
    return parse_in(tmp_path, HEAD + body, {"cfg.toml": toml} if toml is not None else None)


def test_published_flavor_ffn_sizes():
    # the FFN widths of the published checkpoints
    want = {("llama3", "8B"): 14336, ("llama3", "70B"): 28672, ("llama3", "405B"): 53248,
            ("llama2", "7B"): 11008, ("llama2", "13B"): 13824, ("llama2", "70B"): 28672}
    for (name, flavor), ffn in want.items():
        s = FLAVORS[name][0][flavor]
        assert ffn_dim(s["dim"], s["ffn_dim_multiplier"], s["multiple_of"]) == ffn


def test_pipeline_with_fsdp_is_zero3_and_accepted(tmp_path):
    res = _run(tmp_path, LAUNCH + "\n")
    assert res.error is None, res.error
    j = res.job
    assert (j.model.layers, j.model.hidden, j.model.ffn_hidden, j.model.kv_heads) == (80, 8192, 28672, 8)
    assert (j.layout.tp, j.layout.pp, j.layout.dp, j.layout.zero_stage) == (4, 2, 2, 3)
    assert (j.layout.micro_batch, j.layout.micro_batches) == (2, 4)       # local 8 in pp microbatches of 2
    assert j.layout.recompute == "full" and j.run.framework == "torchtitan"
    assert (j.run.train_iters, j.run.save_interval, j.run.eval_interval, j.run.eval_iters) == (300, 100, 50, 10)


def test_float8_converter_is_current_scaling_fp8(tmp_path):
    res = _run(tmp_path, LAUNCH + "--model.converters float8\n")
    assert res.error is None, res.error
    assert res.job.run.fp8 == "current" and res.job.run.precision == "bf16"
    assert _run(tmp_path, LAUNCH + "\n").job.run.fp8 == ""


def test_overrides_win(tmp_path):
    res = _run(tmp_path, LAUNCH + "--training.steps 10 --activation_checkpoint.mode=none "
                                  "--parallelism.pipeline_parallel_degree 1 --training.compile\n")
    assert res.error is None, res.error
    j = res.job
    assert (j.run.train_iters, j.layout.recompute, j.layout.pp, j.layout.dp) == (10, "none", 1, 4)
    assert (j.layout.micro_batch, j.layout.micro_batches) == (8, 1)
    assert res.provenance["run.train_iters"].endswith("job.sbatch:3 (--training.steps)")


def test_old_train_py_with_training_section_degrees(tmp_path):
    old = ('[model]\nname = "llama"\nflavor = "7B"\n[training]\nbatch_size = 4\nseq_len = 2048\nsteps = 50\n'
           'data_parallel_degree = -1\ntensor_parallel_degree = 2\n')
    res = _run(tmp_path, "srun torchrun --nnodes 2 --nproc_per_node 8 train.py --job.config_file cfg.toml\n", old)
    assert res.error is None, res.error
    j = res.job
    assert (j.model.layers, j.model.ffn_hidden, j.model.vocab) == (32, 11008, 32000)
    assert (j.layout.tp, j.layout.dp, j.layout.micro_batch, j.layout.zero_stage) == (2, 8, 4, 3)


def test_degrees_that_do_not_fill_the_world_stop(tmp_path):
    res = _run(tmp_path, LAUNCH + "--parallelism.data_parallel_shard_degree 4\n")
    assert res.job is None and "data_parallel_shard_degree 4" in res.error


def test_unknown_flavor_names_the_line(tmp_path):
    res = _run(tmp_path, LAUNCH + "\n", TOML.replace('"70B"', '"3B"'))
    assert res.job is None and "'3B'" in res.error and res.error.endswith("cfg.toml:3)")


@pytest.mark.parametrize("name, flavor", [("deepseek_v3", "16B"), ("llama4", "17bx16e")])
def test_moe_models_are_refused(tmp_path, name, flavor):
    toml = TOML.replace('"llama3"', f'"{name}"').replace('"70B"', f'"{flavor}"')
    res = _run(tmp_path, LAUNCH + "\n", toml)
    assert res.job is None and "mixture-of-experts models are not modelled yet" in res.error


def test_missing_and_broken_toml_are_named(tmp_path):
    res = _run(tmp_path, LAUNCH.replace("cfg.toml", "nope.toml") + "\n")
    assert res.job is None and "nope.toml" in res.error
    res = _run(tmp_path, LAUNCH + "\n", "[model\nname = 1\n")
    assert res.job is None and "not valid TOML" in res.error and "cfg.toml:" in res.error
    res = _run(tmp_path, LAUNCH + "\n", "x = " + "[" * 100000 + "]" * 100000 + "\n")
    assert res.job is None and res.error.startswith("cannot predict: ") and "internal" not in res.error


def test_compile_is_read_from_the_flag_or_the_compile_section(tmp_path):
    res = _run(tmp_path, LAUNCH + "--training.compile\n")
    assert res.error is None, res.error
    assert res.job.run.compile and res.provenance["run.compile"].endswith("(--training.compile)")
    assert not _run(tmp_path, LAUNCH + "\n").job.run.compile
    section = TOML + '\n[compile]\nenable = true\ncomponents = ["model", "loss"]\n'
    assert _run(tmp_path, LAUNCH + "\n", section).job.run.compile
    # The loss alone compiled: the layers run eager.
    loss_only = TOML + '\n[compile]\nenable = true\ncomponents = ["loss"]\n'
    res = _run(tmp_path, LAUNCH + "\n", loss_only)
    line = 1 + next(i for i, t in enumerate(loss_only.splitlines()) if t.startswith("components"))
    assert not res.job.run.compile and res.provenance["run.compile"].endswith(f"cfg.toml:{line}")


def test_selective_checkpointing_is_op_level_unless_every_layer(tmp_path):
    res = _run(tmp_path, LAUNCH + "--activation_checkpoint.mode selective\n")
    assert res.error is None, res.error
    assert res.job.layout.recompute == "selective" and not res.warnings
    every = _run(tmp_path, LAUNCH + "--activation_checkpoint.mode selective "
                                   "--activation_checkpoint.selective_ac_option 1\n")
    assert every.job.layout.recompute == "full"
    second = _run(tmp_path, LAUNCH + "--activation_checkpoint.mode selective "
                                    "--activation_checkpoint.selective_ac_option 2\n")
    assert second.job.layout.recompute == "selective"
    assert any("one layer in 2 checkpointed whole" in w for w in second.warnings)


# ---- a value that is not an integer (or boolean) stops at its own line, naming the key and the value
def _line_of(toml: str, start: str) -> int:
    return 1 + next(i for i, t in enumerate(toml.splitlines()) if t.startswith(start))


@pytest.mark.parametrize("old, new, shown", [
    ("tensor_parallel_degree = 4", 'tensor_parallel_degree = "two"', "[parallelism] tensor_parallel_degree is 'two'"),
    ("pipeline_parallel_degree = 2", 'pipeline_parallel_degree = "two"',
     "[parallelism] pipeline_parallel_degree is 'two'"),
    ("data_parallel_shard_degree = -1", 'data_parallel_shard_degree = "all"',
     "[parallelism] data_parallel_shard_degree is 'all'"),
    ("pipeline_parallel_microbatch_size = 2", "pipeline_parallel_microbatch_size = 2.5",
     "[parallelism] pipeline_parallel_microbatch_size is 2.5"),
    ("local_batch_size = 8", 'local_batch_size = "eight"', "[training] local_batch_size is 'eight'"),
    ("seq_len = 4096", "seq_len = true", "[training] seq_len is True"),
    ("steps = 300", 'steps = "many"', "[training] steps is 'many'"),
    ("interval = 100", 'interval = "often"', "[checkpoint] interval is 'often'"),
    ("freq = 50", "freq = [50]", "[validation] freq is [50]"),
])
def test_non_integer_toml_value_stops_at_its_line(tmp_path, old, new, shown):
    toml = TOML.replace(old, new)
    res = _run(tmp_path, LAUNCH + "\n", toml)
    assert res.job is None, res.warnings
    assert f"TorchTitan stops at start: {shown}, not an integer" in res.error, res.error
    assert res.error.endswith(f"cfg.toml:{_line_of(toml, new.split(' ')[0])})"), res.error
    assert "global_batch" not in res.error


def test_extra_degree_keys_are_checked_too(tmp_path):
    toml = TOML.replace("pipeline_parallel_degree = 2", 'pipeline_parallel_degree = 2\ncontext_parallel_degree = "one"'
                        "\ndata_parallel_replicate_degree = 1")
    res = _run(tmp_path, LAUNCH + "\n", toml)
    assert res.job is None
    assert "[parallelism] context_parallel_degree is 'one', not an integer" in res.error, res.error
    assert res.error.endswith(f"cfg.toml:{_line_of(toml, 'context_parallel_degree')})"), res.error


@pytest.mark.parametrize("flag", ["--parallelism.tensor_parallel_degree two",
                                  "--parallelism.tensor_parallel_degree=two",
                                  "--training.steps lots", "--parallelism.pipeline_parallel_degree 1.5"])
def test_non_integer_command_line_value_stops_at_the_script_line(tmp_path, flag):
    res = _run(tmp_path, LAUNCH + flag + "\n")
    key, _, value = flag.replace("=", " ").partition(" ")
    assert res.job is None, res.warnings
    assert f"{key} is '{value}', not an integer" in res.error, res.error
    assert res.error.endswith("job.sbatch:3)"), res.error


def test_command_line_degree_without_a_value_stops(tmp_path):
    res = _run(tmp_path, LAUNCH + "--parallelism.tensor_parallel_degree --training.steps 10\n")
    assert res.job is None
    assert "--parallelism.tensor_parallel_degree has no value" in res.error and res.error.endswith("job.sbatch:3)")


def test_unknown_shell_degree_is_unknown_not_a_batch_of_minus_one(tmp_path):
    res = _run(tmp_path, LAUNCH + "--parallelism.tensor_parallel_degree $(get_tp)\n")
    assert res.job is None
    assert "layout.tp unknown" in res.error and "get_tp" in res.error, res.error
    said = res.error.replace(str(tmp_path), "")      # (a pytest-1NN folder holds "-1" itself)
    assert "global_batch" not in said and "-1" not in said, said


def test_quoted_integers_and_integral_floats_still_read(tmp_path):
    res = _run(tmp_path, LAUNCH + "--training.steps 20\n", TOML.replace("seq_len = 4096", "seq_len = 4096.0"))
    assert res.error is None, res.error
    assert res.job.model.seq_len == 4096 and res.job.run.train_iters == 20


def test_boolean_word_on_the_command_line_stops(tmp_path):
    res = _run(tmp_path, LAUNCH + "--checkpoint.enable_checkpoint ture\n")
    assert res.job is None
    assert "--checkpoint.enable_checkpoint 'ture' is not true or false" in res.error
    assert res.error.endswith("job.sbatch:3)"), res.error
    ok = _run(tmp_path, LAUNCH + "--checkpoint.enable_checkpoint false\n")
    assert ok.error is None and ok.job.run.save_interval == 0


def test_boolean_text_in_the_toml_is_read_as_python_does_and_warned(tmp_path):
    toml = TOML.replace("enable_checkpoint = true", 'enable_checkpoint = "ture"')
    res = _run(tmp_path, LAUNCH + "\n", toml)
    assert res.error is None, res.error
    assert res.job.run.save_interval == 100               # a non-empty string is true to TorchTitan
    line = _line_of(toml, "enable_checkpoint")
    assert any("[checkpoint] enable_checkpoint is 'ture', not true or false" in w and w.endswith(f"cfg.toml:{line})")
               for w in res.warnings), res.warnings
    assert not [w for w in _run(tmp_path, LAUNCH + "\n").warnings if "not true or false" in w]


# ---- a misspelt [section] header is blamed on the header's line
def test_misspelt_section_header_stops_at_the_header(tmp_path):
    toml = TOML.replace("[parallelism]", "[paralelism]")
    res = _run(tmp_path, LAUNCH + "\n", toml)
    assert res.job is None
    assert "[paralelism] is not a section of TorchTitan's JobConfig; did you mean [parallelism]?" in res.error
    assert res.error.endswith(f"cfg.toml:{_line_of(toml, '[paralelism]')})"), res.error
    assert _line_of(toml, "[paralelism]") == 10


def test_misspelt_section_without_read_keys_is_one_warning_at_the_header(tmp_path):
    toml = TOML + "\n[metrcs]\nlog_freq = 5\nenable_tensorboard = true\n"
    res = _run(tmp_path, LAUNCH + "\n", toml)
    assert res.error is None, res.error
    said = [w for w in res.warnings if "metrcs" in w]
    assert len(said) == 1 and "did you mean [metrics]?" in said[0], said
    assert said[0].endswith(f"cfg.toml:{_line_of(toml, '[metrcs]')})"), said


def test_misspelt_section_on_the_command_line_names_the_script_line(tmp_path):
    res = _run(tmp_path, LAUNCH + "--paralelism.tensor_parallel_degree 2\n")
    assert res.job is None and "did you mean [parallelism] tensor_parallel_degree?" in res.error
    assert res.error.endswith("job.sbatch:3)"), res.error
