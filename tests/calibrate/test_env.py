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


# ------------------------------------------------------------------ signals (calibrate.env)
class _Stop(Exception):
    pass


@pytest.fixture
def usr1():
    """SIGUSR1 raising _Stop, as SIGINT raises KeyboardInterrupt (not SIGINT itself: a failure
    would interrupt the test session)."""
    import signal

    def stop(signum, frame):
        raise _Stop()
    previous = signal.signal(signal.SIGUSR1, stop)
    yield signal.SIGUSR1
    signal.signal(signal.SIGUSR1, previous)


def test_a_held_signal_is_delivered_when_the_body_is_done(usr1):
    import os
    done = []
    with pytest.raises(_Stop):
        with env.signals_held((usr1,)):
            os.kill(os.getpid(), usr1)
            done.append("body")            # not cut short
    assert done == ["body"]


def test_a_held_signal_is_dropped_when_the_body_fails(usr1):
    import os
    with pytest.raises(ValueError):        # the body's own error, not the held signal's
        with env.signals_held((usr1,)):
            os.kill(os.getpid(), usr1)
            raise ValueError("stopping anyway")


def test_spawning_workers_hold_signals_and_block_them_for_children():
    import os
    import signal
    import subprocess
    import sys
    done = []
    with pytest.raises(KeyboardInterrupt):
        with env.spawning_workers():
            # A child started now begins with SIGINT and SIGTERM blocked ...
            mask = subprocess.run([sys.executable, "-c", "import signal; print(sorted(int(s) for s in "
                                   "signal.pthread_sigmask(signal.SIG_BLOCK, [])))"],
                                  capture_output=True, text=True, check=True).stdout
            # ... and a Ctrl-C for this process waits until the children are started.
            os.kill(os.getpid(), signal.SIGINT)
            done.append("body")
    assert done == ["body"]
    assert mask.strip() == str(sorted([int(signal.SIGINT), int(signal.SIGTERM)]))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert int(signal.SIGINT) not in {int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])}
