"""FSDP1's SHARD_GRAD_OP (llm-foundry's ZeRO-2) as PyTorch runs it: each layer gathered in the
forward of every micro-batch and kept for its backward, its gradients reduce-scattered after every
micro-batch's backward; DeepSpeed's ZeRO-2 reduces once per step and gathers after the step."""
from __future__ import annotations

import copy

import pytest

from predictor import TrainingJob, load_platform, predict
from predictor.estimate import QuerySet, _plan
from predictor.operators import BYTES_PER_ELEMENT
from predictor.recipe import (gathers_layers, gradient_precision, groups, layer_parameters,
                              reshards_after_forward, stage_parameter_counts)

GPN = 8
BASE = {"model": {"layers": 8, "hidden": 2048, "heads": 16, "seq_len": 2048, "attention": "flash"},
        "layout": {"dp": 16, "micro_batch": 1, "micro_batches": 2, "zero_stage": 2, "recompute": "none"},
        "run": {"precision": "bf16", "framework": "llm-foundry", "grad_reduce_precision": "fp32"},
        "cluster": {"gpus_per_node": GPN}}


@pytest.fixture(scope="module")
def plat():
    return load_platform("dgx-h100")


def _job(framework: str = "llm-foundry", **layout) -> TrainingJob:
    d = copy.deepcopy(BASE)
    d["layout"].update(layout)
    d["run"]["framework"] = framework
    return TrainingJob.from_dict(d, source="job.toml")


def _layer_collectives(job: TrainingJob, plat) -> tuple[float, float, float, float]:
    """One layer's all-gather and reduce-scatter, and the leftover bucket's (the stage's
    parameters beyond whole layers), as the collectives model costs them."""
    lay, prec = job.layout, job.run.precision
    dp = lay.dp * lay.cp
    group = groups(job, GPN)["dpcp"]
    scale = BYTES_PER_ELEMENT[gradient_precision(prec, lay, job.run.framework, job.run.grad_reduce_precision)] \
        / BYTES_PER_ELEMENT[prec]
    layer = layer_parameters(job.model, lay.tp)
    rest = stage_parameter_counts(job.model, lay)[0] % layer
    q = QuerySet(plat)
    hs = [q.coll("allgather", layer / dp, group, prec), q.coll("reduce_scatter", layer * scale, group, prec),
          q.coll("allgather", rest / dp, group, prec), q.coll("reduce_scatter", rest * scale, group, prec)]
    secs = q.evaluate()[0]
    return tuple(float(secs[h]) for h in hs)


def _whole_layers(job: TrainingJob) -> int:
    return stage_parameter_counts(job.model, job.layout)[0] // layer_parameters(job.model, job.layout.tp)


def test_fsdp1_zero2_gathers_layer_by_layer_and_keeps_the_forwards_gather():
    assert gathers_layers(_job().layout, "llm-foundry")
    assert not gathers_layers(_job().layout, "deepspeed")
    assert not gathers_layers(_job().layout, "")
    assert gathers_layers(_job(zero_stage=3).layout, "deepspeed")
    assert not gathers_layers(_job(zero_stage=1).layout, "llm-foundry")
    # SHARD_GRAD_OP is among FSDP1's strategies that do not reshard after forward; FULL_SHARD is not.
    assert not reshards_after_forward(_job().layout, "llm-foundry")
    assert reshards_after_forward(_job(zero_stage=3).layout, "llm-foundry")


def test_the_plan_has_per_layer_buckets_and_no_step_reduction(plat):
    job = _job()
    q = QuerySet(plat)
    plan = _plan(job, plat, q)
    assert not plan.regather_backward
    assert len(plan.sharded) == 1 and plan.buckets == []
    assert plan.sharded[0].bucket == layer_parameters(job.model, job.layout.tp)
    assert plan.stage_dp[0].parts == []                 # nothing reduced once per step
    assert [q.names_of([h]) for h, _ in plan.stage_update[0].parts] == [["optimizer"]]   # no gather after it
    ds_plan = _plan(_job("deepspeed"), plat, QuerySet(plat))
    assert ds_plan.sharded == [] and ds_plan.stage_dp[0].parts


@pytest.mark.parametrize("micro_batches", [2, 8])
def test_shard_grad_op_collectives_grow_with_the_micro_batches(plat, micro_batches):
    job = _job(micro_batches=micro_batches)
    g, c, g_rest, c_rest = _layer_collectives(job, plat)
    n = _whole_layers(job)
    p = predict(job, plat)
    # One gather (none again in backward) and one reduce-scatter per layer and micro-batch, each
    # hidden under the layers' work or exposed: together every micro-batch's serial cost.
    per_micro_batch = n * (g + c) + g_rest + c_rest
    assert p.breakdown.dp_exposed_seconds + p.details.dp_hidden_seconds == \
        pytest.approx(micro_batches * per_micro_batch, rel=1e-9)
    assert p.breakdown.gradient_reduce_seconds == 0.0


def test_deepspeed_zero2_reduces_every_micro_batch_and_zero1_once_per_step(plat):
    """DeepSpeed's ZeRO-2 keeps only its partition of the gradients, so it reduces each micro-batch's
    (DeepSpeed issue 2252), on the compute stream by default; ZeRO-1 reduces once, at the step."""
    from predictor.recipe import reduces_every_micro_batch
    two, eight = predict(_job("deepspeed"), plat), predict(_job("deepspeed", micro_batches=8), plat)
    assert reduces_every_micro_batch(_job("deepspeed").layout, "deepspeed")
    assert two.breakdown.gradient_reduce_seconds > 0
    # Two micro-batches' reductions against eight: the same reduction each time.
    assert eight.breakdown.gradient_reduce_seconds == pytest.approx(4 * two.breakdown.gradient_reduce_seconds)
    assert eight.iteration_seconds - 4 * two.iteration_seconds == pytest.approx(
        -3 * (two.breakdown.optimizer_seconds + two.breakdown.step_overhead_seconds), rel=1e-6)
    assert two.breakdown.optimizer_seconds == pytest.approx(eight.breakdown.optimizer_seconds)
    assert two.breakdown.dp_exposed_seconds == eight.breakdown.dp_exposed_seconds == 0.0
    assert two.details.dp_hidden_seconds == eight.details.dp_hidden_seconds == 0.0
    one2, one8 = (predict(_job("deepspeed", zero_stage=1, micro_batches=m), plat) for m in (2, 8))
    assert not reduces_every_micro_batch(_job("deepspeed", zero_stage=1).layout, "deepspeed")
    assert one2.breakdown.gradient_reduce_seconds > 0
    assert one2.breakdown.gradient_reduce_seconds == pytest.approx(one8.breakdown.gradient_reduce_seconds)
    # Neither FSDP (its own per-layer collectives) nor Megatron-core is DeepSpeed's ZeRO-2.
    for framework in ("llm-foundry", "torchtitan", "megatron"):
        assert not reduces_every_micro_batch(_job("deepspeed").layout, framework)
    # FSDP1's per-micro-batch collectives run per layer, under the compute.
    fsdp2, fsdp8 = predict(_job(), plat), predict(_job(micro_batches=8), plat)
    moved = [f.breakdown.dp_exposed_seconds + f.details.dp_hidden_seconds for f in (fsdp2, fsdp8)]
    assert moved[0] > 0 and moved[1] == pytest.approx(4 * moved[0], rel=1e-9)


def test_shard_grad_op_is_torchtitans_fsdp_without_reshard(plat):
    """The same collectives as FSDP2 with reshard_after_forward "never": one code path."""
    q = QuerySet(plat)
    foundry = _plan(_job(), plat, q)
    titan = _plan(_job("torchtitan", zero_stage=3, reshard_after_forward="never"), plat, q)
    assert not foundry.regather_backward and not titan.regather_backward
    assert [t.parts for t in foundry.sharded[0].terms] == [t.parts for t in titan.sharded[0].terms]
    assert [t.parts for t in foundry.stage_update] == [t.parts for t in titan.stage_update]
    # FULL_SHARD gathers again for the backward: one more gather per layer and micro-batch.
    job, full = _job(), _job(zero_stage=3)
    g, _, g_rest, _ = _layer_collectives(job, plat)
    p2, p3 = predict(job, plat), predict(full, plat)
    moved = [p.breakdown.dp_exposed_seconds + p.details.dp_hidden_seconds for p in (p2, p3)]
    assert moved[1] - moved[0] == pytest.approx(2 * (_whole_layers(job) * g + g_rest), rel=1e-9)
