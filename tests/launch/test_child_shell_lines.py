"""A launch run by a child bash (`bash <<EOF`, `bash -c "..."`, `bash file.sh`) is named at its own
line: the line of the batch script (or of the file) that holds it, not its line inside the child's
text."""
from __future__ import annotations

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH -N 1\n#SBATCH --gpus-per-node=4\n\necho start\n"
TYPO = ("srun python pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 2 --global-batch-size 64 "
        "--bf16 --train-iters 100 --pipline-model-parallel-size 2\n")


def _stopped_at(res, where: str) -> None:
    assert res.job is None, res.job
    assert "did you mean --pipeline-model-parallel-size?" in res.error, res.error
    assert res.error.endswith(f"{where})"), res.error


def test_a_heredoc_body_is_named_at_the_scripts_line(tmp_path):
    # lines 6-8: `bash <<EOF`, `echo inside`, the launch
    res = parse_in(tmp_path, HEAD + "bash <<EOF\necho inside\n" + TYPO + "EOF\n")
    _stopped_at(res, "job.sbatch:8")


def test_the_same_launch_at_top_level_is_named_at_the_same_line(tmp_path):
    res = parse_in(tmp_path, HEAD + "\necho inside\n" + TYPO)
    _stopped_at(res, "job.sbatch:8")


def test_bash_c_is_named_at_its_line(tmp_path):
    res = parse_in(tmp_path, HEAD + "\n\nbash -c \"" + TYPO.strip() + "\"\n")
    _stopped_at(res, "job.sbatch:8")


def test_a_file_run_with_bash_is_named_in_that_file(tmp_path):
    res = parse_in(tmp_path, HEAD + "bash ./launch.sh\n", files={"launch.sh": "set -e\n\n" + TYPO})
    _stopped_at(res, "launch.sh:3")
