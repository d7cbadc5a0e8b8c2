"""calibrate/cpu_load.py: what other processes used of the CPUs, from two readings."""
from __future__ import annotations

import math
import os

from calibrate.cpu_load import CpuSeconds, cpu_seconds, loadavg, others_cores, process_cpu_seconds


def test_others_are_the_machine_s_cpu_less_this_process_s():
    before, after = CpuSeconds(100.0, 10.0), CpuSeconds(103.0, 11.0)
    assert others_cores(before, after, 2.0) == 1.0            # 3 s busy, 1 s ours, over 2 s
    assert others_cores(before, CpuSeconds(101.0, 12.0), 2.0) == 0.0    # never negative
    assert others_cores(before, after, 0.0) > 0               # no division by zero


def test_readings_come_from_this_machine():
    a = cpu_seconds()
    sum(i * i for i in range(200_000))
    b = cpu_seconds()
    assert b.own >= a.own >= 0.0
    assert math.isnan(a.machine) or b.machine >= a.machine
    assert process_cpu_seconds(os.getpid()) >= 0.0
    assert math.isnan(process_cpu_seconds(-1))
    assert loadavg() >= 0.0


def test_a_measurement_comes_back_with_what_competed_with_it():
    from calibrate.cpu_load import while_measuring

    out, busy = while_measuring(lambda: sum(i * i for i in range(200_000)))
    assert out == sum(i * i for i in range(200_000))
    assert busy.wall_seconds > 0 and busy.others_cores >= 0.0 and busy.load >= 0.0
