"""calibrate/engine_host.py: DeepSpeed's engine and the plain loop it is compared with, run for real
on this CPU (one gloo rank).  What is asserted holds on any machine: both train and are timed."""
from __future__ import annotations

import math

import pytest


def test_deepspeed_engine_and_plain_loop_are_both_timed():
    pytest.importorskip("torch", reason="the measurement trains with torch (the calibrate extra)")
    pytest.importorskip("deepspeed", reason="DeepSpeed's engine is what is measured")
    from calibrate.engine_host import measure
    ds_ms, plain_ms = measure("engine", layers=1, m=2, steps=3, warmup=1)
    assert math.isfinite(ds_ms) and math.isfinite(plain_ms)
    assert ds_ms > 0 and plain_ms > 0


def test_unknown_mode_is_refused_before_anything_runs():
    pytest.importorskip("torch", reason="calibrate.engine_host imports torch")
    from calibrate.engine_host import measure_mode
    with pytest.raises(ValueError, match="unknown mode 'pipe3'"):
        measure_mode("pipe3", steps=1, warmup=0)


def test_what_a_gpu_cannot_run_is_refused_before_anything_runs():
    # pipe2's two ranks need two GPUs (NCCL refuses two ranks on one); no machine check is needed
    # to refuse it, nor an unknown device.
    pytest.importorskip("torch", reason="calibrate.engine_host imports torch")
    from calibrate.engine_host import check_device, measure, measure_mode
    with pytest.raises(ValueError, match="'pipe2' on cuda needs two GPUs"):
        measure_mode("pipe2", steps=1, warmup=0, device="cuda")
    with pytest.raises(ValueError, match="'pipe2' on cuda needs two GPUs"):
        measure("pipe2", layers=1, m=2, steps=1, warmup=0, device="cuda")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        measure_mode("engine", steps=1, warmup=0, device="tpu")
    check_device("pipe2", "cpu")
    check_device("engine", "cuda")


def test_block_keeps_the_activation_shape():
    torch = pytest.importorskip("torch", reason="calibrate.engine_host imports torch")
    from calibrate.engine_host import HIDDEN, TOKENS, Block
    x = torch.randn(1, TOKENS, HIDDEN)
    assert Block()(x).shape == x.shape
