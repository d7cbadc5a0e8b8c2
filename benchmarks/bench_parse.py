"""Benchmark: parse typical batch scripts with their configs, and time every bad-input case.

    python benchmarks/bench_parse.py [--repeat N]

Targets: median <= 5 ms for a typical script with its configs; <= 100 ms for each bad input.
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import statistics
import sys
import tempfile
import time

from slurm_plugin.launch import parse_script

ROOT = pathlib.Path(__file__).resolve().parent.parent

log = logging.getLogger("bench_parse")
CORPUS = ROOT / "tests" / "launch" / "data" / "corpus"
TYPICAL = ["01_neox_20b", "10_bigscience_tr_rampup", "11_megatron_lm_arrays", "09_ds_launcher_hostfile"]


def time_case(name: str, repeat: int) -> list[float]:
    case = CORPUS / name
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        res = parse_script(str(case / "job.sbatch"), work_dir=str(case))
        times.append(time.perf_counter() - t)
        assert res.job is not None, res.error
    return times


def bad_inputs(tmp: pathlib.Path) -> dict:
    """name -> (path or None, text or None)."""
    head = "#!/bin/bash\n#SBATCH --nodes=1 --gpus-per-node=8\n"
    cases = {}
    (tmp / "garbage.sbatch").write_bytes(os.urandom(4 << 20))
    cases["binary garbage 4 MiB"] = (tmp / "garbage.sbatch", None)
    limit = (4 << 20) - 200   # just under the 4 MiB cap: the evaluator itself must stop
    cases["4 MiB of shell commands"] = (None, head + "echo hello world\n" * (limit // 17))
    cases["4 MiB of assignments"] = (None, head + "X=$((X+1))\n" * (limit // 11))
    cases["4 MiB single quoted word"] = (None, head + "X='" + "a" * limit)
    cases["4 MiB comment"] = (None, head + "#" + "x" * limit + "\n")
    cases["4 MiB heredoc"] = (None, head + "cat <<EOT > ds.json\n" + "{}\n" * (limit // 3) + "EOT\n")
    cases["5 MiB script"] = (None, head + "#" * (5 << 20))
    cases["unterminated quote"] = (None, head + "X=\"abc\n" * 2001)
    cases["unterminated heredoc"] = (None, head + "cat <<EOT > ds.json\n" + "{\n" * 50_000)
    bomb = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        bomb.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]")
    (tmp / "bomb.yml").write_text("\n".join(bomb) + "\n")
    (tmp / "bomb.sbatch").write_text(head + "python deepy.py train.py bomb.yml\n")
    cases["YAML alias bomb"] = (tmp / "bomb.sbatch", None)
    (tmp / "deep.json").write_text("[" * 1000 + "]" * 1000)
    (tmp / "deepmax.json").write_text("[" * 500_000 + "]" * 500_000)
    launch = ("srun python pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 2 "
              "--seq-length 64 --micro-batch-size 1 --train-iters 1 --deepspeed_config ")
    (tmp / "deep.sbatch").write_text(head + launch + "deep.json\n")
    (tmp / "deepmax.sbatch").write_text(head + launch + "deepmax.json\n")
    cases["1000-deep JSON"] = (tmp / "deep.sbatch", None)
    cases["1 MiB-deep JSON"] = (tmp / "deepmax.sbatch", None)
    (tmp / "a.sh").write_text("source ./b.sh\n")
    (tmp / "b.sh").write_text("source ./a.sh\n")
    (tmp / "loop.sbatch").write_text(head + "source ./a.sh\n")
    cases["source loop"] = (tmp / "loop.sbatch", None)
    for n in ("l1.yml", "l2.yml"):
        if not (tmp / n).is_symlink():
            os.symlink(tmp / ("l2.yml" if n == "l1.yml" else "l1.yml"), tmp / n)
    (tmp / "sym.sbatch").write_text(head + "python deepy.py train.py l1.yml\n")
    cases["symlink loop"] = (tmp / "sym.sbatch", None)
    (tmp / "private.yml").write_text("num_layers: 1\n")
    (tmp / "priv.sbatch").write_text(head + "python deepy.py train.py private.yml\n")
    cases["unreadable config"] = (tmp / "priv.sbatch", None)
    cases["infinite while loop"] = (None, head + "while true; do X=1; done\n")
    cases["recursive function"] = (None, head + "f() { f; }\nf\n")
    cases["string doubling"] = (None, head + "X=ab\nfor i in $(seq 1 60); do X=$X$X; done\n")
    cases["deep $( nesting"] = (None, head + "X=" + "$(" * 5000 + ")" * 5000 + "\n")
    cases["big YAML config"] = (tmp / "big.sbatch", None)
    (tmp / "big.yml").write_text("{" + ",".join(f'"k{i}": [1, 2, 3]' for i in range(60_000)) + "}\n")
    (tmp / "big.sbatch").write_text(head + "python deepy.py train.py big.yml\n")
    return cases


def _deny_private(path: str) -> bytes:
    """The daemon's reader refuses files the user cannot read; emulate that for private.yml."""
    if path.endswith("private.yml"):
        raise PermissionError(13, "Permission denied")
    from slurm_plugin.launch.files import default_read_file
    return default_read_file(path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ok = True
    log.info("typical scripts (%d runs each, after one warm-up):", args.repeat)
    for name in TYPICAL:
        time_case(name, 1)
        ts = time_case(name, args.repeat)
        med = statistics.median(ts) * 1000
        log.info("  %-28s median %6.2f ms   p95 %6.2f ms   max %6.2f ms", name, med,
                 sorted(ts)[int(0.95 * len(ts))] * 1000, max(ts) * 1000)
        ok &= med <= 5.0
    log.info("bad inputs (each must give 'cannot predict' within 100 ms):")
    with tempfile.TemporaryDirectory() as d:
        for name, (path, text) in bad_inputs(pathlib.Path(d)).items():
            best = None
            for _ in range(3):
                t = time.perf_counter()
                res = parse_script(str(path) if path else "bad.sbatch", text, read_file=_deny_private)
                dt = time.perf_counter() - t
                best = dt if best is None else min(best, dt)
            good = res.error is not None and res.error.startswith("cannot predict: ") and best <= 0.1
            ok &= good
            log.info("  %-26s %7.1f ms  %s  %s", name, best * 1000, "ok " if good else "BAD", res.error)
    log.info("result: %s", "all targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
