"""Megatron-core's overlapped data parallelism: the closed forms against a bucket-by-bucket
replay, and what the predictor makes of layout.overlap_grad_reduce / overlap_param_gather."""
from __future__ import annotations

import random

import pytest

from predictor import JobError, TrainingJob, load_platform, predict
from predictor import overlap
from predictor.recipe import gradient_precision


def _replay_reduction(w, params, late, bucket, c_full, c_rest):
    """Each bucket (backward order: full ones, then the leftover) starts when its gradients are
    ready and the previous collective is done."""
    early = params - late
    bounds, start = [], 0
    while params - start >= bucket:
        bounds.append((start + bucket, c_full))
        start += bucket
    if params - start:
        bounds.append((params, c_rest))
    end = 0.0
    for stop, cost in bounds:
        ready = w if stop > early or not early else w * stop / early
        end = max(ready, end) + cost
    return max(0.0, end - w)


def _replay_gather(w, params, late, bucket, g_full, g_rest):
    """Forward order: the leftover (the embedding's end of the buffer) first; bucket k's forward
    waits for its gather and for bucket k − 1's forward; gather k + 1 is issued when bucket k's
    forward starts."""
    early = params - late
    rest = params % bucket
    spans = ([(0, rest, g_rest)] if rest else []) + \
        [(rest + j * bucket, rest + (j + 1) * bucket, g_full) for j in range(params // bucket)]
    per = w / early if early else 0.0
    issue, busy = 0.0, 0.0
    for lo, hi, g in spans:
        done = issue + g
        begin = max(done, busy)
        busy = begin + per * max(0, hi - max(lo, late))
        issue = max(begin, done)
    return max(0.0, busy - w)


@pytest.mark.parametrize("seed", range(40))
def test_closed_forms_match_a_bucket_by_bucket_replay(seed):
    rnd = random.Random(seed)
    bucket = rnd.choice([10, 40, 100])
    params = rnd.randint(1, 60) * bucket + rnd.choice([0, rnd.randint(1, bucket - 1)])
    late = rnd.choice([0, rnd.randint(0, params), min(params, 3 * bucket + 7)])
    w = rnd.uniform(0.1, 5.0)
    c, c_rest = rnd.uniform(0.0, 0.3), rnd.uniform(0.0, 0.3)
    got = overlap.exposed_reduction_seconds(w, params, late, bucket, c, c_rest)
    assert got == pytest.approx(_replay_reduction(w, params, late, bucket, c, c_rest), rel=1e-9, abs=1e-12)
    got = overlap.exposed_gather_seconds(w, params, late, bucket, c, c_rest)
    assert got == pytest.approx(_replay_gather(w, params, late, bucket, c, c_rest), rel=1e-9, abs=1e-12)


def test_bounds_of_the_exposed_time():
    # A single bucket cannot overlap anything; with many small ones only the last stays out;
    # a reduction slower than the backward shows its excess.
    assert overlap.exposed_reduction_seconds(1.0, 30, 0, 40, 0.5, 0.7) == pytest.approx(0.7)
    assert overlap.exposed_reduction_seconds(1.0, 400, 0, 40, 0.01, 0.0) == pytest.approx(0.01)
    slow = overlap.exposed_reduction_seconds(1.0, 400, 0, 40, 0.3, 0.0)
    assert slow == pytest.approx(10 * 0.3 + 0.1 - 1.0)
    # The first gather is always exposed; a fast one is all that shows.
    assert overlap.exposed_gather_seconds(1.0, 400, 0, 40, 0.01, 0.0) == pytest.approx(0.01)
    assert overlap.bucket_entries(8) == 40_000_000 and overlap.bucket_entries(128) == 128_000_000


def _job(**layout):
    lay = dict(pp=1, tp=1, cp=1, dp=16, micro_batch=1, micro_batches=4, zero_stage=1, recompute="none")
    lay.update(layout)
    return TrainingJob.from_dict({
        "model": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
                  "seq_len": 4096, "vocab": 128256, "norm": "rmsnorm", "activation": "swiglu",
                  "attention": "flash", "pos_emb": "rotary", "tied_embeddings": False},
        "layout": lay, "run": {"precision": "bf16", "framework": "megatron"}})


@pytest.fixture(scope="module")
def h100():
    return load_platform("dgx-h100")


def test_overlap_hides_communication_and_never_adds(h100):
    serial = predict(_job(), h100)
    grad = predict(_job(overlap_grad_reduce=True), h100)
    both = predict(_job(overlap_grad_reduce=True, overlap_param_gather=True), h100)
    b = serial.breakdown
    # Same compute; what the overlaps hide comes off the data-parallel lines only.
    assert grad.breakdown.forward_seconds == pytest.approx(b.forward_seconds)
    assert grad.breakdown.gradient_reduce_seconds < b.gradient_reduce_seconds
    assert both.breakdown.optimizer_seconds < grad.breakdown.optimizer_seconds
    assert both.iteration_seconds < grad.iteration_seconds < serial.iteration_seconds
    assert grad.details.dp_hidden_seconds > 0 and serial.details.dp_hidden_seconds == 0
    for p in (serial, grad, both):
        x = p.breakdown
        parts = (x.forward_seconds + x.backward_seconds + x.bubble_seconds + x.gradient_reduce_seconds
                 + x.optimizer_seconds + x.step_overhead_seconds)
        assert parts == pytest.approx(p.iteration_seconds)
        assert p.to_dict()["details"]["dp_hidden_seconds"] == p.details.dp_hidden_seconds


def test_gradients_reduce_in_the_frameworks_precision(h100):
    lay = _job().layout
    assert gradient_precision("bf16", lay, "megatron") == "fp32"
    assert gradient_precision("bf16", lay, "nemo") == "fp32"
    assert gradient_precision("bf16", lay, "neox") == "bf16"
    assert gradient_precision("fp16", lay, "megatron") == "fp16"
    assert gradient_precision("bf16", lay, "megatron", explicit="bf16") == "bf16"
    fp32 = predict(_job(), h100).breakdown.gradient_reduce_seconds
    bf16 = predict(_job().replace(run={"grad_reduce_precision": "bf16"}), h100).breakdown.gradient_reduce_seconds
    # Twice the bytes: the ring model's bandwidth term doubles, its latency term does not.
    assert 1.8 * bf16 < fp32 < 2.0 * bf16 + 1e-9


def test_later_stages_reduce_in_the_pipeline_drain(h100):
    # Stage i finishes its last backward i waves before stage 0 and reduces its gradients while
    # stage 0 is still busy: the same big stage costs the step less when it comes last.
    heavy_last = predict(_job(pp=2, dp=8, micro_batches=8, stage_layers=[1, 31]), h100)
    heavy_first = predict(_job(pp=2, dp=8, micro_batches=8, stage_layers=[31, 1]), h100)
    assert heavy_last.breakdown.gradient_reduce_seconds < 0.5 * heavy_first.breakdown.gradient_reduce_seconds


@pytest.mark.parametrize("layout, key, words", [
    ({"overlap_param_gather": True, "overlap_grad_reduce": False}, "layout.overlap_param_gather",
     "overlap_grad_reduce"),
    ({"overlap_param_gather": True, "overlap_grad_reduce": True, "zero_stage": 0},
     "layout.overlap_param_gather", "zero_stage = 1"),
    ({"overlap_grad_reduce": True, "zero_stage": 2}, "layout.overlap_grad_reduce", "ZeRO stage 2"),
])
def test_inconsistent_overlaps_are_refused_naming_the_key(layout, key, words):
    with pytest.raises(JobError) as exc:
        _job(**layout)
    assert exc.value.key == key and words in str(exc.value)


def test_deepspeed_engines_refuse_the_overlap_keys():
    job = _job().to_dict()
    job["layout"]["overlap_grad_reduce"] = True
    job["run"]["framework"] = "neox"
    job["layout"]["pipe_split"] = "neox"
    with pytest.raises(JobError) as exc:
        TrainingJob.from_dict(job)
    assert exc.value.key == "layout.overlap_grad_reduce" and "DeepSpeed" in str(exc.value)


def test_gradients_kept_for_an_fp32_reduction_cost_fp32_memory():
    from predictor import memory
    job = _job()
    est = memory.estimate_job(job)
    assert est.gradients == pytest.approx(4 * est.parameters)       # Megatron bf16: fp32 main grads
    bf16 = memory.estimate_job(job.replace(run={"grad_reduce_precision": "bf16"}))
    assert bf16.gradients == pytest.approx(2 * est.parameters)
    assert est.total > bf16.total


def test_zero3_gathers_and_reductions_run_under_the_layers(h100):
    from predictor.network import ring_seconds
    from predictor.recipe import stage_parameter_counts
    base = dict(framework="torchtitan")
    z0 = predict(_job(zero_stage=0).replace(run=base), h100)
    z3 = predict(_job(zero_stage=3).replace(run=base), h100)
    job = z3.job
    dp, mb = job.layout.dp, job.layout.micro_batches
    whole = stage_parameter_counts(job.model, job.layout)[0]
    # The serial cost the prefetching hides: the stage's whole all-gather per forward (dgx-h100's
    # collectives are its ring model: one node of 8, two nodes here).
    gather = ring_seconds(h100.links, "allgather", whole / dp, 2, 8)
    # FSDP2's own copies around its gathers are device work of their own (recipe.fsdp2_shard_copies).
    from predictor.operators import BYTES_PER_ELEMENT
    from predictor.recipe import fsdp2_shard_copies
    copies = fsdp2_shard_copies(job.layout, "torchtitan", "bf16", "fp32", BYTES_PER_ELEMENT)
    copy_fwd = mb * whole * copies.forward_bytes / (h100.gpu.memory_gbps * 1e9)
    extra_fwd = z3.breakdown.forward_seconds - z0.breakdown.forward_seconds - copy_fwd
    assert 0.0 < extra_fwd < 0.25 * mb * gather
    # Gradients are reduce-scattered layer by layer inside every backward: no tail reduction,
    # and no parameter all-gather after the step.
    assert z3.breakdown.gradient_reduce_seconds == 0.0
    assert z3.breakdown.optimizer_seconds < z0.breakdown.optimizer_seconds
    assert z3.details.dp_hidden_seconds > mb * gather


def test_advise_candidates_keep_the_jobs_overlaps_where_their_zero_stage_allows():
    from predictor.advise import SearchOptions, enumerate_layouts
    job = _job(overlap_grad_reduce=True, overlap_param_gather=True)
    layouts, _ = enumerate_layouts(job, 16, 8, SearchOptions(max_micro_batch=2))
    by_zero = {z: [lay for lay in layouts if lay.zero_stage == z] for z in (0, 1)}
    assert by_zero[0] and by_zero[1]
    assert all(lay.overlap_grad_reduce and not lay.overlap_param_gather for lay in by_zero[0])
    assert all(lay.overlap_grad_reduce and lay.overlap_param_gather for lay in by_zero[1])
    plain, _ = enumerate_layouts(_job(), 16, 8, SearchOptions(max_micro_batch=2))
    assert not any(lay.overlap_grad_reduce or lay.overlap_param_gather for lay in plain)
