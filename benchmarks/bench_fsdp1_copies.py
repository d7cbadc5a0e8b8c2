#!/usr/bin/env python3
"""FSDP1's own device copies, counted op by op on this CPU against predictor.recipe.fsdp1_shard_copies.

    python benchmarks/bench_fsdp1_copies.py [--json OUT]

Each configuration (Composer's mixed_precision DEFAULT / PURE / FULL; FULL_SHARD / SHARD_GRAD_OP;
1, 2 or 8 ranks) runs in its own process (each brings up its own process group): a few blocks of
two linears wrapped as Composer wraps MPT, on torch's fake process group, two micro-batches of
forward and backward under bf16 autocast, every operator that touches a flat parameter or its shard
counted.  The printout sets the count beside what ``fsdp1_shard_copies`` gives for the same layout.
Deterministic: it counts bytes, not time.

Measurement code: calibrate/fsdp1_copies.py.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from calibrate.fsdp1_copies import BLOCKS, CONFIGS, MICRO_BATCHES, PARAMS_PER_BLOCK, count, modelled


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the counts and their provenance here")
    ap.add_argument("--one", nargs=3, metavar=("MIXED", "STRATEGY", "RANKS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        mixed, strategy, ranks = args.one[0], args.one[1], int(args.one[2])
        print(json.dumps({**asdict(count(mixed, strategy, ranks)), "model": modelled(mixed, strategy, ranks)}))
        return 0
    rows = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for mixed, strategy, ranks in CONFIGS:
        run = subprocess.run([sys.executable, __file__, "--one", mixed, strategy, str(ranks)], capture_output=True,
                             text=True, env=env, check=True)
        measured = json.loads(run.stdout.strip().splitlines()[-1])
        model = measured.pop("model")
        rows.append({"mixed_precision": mixed, "sharding_strategy": strategy, "ranks": ranks,
                     "measured": measured, "fsdp1_shard_copies": model})
        print(f"{mixed:7s} {strategy:13s} {ranks} rank(s): forward {measured['forward_bytes']:6.3f} "
              f"(model {model['forward_bytes']:6.3f}), backward {measured['backward_bytes']:6.3f} "
              f"(model {model['backward_bytes']:6.3f}) bytes per parameter per micro-batch")
        print("    backward by operator: " + ", ".join(f"{k} {v:.3f}" for k, v in measured["backward_ops"].items()))
    if args.json:
        prov = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
                "command": "python benchmarks/bench_fsdp1_copies.py --json " + str(args.json),
                "blocks": BLOCKS, "params_per_block": PARAMS_PER_BLOCK, "micro_batches": MICRO_BATCHES}
        args.json.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
