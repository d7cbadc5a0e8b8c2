"""calibrate/attention_timing.py: times forward and backward of a causal kernel (on a CPU here; the
GPU's CUDA events only on a GPU)."""
from __future__ import annotations

import pytest


def _attention_timing():
    """calibrate.attention_timing, skipping the test (alone) where torch is absent."""
    pytest.importorskip("torch", reason="attention timing runs torch (the calibrate extra)")
    from calibrate import attention_timing
    return attention_timing


def test_time_attention_runs_forward_and_backward_each_repeat():
    attention_timing = _attention_timing()
    import torch
    import torch.nn.functional as F

    calls = []

    def sdpa(q, k, v):
        calls.append(q.shape)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    fwd_ms, bwd_ms = attention_timing.time_attention(sdpa, 64, "cpu", torch.float32, repeats=3, warmup=1)
    assert fwd_ms > 0 and bwd_ms > 0
    assert calls == [torch.Size([1, 4, 64, 32])] * 4       # CPU smoke shape, warm-up + repeats


def test_events_ms_is_wall_clock_off_a_gpu():
    import time

    attention_timing = _attention_timing()
    assert attention_timing.events_ms("cpu", lambda: time.sleep(0.01)) >= 10.0


def test_math_kernel_stops_before_the_longest_sequences():
    attention_timing = _attention_timing()
    assert attention_timing.SEQS[0] <= attention_timing.MATH_MAX_SEQ < attention_timing.SEQS[-1]
