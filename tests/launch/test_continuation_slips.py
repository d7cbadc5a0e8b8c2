"""A '\\' followed by a space, and a commented-out line inside a continued command, end the launch
command in bash; the flags after them are lost.  perfcast says where (slurm_plugin.launch.slips),
as a warning and, when the parse then fails, in the error."""
from __future__ import annotations

import random
import re

from slurm_plugin.launch.slips import MAX_LOOKS, MAX_SLIPS, continuation_slips

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


# ---- the scan itself, against the rule written out line by line (what it did until it searched
# from each '\' instead: the same slips, without a Python loop over every line of a big script)
def _by_lines(text: str) -> list[str]:
    def continues(line: str) -> bool:
        return line.endswith("\\") and not line.endswith("\\\\")
    lines, out = text.split("\n"), []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            prev = lines[i - 1] if i else ""
            if continues(line) and continues(prev) and not prev.lstrip().startswith("#"):
                out.append(f"f:{i + 1}: a commented-out line inside a command continued with '\\' ends "
                           "the command; the lines after it run as commands of their own")
        else:
            bare = line.rstrip(" \t")
            if bare != line and continues(bare) and i + 1 < len(lines) and \
                    re.match(r"\s*-{1,2}[A-Za-z]", lines[i + 1]):
                out.append(f"f:{i + 1}: a space after the '\\' ends the command there; the lines after it "
                           "run as commands of their own (delete the space)")
        if len(out) >= MAX_SLIPS:
            break
    return out


def test_the_scan_finds_what_the_line_by_line_rule_finds():
    pieces = ["\\", "\\\\", " ", "\t", "\n", "#", "--x", "-y", "a", "\r", "\f", "  #", "\\ \n", "\\\n#", "\\\n"]
    rng = random.Random(5)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 50)))
        assert continuation_slips(text, "f") == _by_lines(text), repr(text)


def test_a_script_of_many_near_slips_is_scanned_to_a_bound():
    # 5,000 comment lines with a '\' and a space before a flag line: none is a slip, and the scan
    # stops looking after MAX_LOOKS of them, so a slip after them goes unsaid (a warning, not a limit)
    text = "# \\ \n--x\n" * 5000 + "srun a \\ \n--y\n"
    assert continuation_slips(text, "f") == []
    assert _by_lines(text) != []
    assert continuation_slips("# \\ \n--x\n" * (MAX_LOOKS - 1) + "srun a \\ \n--y\n", "f") == \
        [f"f:{2 * MAX_LOOKS - 1}: a space after the '\\' ends the command there; the lines after it run as "
         "commands of their own (delete the space)"]
