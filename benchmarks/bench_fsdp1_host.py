#!/usr/bin/env python3
"""FSDP1's per-layer host cost (llm-foundry / Composer) against FSDP2's (TorchTitan), on this CPU.

    python benchmarks/bench_fsdp1_host.py [--repeats 40] [--rounds 3] [--json OUT]

The same tiny blocks as benchmarks/bench_stack_host.py (calibrate/stack_host.py) wrapped three ways,
timed interleaved, one thread: DDP; FSDP1 ``FullyShardedDataParallel`` with one unit per block and
Composer's defaults (FULL_SHARD, ``backward_prefetch=BACKWARD_POST``, ``limit_all_gathers``,
``use_orig_params``, ``device_id=cpu``); FSDP2 ``fully_shard`` per block (reshard after forward).
The difference of each FSDP's per-layer slope of forward + backward from DDP's is what its hooks add
per layer and micro-batch (DDP's all-reduce is replaced by a hook that returns at once: the fake
group's returns nothing, which DDP refuses).

Why a fake process group of 2 ranks (``torch.testing``'s ``fake`` backend, whose collectives return
at once): FSDP1 on a one-rank group replaces FULL_SHARD by NO_SHARD (it warns "FSDP is switching to
use NO_SHARD … since the world size is 1"), which skips the unshard / reshard hooks this measures;
two real gloo ranks would add gloo's transfer and the wait for the slower rank, which NCCL spends on
the device.  With the fake group FSDP1 and FSDP2 both shard over 2 ranks and issue every hook.

A benchmark, not a test: the figures depend on this machine and on what else runs on it.
Committed runs: benchmarks/data/fsdp1-host/*.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from calibrate.stack_host import Block, _slope, _time_micro_batches, fastest_quarter  # noqa: E402

LAYERS = (1, 2, 4, 8)
FAKE_RANKS = 2


def fake_group() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_RANKS)


def _fsdp1(n: int) -> nn.Module:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = nn.Sequential(*[Block() for _ in range(n)])

    def per_block(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return recurse or isinstance(module, Block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FSDP(model, auto_wrap_policy=per_block, device_id=torch.device("cpu"),
                    sharding_strategy=ShardingStrategy.FULL_SHARD, backward_prefetch=BackwardPrefetch.BACKWARD_POST,
                    limit_all_gathers=True, use_orig_params=True)


def _fsdp2(n: int) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    model = nn.Sequential(*[Block() for _ in range(n)])
    for block in model:
        fully_shard(block, reshard_after_forward=True)
    fully_shard(model)
    return model


def _done(state, bucket):  # noqa: ANN001 - DDP checks the annotations, which must be absent or real
    """A DDP communication hook that returns the bucket as it is (the fake group's all-reduce
    returns nothing, which DDP refuses)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _ddp(n: int) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(nn.Sequential(*[Block() for _ in range(n)]))
    model.register_comm_hook(None, _done)
    return model


def measure(repeats: int, rounds: int) -> dict:
    torch.set_num_threads(1)
    fake_group()
    torch.manual_seed(0)
    build = {"ddp": _ddp, "fsdp1": _fsdp1, "fsdp2": _fsdp2}
    models = {(kind, n): make(n) for n in LAYERS for kind, make in build.items()}
    times: dict = {k: [] for k in models}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(rounds):            # interleaved: the machine's load falls on every configuration
            for key, model in models.items():
                times[key] += _time_micro_batches(model, repeats)
    per = {key: fastest_quarter(v) for key, v in times.items()}
    slope = {kind: _slope(LAYERS, [per[(kind, n)] for n in LAYERS]) for kind in build}
    return {"layer_seconds": slope,
            "hook_layer_seconds": {k: slope[k] - slope["ddp"] for k in ("fsdp1", "fsdp2")},
            "fsdp1_over_fsdp2": (slope["fsdp1"] - slope["ddp"]) / (slope["fsdp2"] - slope["ddp"]),
            "per_config": {f"{k}_{n}": s for (k, n), s in per.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40, help="timed micro-batches per configuration and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the configurations")
    ap.add_argument("--json", type=Path, help="write the figures and their provenance here")
    args = ap.parse_args()
    r = measure(args.repeats, args.rounds)
    h = r["hook_layer_seconds"]
    print(f"FSDP1 hooks: {1e6 * h['fsdp1']:.0f} µs per layer and micro-batch; FSDP2 hooks: {1e6 * h['fsdp2']:.0f} µs "
          f"(FSDP1 / FSDP2 = {r['fsdp1_over_fsdp2']:.2f}); layer slopes DDP {1e6 * r['layer_seconds']['ddp']:.0f} µs, "
          f"FSDP1 {1e6 * r['layer_seconds']['fsdp1']:.0f} µs, FSDP2 {1e6 * r['layer_seconds']['fsdp2']:.0f} µs")
    if args.json:
        r["provenance"] = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), host=platform.node(),
            cpu=platform.processor() or platform.machine(), cpus=os.cpu_count(), torch=torch.__version__,
            python=platform.python_version(), ranks=f"1 process in a fake {FAKE_RANKS}-rank group",
            threads_per_rank=1, repeats=args.repeats, rounds=args.rounds, layers=list(LAYERS),
            load="shared 2-core VM; other sessions' work running; fastest quarter of interleaved repeats")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
