"""What DeepSpeed's engines cost the host beyond the work they issue, measured on this CPU.

A DeepSpeed job (GPT-NeoX, DeepSpeed, Megatron-DeepSpeed) runs every micro-batch through its
engine: the ``PipelineEngine``'s instruction loop (load, forward, send/receive, backward, one
handler each) or, without pipeline parallelism, ``DeepSpeedEngine``'s ``forward`` / ``backward``
/ ``step`` per micro-batch.  That bookkeeping is Python on the host, on top of the kernels and
autograd a plain PyTorch loop issues, and a host-bound job pays it on its critical path
(docs/modelling.md §2).

:func:`measure` trains the same tiny blocks (LayerNorm, two linears, GeLU, a residual: hidden 64,
32 tokens, so that the work itself is a few microseconds per operator) one of three ways, each
against a plain PyTorch loop that does the same forward, backward, sends and optimizer step:

* ``pipe1``: ``PipelineEngine``, one stage (NeoX's layout at pp = 1);
* ``pipe2``: ``PipelineEngine``, two stages on two gloo ranks (one core each), against a plain
  1F1B loop with the same sends;
* ``engine``: ``DeepSpeedEngine`` (Megatron-DeepSpeed's at pp = 1), against a plain loop.

The statistic is the fastest quarter of the timed steps (a shared CPU only ever adds time); the
fit of the three costs is :mod:`calibrate.engine_costs`.  The command line is
``benchmarks/bench_engine_host.py``.  Needs torch and DeepSpeed (``DS_ACCELERATOR=cpu``).
"""
from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from .collectives import free_port, spawn_until_result
from .engine_costs import fit_costs

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
            warmup: int, results, device: str = "cpu") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # DeepSpeed is not a dependency of perfcast: only this measurement, in its own ranks, needs it.
    os.environ.setdefault("DS_ACCELERATOR", device)
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule
    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.ERROR)
    if device == "cuda":
        torch.cuda.set_device(rank)
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    torch.manual_seed(0)
    x, y = torch.randn(1, TOKENS, HIDDEN, device=device), torch.randn(1, TOKENS, HIDDEN, device=device)

    def sync() -> None:
        # On a GPU the step's time is the host's issuing plus the device's tail, the same tiny
        # tail under DeepSpeed and the plain loop, so their difference is the engine's host work.
        if device == "cuda":
            torch.cuda.synchronize()

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
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            eng.train_batch(data_iter=it)
            sync()
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
            sync()
            t0 = time.perf_counter()
            for _ in range(m):
                loss = eng(x, y)
                eng.backward(loss)
                eng.step()
            sync()
            timed["deepspeed"].append(time.perf_counter() - t0)
    # The plain loop: the same blocks, sends and optimizer step without an engine
    blocks = nn.Sequential(*[Block() for _ in range(layers)]).to(device)
    opt = torch.optim.Adam(blocks.parameters())
    for _ in range(warmup + steps):
        sync()
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
        sync()
        timed["plain"].append(time.perf_counter() - t0)
    # A step ends when its slowest rank does.
    ms = torch.tensor([_fastest_quarter_ms(timed[k], warmup) for k in ("deepspeed", "plain")], device=device)
    if world > 1:
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    if rank == 0:
        results.put(ms.tolist())
    dist.barrier()
    dist.destroy_process_group()


def measure(mode: str, layers: int, m: int, steps: int, warmup: int, device: str = "cpu") -> tuple[float, float]:
    """(DeepSpeed, plain) milliseconds per step of ``mode`` at ``layers`` per stage and ``m``, on
    ``device`` (``cuda``: one GPU per rank, NCCL)."""
    world = 2 if mode == "pipe2" else 1
    check_device(mode, device)
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    spawn_until_result(_worker, (world, free_port(), mode, layers, m, steps, warmup, results, device), world,
                       results, timeout_s=600.0, what="rank")
    ds_ms, plain_ms = results.get()
    return ds_ms, plain_ms


def check_device(mode: str, device: str) -> None:
    """Refuse what this measurement cannot run: an unknown device, or ``pipe2`` on ``cuda`` (its
    two ranks need two GPUs; NCCL refuses two ranks on one)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; known: cpu, cuda")
    if device == "cuda" and mode == "pipe2":
        raise ValueError("mode 'pipe2' on cuda needs two GPUs (one per rank); run pipe1 and engine")


def measure_mode(mode: str, steps: int, warmup: int,
                 on_row: Optional[Callable[[int, int, float, float], None]] = None,
                 device: str = "cpu") -> dict[str, Any]:
    """One mode over layers per stage × micro-batches: the rows (layers, micro-batches, ms) of
    DeepSpeed and of the plain loop, their fits, and what the engine adds (the difference).
    ``on_row(layers, micro_batches, deepspeed_ms, plain_ms)`` is told each measurement."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    rows: dict[str, list[tuple[int, int, float]]] = {"deepspeed": [], "plain": []}
    for layers in LAYERS:
        for m in MICRO_BATCHES:
            ds_ms, plain_ms = measure(mode, layers, m, steps, warmup, device)
            rows["deepspeed"].append((layers, m, ds_ms))
            rows["plain"].append((layers, m, plain_ms))
            if on_row is not None:
                on_row(layers, m, ds_ms, plain_ms)
    fits = {k: fit_costs(v) for k, v in rows.items()}
    added = {k: fits["deepspeed"][k] - fits["plain"][k] for k in ("step_ms", "micro_batch_ms", "layer_ms")}
    return {"rows": rows, "fits": fits, "engine_adds": added}


def cpu_name() -> str:
    """This machine's CPU model, for a measurement's provenance."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
