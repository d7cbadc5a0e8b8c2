#!/usr/bin/env python3
"""The lent H100's stack measurements as a runs file that ``perf-calibrate validate`` and the fit read.

    python benchmarks/gpu_stacks_runs.py [--data benchmarks/data/h100-lent/stacks]
                                         [--out .../stacks-runs.toml] [--stacks pytorch,sdpa_efficient,fsdp,ddp]

``bench_gpu_stacks.py`` trains the 33-job family of ``bench_train_family.py`` under several software
stacks and writes rows into ``stacks.json`` / ``stacks2.json``; calibrate/stack_runs.py turns each
into the run its stack's launch would reveal (benchmarks/data/h100-lent/stacks/README.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibrate.stack_runs import STACKS, StackRowError, runs_from_files, to_toml  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "h100-lent" / "stacks"
FILES = ("stacks.json", "stacks2.json", "stacks3.json", "stacks4.json", "stacks5.json", "stacks6.json",
         "hseries.json", "longseq.json", "longseq-flash.json", "stacks7.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the folder holding stacks.json and stacks2.json")
    ap.add_argument("--out", type=Path, default=DATA / "stacks-runs.toml")
    ap.add_argument("--stacks", default=",".join(STACKS), help="comma-separated stacks to convert")
    args = ap.parse_args()
    try:
        runs = runs_from_files([args.data / f for f in FILES if (args.data / f).exists()],
                               [s for s in args.stacks.split(",") if s])
    except StackRowError as exc:
        print(f"gpu_stacks_runs: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(to_toml(runs), encoding="utf-8")
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["name"].split(" ", 1)[0]] = counts.get(r["name"].split(" ", 1)[0], 0) + 1
    print(f"{len(runs)} runs ({', '.join(f'{k} {v}' for k, v in counts.items())}): {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
