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


DS_LAUNCH = ("srun python pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
             "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 32 "
             "--bf16 --train-iters 100 --deepspeed --deepspeed_config {cfg}\n")
TEMPLATE = ('{\n  "train_micro_batch_size_per_gpu": 1,\n\n  "zero_optimization": {"stage": 1},\n'
            '  "bf16": {"enabled": true}\n}\n')


def test_a_config_copied_then_edited_by_sed_is_read_from_the_copy(tmp_path):
    # `cp` was a no-op: the copy could not be read, and the `sed -i` that breaks it went unseen
    script = (HEAD + "cp base.json ds.json\nsed -i 's/zero_optimization/zero_optimisation/' ds.json\n"
              + DS_LAUNCH.format(cfg="ds.json"))
    res = parse_in(tmp_path, script, files={"base.json": TEMPLATE})
    assert res.job is None, res.job
    assert "'zero_optimisation' is not a DeepSpeed config key" in res.error, res.error
    assert res.error.endswith("job.sbatch:7)"), res.error      # the sed line that changed it


def test_a_copy_into_a_directory_keeps_the_templates_lines(tmp_path):
    script = HEAD + "mkdir -p cfg\ncp -f base.json cfg/\n" + DS_LAUNCH.format(cfg="cfg/base.json")
    res = parse_in(tmp_path, script, files={"base.json": TEMPLATE.replace('"stage": 1', '"stage": 3')})
    assert res.job is not None, res.error
    assert res.job.layout.zero_stage == 3
    assert res.provenance["layout.zero_stage"].endswith("base.json:4"), res.provenance


def test_a_copy_from_an_unknown_source_leaves_the_target_unknown(tmp_path):
    script = HEAD + "cp -f $SRC ds.json\n" + DS_LAUNCH.format(cfg="ds.json")
    res = parse_in(tmp_path, script, files={"ds.json": TEMPLATE})     # not the file the job reads
    assert res.job is None, res.job
    assert "config ds.json is written at run time by `cp -f ds.json`" in res.error, res.error


def test_sed_on_a_here_document_names_the_lines_it_left_alone_where_they_were_written(tmp_path):
    script = (HEAD + "STAGE=1\nsed \"s/STAGE/$STAGE/\" > ds.json <<'JSON'\n{\n  \"train_micro_batch_size_per_gpu\": 1,\n"
              "  \"zero_optimization\": {\"stage\": STAGE},\n  \"zero_optimisation\": {},\n  \"bf16\": {\"enabled\": true}\n"
              "}\nJSON\n" + DS_LAUNCH.format(cfg="ds.json"))
    res = parse_in(tmp_path, script)
    assert res.job is None, res.job
    assert "'zero_optimisation' is not a DeepSpeed config key" in res.error, res.error
    assert res.error.endswith("job.sbatch:11)"), res.error     # its own line; line 10 is sed's (changed)


def test_a_shell_script_run_by_its_path_is_followed(tmp_path):
    res = parse_in(tmp_path, HEAD + "srun ./launch.sh\n", files={"launch.sh": "#!/bin/bash\nset -e\n" + TYPO})
    _stopped_at(res, "launch.sh:3")
