"""calibrate/stacks.py: the GPT module under DDP and FSDP2 computes what calibrate.gpt_model's loop does."""
from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="the stacks train with torch (the calibrate extra)")

from calibrate import stacks  # noqa: E402
from calibrate.errors import CalibrationError  # noqa: E402
from calibrate.gpt_model import FlatGPT, token_batches  # noqa: E402
from predictor.job import TrainingJob  # noqa: E402

JOB = {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256, "attention": "flash",
                 "activation": "gelu", "norm": "layernorm", "pos_emb": "rotary", "tied_embeddings": True},
       "layout": {"micro_batch": 2, "micro_batches": 2, "zero_stage": 1, "recompute": "none"},
       "run": {"precision": "fp32"}}


def test_module_loss_is_the_flat_models(one_rank):
    job = TrainingJob.from_dict(JOB)
    ids, tgt = token_batches(job, "cpu")[0]
    flat = FlatGPT(job, "cpu", 1, seed=0)
    module, _ = stacks.module_gpt(job, 1)
    assert sum(p.numel() for p in module.parameters()) == flat.numel
    assert torch.allclose(module(ids, tgt), flat.loss(ids, tgt), rtol=1e-5)


@pytest.mark.parametrize("stack", ["ddp", "fsdp", "fsdp1"])
def test_a_stack_step_trains(one_rank, stack):
    job = TrainingJob.from_dict(JOB)
    batches = token_batches(job, "cpu")
    step = stacks.stack_step(stack, job, batches, device="cpu")
    assert step.params == FlatGPT(job, "cpu", 1).numel
    module, _ = stacks.module_gpt(job, 1)
    with torch.no_grad():
        start = sum(float(module(i, t)) for i, t in batches)
        assert sum(float(step.forward(i, t)) for i, t in batches) == pytest.approx(start, rel=1e-5)
    for _ in range(3):
        step.gpt.begin_step()
        step.run()
    # The same batches again: the wrapped model learned them (its loss went down from the start's).
    with torch.no_grad():
        assert sum(float(step.forward(i, t)) for i, t in batches) < start


@pytest.mark.parametrize("stack, recompute", [("ddp", "none"), ("fsdp1", "none"), ("fsdp", "selective"),
                                               ("fsdp", "full"), ("ddp", "full")])
def test_the_wrappers_and_recomputation_keep_the_loss_and_gradients(one_rank, stack, recompute):
    """FSDP1 (its parameters swapped for views of the gathered flat parameter during the
    forward) and op-level or full recomputation give the plain module's loss and gradients, and
    the recomputation does run: each layer's forward twice per micro-batch."""
    job = TrainingJob.from_dict({**JOB, "layout": {**JOB["layout"], "recompute": recompute}})
    ids, tgt = token_batches(job, "cpu")[0]
    plain, _ = stacks.module_gpt(TrainingJob.from_dict(JOB), 1)
    loss = plain(ids, tgt)
    loss.backward()
    want = sum(float(p.grad.abs().sum()) for p in plain.parameters())
    step = stacks.stack_step(stack, job, [(ids, tgt)], device="cpu")
    step.gpt.begin_step()
    calls = []
    layer = step.gpt._layer
    step.gpt._layer = lambda i, x: calls.append(i) or layer(i, x)
    got = step.forward(ids, tgt)
    got.backward()
    assert float(got.detach()) == pytest.approx(float(loss.detach()), rel=1e-6)
    assert sum(float(p.grad.abs().sum()) for p in step.forward.parameters() if p.grad is not None) == \
        pytest.approx(want, rel=1e-5)
    layers = JOB["model"]["layers"]
    assert len(calls) == (layers if recompute == "none" else 2 * layers)


@pytest.mark.parametrize("preserve", [True, False])
def test_full_recomputation_keeps_the_rng_state_unless_told_not_to(one_rank, preserve):
    """TorchTitan's full AC (``bench_gpu_stacks.py --stacks fsdp+full:norng``) turns the wrapper's
    RNG-state preservation off; PyTorch's default (Composer's) keeps it."""
    job = TrainingJob.from_dict({**JOB, "layout": {**JOB["layout"], "recompute": "full"}})
    module, _ = stacks.module_gpt(job, 1, preserve_rng_state=preserve)
    assert all(layer.checkpoint_fn.keywords["preserve_rng_state"] is preserve for layer in module.layers)
    step = stacks.stack_step("ddp", job, token_batches(job, "cpu"), device="cpu", preserve_rng_state=preserve)
    assert all(layer.checkpoint_fn.keywords["preserve_rng_state"] is preserve
               for layer in step.forward.module.layers)


@pytest.mark.parametrize("stack, recompute, match", [
    ("ddp", "selective", "'selective' is TorchTitan's op-level checkpointing"),
    ("fsdp1", "full", "'fsdp1': layout.recompute = 'full' is not built"),
])
def test_recomputation_a_stack_does_not_run_is_refused(one_rank, stack, recompute, match):
    job = TrainingJob.from_dict({**JOB, "layout": {**JOB["layout"], "recompute": recompute}})
    with pytest.raises(CalibrationError, match=match):
        stacks.stack_step(stack, job, [], device="cpu")


def test_a_recomputation_the_modules_do_not_run_is_refused():
    job = TrainingJob.from_dict(JOB)
    bad = dataclasses.replace(job, layout=dataclasses.replace(job.layout, recompute="block"))
    with pytest.raises(CalibrationError, match="layout.recompute = 'block'"):
        stacks.module_gpt(bad, 1)


def test_unknown_stack_is_refused():
    with pytest.raises(CalibrationError, match="stack 'megatron'"):
        stacks.stack_step("megatron", TrainingJob.from_dict(JOB), [], device="cpu")


MEASURED_JOB = {"model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 256,
                          "attention": "fused_softmax", "pos_emb": "rotary"},
                "layout": {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 2, "micro_batches": 2, "zero_stage": 1,
                           "recompute": "none"},
                "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 2}}


@pytest.mark.parametrize("stack", ["pytorch", "fsdp"])
def test_measure_stack_trains_and_times_every_step(stack):
    # DeepSpeed's stack needs the deepspeed package, which is no dependency of the project.
    import math

    from calibrate.cpu_family import stack_job
    secs, steps, params = stacks.measure_stack(stack_job(MEASURED_JOB, stack), stack, threads=1, steps=2,
                                               warmup=1, timeout_s=300.0)
    assert len(steps) == 2 and all(s > 0 for s in steps)
    assert math.isfinite(secs) and min(steps) <= secs <= max(steps)
    assert params == FlatGPT(TrainingJob.from_dict(MEASURED_JOB), "cpu", 1).numel


def test_deepspeed_zero2_stack_trains_at_its_jobs_stage():
    """The ZeRO-2 stack is DeepSpeed's engine at the job's stage, on two gloo ranks."""
    import math

    pytest.importorskip("deepspeed", reason="DeepSpeed's engine is what is run (no dependency of perfcast)")
    from calibrate.cpu_family import stack_job
    job = {**MEASURED_JOB, "layout": {**MEASURED_JOB["layout"], "dp": 2}}
    secs, steps, params = stacks.measure_stack(stack_job(job, "deepspeed_zero2"), "deepspeed_zero2", threads=1,
                                               steps=2, warmup=1, timeout_s=300.0)
    assert len(steps) == 2 and all(s > 0 for s in steps) and math.isfinite(secs)
    assert params == FlatGPT(TrainingJob.from_dict(MEASURED_JOB), "cpu", 1).numel


def test_an_unknown_stack_worker_is_refused():
    import queue
    with pytest.raises(CalibrationError, match="stack 'ddp'"):
        stacks.stack_worker(0, 1, 0, MEASURED_JOB, "ddp", 1, 1, 0, queue.SimpleQueue())
