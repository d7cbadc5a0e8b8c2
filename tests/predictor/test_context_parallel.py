"""Context parallelism (layout.cp): the sequence split over cp ranks, ring attention, dp × cp."""
from __future__ import annotations

import pytest

from predictor import JobError, TrainingJob, load_platform, predict
from predictor import memory
from predictor.recipe import Group, groups

LLAMA8B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "seq_len": 8192,
           "vocab": 128256, "norm": "rmsnorm", "activation": "swiglu", "attention": "flash",
           "tied_embeddings": False}


def job(**layout):
    lay = {"pp": 1, "tp": 1, "dp": 8, "cp": 1, "micro_batch": 1, "micro_batches": 4, "zero_stage": 1,
           "recompute": "none"}
    lay.update(layout)
    return TrainingJob.from_dict({"model": LLAMA8B, "layout": lay, "run": {"precision": "bf16", "train_iters": 10},
                                  "cluster": {"gpus_per_node": 8}})


def test_gpus_count_cp_and_bad_cp_is_refused_naming_the_key():
    assert job(cp=4, dp=2).gpus == 8
    with pytest.raises(JobError, match="layout.cp"):
        TrainingJob.from_dict({"model": dict(LLAMA8B, seq_len=8190), "layout": {"cp": 2}})
    with pytest.raises(JobError, match="layout.cp"):
        TrainingJob.from_dict({"model": dict(LLAMA8B, attention="fused_softmax"), "layout": {"cp": 2}})
    with pytest.raises(JobError, match="layout.cp"):
        TrainingJob.from_dict({"model": LLAMA8B, "layout": {"cp": 0}})


def test_groups_follow_megatron_rank_order():
    g = groups(job(tp=2, cp=4, dp=4), 8)
    assert g["tp"] == Group(1, 2) and g["cp"] == Group(1, 4)
    assert g["dp"] == Group(4, 1)                 # dp ranks are tp × cp = 8 apart: one per node
    assert g["dpcp"].size == 16 and g["cp_ring"] == Group(1, 2)
    assert groups(job(tp=8, cp=2, dp=1), 8)["cp_ring"] == Group(2, 1)   # the ring leaves the node


def test_a_rank_does_its_share_of_the_tokens_and_of_the_attention():
    plat = load_platform("dgx-h100")
    # Same global batch and GPUs: cp = 2 halves each rank's tokens, doubles the ranks per sequence.
    base = predict(job(dp=8, micro_batches=4), plat)
    ctx = predict(job(dp=4, cp=2, micro_batches=8), plat)
    assert ctx.job.gpus == base.job.gpus == 8
    assert ctx.breakdown.cp_exposed_seconds >= 0.0
    # The work per sequence is the same, split differently: within a factor of the GEMMs'
    # efficiency at half the tokens, never half or double.
    assert 0.8 < ctx.iteration_seconds / base.iteration_seconds < 1.5


def test_cp_halves_activations_and_shards_the_optimizer_over_dp_times_cp():
    a1 = memory.layer_activation_bytes(job().model, job().layout, "bf16")
    a2 = memory.layer_activation_bytes(job(cp=2, dp=4).model, job(cp=2, dp=4).layout, "bf16")
    assert a2 == pytest.approx(a1 / 2, rel=0.02)
    m1 = memory.estimate(job(dp=2, cp=4).model, job(dp=2, cp=4).layout, "bf16")
    m2 = memory.estimate(job(dp=8).model, job(dp=8).layout, "bf16")
    assert m1.optimizer == pytest.approx(m2.optimizer)    # both sharded over 8 ranks
