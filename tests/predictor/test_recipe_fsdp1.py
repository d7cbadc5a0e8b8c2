"""FSDP1's own device copies (llm-foundry / Composer): recipe.fsdp1_shard_copies and their cost (counted
against torch's FSDP1 in tests/calibrate/test_fsdp1_copies.py)."""
from __future__ import annotations

import copy

import pytest

import predictor.estimate as estimate_module
from predictor import TrainingJob, load_platform, predict
from predictor.operators import BYTES_PER_ELEMENT
from predictor.recipe import (fsdp1_shard_copies, fsdp2_shard_copies, fsdp_shard_copies, gradient_divide_factors,
                              stage_parameter_counts)

MPT = {"model": {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 2048, "vocab": 50368, "attention": "flash",
                 "pos_emb": "alibi", "activation": "gelu", "norm": "layernorm"},
       "layout": {"dp": 16, "micro_batch": 8, "micro_batches": 4, "zero_stage": 3, "recompute": "full"},
       "run": {"precision": "bf16", "framework": "llm-foundry", "grad_reduce_precision": "fp32"},
       "cluster": {"gpus_per_node": 8}}
B = BYTES_PER_ELEMENT


def _job(run=None, **layout) -> TrainingJob:
    d = copy.deepcopy(MPT)
    d["layout"].update(layout)
    d["run"].update(run or {})
    return TrainingJob.from_dict(d, source="job.toml")


def _copies(reduce: str, param: str = "", **layout):
    return fsdp1_shard_copies(_job(**layout).layout, "llm-foundry", "bf16", reduce, B, param)


def test_divide_factors_split_the_ranks_as_fsdp1_does():
    # The largest power of two f dividing the ranks with f <= ranks / f, then the rest.
    assert [gradient_divide_factors(n) for n in (1, 2, 4, 8, 16, 64)] == \
        [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 8)]


@pytest.mark.parametrize("n", [8, 16, 64])
def test_sharded_bytes_per_parameter_by_mixed_precision(n):
    m = 4
    accumulating = (m - 1) / m            # every micro-batch but the step's first adds to the shard
    # DEFAULT (param bf16, reduce fp32, fp32 shards): the shard cast 4/N + 2/N in each gather;
    # backward: regather (FULL_SHARD), the flat gradient built from the views' gradients (2 + 2),
    # cast to fp32 (2 + 4), pre-divided (4 + 4), post-divided (2 x 4/N), accumulated (3 x 4/N).
    cast = (4 + 2) / n
    default = _copies("fp32", dp=n, micro_batches=m)
    assert default.forward_bytes == pytest.approx(cast)
    assert default.backward_bytes == pytest.approx(cast + 4 + 6 + 8 + 8 / n + accumulating * 12 / n)
    # PURE (all bf16): no cast to the reduce dtype; the divides move bf16; the reduced bf16 shard is
    # cast back to the fp32 shard (2/N + 4/N) before it is added.
    pure = _copies("bf16", dp=n, micro_batches=m)
    assert pure.forward_bytes == pytest.approx(cast)
    assert pure.backward_bytes == pytest.approx(cast + 4 + 4 + 4 / n + 6 / n + accumulating * 12 / n)
    # FULL (all fp32): no cast anywhere; every gradient pass is 4 bytes an element.
    full = _copies("fp32", "fp32", dp=n, micro_batches=m)
    assert full.forward_bytes == 0.0
    assert full.backward_bytes == pytest.approx(8 + 8 + 8 / n + accumulating * 12 / n)
    assert pure.backward_bytes < default.backward_bytes and full.backward_bytes < default.backward_bytes


def test_shard_grad_op_keeps_its_gather_for_the_backward():
    full_shard = _copies("fp32", dp=16, zero_stage=3)
    grad_op = _copies("fp32", dp=16, zero_stage=2)
    # SHARD_GRAD_OP gathers (and casts) once per micro-batch; FULL_SHARD again for the backward.
    assert grad_op.forward_bytes == full_shard.forward_bytes == pytest.approx(6 / 16)
    assert full_shard.backward_bytes - grad_op.backward_bytes == pytest.approx(6 / 16)
    # So does FULL_SHARD told not to reshard after the forward.
    kept = _copies("fp32", dp=16, zero_stage=3, reshard_after_forward="never")
    assert kept.backward_bytes == pytest.approx(grad_op.backward_bytes)


def test_one_rank_runs_no_shard():
    m = 4
    first, later = 1 / m, (m - 1) / m
    one = _copies("fp32", dp=1, micro_batches=m)
    sixteen = _copies("fp32", dp=16, micro_batches=m)
    # NO_SHARD casts the whole fp32 parameter to bf16 (4 + 2) for the forward and again for the
    # backward; the flat gradient (2 + 2) is cast to fp32 (2 + 4) in the first micro-batch, and later
    # ones add the new bf16 gradient into the kept fp32 one (4 + 2 + 4); nothing is divided.
    assert one.forward_bytes == 6.0
    assert one.backward_bytes == pytest.approx(6 + 4 + first * 6 + later * 10)
    # Sharded over 16 ranks the casts shrink to a shard's; the gradient's full-size passes stay.
    assert sixteen.forward_bytes == pytest.approx(one.forward_bytes / 16)
    # PURE on one rank: the kept fp32 gradient goes to bf16 for the reduction and back (4+2, 2+4).
    pure = _copies("bf16", dp=1, micro_batches=m)
    assert pure.backward_bytes == pytest.approx(6 + 4 + first * 6 + later * (10 + 12))


def test_only_fsdp1_frameworks_and_sharded_stages():
    lay = _job().layout
    assert fsdp1_shard_copies(lay, "torchtitan", "bf16", "fp32", B) is None
    assert fsdp1_shard_copies(_job(zero_stage=1).layout, "llm-foundry", "bf16", "fp32", B) is None
    assert fsdp1_shard_copies(_job(zero_stage=0).layout, "llm-foundry", "bf16", "fp32", B) is None
    # The dispatcher gives each framework its own FSDP's copies.
    assert fsdp_shard_copies(lay, "llm-foundry", "bf16", "fp32", B) == fsdp1_shard_copies(lay, "llm-foundry", "bf16",
                                                                                          "fp32", B)
    assert fsdp_shard_copies(lay, "torchtitan", "bf16", "fp32", B) == fsdp2_shard_copies(lay, "torchtitan", "bf16",
                                                                                         "fp32", B)
    assert fsdp_shard_copies(lay, "deepspeed", "bf16", "fp32", B) is None


def _without_copies(job, plat, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(estimate_module, "fsdp_shard_copies", lambda *a, **k: None)
        return predict(job, plat)


@pytest.mark.parametrize("layout", [dict(dp=1), dict(dp=16), dict(dp=16, zero_stage=2), dict(dp=16, dp_shard=8)])
def test_an_fsdp1_step_grows_by_its_copies_at_the_gpus_bandwidth(layout, monkeypatch):
    plat = load_platform("dgx-h100")
    job = _job(**layout)
    with_copies, without = predict(job, plat), _without_copies(job, plat, monkeypatch)
    c = fsdp1_shard_copies(job.layout, "llm-foundry", "bf16", "fp32", B)
    params = stage_parameter_counts(job.model, job.layout)[0]
    passes = job.layout.micro_batches * params * (c.forward_bytes + c.backward_bytes) / (plat.gpu.memory_gbps * 1e9)
    assert passes > 0
    assert with_copies.iteration_seconds - without.iteration_seconds == pytest.approx(passes, rel=1e-9)

