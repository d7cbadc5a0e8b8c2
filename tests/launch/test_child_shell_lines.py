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


# A file the script writes and then runs: it does not exist when the job is submitted, so the line
# named is the batch script's line that wrote the launch.
def test_a_written_script_run_with_bash_is_named_at_the_line_that_wrote_it(tmp_path):
    # lines 6-9: `cat > run.sh <<EOF`, `#!/bin/bash`, the launch, `EOF`
    res = parse_in(tmp_path, HEAD + "cat > run.sh <<EOF\n#!/bin/bash\n" + TYPO + "EOF\nbash run.sh\n")
    _stopped_at(res, "job.sbatch:8")


def test_a_written_file_sourced_is_named_at_the_line_that_wrote_it(tmp_path):
    res = parse_in(tmp_path, HEAD + "cat > env.sh <<EOF\nexport A=1\n\n" + TYPO + "EOF\nsource env.sh\n")
    _stopped_at(res, "job.sbatch:9")


def test_a_written_config_with_empty_lines_names_the_keys_own_line(tmp_path):
    # The origin of each line of a written file is kept for empty lines too: before, every line
    # after an empty one was named one line late.
    script = (HEAD + "MB=4\ncat > ds.json <<EOF\n{\n\n  \"train_micro_batch_size_per_gpu\": $MB,\n\n"
              "  \"gradient_accumulation_stepz\": 2,\n  \"bf16\": {\"enabled\": true}\n}\nEOF\n"
              "srun python pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
              "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 64 "
              "--bf16 --train-iters 100 --deepspeed --deepspeed_config ds.json\n")
    res = parse_in(tmp_path, script)
    assert res.job is None, res.job
    assert "'gradient_accumulation_stepz' is not a DeepSpeed config key" in res.error, res.error
    assert res.error.endswith("job.sbatch:12)"), res.error   # line 12: the key's own line
