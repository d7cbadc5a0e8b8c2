"""calibrate/contention.py: one rank's compute timed alone and beside a concurrent copy.

Nothing here depends on how fast the machine is: that both phases are timed and summarised.
"""
from __future__ import annotations

import math

import pytest


@pytest.fixture(autouse=True)
def _needs_torch():
    # Each test skips on its own, with the reason, where torch is absent.
    pytest.importorskip("torch", reason="training the model needs torch (the calibrate extra)")


def test_concurrent_slowdown_times_both_phases():
    from calibrate.contention import concurrent_slowdown

    job = {"model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 256,
                     "attention": "fused_softmax", "pos_emb": "rotary"},
           "layout": {"pp": 1, "tp": 1, "dp": 2, "micro_batch": 2, "micro_batches": 2, "zero_stage": 1},
           "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 2}}
    r = concurrent_slowdown(job, threads=1, rounds=1, per_phase=2, max_others=math.inf)
    assert len(r.alone) == 2 and len(r.concurrent) == 2 and r.dropped == 0 and len(r.others_cores) == 4
    assert r.alone_seconds == min(r.alone) and r.concurrent_seconds == min(r.concurrent)
    assert r.ratio == pytest.approx(r.concurrent_seconds / r.alone_seconds) and r.ratio > 0
