"""ZeRO-3 as PyTorch FSDP runs it: hybrid sharding (layout.dp_shard) and the reshard policy."""
from __future__ import annotations

import copy

import pytest

from predictor import TrainingJob, load_platform, predict
from predictor.errors import JobError
from predictor.recipe import groups, reshards_after_forward, shard_ranks

BASE = {"model": {"layers": 8, "hidden": 2048, "heads": 16, "seq_len": 2048, "attention": "flash"},
        "layout": {"dp": 16, "micro_batch": 1, "micro_batches": 2, "zero_stage": 3, "recompute": "none"},
        "run": {"precision": "bf16", "framework": "torchtitan"}, "cluster": {"gpus_per_node": 8}}


def _job(**layout) -> TrainingJob:
    d = copy.deepcopy(BASE)
    d["layout"].update(layout)
    return TrainingJob.from_dict(d, source="job.toml")


def test_hybrid_sharding_at_zero2_is_fsdps_only():
    ok = TrainingJob.from_dict({**BASE, "layout": {**BASE["layout"], "zero_stage": 2, "dp_shard": 8},
                                "run": {"precision": "bf16", "framework": "llm-foundry"}})
    assert ok.layout.dp_shard == 8
    with pytest.raises(JobError, match=r"layout.dp_shard: .*\(or 2 under llm-foundry or torchtitan\), "
                                       r"not 2 under 'deepspeed'"):
        TrainingJob.from_dict({**BASE, "layout": {**BASE["layout"], "zero_stage": 2, "dp_shard": 8},
                               "run": {"precision": "bf16", "framework": "deepspeed"}})


def test_keys_are_zero3_only_and_checked():
    with pytest.raises(JobError, match="layout.dp_shard: .*zero_stage = 3"):
        _job(zero_stage=1, dp_shard=8)
    with pytest.raises(JobError, match="layout.dp_shard: .*must divide dp"):
        _job(dp_shard=6)
    with pytest.raises(JobError, match="layout.reshard_after_forward: .*zero_stage = 3"):
        _job(zero_stage=2, reshard_after_forward="never")
    with pytest.raises(JobError, match="layout.reshard_after_forward: 'sometimes' is not one of"):
        _job(reshard_after_forward="sometimes")


def test_reshard_defaults_follow_the_framework():
    assert reshards_after_forward(_job().layout, "torchtitan")
    pp = TrainingJob.from_dict({**BASE, "layout": {**BASE["layout"], "pp": 2, "dp": 8}})
    assert not reshards_after_forward(pp.layout, "torchtitan")      # TorchTitan under PP
    assert reshards_after_forward(pp.layout, "deepspeed")
    assert reshards_after_forward(_job(reshard_after_forward="always").layout, "torchtitan")
    assert not reshards_after_forward(_job(reshard_after_forward="never").layout, "")


def test_keeping_layers_gathered_saves_a_gather_and_costs_memory():
    plat = load_platform("dgx-h100")
    always, never = predict(_job(reshard_after_forward="always"), plat), predict(_job(reshard_after_forward="never"), plat)
    assert never.iteration_seconds <= always.iteration_seconds
    assert never.stages()[0]["peak_memory_bytes"] > always.stages()[0]["peak_memory_bytes"]


def test_hybrid_sharding_shards_over_its_group_and_replicates_across():
    job = _job(dp_shard=8)
    g = groups(job, 8)
    assert (g["dp_shard"].nodes, g["dp_shard"].gpus_per_node) == (1, 8)       # inside a node
    assert (g["dp_replicate"].nodes, g["dp_replicate"].gpus_per_node) == (2, 1)
    assert shard_ranks(job.layout) == 8
    plat = load_platform("dgx-h100")
    hsdp, full = predict(job, plat), predict(_job(), plat)
    # Each GPU holds 1/8 of the model state (not 1/16), as an FSDP job on 8 ranks does.
    eight = TrainingJob.from_dict({**BASE, "layout": {**BASE["layout"], "dp": 8}})
    assert hsdp.stages()[0]["peak_memory_bytes"] == predict(eight, plat).stages()[0]["peak_memory_bytes"]
    assert hsdp.stages()[0]["peak_memory_bytes"] > full.stages()[0]["peak_memory_bytes"]
    assert hsdp.iteration_seconds != full.iteration_seconds
    assert "dp_shard" not in groups(_job(), 8)


def test_fsdp2_copies_follow_its_collectives_bytes():
    from predictor.operators import BYTES_PER_ELEMENT
    from predictor.recipe import fsdp2_shard_copies
    one = TrainingJob.from_dict({**BASE, "layout": {**BASE["layout"], "dp": 1}}).layout
    c1 = fsdp2_shard_copies(one, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT)
    # One rank: fp32 shard cast to bf16 (4 + 2), copied out (2 + 2), twice (reshard after
    # forward); gradients copied in as fp32 (2 + 4) and accumulated (3 x 4): 38 bytes per parameter.
    assert (c1.forward_bytes, c1.backward_bytes) == (10.0, 28.0)
    # Sixteen ranks: the shard-sized parts shrink, the full-sized copies stay.
    c16 = fsdp2_shard_copies(_job().layout, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT)
    assert c16.forward_bytes == pytest.approx(4 + 6 / 16) and c16.backward_bytes == pytest.approx(4 + 6 / 16 + 6 + 12 / 16)
    never = fsdp2_shard_copies(_job(reshard_after_forward="never").layout, "torchtitan", "bf16", "fp32",
                               BYTES_PER_ELEMENT)
    assert never.backward_bytes == pytest.approx(6 + 12 / 16)
    # ZeRO-2 (TorchTitan's reshard_after_forward = False): gathered once per micro-batch, as "never".
    two = fsdp2_shard_copies(_job(zero_stage=2).layout, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT)
    assert (two.forward_bytes, two.backward_bytes) == (never.forward_bytes, never.backward_bytes)
    # Not FSDP2, or not sharded: no such copies.
    assert fsdp2_shard_copies(_job().layout, "deepspeed", "bf16", "bf16", BYTES_PER_ELEMENT) is None
    assert fsdp2_shard_copies(_job(zero_stage=0).layout, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT) is None
    assert fsdp2_shard_copies(_job(zero_stage=1).layout, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT) is None


def test_fsdp2_copies_cost_memory_passes_each_micro_batch():
    plat = load_platform("dgx-h100")
    z3 = predict(_job(), plat)
    titan_off = predict(TrainingJob.from_dict({**BASE, "run": {"precision": "bf16", "framework": "deepspeed"}}), plat)
    assert z3.breakdown.forward_seconds > titan_off.breakdown.forward_seconds
    two = predict(_job(micro_batches=4), plat)
    # Twice the micro-batches, twice the copies (and twice the layers' work): the forward doubles.
    assert two.breakdown.forward_seconds == pytest.approx(2 * z3.breakdown.forward_seconds, rel=0.02)
