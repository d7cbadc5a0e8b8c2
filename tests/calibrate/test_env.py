"""calibrate/env.py: a probed device spec never rounds a slow peak to zero."""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="probing a device times it with torch (the calibrate extra)")

from calibrate import env, timing  # noqa: E402


def test_a_slow_probe_keeps_a_positive_peak(monkeypatch):
    # An emulated FP8 GEMM on a loaded CPU: 768^3 multiply-adds in 60 s is ~1.5e-5 TFLOP/s, which
    # rounding to decimals made 0 (and every roofline then divided by it).
    monkeypatch.setattr(timing, "measure", lambda fn, device, **kw: timing.Timing(60.0, (60.0,)))
    spec = env.probe_spec("cpu", ("fp32",))
    assert 0 < spec.tflops["fp32"] == pytest.approx(2 * 768**3 / 60.0 / 1e12, rel=1e-3)
    assert spec.memory_gbps > 0
