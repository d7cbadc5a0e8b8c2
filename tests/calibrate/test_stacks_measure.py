"""calibrate/stacks.py's measure_stack: the CPU family's model trained under each stack on gloo.

Nothing here depends on how fast the machine is: that each stack trains, times every step and
counts the same parameters.
"""
from __future__ import annotations

import math

import pytest

JOB = {"model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 256,
                 "attention": "fused_softmax", "pos_emb": "rotary"},
       "layout": {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 2, "micro_batches": 2, "zero_stage": 1,
                  "recompute": "none"},
       "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 2}}


@pytest.fixture(autouse=True)
def _needs_torch():
    # Each test skips on its own, with the reason, where torch is absent.
    pytest.importorskip("torch", reason="training the model needs torch (the calibrate extra)")


@pytest.mark.parametrize("stack", ["pytorch", "fsdp", "deepspeed"])
def test_each_stack_trains_and_times_every_step(stack):
    if stack == "deepspeed":
        pytest.importorskip("deepspeed", reason="the deepspeed stack needs the deepspeed package")
    from calibrate.cpu_family import stack_job
    from calibrate.stacks import measure_stack

    secs, steps, params = measure_stack(stack_job(JOB, stack), stack, threads=1, steps=2, warmup=1,
                                        timeout_s=300.0)
    assert len(steps) == 2 and all(s > 0 for s in steps)
    assert math.isfinite(secs) and min(steps) <= secs <= max(steps)
    from calibrate.gpt_model import FlatGPT
    from predictor import TrainingJob
    assert params == FlatGPT(TrainingJob.from_dict(JOB), "cpu", 1).numel


def test_an_unknown_stack_is_refused():
    import queue

    from calibrate.errors import CalibrationError
    from calibrate.stacks import stack_worker

    with pytest.raises(CalibrationError, match="stack 'ddp'"):
        stack_worker(0, 1, 0, JOB, "ddp", 1, 1, 0, queue.SimpleQueue())
