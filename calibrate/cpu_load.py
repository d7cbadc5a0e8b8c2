"""What else used this machine's CPUs while a measurement ran (Linux /proc, getrusage).

A CPU measurement shares its cores with whatever else runs; these readings are recorded next to
it (the load average also counts the measurement's own ranks, and lags).
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class CpuSeconds:
    """CPU seconds every process of the machine has used (``machine``, nan where /proc/stat is
    unreadable), and of those this process and its finished children (``own``)."""

    machine: float
    own: float


def loadavg() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def cpu_seconds() -> CpuSeconds:
    """A reading for :func:`others_cores`."""
    own = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
    try:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        busy = (sum(v) - v[3] - (v[4] if len(v) > 4 else 0.0)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    return CpuSeconds(busy, own)


def others_cores(before: CpuSeconds, after: CpuSeconds, wall_seconds: float) -> float:
    """Cores' worth of CPU that *other* processes used between two :func:`cpu_seconds` readings."""
    return max(0.0, ((after.machine - before.machine) - (after.own - before.own)) / max(wall_seconds, 1e-9))


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (its threads included), from /proc; nan if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (float(v[11]) + float(v[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


@dataclass(frozen=True)
class Competition:
    """What competed with one measurement: the highest 1-minute load average at its start or end
    (it counts the measurement's own processes too) and the cores other processes used."""

    load: float
    others_cores: float
    wall_seconds: float


def while_measuring(measure: Callable[[], T]) -> tuple[T, Competition]:
    """``measure()``'s result, and what else used the CPUs while it ran."""
    before = loadavg()
    c0 = cpu_seconds()
    t0 = time.monotonic()
    out = measure()
    wall = time.monotonic() - t0
    others = others_cores(c0, cpu_seconds(), wall)
    return out, Competition(max(before, loadavg()), others, wall)
