"""Timing a kernel the way the paper does: warm up, repeat, keep a robust statistic.

On CUDA each repetition is bracketed by CUDA events (device time, no host jitter); on CPU by
``perf_counter`` (the work is synchronous there).  An isolated call bracketed so still holds the
host's issue time wherever the host issues slower than the device runs (the events wait for the
host's kernels); ``queue_behind_seconds`` first queues a device-side sleep that outlasts the
host's issue, so the call's kernels are all queued when the start event fires and the repetition
is the device's time alone (``perf-calibrate run --timing device``).  The statistic (:func:`robust_seconds`) is the
mean of the middle half of the repetitions on a GPU, which drops both the cold outliers and the
preempted ones.  On a CPU it is the mean of the fastest quarter: there the cores are shared with
whatever else runs, which only ever *adds* time, and for longer than ten repetitions last (on the
shared CI-class machine, other tenants inflated middle-half samples 2.5-2.9x against the same
kernel re-timed alone: benchmarks/bench_cpu_family.py --parts).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class Timing:
    """A robust duration and the raw repetitions it came from."""

    seconds: float
    samples: tuple[float, ...]

    @property
    def us(self) -> float:
        return self.seconds * 1e6


def middle_half_mean(values: "list[float] | tuple[float, ...]") -> float:
    """Mean of the middle half (interquartile mean); the plain mean below four values."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        raise ValueError("no repetitions to summarise")
    if n < 4:
        return sum(v) / n
    lo, hi = n // 4, n - n // 4
    mid = v[lo:hi]
    return sum(mid) / len(mid)


def fastest_quarter_mean(values: "list[float] | tuple[float, ...]") -> float:
    """Mean of the fastest quarter of the repetitions (at least one)."""
    v = sorted(values)
    if not v:
        raise ValueError("no repetitions to summarise")
    k = max(1, len(v) // 4)
    return sum(v[:k]) / k


def robust_seconds(values: "list[float] | tuple[float, ...]", device: str) -> float:
    """The module's statistic for ``device``: see the module docstring."""
    return middle_half_mean(values) if device == "cuda" else fastest_quarter_mean(values)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(step: Callable[[], None], steps: int, warmup: int, device: str = "cpu",
               before: Callable[[], None] | None = None) -> list[float]:
    """Wall seconds of ``steps`` training steps after ``warmup`` more: each begins after
    ``before`` (the ranks' barrier) with the device's queue drained, and ends when the device is
    done with it."""
    times: list[float] = []
    for s in range(warmup + steps):
        if before is not None:
            before()
        synchronize(device)
        t0 = time.perf_counter()
        step()
        synchronize(device)
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return times


_SLEEP_CYCLES_PER_SECOND: list[float] = []


def queue_behind(seconds: float) -> None:
    """Keep the current CUDA stream busy for about ``seconds`` (``torch.cuda._sleep`` spins a
    number of GPU clock cycles; the rate is measured once)."""
    if not _SLEEP_CYCLES_PER_SECOND:
        # The highest clock of three: a rate read at a low idle clock would make every later
        # sleep at the boost clock shorter than asked.
        rates = []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
            end.synchronize()
            rates.append(1_000_000 / max(start.elapsed_time(end) / 1e3, 1e-6))
        _SLEEP_CYCLES_PER_SECOND.append(max(rates))
    torch.cuda._sleep(int(seconds * _SLEEP_CYCLES_PER_SECOND[0]))


def measure(fn: Callable[[], object], device: str, *, warmup: int = 3, repeats: int = 10,
            setup: Callable[[], object] | None = None, queue_behind_seconds: float = 0.0) -> Timing:
    """Time ``fn`` (after ``warmup`` untimed calls) ``repeats`` times.

    ``setup`` runs before every call, untimed (e.g. zeroing gradients).  ``queue_behind_seconds``
    (CUDA only): each timed call waits behind a device-side sleep this long, so the events time
    the device alone (module docstring).
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    for _ in range(max(0, warmup)):
        if setup is not None:
            setup()
        fn()
    synchronize(device)
    out: list[float] = []
    if device == "cuda":
        for _ in range(repeats):
            if setup is not None:
                setup()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if queue_behind_seconds > 0.0:
                queue_behind(queue_behind_seconds)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            if setup is not None:
                setup()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return Timing(robust_seconds(out, device), tuple(out))
