"""One calibration run: plan → operator kernels and collectives → resumable sample store.

``run_calibration`` is what ``perf-calibrate run`` calls.  Operators are measured by rank 0 (one
device); collectives by every rank, either under srun/torchrun (ranks from the environment) or,
on one host, by spawning local ranks (gloo on CPU).  Points already in the store are skipped, so
a killed run resumes where it stopped.  When every point of the plan is in the store (or recorded
as unmeasurable), the store is marked complete — the condition for installing its platform.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

import torch
import torch.multiprocessing as mp

from .attention import survey as attention_survey
from .collectives import agree_on_points, context_from_env, init_process_group, run_points, spawn_local
from .env import (METHOD_VERSION, DeviceSpec, collect_environment, device_spec, quiet_worker_signals,
                  signals_default, signals_held, spawning_workers)
from .errors import CalibrationError
from .kernels import build_kernel, fp8_gemms_supported
from .plans import (Allocation, Cost, OperatorPoint, Plan, add_attention_kernels, estimate_cost, make_plan,
                    plan_precisions)
from .store import SampleStore, StoreIdentity

log = logging.getLogger(__name__)

PARTS = ("all", "operators", "collectives")
#: How an operator sample is timed on a GPU: "call" brackets one isolated call with CUDA events
#: (the host's issue time is in it where the host is the slower; the predictor takes half of the
#: measured call cost off), "device" queues the call behind a device-side sleep so that it is the
#: device's time alone (calibrate.timing).  A store holds one kind.
TIMINGS = ("call", "device")
_GROUP_TIMEOUT_S = 24 * 3600


@dataclass
class RunOptions:
    """What ``perf-calibrate run`` was asked to do."""

    out: Path
    device: str = "cpu"
    plan: str = "smoke"
    precisions: Sequence[str] | None = None
    part: str = "all"
    ranks: int = 0                   # local ranks when not under srun/torchrun (0: 2 on CPU, every GPU)
    threads: int = 0                 # CPU threads per rank (0: cores / ranks, as training would use)
    budget_gpu_minutes: float = 0.0  # adaptive plan
    progress: bool = False
    stop_after: int = 0              # measure at most this many points, then stop (testing resume)
    timing: str = "call"             # TIMINGS: "device" leaves the host's issue time out (CUDA)
    ops: Sequence[str] = ()          # only these operators of the plan (empty: all)
    announce: Callable[[Plan, Cost], None] | None = None   # told the plan and its cost up front


@dataclass
class RunResult:
    out: Path
    plan: str
    cost: Cost
    measured_operators: int = 0
    measured_collectives: int = 0
    already_done: int = 0
    skipped: int = 0
    complete: bool = False           # every point of the plan is in the store
    part_complete: bool = True       # every point of the requested --part is (rank 0 decides)
    seconds: float = 0.0
    spec: DeviceSpec | None = None
    notes: list[str] = field(default_factory=list)


def _check_device(device: str) -> None:
    if device not in ("cpu", "cuda"):
        raise CalibrationError(f"unknown device {device!r}: cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("--device cuda: torch sees no CUDA GPU here (CPU build or no driver)")


def _bar(total: int, desc: str, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is part of the calibrate extra
        enabled = False
        tqdm = None
    if not enabled or tqdm is None:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit="pt", dynamic_ncols=True, leave=True)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or "out of memory" in text or "can't allocate memory" in text


def run_calibration(opts: RunOptions) -> RunResult:
    """Measure a plan into ``opts.out`` (created or resumed).  See the module docstring."""
    t_start = time.monotonic()
    _check_device(opts.device)
    if opts.part not in PARTS:
        raise CalibrationError(f"--part must be one of {', '.join(PARTS)}")
    if opts.timing not in TIMINGS:
        raise CalibrationError(f"--timing must be one of {', '.join(TIMINGS)}")
    if opts.timing == "device" and opts.device != "cuda":
        raise CalibrationError("--timing device needs --device cuda (on a CPU the host is the device)")
    ctx = context_from_env(opts.device)
    if ctx is not None:
        alloc = Allocation(ctx.nodes, ctx.local_world)
        local_ranks = ctx.local_world
    else:
        local = opts.ranks or (max(1, torch.cuda.device_count()) if opts.device == "cuda" else 2)
        alloc = Allocation(1, local)
        local_ranks = local
        if opts.part == "collectives" and local_ranks < 2:
            # One rank has no one to exchange with: nothing to measure, said before any work.
            raise CalibrationError(f"--part collectives: collectives need 2 or more ranks, got --ranks "
                                   f"{local_ranks} (use --ranks 2 or more, or start under srun/torchrun)")
    if opts.device == "cpu":
        # One "GPU" = one rank's share of the cores: the regressors must see the speed a training
        # rank sees when all ranks of the node run at once.
        threads = opts.threads or max(1, (os.cpu_count() or 1) // max(1, local_ranks))
        torch.set_num_threads(threads)
    else:
        threads = opts.threads or torch.get_num_threads()
    rank0 = ctx is None or ctx.rank == 0
    # Under srun/torchrun, operators are measured by rank 0 alone (the other tasks wait for the
    # collectives); started alone, every local rank measures a share of them.
    op_ranks = 1 if ctx is not None else local_ranks

    precs = plan_precisions(opts.plan, opts.device, opts.precisions)
    if "fp8" in precs and not fp8_gemms_supported(opts.device):
        name = torch.cuda.get_device_name(0) if opts.device == "cuda" else opts.device
        raise CalibrationError(f"precision fp8: {name} has no FP8 GEMMs that torch._scaled_mm runs "
                               "(an NVIDIA GPU of compute capability 8.9 or later: L40S, H100, GH200, ...)")
    spec = device_spec(opts.device, precs)
    mem = spec.memory_gib / (local_ranks if opts.device == "cpu" else 1)
    plan = make_plan(opts.plan, device=opts.device, precisions=precs, allocation=alloc,
                     memory_gib=mem, budget_gpu_minutes=opts.budget_gpu_minutes,
                     spec=spec.to_gpu_spec())
    # The plan's points beside those of --ops: a store is complete when the whole plan is in it,
    # whichever runs measured it (so a run of some operators into a complete store keeps it so).
    whole_plan = SimpleNamespace(operators=list(plan.operators) if opts.ops else [], candidates=[])
    if opts.ops:
        unknown = sorted(set(opts.ops) - {p.op for p in plan.operators})
        if unknown:
            raise CalibrationError(f"--ops: plan {plan.name} measures no {', '.join(unknown)} "
                                   f"(its operators: {', '.join(sorted({p.op for p in plan.operators}))})")
        plan.operators = [p for p in plan.operators if p.op in set(opts.ops)]
        plan.candidates = [p for p in plan.candidates if p.op in set(opts.ops)]
    # Each attention kernel the partition has beside the one SDPA picks (calibrate/attention.py);
    # those it lacks are recorded, so predictions for them say they were not measured.
    kernels = attention_survey(opts.device)
    if any(p.op == "flash_atten" for p in plan.operators):
        add_attention_kernels(plan, [k for k in kernels.available if k != kernels.default])
        log.info("attention kernels: flash_atten times %s; also timed: %s; not here: %s",
                 kernels.default or "SDPA's choice",
                 ", ".join(k for k in kernels.available if k != kernels.default) or "none",
                 "; ".join(kernels.missing_lines()) or "none")
    if any(p.op == "flash_atten" for p in whole_plan.operators):
        add_attention_kernels(whole_plan, [k for k in kernels.available if k != kernels.default])
    cost = estimate_cost(plan, spec.to_gpu_spec(), opts.device)
    result = RunResult(opts.out, plan.name, cost, spec=spec)
    if rank0:
        log.info("%s", plan.summary())
        log.info("estimated cost: %s", cost)
        if opts.announce is not None:
            opts.announce(plan, cost)

    env = collect_environment(opts.device, threads)
    host_timing = "excluded" if opts.timing == "device" else "included"
    identity = StoreIdentity(opts.device, env.gpu_name, METHOD_VERSION, host_timing=host_timing)
    store = None
    if rank0:
        meta = {
            "device": opts.device, "gpu_name": env.gpu_name,
            "plans": [f"{plan.name} ({', '.join(opts.ops)} only)" if opts.ops else plan.name],
            "precisions": list(plan.precisions),
            "environment": env.to_dict(),
            "gpu": spec.to_dict(),
            "allocation": {"nodes": alloc.nodes, "gpus_per_node": alloc.gpus_per_node},
            "timing": {"warmup": plan.warmup, "repeats": plan.repeats,
                       "statistic": "mean of middle half" if opts.device == "cuda" else "mean of fastest quarter",
                       "clock": "cuda events" if opts.device == "cuda" else "perf_counter",
                       "host": host_timing},
            "estimated": {"wall_minutes": round(cost.wall_minutes, 3), "gpu_minutes": round(cost.gpu_minutes, 3)},
            # What flash_atten timed (the bundle's [source] carries it to the predictor), causal.
            "flash_atten_impl": kernels.default, "flash_atten_causal": True,
            "attention_impls_measured": sorted(set(kernels.available) | {kernels.default} - {""}),
            "attention_impls_missing": kernels.missing_lines(),
        }
        if opts.device == "cpu" and any(p != "fp32" for p in plan.precisions):
            meta["notes"] = "half precision on CPU: torch's CPU kernels, often much slower than fp32"
        store = SampleStore.open(opts.out, identity, meta)

    budget_points = opts.stop_after or 0
    stopped = False

    # ---------------------------------------------------------------- operators (rank 0)
    if rank0 and opts.part in ("all", "operators"):
        assert store is not None
        deadline = math.inf
        if plan.adaptive:
            # The budget is a promise: operators stop when the wall-clock it buys (less the
            # collectives) is spent, and points not reached are dropped from the plan.
            gpus = max(1, plan.allocation.ranks) if opts.device == "cuda" else 1
            deadline = t_start + plan.budget_gpu_minutes * 60.0 / gpus - cost.collective_seconds
        stopped = _measure_operators(plan, plan.operators, store, opts, result, budget_points,
                                     op_ranks, threads, deadline)
        if plan.adaptive and time.monotonic() > deadline:
            _drop_unmeasured(plan, store)
        if plan.adaptive and not stopped and time.monotonic() <= deadline:
            stopped = _adaptive_rounds(plan, store, spec, opts, result, t_start, budget_points,
                                       op_ranks, threads)

    # ---------------------------------------------------------------- collectives
    if ctx is not None:
        # Joined only now: with --part all, the other ranks wait here while rank 0 measures the
        # operators, which can take hours — hence the long rendezvous/collective timeout.
        with signals_default():      # a wait in C++: SIGTERM must end it (signals_default)
            init_process_group(ctx, timeout_s=_GROUP_TIMEOUT_S if opts.part == "all" else None)
    if opts.part in ("all", "collectives") and not stopped:
        stopped = _measure_collectives(plan, store, opts, result, ctx, threads, local_ranks, budget_points)

    if rank0:
        assert store is not None
        pending = [p for p in plan.operators if not store.has_operator(p)]
        pending_c = [c for c in plan.collectives if not store.has_collective(c)]
        # With --ops, the plan's other operators, which this run did not measure.
        asked_ops = set(plan.operators)
        pending_other = [p for p in whole_plan.operators if p not in asked_ops and not store.has_operator(p)]
        # Complete = every point of the plan is in the store, whichever runs (--part, --ops)
        # measured them: a run of some operators into a store without the others is not complete,
        # one into a store that holds the whole plan leaves it complete.
        result.complete = not pending and not pending_other and not pending_c and not stopped
        asked = (pending if opts.part in ("all", "operators") else []) + \
            (pending_c if opts.part in ("all", "collectives") else [])
        result.part_complete = not asked and not stopped
        result.skipped = store.skipped
        label = f"{plan.name} ({', '.join(opts.ops)} only)" if opts.ops else plan.name
        plan_done = result.complete
        # The whole plan in the store: so are the points of every run of it, --ops or not (a label
        # "tiny (linear1 only)" left incomplete by an earlier perfcast is completed so too).
        covered = [p for p in store.meta.get("plans", [])
                   if p == plan.name or (p.startswith(f"{plan.name} (") and p.endswith(" only)"))]
        result.complete = store.mark_complete(plan_done, label, covers=covered)
        others = [p for p in store.incomplete_plans() if p != label]
        if plan_done and others:
            result.notes.append(f"plan {plan.name} is complete, but this store was also started with "
                                f"{', '.join(others)}, not complete: the store is not complete until "
                                "those are (run them again into it)")
    if ctx is not None:
        import torch.distributed as dist
        with signals_default():
            dist.barrier()
            dist.destroy_process_group()
    result.seconds = time.monotonic() - t_start
    return result


def measure_point(pt: OperatorPoint, device: str, warmup: int, repeats: int,
                  device_only: bool = False) -> tuple[str, object]:
    """("ok", {direction: µs}) or ("skip", reason) for one operator point."""
    try:
        kernel = build_kernel(pt.op, pt.shape_dict(), pt.precision, device)
        timings = kernel.time(warmup=warmup, repeats=repeats, device_only=device_only)
        del kernel
    except (RuntimeError, MemoryError, NotImplementedError, TypeError) as exc:
        if device == "cuda":
            torch.cuda.empty_cache()
        return "skip", ("out of memory" if _is_oom(exc) else f"{type(exc).__name__}: {exc}")
    return "ok", {d: t.us for d, t in timings.items()}


def _operator_worker(rank: int, world: int, device: str, threads: int, points: list[OperatorPoint],
                     warmup: int, repeats: int, results, device_only: bool = False,
                     parent_pid: int | None = None) -> None:
    """One local rank measuring its share (every world-th point); results stream to the parent."""
    # Ctrl-C and SIGTERM are the parent's to handle: it kills its workers and keeps what they
    # measured (_spawn_operators), so none of them prints a traceback.
    quiet_worker_signals(parent_pid, (signal.SIGINT, signal.SIGTERM))
    warnings.filterwarnings("ignore")
    if device == "cuda":
        torch.cuda.set_device(rank)
    elif threads:
        torch.set_num_threads(threads)
    for pt in points[rank::world]:
        kind, value = measure_point(pt, device, warmup, repeats, device_only)
        results.put((kind, pt, value))


def _measure_operators(plan: Plan, points: Sequence[OperatorPoint], store: SampleStore,
                       opts: RunOptions, result: RunResult, budget_points: int,
                       local_ranks: int = 1, threads: int = 0, deadline: float = math.inf) -> bool:
    """Measure the points not yet in the store; True when stopped early (``stop_after``).

    With several local ranks the points are shared out over that many processes (one per GPU,
    or one per share of the cores): the calibration runs that many times faster, and every
    kernel is timed while the other ranks of the node are busy too, as in training (shared
    memory bandwidth, power and thermal limits).
    """
    todo = [p for p in points if not store.has_operator(p)]
    result.already_done += len(points) - len(todo)
    if result.already_done:
        log.info("resuming: %d operator points already measured, %d to go", result.already_done, len(todo))
    if not todo:
        return False
    bar = _bar(len(todo), "operators", opts.progress)

    def record(kind: str, pt: OperatorPoint, value) -> None:
        if kind == "ok":
            store.record_operator(pt, value)
            result.measured_operators += 1
        else:
            store.record_skip("operator", pt, str(value))
        bar.update(1)

    def budget_spent() -> bool:
        return bool(budget_points) and result.measured_operators + result.measured_collectives >= budget_points

    def past_deadline() -> bool:
        return time.monotonic() > deadline

    try:
        if local_ranks <= 1 or len(todo) < 2:
            for pt in todo:
                if budget_spent():
                    return True
                if past_deadline():
                    break
                bar.set_postfix_str(f"{pt.op} {pt.precision}")
                kind, value = measure_point(pt, opts.device, plan.warmup, plan.repeats, opts.timing == "device")
                record(kind, pt, value)
            return False
        if _spawn_operators(todo, plan, opts, local_ranks, threads, record, budget_spent, past_deadline):
            return not past_deadline()
        return False
    finally:
        bar.close()


def _spawn_operators(todo: list[OperatorPoint], plan: Plan, opts: RunOptions, world: int, threads: int,
                     record, budget_spent, past_deadline) -> bool:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    proc = None
    stopped = False

    def drain() -> bool:
        while not results.empty():
            if budget_spent():
                return True
            kind, pt, value = results.get()
            record(kind, pt, value)
        return budget_spent() or past_deadline()
    try:
        # The workers start with SIGINT and SIGTERM blocked, then leave them to this process
        # (_operator_worker); a Ctrl-C meanwhile is raised once they have started, inside the try.
        with spawning_workers():
            proc = mp.start_processes(_operator_worker,
                                      args=(world, opts.device, threads, todo, plan.warmup, plan.repeats,
                                            results, opts.timing == "device", os.getpid()),
                                      nprocs=world, join=False, start_method="spawn")
        while not proc.join(timeout=0.2):
            if drain():
                stopped = True
                break
        stopped = stopped or drain()
    except mp.ProcessRaisedException as exc:
        drain()
        raise CalibrationError(f"an operator rank failed: {str(exc).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as exc:
        drain()
        raise CalibrationError(f"an operator rank died: {exc}") from None
    finally:
        # stop_after, an error, Ctrl-C or SIGTERM: what was recorded stays, the rest is resumed.
        # The workers leave both signals to this process, so they are killed; a second Ctrl-C
        # waits for that.
        with signals_held():
            for p in proc.processes if proc is not None else ():
                if p.is_alive():
                    p.kill()
                    p.join()
            results.close()
    return stopped


def _adaptive_rounds(plan: Plan, store: SampleStore, spec: DeviceSpec, opts: RunOptions,
                     result: RunResult, t_start: float, budget_points: int, op_ranks: int,
                     threads: int) -> bool:
    from predictor.samples import load_samples

    from .adaptive import next_round

    gpus = max(1, plan.allocation.ranks) if opts.device == "cuda" else 1
    budget_s = plan.budget_gpu_minutes * 60.0 / gpus
    for round_no in range(1, 20):
        left = budget_s - (time.monotonic() - t_start) - result.cost.collective_seconds
        if left <= 0.05 * budget_s or not plan.candidates:
            break
        # Device-seconds: the local ranks measure side by side.
        pts = next_round(plan, load_samples(store.directory), spec.to_gpu_spec(), opts.device,
                         min(left, budget_s / 4.0) * max(1, op_ranks))
        if not pts:
            break
        log.info("adaptive round %d: %d points (%.1f device-minutes left)", round_no, len(pts), left / 60)
        plan.operators.extend(pts)
        deadline = t_start + budget_s - result.cost.collective_seconds
        if _measure_operators(plan, pts, store, opts, result, budget_points, op_ranks, threads, deadline):
            return True
        if time.monotonic() > deadline:
            _drop_unmeasured(plan, store)
            break
    return False


def _drop_unmeasured(plan: Plan, store: SampleStore) -> None:
    before = len(plan.operators)
    plan.operators = [p for p in plan.operators if store.has_operator(p)]
    if before > len(plan.operators):
        log.info("adaptive budget spent: %d planned points not measured", before - len(plan.operators))


def _measure_collectives(plan: Plan, store: SampleStore | None, opts: RunOptions, result: RunResult,
                         ctx, threads: int, local_ranks: int, budget_points: int) -> bool:
    if not plan.collectives:
        return False
    # Collectives need more warm-up than kernels (connection set-up, first-touch of buffers) and
    # are noisier; they are also cheap at the sizes measured, so both counts get a floor.
    warmup, repeats = max(plan.warmup, 5), max(plan.repeats, 10)
    if ctx is not None:
        todo = [c for c in plan.collectives if store is not None and not store.has_collective(c)]
        with signals_default():
            todo = agree_on_points(ctx, todo)
        bar = _bar(len(todo), "collectives", opts.progress and ctx.rank == 0)

        def report(p, us):
            assert store is not None
            store.record_collective(p, us)
            result.measured_collectives += 1
            bar.update(1)
        try:
            with signals_default():      # collectives and barriers wait in C++ (signals_default)
                run_points(ctx, todo, warmup, repeats, report)
        finally:
            bar.close()
        return False
    assert store is not None
    if local_ranks < 2:
        log.warning("collectives skipped: one local rank (use srun/torchrun, or --ranks 2 or more)")
        result.notes.append("collectives not measured: a single rank")
        return False
    todo = [c for c in plan.collectives if not store.has_collective(c)]
    result.already_done += len(plan.collectives) - len(todo)
    if budget_points:
        room = budget_points - result.measured_operators
        if room <= 0:
            return True
        if room < len(todo):
            todo = todo[:room]
            stopped = True
        else:
            stopped = False
    else:
        stopped = False
    if not todo:
        return stopped
    bar = _bar(len(todo), "collectives", opts.progress)

    def on_result(p, us):
        store.record_collective(p, us)
        result.measured_collectives += 1
        bar.update(1)
    try:
        spawn_local(local_ranks, opts.device, todo, warmup=warmup, repeats=repeats,
                    threads=threads, on_result=on_result)
    finally:
        bar.close()
    return stopped


__all__ = ["RunOptions", "RunResult", "run_calibration", "PARTS"]
