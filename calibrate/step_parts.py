"""One CPU training step of :mod:`calibrate.gpt_model`, each part timed on its own, next to the
same micro-batch's operators timed in isolation and the platform's per-operator predictions:
where a prediction misses, this says which part (``bench_cpu_family.py --parts``).

With dp > 1 a barrier before each collective is timed as ``wait`` (the skew between the ranks), so
``all_reduce`` is the collective alone: training has no such barrier, and there the faster rank
spends the skew inside the collective (docs/calibration.md).
"""
from __future__ import annotations

import os
import resource
import time
import warnings
from dataclasses import dataclass
from typing import Any

#: The timed parts of a step, in order (``step`` is the whole step).
PARTS = ("zero_grad", "forward", "backward", "wait", "all_reduce", "optimizer", "all_gather", "step")


@dataclass
class IsolatedSum:
    """A micro-batch's operators timed each on its own and summed with the recipe's counts:
    seconds per micro-batch (forward, backward with full recomputation's extra forward; ``ops``:
    each operator's (forward, backward)), the optimizer's seconds per step."""

    forward_seconds: float
    backward_seconds: float
    optimizer_seconds: float
    ops: dict[str, tuple[float, float]]


@dataclass
class StepParts:
    """Per rank, per timed step, seconds of each of :data:`PARTS` (and the micro-batches' minor
    page faults and kernel seconds, ``minor_faults`` and ``sys_s``); rank 0's isolated sum."""

    ranks: list[list[dict[str, float]]]
    isolated: IsolatedSum | None


def isolated_sum(job: Any, optimizer_params: int) -> IsolatedSum:
    """Every operator of the predictor's recipe (predictor/recipe.py) for ``job``'s micro-batch,
    built and timed on its own as ``perf-calibrate run`` times a sample (calibrate/kernels.py +
    calibrate/timing.py: warm-up 2, fastest-quarter mean of 8), in this process, now; and the
    optimizer over ``optimizer_params`` parameters (this rank's shard)."""
    from predictor.recipe import micro_batch_recipe

    from .kernels import build_kernel

    r = micro_batch_recipe(job.model, job.layout)
    calls = [(c, job.model.layers, True) for c in r.layer] + [(c, 1, False) for c in r.embedding + r.head]
    forward = backward = 0.0
    ops: dict[str, tuple[float, float]] = {}
    full = job.layout.recompute == "full"
    for c, n, in_layer in calls:
        shape = {k: int(round(v)) for k, v in c.shape.items()}
        t = build_kernel(c.name, shape, "fp32", "cpu").time(warmup=2, repeats=8)
        f, b = t["fwd"].seconds * c.count * n, t["bwd"].seconds * c.count * n
        forward += f
        backward += b + (f if full and in_layer else 0.0)     # full recomputation
        f0, b0 = ops.get(c.name, (0.0, 0.0))
        ops[c.name] = (f0 + f, b0 + b)
    opt = build_kernel("optimizer", {"params": optimizer_params}, "fp32", "cpu").time(
        warmup=2, repeats=8)["step"].seconds
    return IsolatedSum(forward, backward, opt, ops)


def parts_worker(rank: int, world: int, port: int, job_dict: dict, threads: int, steps: int,
                 warmup: int, results: Any, isolated_too: bool = False) -> None:
    """gpt_model's training step on ``rank`` of ``world`` gloo ranks, each part timed on its own
    (CPU: no asynchrony); rank 0 puts (every rank's rows, :class:`IsolatedSum` or None)."""
    import torch
    import torch.distributed as dist

    from predictor import TrainingJob

    from .gpt_model import rank_state

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    j = TrainingJob.from_dict(job_dict)
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        st = rank_state(j, "cpu", world, rank)
        model, opt, batches, zero, lo, hi = st.model, st.optimizer, st.batches, st.zero, st.lo, st.hi
        rows = []
        for step in range(warmup + steps):
            if world > 1:
                dist.barrier()
            t = {"forward": 0.0, "backward": 0.0}
            c0 = time.perf_counter()
            model.flat_grad.zero_()
            c1 = time.perf_counter()
            t["zero_grad"] = c1 - c0
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for ids, tgt in batches:
                a = time.perf_counter()
                loss = model.loss(ids, tgt)
                b = time.perf_counter()
                loss.backward()
                c = time.perf_counter()
                t["forward"] += b - a
                t["backward"] += c - b
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            # Page faults and kernel time of the micro-batches (first-touch of fresh memory).
            t["minor_faults"] = float(r1.ru_minflt - r0.ru_minflt)
            t["sys_s"] = r1.ru_stime - r0.ru_stime
            w0 = time.perf_counter()
            if world > 1:
                dist.barrier()
            a = time.perf_counter()
            if world > 1:
                dist.all_reduce(model.flat_grad)
                model.flat_grad.div_(world)
            b = time.perf_counter()
            opt.step()
            c = time.perf_counter()
            if zero:
                dist.barrier()
            c2 = time.perf_counter()
            if zero:
                dist.all_gather_into_tensor(model.flat, model.flat[lo:hi].clone())
            d = time.perf_counter()
            t.update(wait=(a - w0) + (c2 - c), all_reduce=b - a, optimizer=c - b, all_gather=d - c2,
                     step=d - c0)
            if step >= warmup:
                rows.append(t)
        every = [rows]
        if world > 1:
            every = [None] * world
            dist.all_gather_object(every, rows)
        isolated = (isolated_sum(j, model.padded // (world if zero else 1))
                    if rank == 0 and isolated_too else None)
        if rank == 0:
            results.put((every, isolated))
        if world > 1:
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()


def measure_step_parts(job_dict: dict, *, threads: int, steps: int, warmup: int, isolated: bool = True,
                       timeout_s: float = 900.0) -> StepParts:
    """Train ``job_dict`` (pp = tp = 1) on its dp gloo ranks, each part of each step timed."""
    import torch.multiprocessing as mp

    from .collectives import free_port, spawn_until_result

    world = int(job_dict["layout"]["dp"])
    results = mp.get_context("spawn").SimpleQueue()
    args = (world, free_port(), job_dict, threads, steps, warmup, results, isolated)
    if world == 1:
        parts_worker(0, *args)
    else:
        spawn_until_result(parts_worker, args, world, results, timeout_s=timeout_s, what="training rank")
    every, iso = results.get()
    return StepParts(every, iso)


def predicted_ops(job: Any, plat: Any) -> dict[str, tuple[float, float]]:
    """The platform's (forward, backward) seconds per operator of ``job``'s recipe, one
    micro-batch, counts applied."""
    from predictor.estimate import QuerySet
    from predictor.recipe import micro_batch_recipe

    q = QuerySet(plat)
    r = micro_batch_recipe(job.model, job.layout)
    rows = [(c, job.model.layers * c.count, q.op(c.name, "fwd", "fp32", c.shape),
             q.op(c.name, "bwd", "fp32", c.shape)) for c in r.layer]
    rows += [(c, c.count, q.op(c.name, "fwd", "fp32", c.shape), q.op(c.name, "bwd", "fp32", c.shape))
             for c in r.embedding + r.head]
    secs = q.evaluate()[0]
    out: dict[str, tuple[float, float]] = {}
    for c, n, hf, hb in rows:
        f0, b0 = out.get(c.name, (0.0, 0.0))
        out[c.name] = (f0 + n * secs[hf], b0 + n * secs[hb])
    return out
