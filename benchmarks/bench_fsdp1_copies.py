#!/usr/bin/env python3
"""FSDP1's own device copies, counted op by op on this CPU against predictor.recipe.fsdp1_shard_copies.

    python benchmarks/bench_fsdp1_copies.py [--json OUT]

Each configuration (Composer's mixed_precision DEFAULT / PURE / FULL; FULL_SHARD / SHARD_GRAD_OP;
1, 2 or 8 ranks) runs in its own process: a few blocks of two linears wrapped as Composer wraps
MPT (``FullyShardedDataParallel``, one unit per block, ``use_orig_params``, ``device_id=cpu``) on
torch's fake process group (collectives return at once; one rank is a real one-rank group, where
FSDP1 runs NO_SHARD), two micro-batches of forward and backward under bf16 autocast, no
optimizer step.  A ``TorchDispatchMode`` sees every aten operator, the autograd engine's
included; an operator that reads or writes a tensor the size of a block's flat parameter or of
its shard, other than a view or a collective, is one of FSDP's copies (the blocks' sizes are
chosen so that no activation and no single weight has either size).  Its bytes are what it reads
(every tensor input but ``copy_``'s destination) and what it writes (its outputs), divided by the
blocks' parameters and the micro-batches.  The printout sets the count beside what
``fsdp1_shard_copies`` gives for the same layout.  Deterministic: it counts bytes, not time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IN, OUT, TOKENS, BLOCKS, MICRO_BATCHES = 96, 160, 40, 3, 2
# per block: Linear(IN, OUT) with bias + Linear(OUT, IN) without: 30,880 parameters, a multiple of
# 8 (bf16 alignment) and of every rank count below, so FSDP pads nothing
PARAMS_PER_BLOCK = IN * OUT + OUT + OUT * IN
CONFIGS = [(mp, strategy, ranks) for ranks in (1, 2, 8) for strategy in ("FULL_SHARD", "SHARD_GRAD_OP")
           for mp in ("DEFAULT", "PURE", "FULL") if not (ranks == 1 and strategy == "SHARD_GRAD_OP")]


def count(mixed: str, strategy: str, ranks: int) -> dict:
    """Bytes FSDP1's copies move per parameter per micro-batch (forward, backward), by operator."""
    import warnings

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    if ranks == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(IN, OUT), nn.Linear(OUT, IN, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

    bf16 = torch.bfloat16
    # Composer's mixed_precision words (composer/distributed/mosaic_parallelism.py)
    policy = {"DEFAULT": MixedPrecision(param_dtype=bf16, reduce_dtype=torch.float32, buffer_dtype=bf16),
              "PURE": MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16),
              "FULL": MixedPrecision()}[mixed]
    model = nn.Sequential(*[Block() for _ in range(BLOCKS)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FSDP(model, auto_wrap_policy=lambda module, recurse, nonwrapped_numel: recurse or isinstance(module, Block),
                     device_id=torch.device("cpu"), sharding_strategy=ShardingStrategy[strategy], mixed_precision=policy,
                     limit_all_gathers=True, use_orig_params=True)
    sizes = {PARAMS_PER_BLOCK, PARAMS_PER_BLOCK // ranks}

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes: dict[str, float] = {}
            self.views: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            ins = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if not any(t.numel() in sizes for t in ins + outs):
                return out
            name = str(func.overloadpacket.__name__)
            if func.is_view or name.startswith(("_c10d", "c10d", "allgather", "reduce_scatter", "allreduce")) \
                    or "c10d" in str(func.namespace) or name in ("empty", "empty_like", "new_empty", "set_",
                                                                 "resize_", "detach", "alias", "record_stream"):
                self.views.add(name)
                return out
            reads = ins[1:] if name == "copy_" else ins
            moved = sum(t.numel() * t.element_size() for t in reads + outs)
            self.bytes[name] = self.bytes.get(name, 0.0) + moved
            return out

    x = torch.randn(TOKENS, IN)
    forward, backward = Copies(), Copies()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(MICRO_BATCHES):
            with forward, torch.autocast("cpu", dtype=bf16):
                loss = model(x).float().square().mean()
            with backward:
                loss.backward()
    params = BLOCKS * PARAMS_PER_BLOCK * MICRO_BATCHES
    dist.destroy_process_group()
    return {"forward_bytes": sum(forward.bytes.values()) / params, "backward_bytes": sum(backward.bytes.values()) / params,
            "forward_ops": {k: v / params for k, v in forward.bytes.items()},
            "backward_ops": {k: v / params for k, v in backward.bytes.items()},
            "skipped_ops": sorted(forward.views | backward.views)}


def counted(mixed: str, strategy: str, ranks: int) -> dict:
    """What predictor.recipe.fsdp1_shard_copies gives for the same job."""
    from predictor import TrainingJob
    from predictor.operators import BYTES_PER_ELEMENT
    from predictor.recipe import fsdp1_shard_copies
    job = TrainingJob.from_dict({"model": {"layers": BLOCKS, "hidden": IN, "heads": 1, "seq_len": TOKENS},
                                 "layout": {"dp": ranks, "micro_batches": MICRO_BATCHES,
                                            "zero_stage": 3 if strategy == "FULL_SHARD" else 2},
                                 "run": {"precision": "bf16", "framework": "llm-foundry"}})
    reduce = "bf16" if mixed == "PURE" else "fp32"
    c = fsdp1_shard_copies(job.layout, "llm-foundry", "bf16", reduce, BYTES_PER_ELEMENT, "fp32" if mixed == "FULL" else "")
    return {"forward_bytes": c.forward_bytes, "backward_bytes": c.backward_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the counts and their provenance here")
    ap.add_argument("--one", nargs=3, metavar=("MIXED", "STRATEGY", "RANKS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        mixed, strategy, ranks = args.one[0], args.one[1], int(args.one[2])
        print(json.dumps({**count(mixed, strategy, ranks), "model": counted(mixed, strategy, ranks)}))
        return 0
    import platform

    import torch
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
        print(f"    backward by operator: " + ", ".join(f"{k} {v:.3f}" for k, v in measured["backward_ops"].items()))
    if args.json:
        prov = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
                "command": "python benchmarks/bench_fsdp1_copies.py --json " + str(args.json),
                "blocks": BLOCKS, "params_per_block": PARAMS_PER_BLOCK, "micro_batches": MICRO_BATCHES}
        args.json.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
