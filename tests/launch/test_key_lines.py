"""A misspelt key on a line the script wrote with a value from a variable (`"key": $VAR`) is named at
the line that wrote the key, and the value's own problems at the line that set the variable: a
written line keeps both origins (shell.LineOrigin)."""
from __future__ import annotations

import re

from .helpers import parse_in
from .test_nemo import CONF as NEMO_CONF
from .test_nemo import HEAD as NEMO_HEAD
from .test_nemo import LAUNCH as NEMO_LAUNCH
from .test_torchtitan import HEAD as TT_HEAD
from .test_torchtitan import LAUNCH as TT_LAUNCH
from .test_torchtitan import TOML
from .test_typos import MEGATRON


def _written(head: str, config_name: str, config: str, launch: str) -> tuple[str, int]:
    """The script (V=... on line 3, then a heredoc writing ``config``) and the line of the config's
    first line that holds $V."""
    lines = config.splitlines()
    at = next(i for i, line in enumerate(lines) if "$V" in line)
    script = head + "V=8\n" + f"cat > {config_name} <<EOF\n" + config + "EOF\n" + launch
    return script, head.count("\n") + 3 + at


def _named(text: str, tmp_path, line: int) -> None:
    text = text.replace(f"{tmp_path}/", "")
    assert f"job.sbatch:{line})" in text, text
    assert "job.sbatch:3)" not in text, text          # not the variable's line


def test_deepspeed_key_typo_with_a_variable_value(tmp_path):
    config = '{\n  "zero_optimization": {"stage": 1},\n  "train_micro_batch_size_per_gpux": $V\n}\n'
    script, line = _written("#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\n", "ds.json", config,
                            MEGATRON.split("\n", 2)[2].format(extra="--deepspeed --deepspeed_config ds.json"))
    res = parse_in(tmp_path, script)
    assert res.job is None and "train_micro_batch_size_per_gpux" in res.error, res.error
    _named(res.error, tmp_path, line)


def test_deepspeed_value_from_a_variable_is_still_named_where_it_was_set(tmp_path):
    config = '{\n  "zero_optimization": {"stage": 1},\n  "train_micro_batch_size_per_gpu": "$V"\n}\n'
    script, _ = _written("#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\n", "ds.json", config,
                         MEGATRON.split("\n", 2)[2].format(extra="--deepspeed --deepspeed_config ds.json"))
    res = parse_in(tmp_path, script.replace("V=8", "V=eight"))
    assert res.job is None and "train_micro_batch_size_per_gpu is 'eight'" in res.error, res.error
    assert res.error.replace(f"{tmp_path}/", "").endswith("job.sbatch:3)"), res.error


def test_nemo_key_typo_with_a_variable_value(tmp_path):
    # (Hydra's ${...} escaped, as an unquoted heredoc needs)
    config = NEMO_CONF.replace("${", "\\${").replace("model:\n", "model:\n  pipline_model_parallel_size: $V\n", 1)
    assert "pipline" in config
    script, line = _written(NEMO_HEAD, "conf/gpt.yaml", config, NEMO_LAUNCH + "\n")
    res = parse_in(tmp_path, script, files={"conf/.keep": ""})
    hit = [s for s in [res.error or ""] + res.warnings if "pipline_model_parallel_size" in s]
    assert hit, (res.error, res.warnings)
    _named(hit[0], tmp_path, line)


def test_torchtitan_key_typo_with_a_variable_value(tmp_path):
    config = TOML.replace("local_batch_size = 8", "local_batch_sise = $V")
    script, line = _written(TT_HEAD, "cfg.toml", config, TT_LAUNCH + "\n")
    res = parse_in(tmp_path, script)
    said = [res.error or ""] + res.warnings
    hit = [s for s in said if "local_batch_sise" in s]
    assert hit, (res.error, res.warnings)
    _named(hit[0], tmp_path, line)


def test_a_line_written_from_one_piece_has_a_plain_origin(tmp_path):
    # no variable on the line: one origin, as before (a plain str, no second one kept)
    from slurm_plugin.launch.shell import LineOrigin, _line_origins
    origins = _line_origins([('  "a": 1,\n  "b": ', "f:4"), ("8", "f:1"), ("\n}\n", "f:4")])
    assert origins == ["f:4", "f:1", "f:4"]
    assert not isinstance(origins[0], LineOrigin) and isinstance(origins[1], LineOrigin)
    assert origins[1].written == "f:4" and re.fullmatch("f:1", origins[1])


def test_llmfoundry_key_typo_with_a_variable_value(tmp_path):
    from .test_typos_more import COMPOSER, FOUNDRY_HEAD, MPT7B
    config = MPT7B.replace("${", "\\${").replace("global_train_batch_size:", "global_train_batch_sise: $V\nx_unused:", 1)
    assert "sise" in config
    script, line = _written(FOUNDRY_HEAD, "mpt.yaml", config, COMPOSER)
    res = parse_in(tmp_path, script)
    hit = [s for s in [res.error or ""] + res.warnings if "global_train_batch_sise" in s]
    assert hit, (res.error, res.warnings)
    _named(hit[0], tmp_path, line)


# ---- a template copied, then filled in by `sed -i`
TEMPLATE = ('{\n  "zero_optimization": {"stage": 1},\n  "train_micro_batch_size_per_gpu": MB,\n'
            '  "gradient_accumulation_steps": 2\n}\n')


def _filled(tmp_path, template: str, sed: str):
    launch = MEGATRON.split("\n", 2)[2].format(extra="--deepspeed --deepspeed_config ds.json")
    script = f"#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\ncp tmpl.json ds.json\nsed -i \"{sed}\" ds.json\n" + launch
    res = parse_in(tmp_path, script, files={"tmpl.json": template})
    return res, (res.error or "").replace(f"{tmp_path}/", "")


def test_a_line_sed_left_alone_is_named_in_the_template(tmp_path):
    res, err = _filled(tmp_path, TEMPLATE.replace("accumulation_steps", "accumulation_stepz"), "s/MB/4/")
    assert res.job is None and "gradient_accumulation_stepz" in err and err.endswith("(tmpl.json:4)"), err


def test_a_line_sed_filled_in_names_its_key_in_the_template_and_its_value_at_sed(tmp_path):
    res, err = _filled(tmp_path, TEMPLATE.replace("per_gpu", "per_gpz"), "s/MB/4/")
    assert res.job is None and "per_gpz" in err and err.endswith("(tmpl.json:3)"), err
    res, err = _filled(tmp_path, TEMPLATE.replace("MB", '"MB"'), "s/MB/eight/")
    assert res.job is None and "is 'eight'" in err and err.endswith("(job.sbatch:4)"), err


def test_a_key_sed_wrote_is_named_at_sed(tmp_path):
    res, err = _filled(tmp_path, TEMPLATE, "s/MB/4/; s/accumulation_steps/accumulation_stepz/")
    assert res.job is None and "gradient_accumulation_stepz" in err and err.endswith("(job.sbatch:4)"), err


def test_a_value_warning_stays_at_the_variables_line(tmp_path):
    config = '{\n  "zero_optimization": {\n    "stage": 2,\n    "overlap_comm": $V\n  }\n}\n'
    script, _ = _written("#!/bin/bash\n#SBATCH -N 1 --gpus-per-node=8\n", "ds.json", config,
                         MEGATRON.split("\n", 2)[2].format(extra="--deepspeed --deepspeed_config ds.json"))
    res = parse_in(tmp_path, script.replace("V=8", "V=true"))
    said = [w.replace(f"{tmp_path}/", "") for w in res.warnings if "overlap_comm at ZeRO stage 2" in w]
    assert said and said[0].endswith("job.sbatch:3)"), res.warnings


def test_a_line_continued_by_a_later_write_keeps_its_first_words_origin():
    from slurm_plugin.launch.configs import key_origin
    from slurm_plugin.launch.shell import _add_line_origins
    origins: list = []
    _add_line_origins(origins, [("  ", "t.sh:2")], open_line=False)            # printf "  " > c.json
    _add_line_origins(origins, [('"micro": ', "t.sh:3"), ("4", "t.sh:1"), ("\n", "t.sh:3")], open_line=True)
    assert origins == ["t.sh:1"] and key_origin(origins[0]) == "t.sh:3"


def test_line_origins_survive_copy_and_pickle():
    import copy
    import pickle

    from slurm_plugin.launch.shell import LineOrigin
    o = LineOrigin("a.sh:1", "a.sh:4")
    for c in (copy.copy(o), copy.deepcopy(o), pickle.loads(pickle.dumps(o))):
        assert c == "a.sh:1" and c.written == "a.sh:4"
