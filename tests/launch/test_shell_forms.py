"""Shell forms users write around the launch: arrays in quoted -c strings, heredoc commands, argument files."""
from __future__ import annotations

import pathlib

import pytest

from slurm_plugin.launch import parse_script

from .helpers import parse_in

HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --gpus-per-node=8 --ntasks-per-node=1\n"
ARGS = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 "
        "--micro-batch-size 2 --global-batch-size 256 --train-iters 500 --bf16 --tensor-model-parallel-size 2")
TR = "torchrun --nproc_per_node 8 --nnodes 2"


def _run(tmp_path: pathlib.Path, body: str, files: dict[str, str] | None = None):
    return parse_in(tmp_path, HEAD + body, files)


def _ok(res):
    assert res.error is None, res.error
    j = res.job
    assert (j.model.layers, j.model.hidden, j.layout.tp, j.layout.dp, j.layout.micro_batches) == (24, 2048, 2, 8, 16)
    return res


def test_array_in_quoted_bash_c(tmp_path):
    body = (f"MODEL=({ARGS})\n"
            f'srun bash -c "{TR} pretrain_gpt.py ${{MODEL[*]}}"\n')
    res = _ok(_run(tmp_path, body))
    assert res.provenance["model.layers"].endswith("job.sbatch:3")


def test_at_array_splits_the_bash_c_string(tmp_path):
    # "...${A[@]}" makes one word per element: bash -c runs only the first ("... --num-layers"),
    # the others become $0, $1 ... as in bash; the reader says so instead of guessing.
    body = (f"MODEL=({ARGS})\n"
            f'srun bash -c "{TR} pretrain_gpt.py ${{MODEL[@]}}"\n')
    res = _run(tmp_path, body)
    assert res.job is None
    assert any("bash -c runs only its first argument" in w and "[*]" in w for w in res.warnings), res.warnings


def test_at_array_as_positional_args_of_bash_c(tmp_path):
    body = (f"MODEL=({ARGS})\n"
            f'srun bash -c \'{TR} pretrain_gpt.py "$@"\' bash "${{MODEL[@]}}"\n')
    _ok(_run(tmp_path, body))


def test_array_in_quoted_sh_c_with_container(tmp_path):
    body = (f"A=({ARGS})\n"
            f'srun --container-image=nvcr.io/nvidia/nemo:24.05 --container-mounts=/data:/data '
            f'sh -c "{TR} pretrain_gpt.py ${{A[*]}}"\n')
    _ok(_run(tmp_path, body))


def test_heredoc_read_into_variable(tmp_path):
    body = ("read -r -d '' cmd <<EOF\n"
            f"{TR} pretrain_gpt.py \\\n  {ARGS}\n"
            "EOF\n"
            'srun bash -c "$cmd"\n')
    res = _ok(_run(tmp_path, body))
    assert res.provenance["model.layers"].endswith("job.sbatch:5")    # the heredoc line with the flag


def test_heredoc_read_into_variable_quoted_delimiter(tmp_path):
    body = ("read -r -d '' CMD << 'EOF'\n"
            f"cd /workspace/Megatron-LM && {TR} pretrain_gpt.py {ARGS}\n"
            "EOF\n"
            'srun --container-image img bash -c "${CMD}"\n')
    _ok(_run(tmp_path, body))


def test_cd_and_python_inside_c_string(tmp_path):
    body = f'srun bash -c "cd /opt/megatron && {TR} pretrain_gpt.py {ARGS}"\n'
    _ok(_run(tmp_path, body))


@pytest.mark.parametrize("form", ["$(cat args.txt)", "$(< args.txt)", "$(cat ./args.txt)"])
def test_argument_file(tmp_path, form):
    res = _ok(_run(tmp_path, f"{TR} pretrain_gpt.py {form}\n", {"args.txt": ARGS.replace(" --bf16", "\n--bf16") + "\n"}))
    assert "args.txt" in res.provenance["model.layers"]


def test_argument_file_unreadable_names_the_file(tmp_path):
    res = _run(tmp_path, f"{TR} pretrain_gpt.py $(cat missing_args.txt)\n")
    assert res.job is None and "missing_args.txt" in res.error


def test_argument_file_is_never_executed(tmp_path):
    marker = tmp_path / "ran"
    res = _run(tmp_path, f"{TR} pretrain_gpt.py $(cat args.txt) $(touch {marker})\n",
               {"args.txt": ARGS})
    assert not marker.exists()
    assert res.job is not None or res.error


def test_argument_file_goes_through_the_read_file_callback(tmp_path):
    (tmp_path / "args.txt").write_text(ARGS)
    p = tmp_path / "job.sbatch"
    p.write_text(HEAD + f"{TR} pretrain_gpt.py $(< args.txt)\n")
    seen: list = []

    def reader(path: str) -> bytes:
        seen.append(path)
        return pathlib.Path(path).read_bytes()

    res = parse_script(str(p), read_file=reader, deadline_s=10.0)
    _ok(res)
    assert str(tmp_path / "args.txt") in seen


def test_argument_file_written_by_the_script_keeps_script_lines(tmp_path):
    body = ("cat > args.txt <<EOF\n"
            "--num-layers 24 --hidden-size 2048 --num-attention-heads 16\n"
            "--seq-length 2048 --micro-batch-size 2 --global-batch-size 256 --train-iters 500 --bf16\n"
            "--tensor-model-parallel-size 2\n"
            "EOF\n"
            f"{TR} pretrain_gpt.py $(< args.txt)\n")
    res = _ok(_run(tmp_path, body))
    assert res.provenance["model.layers"].endswith("job.sbatch:4")
    assert res.provenance["run.train_iters"].endswith("job.sbatch:5")


def test_huge_heredoc_command_names_one_location(tmp_path):
    body = "read -r -d '' cmd <<EOF\n" + "--x 1 \\\n" * 6000 + "EOF\nbash -c \"$cmd\"\n"
    p = tmp_path / "job.sbatch"
    p.write_text(HEAD + body)
    res = parse_script(str(p), deadline_s=10.0)    # the word limit, not the clock, stops it
    assert res.job is None and "more than 10000 words" in res.error
    assert res.error.count("job.sbatch") == 1, res.error


_LAYERS = ("srun python pretrain_gpt.py --num-layers $L --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
           "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 --train-iters 10\n")


@pytest.mark.parametrize("body, layers", [
    ('X=a]\nL=2\ncase "$X" in *[!]]) L=3;; *) L=4;; esac\n', 4),          # ] first in a bracket is a member
    ('X=a5\nL=2\ncase "$X" in a[[:digit:]]) L=3;; *) L=4;; esac\n', 3),   # POSIX classes
    ('X=_x1\nL=2\ncase "$X" in [[:alpha:]_]*) L=5;; esac\n', 5),
    ('X="a*"\nL=2\n[[ $X == "a*" ]] && L=6\n[[ abc == "a*" ]] && L=7\n', 6),  # quoted: itself, not a glob
    ('X=abc\nL=2\n[[ $X == a"b"* ]] && L=8\n[[ $X != "a"* ]] && L=9\n', 8),
    ('P="a*"\nL=2\n[[ abc == $P ]] && L=10\n', 10),                          # unquoted expansion: a glob
    ('X=b\nL=2\ncase "$X" in [z-a]) L=3;; *) L=11;; esac\n', 11),          # a reversed range: nothing
])
def test_patterns_read_as_bash_reads_them(body, layers):
    res = parse_script("j.sh", "#!/bin/bash\n" + body + _LAYERS, deadline_s=10.0)
    assert res.job is not None and res.job.model.layers == layers, (res.error, res.job)
