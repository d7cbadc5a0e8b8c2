"""How a framework passes tensors between pipeline stages (predictor.recipe.pipeline_sends)."""
from __future__ import annotations

import pytest

from predictor import TrainingJob, predict
from predictor.estimate import QuerySet, _plan
from predictor.recipe import gradient_reduction, micro_batch_recipe, pipeline_sends

from .conftest import make_job

TOKENS_X_HIDDEN = 4 * 2048 * 6144         # micro-batch 4, seq 2048, hidden 6144


def _job(framework: str = "", **layout) -> TrainingJob:
    job = make_job(**layout)
    return TrainingJob.from_dict({**job.to_dict(), "run": {"train_iters": 100, "framework": framework}})


def _sends(job: TrainingJob, framework: str = ""):
    return pipeline_sends(micro_batch_recipe(job.model, job.layout), job.layout, framework)


@pytest.mark.parametrize("framework", ["neox", "deepspeed", "megatron-deepspeed"])
def test_deepspeeds_engine_sends_a_tp_shard_and_the_receiver_gathers_it(framework):
    job = _job(framework, tp=4)
    s = _sends(job, framework)
    assert s.send_entries == TOKENS_X_HIDDEN / 4
    assert s.gather_entries == TOKENS_X_HIDDEN / 4      # an all-gather's entries: one rank's shard


@pytest.mark.parametrize("framework", ["megatron", "nemo", "torchtitan"])
def test_megatron_core_sends_the_whole_tensor_from_every_tp_rank(framework):
    job = _job(framework, tp=4, pipe_split="megatron")
    s = _sends(job, framework)
    assert (s.send_entries, s.gather_entries) == (TOKENS_X_HIDDEN, 0.0)
    sp = _job(framework, tp=4, pipe_split="megatron", sequence_parallel=True)
    s = _sends(sp, framework)
    assert (s.send_entries, s.gather_entries) == (TOKENS_X_HIDDEN / 4, 0.0)


def test_a_job_that_names_no_framework_follows_its_split_rule():
    ds = _job("", tp=4)                                  # pipe_split "neox", the default
    mg = _job("", tp=4, pipe_split="megatron")
    assert _sends(ds).gather_entries == TOKENS_X_HIDDEN / 4
    assert _sends(mg).gather_entries == 0.0


def test_without_tensor_parallelism_there_is_nothing_to_partition():
    job = _job("neox", tp=1, dp=32)
    s = _sends(job, "neox")
    assert (s.send_entries, s.gather_entries) == (TOKENS_X_HIDDEN, 0.0)


def _asked(job, plat):
    q = QuerySet(plat)
    _plan(job, plat, q)
    return {(kind, entries, group.nodes, group.gpus_per_node)
            for _, kind, _, entries, group in q._coll_rows}


def test_the_prediction_costs_the_shard_send_and_the_tp_all_gather(perlmutter):
    ds = _asked(_job("neox", tp=4), perlmutter)
    mg = _asked(_job("megatron", tp=4, pipe_split="megatron"), perlmutter)
    # tp = 4 inside one Perlmutter node; the stages span nodes.
    assert ("p2p", TOKENS_X_HIDDEN / 4, 2, 1) in ds
    assert ("allgather", TOKENS_X_HIDDEN / 4, 1, 4) in ds
    assert ("p2p", TOKENS_X_HIDDEN, 2, 1) in mg
    assert not any(kind == "allgather" and nodes == 1 and gpn == 4 for kind, _, nodes, gpn in mg)


def test_first_and_last_stage_gather_only_what_they_receive(perlmutter):
    job = _job("neox", tp=4)
    plan = _plan(job, perlmutter, QuerySet(perlmutter))
    # Stage 0 receives no activation but a gradient; the last stage the reverse; the middle both.
    sends_f = [len(pf.parts) for pf, _ in plan.p2p]
    sends_b = [len(pb.parts) for _, pb in plan.p2p]
    assert sends_f == [1, 2, 2, 1]       # send forward (all but last) + gather (all but first)
    assert sends_b == [1, 2, 2, 1]       # send backward (all but first) + gather (all but last)


def test_partitioning_changes_the_pipeline_part_only(perlmutter):
    # ZeRO-0: both all-reduce their gradients (gradient_reduction below).
    ds = predict(_job("neox", tp=4, pipe_split="megatron", zero_stage=0), perlmutter)
    mg = predict(_job("megatron", tp=4, pipe_split="megatron", zero_stage=0), perlmutter)
    assert ds.breakdown.pp_p2p_seconds != mg.breakdown.pp_p2p_seconds
    assert ds.breakdown.tp_allreduce_seconds == pytest.approx(mg.breakdown.tp_allreduce_seconds)
    assert ds.breakdown.gradient_reduce_seconds == pytest.approx(mg.breakdown.gradient_reduce_seconds)


@pytest.mark.parametrize("framework, zero, kind", [
    ("megatron", 1, "reduce_scatter"), ("nemo", 1, "reduce_scatter"), ("megatron", 0, "allreduce"),
    ("neox", 1, "allreduce"), ("megatron-deepspeed", 1, "allreduce"), ("neox", 2, "reduce_scatter"),
    ("", 1, "allreduce")])
def test_gradient_reduction_follows_the_framework(framework, zero, kind, perlmutter):
    split = "megatron" if framework in ("megatron", "nemo") else "neox"
    # DeepSpeed refuses ZeRO-2 with a pipeline: one stage, the same 8 × 1 dp group.
    pp = 1 if zero >= 2 else 4
    job = _job(framework, zero_stage=zero, pipe_split=split, pp=pp, dp=8)
    assert gradient_reduction(job.layout, framework) == kind
    # ... and is what the prediction asks the collective models for, over the dp group.
    kinds = {k for k, _, nodes, gpn in _asked(job, perlmutter) if (nodes, gpn) == (8, 1)}
    assert kind in kinds and ({"allreduce", "reduce_scatter"} - {kind}).isdisjoint(kinds)
