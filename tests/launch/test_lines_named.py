"""Each error and warning names the line a user would edit: a function in the file it is written in,
an `eval`'d string where its pieces were written, a job submitted with `sbatch <<EOF` at the
wrapper's lines, the task count where it was set, both sides of a layout that does not divide the
GPUs.  (Child shells and written files: test_child_shell_lines.py.)"""
from __future__ import annotations

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n#SBATCH --ntasks-per-node=1\n"
MODEL = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
         "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --train-iters 1000 --bf16")
TYPO = "--pipline-model-parallel-size 2"


def _typo_at(res, where: str) -> None:
    assert res.job is None, res.job
    assert "did you mean --pipeline-model-parallel-size?" in res.error, res.error
    assert res.error.endswith(f"{where})"), res.error


def test_a_function_from_a_sourced_file_is_named_in_that_file(tmp_path):
    lib = f"# helpers\nlaunch() {{\n  echo go\n  srun torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL} {TYPO}\n}}\n"
    res = parse_in(tmp_path, HEAD + "source lib.sh\n# a\n# b\n# c\nlaunch\n", files={"lib.sh": lib})
    _typo_at(res, "lib.sh:4")


def test_a_function_of_the_script_called_from_a_sourced_file_is_named_in_the_script(tmp_path):
    script = (HEAD + "launch() {\n  srun torchrun --nproc_per_node 8 pretrain_gpt.py " + MODEL + " " + TYPO
              + "\n}\nsource run_it.sh\n")
    res = parse_in(tmp_path, script, files={"run_it.sh": "# x\nlaunch\n"})
    _typo_at(res, "job.sbatch:6")


def test_eval_of_a_variable_names_the_line_in_the_variable(tmp_path):
    # lines 5-8: CMD='… \ / <typo> \ / …', then eval on line 9
    script = (HEAD + "CMD='torchrun --nproc_per_node 8 pretrain_gpt.py \\\n    " + MODEL + " \\\n    "
              + TYPO + " \\\n    --log-interval 10'\neval \"srun $CMD\"\n")
    _typo_at(parse_in(tmp_path, script), "job.sbatch:7")


def test_eval_of_a_variable_built_up_names_the_line_that_added_the_flag(tmp_path):
    script = (HEAD + f'CMD="torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL}"\n'
              f'CMD="$CMD {TYPO}"\n\neval "srun $CMD"\n')
    _typo_at(parse_in(tmp_path, script), "job.sbatch:6")


def test_a_job_submitted_with_an_sbatch_heredoc_is_named_at_the_wrappers_lines(tmp_path):
    script = ("#!/bin/bash\n# wrapper\nNODES=2\nsbatch <<EOT\n#!/bin/bash\n#SBATCH --nodes=${NODES}\n"
              "#SBATCH --gpus-per-node=4\n#SBATCH --ntasks-per-node=1\n"
              f"srun torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL}\nEOT\n")
    res = parse_in(tmp_path, script)
    assert res.job is None, res.job
    assert "but the request gives a node 4 GPU(s) (" in res.error and "job.sbatch:7)" in res.error, res.error
    assert res.error.endswith("job.sbatch:9)"), res.error      # the launch, line 9 of the wrapper


def test_srun_s_own_task_count_is_named_at_the_srun_line(tmp_path):
    script = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\n#SBATCH --ntasks-per-node=1\n\n"
              f"srun --ntasks=4 python pretrain_gpt.py {MODEL}\n")
    res = parse_in(tmp_path, script)
    assert res.job is not None, res.error
    said = [w.replace(f"{tmp_path}/", "") for w in res.warnings if w.startswith("srun starts 4 task(s)")]
    assert said and "(job.sbatch:6)" in said[0] and "job.sbatch:4" not in said[0], res.warnings


def test_torchruns_node_count_against_the_jobs_is_said_with_its_line(tmp_path):
    res = parse_in(tmp_path, HEAD + f"\nsrun torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL}\n")
    assert res.job is not None, res.error
    at = f"({tmp_path}/job.sbatch:6)"
    assert f"torchrun without --nnodes (1) but the job has 2 node(s) {at}" in res.warnings, res.warnings
    res = parse_in(tmp_path, HEAD + f"\nsrun torchrun --nnodes 1:2 --nproc_per_node 8 pretrain_gpt.py {MODEL}\n")
    assert f"torchrun --nnodes 1:2: predicting for the maximum 2 {at}" in res.warnings, res.warnings


def test_a_layout_the_gpus_do_not_divide_names_both_sides(tmp_path):
    # 16 GPUs (the request, line 3 and the launch) against pp 4 (line 5) × tp 3 (line 6)
    script = (HEAD + "PP=4\nTP=3\n"
              f"srun torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py {MODEL} "
              "--pipeline-model-parallel-size $PP --tensor-model-parallel-size $TP\n")
    res = parse_in(tmp_path, script)
    assert res.job is None, res.job
    error = res.error.replace(f"{tmp_path}/", "")
    assert error.startswith("cannot predict: 16 GPUs (job.sbatch:7) are not divisible by pp×tp×cp = 4×3×1 "
                            "(pp job.sbatch:5) — tp = 3 (job.sbatch:6)"), error


def test_warnings_about_one_flag_name_its_line(tmp_path):
    script = ("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=8\n#SBATCH --array=3-9%2\n"
              f"srun torchrun --nproc_per_node 8 pretrain_gpt.py {MODEL} \\\n"
              "    --decoder-first-pipeline-num-layers 4\n")
    res = parse_in(tmp_path, script)
    assert res.job is not None, res.error
    said = [w.replace(f"{tmp_path}/", "") for w in res.warnings]
    assert "--decoder-first-pipeline-num-layers has no effect with one pipeline stage (job.sbatch:6)" in said, said
    assert "job array 3-9%2: predicting array task 3 (job.sbatch:4)" in said, said
