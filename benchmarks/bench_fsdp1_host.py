#!/usr/bin/env python3
"""FSDP1's per-layer host cost (llm-foundry / Composer) against FSDP2's (TorchTitan), on this CPU.

    python benchmarks/bench_fsdp1_host.py [--repeats 40] [--rounds 3] [--json OUT]

The same tiny blocks as benchmarks/bench_stack_host.py (calibrate/stack_host.py) wrapped four ways,
timed interleaved, one thread: DDP; FSDP1 ``FullyShardedDataParallel`` with one unit per block and
Composer's defaults (FULL_SHARD, ``backward_prefetch=BACKWARD_POST``, ``limit_all_gathers``,
``use_orig_params``, ``device_id=cpu``); the same with SHARD_GRAD_OP (llm-foundry's ZeRO-2: the
forward's gather kept for the backward); FSDP2 ``fully_shard`` per block (reshard after forward).
The difference of each FSDP's per-layer slope of forward + backward from DDP's is what its hooks add
per layer and micro-batch (DDP's all-reduce is replaced by a hook that returns at once: the fake
group's returns nothing, which DDP refuses).

Why a fake process group of 2 ranks (``torch.testing``'s ``fake`` backend, whose collectives return
at once): FSDP1 on a one-rank group replaces FULL_SHARD by NO_SHARD (it warns "FSDP is switching to
use NO_SHARD … since the world size is 1"), which skips the unshard / reshard hooks this measures;
two real gloo ranks would add gloo's transfer and the wait for the slower rank, which NCCL spends on
the device.  With the fake group FSDP1 and FSDP2 both shard over 2 ranks and issue every hook.

Measurement code: calibrate/stack_host.py (fsdp1_costs).  Committed runs:
benchmarks/data/fsdp1-host/*.json.  A benchmark, not a test: the figures depend on this machine and
on what else runs on it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from calibrate.stack_host import FAKE_RANKS, fake_group, fsdp1_costs  # noqa: E402

LAYERS = (1, 2, 4, 8)


def measure(repeats: int, rounds: int) -> dict:
    torch.set_num_threads(1)
    fake_group()
    return fsdp1_costs(LAYERS, repeats, rounds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40, help="timed micro-batches per configuration and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the configurations")
    ap.add_argument("--json", type=Path, help="write the figures and their provenance here")
    args = ap.parse_args()
    load_at_start = os.getloadavg()[0]
    r = measure(args.repeats, args.rounds)
    h = r["hook_layer_seconds"]
    print(f"FSDP1 hooks: {1e6 * h['fsdp1']:.0f} µs per layer and micro-batch; FSDP2 hooks: {1e6 * h['fsdp2']:.0f} µs "
          f"(FSDP1 / FSDP2 = {r['fsdp1_over_fsdp2']:.2f}); FSDP1 SHARD_GRAD_OP hooks: {1e6 * h['fsdp1_zero2']:.0f} µs "
          f"(/ FULL_SHARD = {r['fsdp1_zero2_over_fsdp1']:.2f})")
    print("layer slopes: " + ", ".join(f"{k} {1e6 * v:.0f} µs" for k, v in r["layer_seconds"].items()))
    if args.json:
        r["provenance"] = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), host=platform.node(),
            cpu=platform.processor() or platform.machine(), cpus=os.cpu_count(), torch=torch.__version__,
            python=platform.python_version(), ranks=f"1 process in a fake {FAKE_RANKS}-rank group",
            threads_per_rank=1, repeats=args.repeats, rounds=args.rounds, layers=list(LAYERS),
            load="shared 2-core VM; other sessions' work running; fastest quarter of interleaved repeats",
            load_average_1m={"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)})
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
