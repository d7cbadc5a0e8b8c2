#!/usr/bin/env python3
"""The lent H100's stack measurements as a runs file that ``perf-calibrate validate`` and the fit read.

    python benchmarks/gpu_stacks_runs.py [--data benchmarks/data/h100-lent/stacks]
                                         [--out .../stacks-runs.toml] [--stacks pytorch,sdpa_efficient,fsdp,ddp]
                                         [--files rngseries.json rngseries2.json --what "..."]

``bench_gpu_stacks.py`` trains the 33-job family of calibrate/train_family.py under several software
stacks and writes rows into ``stacks.json`` / ``stacks2.json`` ... (calibrate/stack_files.py lists
them); calibrate/stack_runs.py turns each into the run its stack's launch would reveal
(benchmarks/data/h100-lent/stacks/README.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from calibrate.stack_files import LENT_STACKS_DIR as DATA
from calibrate.stack_files import step_files
from calibrate.stack_runs import FAMILY_RUNS, STACKS, StackRowError, runs_from_files, to_toml


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the folder holding stacks.json and stacks2.json")
    ap.add_argument("--out", type=Path, default=DATA / "stacks-runs.toml")
    ap.add_argument("--stacks", default=",".join(STACKS), help="comma-separated stacks to convert")
    ap.add_argument("--files", nargs="+", metavar="NAME",
                    help="these files of --data instead of the family's (calibrate/stack_files.py)")
    ap.add_argument("--what", default=FAMILY_RUNS, help="which jobs, for the file's header")
    args = ap.parse_args()
    files = [args.data / name for name in args.files] if args.files else step_files(args.data)
    try:
        runs = runs_from_files(files, [s for s in args.stacks.split(",") if s])
    except StackRowError as exc:
        print(f"gpu_stacks_runs: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(to_toml(runs, args.what), encoding="utf-8")
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["name"].split(" ", 1)[0]] = counts.get(r["name"].split(" ", 1)[0], 0) + 1
    print(f"{len(runs)} runs ({', '.join(f'{k} {v}' for k, v in counts.items())}): {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
