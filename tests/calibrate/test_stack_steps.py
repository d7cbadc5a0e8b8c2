"""calibrate/stack_steps.py: a job's steps under a stack, measured on a CPU (one gloo rank)."""
from __future__ import annotations

import pytest

from calibrate.train_family import quick_jobs


def _stack_steps():
    """calibrate.stack_steps, skipping the test (alone) where torch is absent."""
    pytest.importorskip("torch", reason="training steps run torch (the calibrate extra)")
    from calibrate import stack_steps
    return stack_steps


@pytest.mark.parametrize("stack", ["pytorch", "ddp"])
def test_one_stack_times_each_step_of_the_job(one_rank, stack):
    stack_steps = _stack_steps()
    name, job = quick_jobs()[0]
    row = stack_steps.one_stack(stack, job, "cpu", steps=3, warmup=1)
    assert len(row["steps"]) == 3 and all(s > 0 for s in row["steps"])
    assert min(row["steps"]) <= row["measured_iteration_seconds"] <= max(row["steps"])
    assert row["params"] > 0 and "peak_allocated_bytes" not in row      # a CPU has no allocator peak


def test_both_stacks_train_the_same_model(one_rank):
    stack_steps = _stack_steps()
    _, job = quick_jobs()[0]
    own = stack_steps.one_stack("pytorch", job, "cpu", steps=1, warmup=0)
    ddp = stack_steps.one_stack("ddp", job, "cpu", steps=1, warmup=0)
    assert own["params"] == ddp["params"]
