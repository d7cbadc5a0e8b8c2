"""Collectives timed beside each other: what a job's other groups cost one group's collectives.

``perf-calibrate run`` times each collective on one group while the rest of the allocation idles.
In a job, dp × pp tensor-parallel groups (and tp × pp data-parallel groups) run their collectives
at once over the same adapters and switches.  ``perf-calibrate fabric`` tiles the allocation with
as many disjoint groups of one shape as fit (nodes in blocks, local ranks in blocks, as the
layouts place their groups), times an all-reduce on the first group alone, then on every group at
once, and writes both (``SAMPLES/fabric.toml``).  ``perf-calibrate fit`` turns the groups that
span nodes into the platform's ``[fabric] between_nodes_slowdown`` (calibrate/fitting/fabric.py),
which the predictor applies to every collective between nodes.

The file::

    [fabric]
    device = "cuda"
    device_name = "NVIDIA GH200 120GB"
    kind = "allreduce"
    precision = "bf16"
    nodes = 16                      # the allocation measured
    gpus_per_node = 1
    [[rows]]
    entries = 16777216
    group_nodes = 4                 # one group's shape
    group_gpus_per_node = 1
    groups = 4                      # how many ran at once
    alone_us = 2150.0
    concurrent_us = 2730.0
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from .collectives import DistContext, context_from_env, init_process_group, measure_point, spawn_ranks
from .errors import CalibrationError
from .plans import CollectivePoint

log = logging.getLogger(__name__)

#: What a default measurement sends: 2 MB to 128 MB of 16-bit all-reduce (tensor-parallel
#: activations to data-parallel buckets), where bandwidth, and so the sharing, decides the time.
DEFAULT_ENTRIES = (1 << 20, 1 << 24, 1 << 26)


@dataclass(frozen=True)
class FabricRow:
    """One collective shape timed alone and beside ``groups - 1`` others of the same shape."""

    entries: int
    group_nodes: int
    group_gpus_per_node: int
    groups: int
    alone_us: float
    concurrent_us: float


def tiles(places: Sequence[tuple[int, int]], nodes: int, gpn: int) -> list[list[int]]:
    """Disjoint groups of ``nodes`` × ``gpn`` ranks covering as much of the allocation as they can:
    ``places[r]`` is rank r's (node, local rank); nodes are taken in blocks of ``nodes`` in node
    order, local ranks in blocks of ``gpn``.  Incomplete blocks are left out."""
    node_ids = sorted({n for n, _ in places})
    locals_per_node = 1 + max(loc for _, loc in places)
    out = []
    for b in range(len(node_ids) // nodes):
        block = set(node_ids[b * nodes:(b + 1) * nodes])
        for c in range(locals_per_node // gpn):
            members = [r for r, (n, loc) in enumerate(places) if n in block and c * gpn <= loc < (c + 1) * gpn]
            if len(members) == nodes * gpn:
                out.append(members)
    return out


def default_shapes(nodes: int, gpus_per_node: int) -> list[tuple[int, int]]:
    """Group shapes a job tiles an allocation with, each with room for two groups or more: whole
    nodes and one rank per node over 1, 2, 4 … nodes, and half a node's ranks inside one node."""
    shapes = set()
    n = 1
    while n <= nodes:
        for g in {gpus_per_node, 1}:
            if (nodes // n) * (gpus_per_node // g) >= 2 and n * g >= 2:
                shapes.add((n, g))
        n *= 2
    if gpus_per_node >= 4:
        shapes.add((1, gpus_per_node // 2))
    return sorted(shapes)


def measure_fabric(ctx: DistContext, shapes: Sequence[tuple[int, int]], entries: Sequence[int], *,
                   precision: str, warmup: int, repeats: int,
                   report: Callable[[FabricRow], None] | None = None) -> list[FabricRow]:
    """Time an all-reduce of each size on each shape's first group alone, then on all its groups at
    once; every rank calls this, rank 0 gets (and reports) the rows."""
    places: list = [None] * ctx.world
    dist.all_gather_object(places, (ctx.node, ctx.local_rank))
    dev = torch.device("cuda", ctx.local_rank) if ctx.device == "cuda" else torch.device("cpu")
    rows: list[FabricRow] = []
    for nodes, gpn in shapes:
        groups = tiles(places, nodes, gpn)
        if len(groups) < 2:
            if ctx.rank == 0:
                log.warning("%d×%d groups: fewer than two fit this allocation; skipped", nodes, gpn)
            continue
        # new_group is collective: every rank creates every group, in the same order.
        handles = [dist.new_group(m) for m in groups]
        mine = next((i for i, m in enumerate(groups) if ctx.rank in m), None)
        for n_entries in entries:
            pt = CollectivePoint("allreduce", precision, int(n_entries), nodes, gpn)
            alone = torch.zeros(1, dtype=torch.float64, device=dev)
            if mine == 0:
                alone[0] = measure_point(pt, groups[0], handles[0], ctx, warmup, repeats)
            dist.barrier()
            together = torch.zeros(1, dtype=torch.float64, device=dev)
            if mine is not None:
                together[0] = measure_point(pt, groups[mine], handles[mine], ctx, warmup, repeats)
            # The slowest group, and the first group's lone figure, to every rank.
            dist.all_reduce(together, op=dist.ReduceOp.MAX)
            dist.all_reduce(alone, op=dist.ReduceOp.MAX)
            row = FabricRow(int(n_entries), nodes, gpn, len(groups), float(alone.item()), float(together.item()))
            rows.append(row)
            if ctx.rank == 0 and report is not None:
                report(row)
        dist.barrier()
        for h in handles:
            dist.destroy_process_group(h)
    return rows


def _fabric_task(ctx: DistContext, emit: Callable[[object], None] | None, shapes: list, entries: list,
                 precision: str, warmup: int, repeats: int) -> None:
    measure_fabric(ctx, shapes or default_shapes(ctx.nodes, ctx.local_world), entries, precision=precision,
                   warmup=warmup, repeats=repeats, report=emit)


def _check_local_shapes(device: str, ranks: int, shapes: Sequence[tuple[int, int]], *,
                        ranks_given: bool) -> None:
    """Refuse, before any rank is started, ``ranks`` local processes (one host) that no shape
    (``shapes``, else :func:`default_shapes`) tiles with two groups of two ranks or more: they would
    start, measure nothing and fail.  The message says which ``--ranks``/``--shapes`` would do."""
    if ranks >= 2:
        places = [(0, r) for r in range(ranks)]
        if any(n * g >= 2 and len(tiles(places, n, g)) >= 2 for n, g in list(shapes) or default_shapes(1, ranks)):
            return
    given = "--ranks" if ranks_given else "the default --ranks"
    if shapes:
        given += ", --shapes " + ",".join(f"{n}x{g}" for n, g in shapes)
    if ranks >= 4:
        fix = f"--shapes 1x{ranks // 2} (two groups of {ranks // 2} ranks), or no --shapes"
    elif device == "cpu":
        fix = "--ranks 4 --shapes 1x2 (two groups of two ranks), or more ranks"
    else:
        fix = "4 or more GPUs in the node (--ranks 4 --shapes 1x2), or srun over 2 or more nodes"
    raise CalibrationError(f"no group shape has room for two groups among {ranks} local rank"
                           f"{'s' if ranks != 1 else ''} on one host ({given}): nothing to measure; use {fix}")


def run_fabric(device: str, *, ranks: int = 0, shapes: Sequence[tuple[int, int]] = (),
               entries: Sequence[int] = DEFAULT_ENTRIES, precision: str = "", warmup: int = 3,
               repeats: int = 10) -> tuple[list[FabricRow], dict]:
    """``perf-calibrate fabric``: under srun / torchrun every rank of the allocation takes part and
    rank 0 returns the rows and the ``fabric.toml`` document (the others return none); without them
    ``ranks`` local processes (one host) do.  ``shapes`` default to :func:`default_shapes`."""
    from .env import collect_environment
    from .runner import _check_device

    _check_device(device)
    precision = precision or ("fp32" if device == "cpu" else "bf16")
    ctx = context_from_env(device)
    rows: list[FabricRow] = []
    if ctx is not None:
        init_process_group(ctx)
        try:
            rows = measure_fabric(ctx, list(shapes) or default_shapes(ctx.nodes, ctx.local_world), entries,
                                  precision=precision, warmup=warmup, repeats=repeats)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        if ctx.rank != 0:
            return [], {}
        nodes, gpn = ctx.nodes, ctx.local_world
    else:
        nodes, gpn = 1, ranks or (torch.cuda.device_count() if device == "cuda" else 2)
        _check_local_shapes(device, gpn, shapes, ranks_given=bool(ranks))
        if device == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, gpn)))
        spawn_ranks(gpn, device, _fabric_task, (list(shapes), list(entries), precision, warmup, repeats),
                    on_result=rows.append)
    env = collect_environment(device)
    doc = {"fabric": {"device": device, "device_name": env.gpu_name, "kind": "allreduce",
                      "precision": precision, "nodes": nodes, "gpus_per_node": gpn, "torch": torch.__version__},
           "rows": [asdict(r) for r in rows]}
    return rows, doc


__all__ = ["DEFAULT_ENTRIES", "FabricRow", "default_shapes", "measure_fabric",
           "run_fabric", "tiles"]
