"""A '\\' followed by a space, and a commented-out line inside a continued command, end the launch
command in bash; the flags after them are lost.  perfcast says where (slurm_plugin.launch.slips),
as a warning and, when the parse then fails, in the error."""
from __future__ import annotations

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=8\n"
LAUNCH = ("torchrun --nproc_per_node 8 pretrain_gpt.py \\\n"
          "    --num-layers 24 \\\n"
          "    --hidden-size 2048{slip}\n"
          "{comment}"
          "    --num-attention-heads 16 \\\n"
          "    --seq-length 2048 --max-position-embeddings 2048 \\\n"
          "    --micro-batch-size 4 --global-batch-size 32 --train-iters 100 --bf16\n")


def _script(slip: str = " \\", comment: str = "") -> str:
    return HEAD + LAUNCH.format(slip=slip, comment=comment)


def test_a_clean_continuation_says_nothing(tmp_path):
    res = parse_in(tmp_path, _script())
    assert res.job is not None, res.error
    assert not any("'\\'" in w for w in res.warnings), res.warnings


def test_a_space_after_the_backslash_is_named_in_the_error(tmp_path):
    res = parse_in(tmp_path, _script(slip=" \\ "))
    assert res.job is None
    assert "job.sbatch:6: a space after the '\\' ends the command there" in res.error, res.error
    assert "heads" in res.error.split("; note:")[0]          # what went wrong first, then why


def test_a_commented_out_flag_inside_the_command_is_named(tmp_path):
    res = parse_in(tmp_path, _script(comment="    # --pipeline-model-parallel-size 2 \\\n"))
    assert res.job is None
    assert "job.sbatch:7: a commented-out line inside a command continued with '\\' ends the command" in res.error


def test_a_slip_whose_flags_do_not_matter_is_still_warned(tmp_path):
    """The job still parses (the flags after the slip had defaults): a warning, since they are lost."""
    script = HEAD + ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 24 --hidden-size 2048 "
                     "--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 \\\n"
                     "    --micro-batch-size 4 --global-batch-size 32 --train-iters 100 --bf16 \\ \n"
                     "    --log-interval 10\n")
    res = parse_in(tmp_path, script)
    assert res.job is not None, res.error
    assert any(w.startswith("job.sbatch:5: a space after the '\\'") or "job.sbatch:5: a space after" in w
               for w in res.warnings), res.warnings


def test_backslashes_in_a_heredoc_or_before_a_non_flag_say_nothing(tmp_path):
    script = HEAD + ("cat > run.py <<'EOF'\nprint('a \\\\ b') \\ \nx = 1\nEOF\n") + LAUNCH.format(slip=" \\", comment="")
    res = parse_in(tmp_path, script)
    assert res.job is not None, res.error
    assert not any("a space after the" in w for w in res.warnings), res.warnings
