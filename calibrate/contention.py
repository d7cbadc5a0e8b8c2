"""What a second rank's compute on the same CPU costs the first (``bench_cpu_family.py --contention``).

``perf-calibrate run`` times operators with the other cores idle, as a dp 1 run of the CPU family
runs; in a dp 2 run the other rank computes the same micro-batches at the same time.  The ratio of
the two timings is what a dp 2 run's compute costs beyond its calibrated operators on this machine;
the predictor has no term for it (docs/calibration.md).
"""
from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from .cpu_load import cpu_seconds, process_cpu_seconds


@dataclass
class Slowdown:
    """Seconds of one rank's forward + backward of its micro-batches, per repetition kept, alone
    and beside a concurrent copy; repetitions dropped for other processes' load, and every
    repetition's other processes' cores; fastest-quarter means and their ratio."""

    alone: list[float] = field(default_factory=list)
    concurrent: list[float] = field(default_factory=list)
    dropped: int = 0
    others_cores: list[float] = field(default_factory=list)
    alone_seconds: float = math.nan
    concurrent_seconds: float = math.nan
    ratio: float = math.nan


def loader_worker(job_dict: dict, threads: int, running: Any, idle: Any, stop: Any) -> None:
    """Another rank's compute without gloo: the same micro-batches' forward + backward, in a loop
    while ``running`` is set (``idle`` acknowledges a pause) until ``stop`` is."""
    import torch

    from predictor import TrainingJob

    from .gpt_model import rank_state

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    st = rank_state(TrainingJob.from_dict(job_dict), "cpu", 1, 0)
    while not stop.is_set():
        if running.is_set():
            idle.clear()
            for ids, tgt in st.batches:
                st.model.loss(ids, tgt).backward()
        else:
            idle.set()
            time.sleep(0.002)


def concurrent_slowdown(job_dict: dict, *, threads: int, rounds: int = 6, per_phase: int = 3,
                        max_others: float = 0.15) -> Slowdown:
    """One rank's forward + backward of its micro-batches timed alone and while another process
    runs the same rank's micro-batches, in alternating phases.  Repetitions during which other
    processes used more than ``max_others`` cores are dropped."""
    import multiprocessing as mpp

    import torch

    from predictor import TrainingJob

    from .gpt_model import rank_state
    from .timing import fastest_quarter_mean

    torch.set_num_threads(threads)
    st = rank_state(TrainingJob.from_dict(job_dict), "cpu", 1, 0)

    def fb() -> None:
        for ids, tgt in st.batches:
            st.model.loss(ids, tgt).backward()

    ctx = mpp.get_context("spawn")
    running, idle, stop = ctx.Event(), ctx.Event(), ctx.Event()
    child = ctx.Process(target=loader_worker, args=(job_dict, threads, running, idle, stop), daemon=True)
    child.start()
    out = Slowdown()
    try:
        idle.wait(300)
        fb()
        for _ in range(rounds):
            for phase in ("alone", "concurrent"):
                if phase == "concurrent":
                    running.set()
                    time.sleep(0.2)
                else:
                    running.clear()
                    idle.clear()
                    idle.wait(300)
                for _ in range(per_phase):
                    c0 = cpu_seconds().machine
                    o0 = process_cpu_seconds(os.getpid()) + process_cpu_seconds(child.pid)
                    t0 = time.perf_counter()
                    fb()
                    dt = time.perf_counter() - t0
                    others = (cpu_seconds().machine - c0
                              - (process_cpu_seconds(os.getpid()) + process_cpu_seconds(child.pid) - o0)) / dt
                    out.others_cores.append(round(others, 3))
                    if others <= max_others:
                        getattr(out, phase).append(dt)
                    else:
                        out.dropped += 1
    finally:
        stop.set()
        running.clear()
        child.join(10)
        if child.is_alive():
            child.terminate()
    out.alone_seconds = fastest_quarter_mean(out.alone) if out.alone else math.nan
    out.concurrent_seconds = fastest_quarter_mean(out.concurrent) if out.concurrent else math.nan
    out.ratio = out.concurrent_seconds / out.alone_seconds
    return out
