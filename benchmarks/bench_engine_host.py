#!/usr/bin/env python3
"""What DeepSpeed's engines cost the host beyond the work they issue, measured on this CPU.

    pip install deepspeed          # DS_BUILD_OPS=0: no compiled ops are needed
    python benchmarks/bench_engine_host.py [--steps 40] [--json OUT]
    python benchmarks/bench_engine_host.py --pool benchmarks/data/engine-host/*.json   # fit only

A DeepSpeed job (GPT-NeoX, DeepSpeed, Megatron-DeepSpeed) runs every micro-batch through its
engine: the ``PipelineEngine``'s instruction loop (load, forward, send/receive, backward, one
handler each) or, without pipeline parallelism, ``DeepSpeedEngine``'s ``forward`` / ``backward``
/ ``step`` per micro-batch.  That bookkeeping is Python on the host, on top of the kernels and
autograd a plain PyTorch loop issues, and a host-bound job pays it on its critical path
(docs/modelling.md §2).

This script trains the same tiny blocks (LayerNorm, two linears, GeLU, a residual: hidden 64,
32 tokens, so that the work itself is a few microseconds per operator) three ways, each against
a plain PyTorch loop that does the same forward, backward, sends and optimizer step:

* ``pipe1``: ``PipelineEngine``, one stage (NeoX's layout at pp = 1);
* ``pipe2``: ``PipelineEngine``, two stages on two gloo ranks (one core each), against a plain
  1F1B loop with the same sends;
* ``engine``: ``DeepSpeedEngine`` (Megatron-DeepSpeed's at pp = 1), against a plain loop.

For each it fits step time = step + micro-batches × (micro_batch + layers per stage × layer) by
least squares over layers per stage {1, 2, 4} × micro-batches {2, 4, 8} (the fastest quarter of
the steps of each, as the CPU family keeps) and prints the three costs for DeepSpeed, for the
plain loop, and their difference: what the engine adds.  One run's split between the per-layer
and per-micro-batch costs moves by ~0.1 ms from run to run on a shared machine; ``--pool`` fits
several runs together, each configuration at its fastest (what scripts/build_platforms.py ships).  The figures are this CPU's; the engine's
are pure host work, so a GPU node's CPU pays about as much per call (what ``[host.engines]`` of the
shipped platforms carries, with this script as its source).

A benchmark, not a test: the figures depend on this machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

from calibrate.collectives import free_port, spawn_until_result  # noqa: E402

HIDDEN, TOKENS = 64, 32
LAYERS = (1, 2, 4)
MICRO_BATCHES = (2, 4, 8)
MODES = ("pipe1", "pipe2", "engine")


class Block(nn.Module):
    """A transformer-sized list of small operators at a shape that costs the device nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def loss_fn(out: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return ((out - label) ** 2).mean()


def _fastest_quarter_ms(times: list[float], warmup: int) -> float:
    kept = sorted(times[warmup:])
    return 1e3 * statistics.mean(kept[:max(1, len(kept) // 4)])


def _ds_config(micro_batches: int) -> dict:
    return {"train_batch_size": micro_batches, "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": micro_batches, "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False}


def _plain_1f1b(rank: int, blocks: nn.Module, x: torch.Tensor, y: torch.Tensor, m: int) -> None:
    """Two-stage 1F1B, as PipelineEngine schedules it: stage 0 keeps one micro-batch in flight."""
    other = 1 - rank
    if rank == 0:
        outs, sends = [], []
        for i in range(m):
            out = blocks(x)
            sends.append(dist.isend(out.detach(), other))
            outs.append(out)
            if i >= 1:
                grad = torch.empty_like(out)
                dist.recv(grad, other)
                outs.pop(0).backward(grad)
        grad = torch.empty_like(x)
        dist.recv(grad, other)
        outs.pop(0).backward(grad)
    else:
        sends = []
        for _ in range(m):
            act = torch.empty_like(x)
            dist.recv(act, other)
            act.requires_grad_(True)
            loss_fn(blocks(act), y).backward()
            sends.append(dist.isend(act.grad, other))
    for req in sends:
        req.wait()


def _worker(rank: int, world: int, port: int, mode: str, layers: int, m: int, steps: int,
            warmup: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.ERROR)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    x, y = torch.randn(1, TOKENS, HIDDEN), torch.randn(1, TOKENS, HIDDEN)

    def data():
        while True:
            yield x, y

    timed: dict[str, list[float]] = {"deepspeed": [], "plain": []}
    # DeepSpeed's engine
    if mode.startswith("pipe"):
        module = PipelineModule(layers=[LayerSpec(Block) for _ in range(world * layers)],
                                num_stages=world, loss_fn=loss_fn, partition_method="uniform")
        eng, _, _, _ = deepspeed.initialize(model=module, optimizer=torch.optim.Adam(module.parameters()),
                                            config=_ds_config(m))
        it = data()
        for _ in range(warmup + steps):
            dist.barrier()
            t0 = time.perf_counter()
            eng.train_batch(data_iter=it)
            timed["deepspeed"].append(time.perf_counter() - t0)
    else:
        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.blocks = nn.Sequential(*[Block() for _ in range(layers)])

            def forward(self, inp: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
                return loss_fn(self.blocks(inp), label)
        model = Model()
        eng, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.Adam(model.parameters()),
                                            config=_ds_config(m))
        for _ in range(warmup + steps):
            t0 = time.perf_counter()
            for _ in range(m):
                loss = eng(x, y)
                eng.backward(loss)
                eng.step()
            timed["deepspeed"].append(time.perf_counter() - t0)
    # The plain loop: the same blocks, sends and optimizer step without an engine
    blocks = nn.Sequential(*[Block() for _ in range(layers)])
    opt = torch.optim.Adam(blocks.parameters())
    for _ in range(warmup + steps):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        if world > 1:
            _plain_1f1b(rank, blocks, x, y, m)
        else:
            for _ in range(m):
                loss_fn(blocks(x), y).backward()
        opt.step()
        opt.zero_grad()
        timed["plain"].append(time.perf_counter() - t0)
    # A step ends when its slowest rank does.
    ms = torch.tensor([_fastest_quarter_ms(timed[k], warmup) for k in ("deepspeed", "plain")])
    if world > 1:
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    if rank == 0:
        results.put(ms.tolist())
    dist.barrier()
    dist.destroy_process_group()


def measure(mode: str, layers: int, m: int, steps: int, warmup: int) -> tuple[float, float]:
    """(DeepSpeed, plain) milliseconds per step of ``mode`` at ``layers`` per stage and ``m``."""
    world = 2 if mode == "pipe2" else 1
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    spawn_until_result(_worker, (world, free_port(), mode, layers, m, steps, warmup, results), world, results,
                       timeout_s=600.0, what="rank")
    ds_ms, plain_ms = results.get()
    return ds_ms, plain_ms


def fit_costs(rows: list[tuple[int, int, float]]) -> dict[str, float]:
    """Least squares of ms = step + m·micro_batch + m·layers·layer over (layers, m, ms) rows."""
    a = np.array([[1.0, m, m * layers] for layers, m, _ in rows])
    b = np.array([ms for _, _, ms in rows])
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    resid = b - a @ coef
    return {"step_ms": float(coef[0]), "micro_batch_ms": float(coef[1]), "layer_ms": float(coef[2]),
            "residual_rms_ms": float(np.sqrt(np.mean(resid ** 2)))}


def pooled_costs(paths: list[Path]) -> dict[str, dict[str, float]]:
    """Per mode, what the engine adds (ms per step, micro-batch, layer), fitted over the fastest
    time of each configuration across the ``--json`` files in ``paths``: other tenants' load only
    ever adds time (calibrate/timing.py keeps the fastest quarter on a CPU for the same reason)."""
    best: dict[str, dict[str, dict[tuple[int, int], float]]] = {}
    for path in paths:
        for mode, d in json.loads(path.read_text(encoding="utf-8"))["modes"].items():
            for kind in ("deepspeed", "plain"):
                seen = best.setdefault(mode, {}).setdefault(kind, {})
                for layers, m, ms in d["rows"][kind]:
                    seen[(layers, m)] = min(ms, seen.get((layers, m), math.inf))
    out = {}
    for mode, by_kind in best.items():
        ds, plain = (fit_costs([(*key, ms) for key, ms in by_kind[k].items()]) for k in ("deepspeed", "plain"))
        out[mode] = {k: ds[k] - plain[k] for k in ("step_ms", "micro_batch_ms", "layer_ms")}
        out[mode]["runs"] = len(paths)
        out[mode]["residual_rms_ms"] = max(ds["residual_rms_ms"], plain["residual_rms_ms"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--json", type=Path, help="also write the measurements and fits here")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="JSON",
                    help="measure nothing: fit the rows of these --json files together and print them")
    args = ap.parse_args(argv)
    if args.pool:
        print("what the engine adds, ms: per step / micro-batch / layer")
        for mode, c in pooled_costs(args.pool).items():
            print(f"  {mode:<7} {c['step_ms']:7.3f} {c['micro_batch_ms']:7.3f} {c['layer_ms']:7.3f}"
                  f"   (fastest of {c['runs']} runs per configuration; fit residual rms "
                  f"{c['residual_rms_ms']:.3f})")
        return 0
    try:
        import deepspeed
    except ImportError:
        print("bench_engine_host: needs DeepSpeed (pip install deepspeed; DS_BUILD_OPS=0 builds nothing)",
              file=sys.stderr)
        return 2
    modes = [s.strip() for s in args.modes.split(",") if s.strip()]
    bad = [s for s in modes if s not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}; known: {', '.join(MODES)}")
    out: dict = {"cpu": _cpu_name(), "torch": torch.__version__,
                 "deepspeed": deepspeed.__version__, "modes": {}}
    print(f"{out['cpu']}, torch {out['torch']}, deepspeed {out['deepspeed']}; ms per step, "
          f"fastest quarter of {args.steps}")
    for mode in modes:
        rows = {"deepspeed": [], "plain": []}
        for layers in LAYERS:
            for m in MICRO_BATCHES:
                ds_ms, plain_ms = measure(mode, layers, m, args.steps, args.warmup)
                rows["deepspeed"].append((layers, m, ds_ms))
                rows["plain"].append((layers, m, plain_ms))
                print(f"  {mode:<7} layers/stage {layers}  micro-batches {m}:  deepspeed {ds_ms:7.3f}"
                      f"  plain {plain_ms:7.3f}", flush=True)
        fits = {k: fit_costs(v) for k, v in rows.items()}
        added = {k: fits["deepspeed"][k] - fits["plain"][k] for k in ("step_ms", "micro_batch_ms", "layer_ms")}
        out["modes"][mode] = {"rows": rows, "fits": fits, "engine_adds": added}
        print(f"{mode}: per step / micro-batch / layer (ms)")
        for k in ("deepspeed", "plain"):
            f = fits[k]
            print(f"  {k:<10} {f['step_ms']:7.3f} {f['micro_batch_ms']:7.3f} {f['layer_ms']:7.3f}"
                  f"   (fit residual rms {f['residual_rms_ms']:.3f})")
        print(f"  {'adds':<10} {added['step_ms']:7.3f} {added['micro_batch_ms']:7.3f} {added['layer_ms']:7.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
