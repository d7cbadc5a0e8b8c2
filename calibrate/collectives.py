"""Collectives through torch.distributed: all-reduce, all-gather, reduce-scatter and send/recv.

Ranks come from Slurm (``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` / ``SLURM_NODEID``
under ``srun``), from torchrun (``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``), or from
:func:`spawn_local`, which starts N processes on this host (gloo on CPU: the testable path).
NCCL on GPUs, gloo on CPUs.

Groups are shaped like the layouts' groups over the allocation: ``nodes × ranks-per-node`` with
1 × g inside a node (TP), n × 1 across nodes (DP/PP with one rank per node) and n × G (mixed).
Every rank creates every group in the same order (``new_group`` is itself collective); rank 0,
which is in every group, decides which points remain and records the results.

A collective's time is the slowest member's robust statistic (calibrate/timing.py: middle-half
mean on GPUs, fastest-quarter mean on CPUs; a collective ends when its last rank does); p2p is a
ping-pong, half the round trip.  On CPUs small collectives are repeated more (:func:`cpu_repeats`).
"""
from __future__ import annotations

import datetime
import logging
import os
import socket
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .errors import CalibrationError
from .kernels import DTYPES
from .plans import CollectivePoint
from .timing import robust_seconds, synchronize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """This process's place in the allocation."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    node: int
    nodes: int
    device: str
    backend: str


def context_from_env(device: str) -> DistContext | None:
    """The distributed context from srun or torchrun variables; None when not launched by them."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        node = int(env.get("GROUP_RANK", rank // max(1, local_world)))
    elif int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local = int(env.get("SLURM_LOCALID", 0))
        local_world = int(env.get("SLURM_NTASKS_PER_NODE", "0").split("(")[0] or 0) or \
            max(1, world // max(1, int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))))
        node = int(env.get("SLURM_NODEID", rank // local_world))
    else:
        return None
    if world < 2:
        return None
    nodes = max(1, (world + local_world - 1) // local_world)
    return DistContext(rank, world, local, local_world, node, nodes, device,
                       "nccl" if device == "cuda" else "gloo")


def init_process_group(ctx: DistContext, master_addr: str | None = None, master_port: int | None = None,
                       timeout_s: float | None = None) -> None:
    """Join the process group (env:// rendezvous on MASTER_ADDR / MASTER_PORT)."""
    os.environ.setdefault("MASTER_ADDR", master_addr or "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(master_port or 29500))
    if ctx.device == "cuda":
        torch.cuda.set_device(ctx.local_rank)
    kw = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
    dist.init_process_group(ctx.backend, rank=ctx.rank, world_size=ctx.world, **kw)


def _group_members(ctx: DistContext, nodes: int, gpn: int) -> list[int]:
    """Ranks on the first ``nodes`` nodes with local index below ``gpn`` (placement gathered)."""
    places: list = [None] * ctx.world
    dist.all_gather_object(places, (ctx.node, ctx.local_rank))
    node_ids = sorted({p[0] for p in places})
    chosen = set(node_ids[:nodes])
    return [r for r, (n, l) in enumerate(places) if n in chosen and l < gpn]


def _make_op(kind: str, entries: int, members: Sequence[int], group, ctx: DistContext,
             dtype: torch.dtype) -> Callable[[], None]:
    dev = torch.device("cuda", ctx.local_rank) if ctx.device == "cuda" else torch.device("cpu")
    n = len(members)
    if kind == "allreduce":
        t = torch.ones(entries, dtype=dtype, device=dev)
        return lambda: dist.all_reduce(t, group=group)
    if kind == "allgather":
        # entries = the per-rank input shard (ZeRO-1 parameter gather)
        inp = torch.ones(entries, dtype=dtype, device=dev)
        out = torch.empty(entries * n, dtype=dtype, device=dev)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if kind == "reduce_scatter":
        # entries = the full tensor; each rank keeps entries / n
        per = max(1, entries // n)
        inp = torch.ones(per * n, dtype=dtype, device=dev)
        out = torch.empty(per, dtype=dtype, device=dev)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if kind == "p2p":
        t = torch.ones(entries, dtype=dtype, device=dev)
        a, b = members[0], members[1]

        def pingpong() -> None:
            if ctx.rank == a:
                dist.send(t, b)
                dist.recv(t, b)
            else:
                dist.recv(t, a)
                dist.send(t, a)
        return pingpong
    raise CalibrationError(f"unknown collective {kind!r}")


# On a CPU (gloo) a collective is repeated until its repetitions add up to this many seconds, at
# most CPU_MAX_REPEATS times: the plan's 8 repetitions leave the fastest quarter 2 samples, and a
# small gloo collective on shared cores varies by 1.5x between neighbouring sizes
# (benchmarks/data/cpu-family: 1,024 entries 635 µs, 4,096 entries 415 µs), which is most of the
# collectives fit's hold-out error there.
CPU_BUDGET_S = 0.25
CPU_MAX_REPEATS = 64


def cpu_repeats(first_seconds: float, repeats: int, budget_s: float = CPU_BUDGET_S,
                cap: int = CPU_MAX_REPEATS) -> int:
    """Repetitions of a CPU collective whose one call took ``first_seconds``: enough to fill
    ``budget_s``, never fewer than the plan's ``repeats`` nor more than ``max(cap, repeats)``."""
    if not first_seconds > 0.0:
        return repeats
    return max(repeats, min(cap, int(budget_s / first_seconds)))


def measure_point(pt: CollectivePoint, members: Sequence[int], group, ctx: DistContext,
                  warmup: int, repeats: int) -> float:
    """Time one collective on this rank's group; every member returns the group's µs."""
    fn = _make_op(pt.kind, pt.entries, members, group, ctx, DTYPES[pt.precision])
    dev = torch.device("cuda", ctx.local_rank) if ctx.device == "cuda" else torch.device("cpu")
    token = torch.zeros(1, device=dev)

    def barrier() -> None:
        # A tiny all-reduce is a barrier that works on gloo and NCCL alike, scoped to the group.
        dist.all_reduce(token, group=group)
        synchronize(ctx.device)

    first = 0.0
    for _ in range(max(0, warmup)):
        barrier()
        t0 = time.perf_counter()
        fn()
        synchronize(ctx.device)
        first = time.perf_counter() - t0
    synchronize(ctx.device)
    if ctx.device != "cuda":
        # Every member must loop the same number of times: agree on the slowest member's call.
        agreed = torch.tensor([first], dtype=torch.float64, device=dev)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        repeats = cpu_repeats(float(agreed.item()), repeats)
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        fn()
        synchronize(ctx.device)
        times.append(time.perf_counter() - t0)
    t = robust_seconds(times, ctx.device)
    if pt.kind == "p2p":
        t /= 2.0            # one way of the ping-pong
    slowest = torch.tensor([t], dtype=torch.float64, device=dev)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return float(slowest.item()) * 1e6


def run_points(ctx: DistContext, points: Sequence[CollectivePoint], warmup: int, repeats: int,
               report: Callable[[CollectivePoint, float], None] | None) -> None:
    """Measure ``points`` (already agreed on by every rank) in group order; rank 0 reports each."""
    by_group: dict[tuple[int, int], list[CollectivePoint]] = {}
    for p in points:
        by_group.setdefault((p.nodes, p.gpus_per_node), []).append(p)
    for (nodes, gpn), pts in sorted(by_group.items()):
        members = _group_members(ctx, nodes, gpn)
        if len(members) != nodes * gpn:
            if ctx.rank == 0:
                log.warning("group %d×%d does not fit this allocation (%d ranks): skipped",
                            nodes, gpn, len(members))
            continue
        group = dist.new_group(members)
        for p in pts:
            if ctx.rank in members:
                us = measure_point(p, members, group, ctx, warmup, repeats)
                if ctx.rank == 0 and report is not None:
                    report(p, us)
            dist.barrier()
        dist.destroy_process_group(group)


def agree_on_points(ctx: DistContext, points: Sequence[CollectivePoint]) -> list[CollectivePoint]:
    """Rank 0's list of remaining points, broadcast so that every rank loops over the same ones."""
    box = [list(points) if ctx.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return list(box[0] or [])


# ------------------------------------------------------------------------------- local spawn
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _points_task(ctx: DistContext, emit: Callable[[object], None] | None, points: list[CollectivePoint],
                 warmup: int, repeats: int) -> None:
    run_points(ctx, points, warmup, repeats, (lambda p, us: emit((p, us))) if emit is not None else None)


# What rank 0 puts on the results queue once every rank has finished its task.
_DONE = "perfcast: every rank done"


def _local_worker(rank: int, world: int, port: int, device: str, threads: int, task: Callable,
                  task_args: tuple, results) -> None:
    warnings.filterwarnings("ignore")
    if threads:
        torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    ctx = DistContext(rank, world, rank, world, 0, 1, device, "nccl" if device == "cuda" else "gloo")
    init_process_group(ctx)
    try:
        task(ctx, results.put if rank == 0 else None, *task_args)
        dist.barrier()   # tear down together (see gpt_model._train_worker)
        if rank == 0:
            results.put(_DONE)      # every rank is done: a death in teardown loses nothing
    finally:
        dist.destroy_process_group()


def spawn_ranks(world: int, device: str, task: Callable, task_args: tuple, *, threads: int = 0,
                on_result: Callable[[object], None] | None = None, timeout_s: float = 3600.0) -> int:
    """Run ``task(ctx, emit, *task_args)`` on ``world`` local processes (one host); what rank 0
    emits streams back to ``on_result``, called in this process.  Returns the number of results.
    ``task`` must be a module-level function (the ranks are spawned)."""
    if world < 2:
        raise CalibrationError("collectives need at least 2 ranks")
    if device == "cuda" and torch.cuda.device_count() < world:
        raise CalibrationError(f"{world} local ranks need {world} GPUs, found {torch.cuda.device_count()}")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    proc = mp.start_processes(_local_worker, args=(world, port, device, threads, task, task_args, results),
                              nprocs=world, join=False, start_method="spawn")
    n = 0
    done = False
    deadline = time.monotonic() + timeout_s

    def drain() -> None:
        nonlocal n, done
        while not results.empty():
            item = results.get()
            if isinstance(item, str) and item == _DONE:
                done = True
                continue
            n += 1
            if on_result is not None:
                on_result(item)
    try:
        while not proc.join(timeout=0.2):
            drain()
            if time.monotonic() > deadline:
                raise CalibrationError(f"collective ranks did not finish within {timeout_s:.0f} s")
    except mp.ProcessRaisedException as exc:
        drain()
        raise CalibrationError(f"a collective rank failed: {str(exc).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as exc:
        drain()
        if not done:
            raise CalibrationError(f"a collective rank died: {exc}") from None
        # gloo's teardown (see spawn_until_result): every rank had finished.
        log.warning("a collective rank died in its teardown, after every rank had finished (%s)", exc)
    finally:
        for p in proc.processes:
            if p.is_alive():
                p.terminate()
    drain()
    return n


def spawn_until_result(worker: Callable, args: tuple, world: int, results, *, timeout_s: float,
                       what: str = "rank") -> None:
    """Run ``worker(rank, *args)`` on ``world`` spawned processes until they end; ``results`` is the
    queue rank 0 puts its result on once every rank has finished measuring.  gloo's teardown can
    abort a rank after that ("terminate called without an active exception", about one run in ten
    on two ranks here, with or without destroy_process_group): a rank that dies once the result is
    on the queue has lost nothing, so that is a warning; before it, a CalibrationError."""
    proc = mp.start_processes(worker, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not proc.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise CalibrationError(f"{what}s did not finish within {timeout_s:.0f} s")
    except mp.ProcessRaisedException as exc:
        raise CalibrationError(f"a {what} failed: {str(exc).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as exc:
        if results.empty():
            raise CalibrationError(f"a {what} died: {exc}") from None
        log.warning("a %s died after the measurement was complete (%s); result kept", what, exc)
    finally:
        for p in proc.processes:
            if p.is_alive():
                p.terminate()


def spawn_local(world: int, device: str, points: Sequence[CollectivePoint], *, warmup: int,
                repeats: int, threads: int = 0,
                on_result: Callable[[CollectivePoint, float], None] | None = None,
                timeout_s: float = 3600.0) -> int:
    """Run ``points`` on ``world`` local processes (one host: groups are 1 × world at most).

    Results stream back to this process as they are measured (``on_result`` is called here, so the
    caller keeps the sample store and the progress bar).  Returns the number of results.
    """
    return spawn_ranks(world, device, _points_task, (list(points), warmup, repeats), threads=threads,
                       on_result=(lambda item: on_result(*item)) if on_result is not None else None,
                       timeout_s=timeout_s)


def iter_pending(points: Iterable[CollectivePoint], done: Callable[[CollectivePoint], bool]) -> list[CollectivePoint]:
    return [p for p in points if not done(p)]


__all__ = ["DistContext", "context_from_env", "init_process_group", "run_points", "agree_on_points",
           "spawn_local", "spawn_ranks", "spawn_until_result", "measure_point", "free_port", "iter_pending", "cpu_repeats"]
