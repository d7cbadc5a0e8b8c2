"""Unset shell variables are never silently empty: under set -u bash stops there (an error), else the
empty word is named in a warning, or in the error it most likely caused (an argument shifted)."""
from __future__ import annotations

import pytest

from slurm_plugin.launch import parse_script

from .helpers import run_shell
from .test_typos import MEGATRON
from .test_typos_more import NEOX_YML

WHOLE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/u"}        # perf-predict: os.environ
DAEMON_ENV = {"HOME": "/home/u", "USER": "u", "LOGNAME": "u"}   # the daemon: passwd only

MPT_YAML = """\
max_seq_len: 2048
global_train_batch_size: 256
device_train_microbatch_size: 4
max_duration: 1000ba
precision: amp_bf16
model:
  name: mpt_causal_lm
  d_model: 2048
  n_heads: 16
  n_layers: 24
  expansion_ratio: 4
  max_seq_len: ${max_seq_len}
  vocab_size: 50368
"""


def _parse(tmp_path, script: str, files=None, env=None):
    """helpers.parse_in with an environment: perf-predict's os.environ, the daemon's, or none."""
    for name, text in {**(files or {}), "job.sbatch": script}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return parse_script(str(tmp_path / "job.sbatch"), env=env, deadline_s=10.0)


def _error_with_clause(res) -> str:
    """The error as perf-predict shows it (parse_script adds the clause on the unset variables)."""
    assert res.error, res.warnings
    return res.error


def _unset_warnings(res) -> list:
    return [w for w in res.warnings if "not set here" in w]


def _megatron_tp(prelude: str, tp_word: str = "$TP") -> str:
    head, launch = MEGATRON.split("srun ", 1)
    return head + prelude + "srun " + launch.format(
        extra=f"--tensor-model-parallel-size {tp_word} --pipeline-model-parallel-size 2")


# ---- 1. set -u: bash stops at the expansion
@pytest.mark.parametrize("opts", ["set -euo pipefail", "set -u", "set -o nounset", "set -e -o nounset -o pipefail"])
def test_set_u_unset_variable_is_an_error_naming_it_and_the_line(tmp_path, opts):
    res = _parse(tmp_path, _megatron_tp(f"{opts}\nTP=$MYTP\n"), env=WHOLE_ENV)
    assert res.job is None
    assert res.error == (f"cannot predict: $MYTP is not set ({tmp_path}/job.sbatch:4) and the script runs with "
                         f"set -u: bash stops there ('MYTP: unbound variable'); set it in the script or export it "
                         f"before sbatch (sbatch passes your environment)")


def test_set_u_from_the_shebang_is_an_error(tmp_path):
    script = _megatron_tp("TP=$MYTP\n").replace("#!/bin/bash\n", "#!/bin/bash -eu\n")
    res = _parse(tmp_path, script)             # no environment given: nothing sets MYTP
    assert res.error and "$MYTP is not set" in res.error and "job.sbatch:3" in res.error


def test_set_u_variable_from_the_environment_is_read(tmp_path):
    res = _parse(tmp_path, _megatron_tp("set -euo pipefail\nTP=$MYTP\n"), env={**WHOLE_ENV, "MYTP": "2"})
    assert res.job is not None, res.error
    assert res.job.layout.tp == 2
    assert not _unset_warnings(res)


def test_set_u_in_the_daemon_without_the_users_environment_is_a_warning(tmp_path):
    # cli_filter.lua sends no environment: the user may export the variable, so no refusal
    res = _parse(tmp_path, _megatron_tp("set -euo pipefail\necho \"$RUN_TAG\"\n", "2"), env=DAEMON_ENV)
    assert res.job is not None, res.error
    assert _unset_warnings(res) == [
        f"$RUN_TAG ({tmp_path}/job.sbatch:4) is not set here and was read as empty; sbatch passes your "
        f"environment, so the job may see another value; the script runs with set -u: bash stops at the "
        f"first one unless your environment sets it"]


@pytest.mark.parametrize("where", [
    'echo "done $ELAPSED"',                   # after the launch: the training has run by then
    'X=$(echo "$ELAPSED")',                   # in $( ): only the subshell stops
    '( echo "$ELAPSED" )',
    'set +u\necho "$ELAPSED"',
])
def test_set_u_where_bash_does_not_stop_the_job_is_not_an_error(tmp_path, where):
    script = _megatron_tp("set -eu\n", "2")
    if "done" in where:
        script += where + "\n"
    else:
        script = script.replace("set -eu\n", f"set -eu\n{where}\n")
    res = _parse(tmp_path, script, env=WHOLE_ENV)
    assert res.job is not None, res.error
    assert len(_unset_warnings(res)) == 1 and "$ELAPSED" in _unset_warnings(res)[0]


# ---- 2. without set -u: the warning, or the clause in the error that follows
def test_unset_variable_in_a_test_is_warned(tmp_path):
    script = _megatron_tp('if [ "$SIZE" == "big" ]; then TP=8; else TP=2; fi\n')
    res = _parse(tmp_path, script, env=WHOLE_ENV)
    assert res.job is not None, res.error
    assert _unset_warnings(res) == [
        f"$SIZE ({tmp_path}/job.sbatch:3) is not set here and was read as empty; sbatch passes your environment, "
        f"so the job may see another value"]


def test_more_than_three_unset_variables_are_counted():
    sh = run_shell("echo $A $B\necho $C\necho $D $E $A\n")
    assert sh.unset_note()[0] == ("$A (t.sh:1), $B (t.sh:1), $C (t.sh:2) and 2 more are not set here and were "
                                    "read as empty; sbatch passes your environment, so the job may see another value")


def test_megatron_shifted_argument_error_names_the_unset_variable(tmp_path):
    res = _parse(tmp_path, _megatron_tp("TP=$MYTP\n"), env=WHOLE_ENV)
    err = _error_with_clause(res)
    assert "--tensor-model-parallel-size is '--pipeline-model-parallel-size', not an integer" in err
    assert err.endswith(f"(the script expands $MYTP ({tmp_path}/job.sbatch:3), which is not set here: read as empty)")
    assert not _unset_warnings(res)              # said once, in the error


def test_composer_shifted_config_error_names_the_unset_variable(tmp_path):
    script = ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
              "srun composer --world_size 16 --node_rank $SLURM_NODEID --master_addr $MASTER_ADDR "
              "--master_port 29500 scripts/train/train.py mpt.yaml\n")
    res = _parse(tmp_path, script, {"mpt.yaml": MPT_YAML}, env=WHOLE_ENV)
    err = _error_with_clause(res)
    assert "cannot read config" in err and "train.py" in err
    assert err.endswith(f"(the script expands $MASTER_ADDR ({tmp_path}/job.sbatch:3), which is not set here: "
                        f"read as empty)")


def test_neox_config_dir_error_names_the_unset_variable(tmp_path):
    script = ("#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=4 --ntasks-per-node=1\n"
              "python deepy.py train.py -d $CONFIGS_DIR m.yml local.yml\n")
    res = _parse(tmp_path, script, {"configs/m.yml": NEOX_YML, "configs/local.yml": "{}\n"}, env=WHOLE_ENV)
    err = _error_with_clause(res)
    assert "m.yml/local.yml" in err and "(the script expands $CONFIGS_DIR (" in err


# ---- what is not "unset"
@pytest.mark.parametrize("text", [
    'echo "${X:-4}" "${X-4}" "${X:+y}" "${X+y}" "${X:=1}"',          # written for an unset X
    "X=1\necho $X",                                                # the script sets it
    'if [ "$SLURM_JOB_ID" = none ]; then X=1; fi\necho "$X"',      # ... in a branch not taken
    'read -r X <<< "$(hostname)"\necho $X',
    'printf -v X %s 1\necho $X',
    'echo $1 $# $? $@ "${@}" $$ ${#@}',                             # special parameters
    'echo $SLURM_STEP_ID $SLURM_LOCALID $PMI_RANK $OMPI_COMM_WORLD_RANK $CUDA_VISIBLE_DEVICES $HOSTNAME',
    "source /nonexistent/env.sh\necho $FROM_ENV_FILE",             # the env_incomplete message says it
])
def test_not_reported(text):
    sh = run_shell(text)
    assert sh.unset_vars() == [], sh.unset_vars()
    assert not any("not set here" in w for w in sh.warnings)


def test_variable_from_the_given_environment_is_not_reported(tmp_path):
    res = _parse(tmp_path, _megatron_tp('if [ "$SIZE" == "big" ]; then TP=8; else TP=2; fi\n'),
                 env={**WHOLE_ENV, "SIZE": "big"})
    assert res.job is not None and res.job.layout.tp == 8
    assert not _unset_warnings(res)


def test_set_u_use_before_an_assignment_elsewhere_is_not_refused():
    # the script sets it later (a loop, a function called first): we do not claim bash stops
    sh = run_shell("set -u\nf() { echo $LATER; }\nLATER=1\nf\n")
    assert sh.unset_vars() == []
