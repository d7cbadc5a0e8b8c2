"""Transformer Engine's tensor-parallel overlap: the closed forms against a chunk-by-chunk replay,
and what the predictor makes of layout.tp_comm_overlap."""
from __future__ import annotations

import random

import pytest

from predictor import JobError, TrainingJob, load_platform, predict
from predictor import tp_overlap


def _replay_ring(g, gather, tp):
    """Chunk 0 is local; chunk k arrives after k ring steps (each gather / (tp − 1)); a chunk's
    GEMM starts when it has arrived and the previous chunk's GEMM is done."""
    step, end = gather / (tp - 1), 0.0
    for k in range(tp):
        end = max(end, k * step) + g
    return end


def _replay_pipeline(g, r, splits):
    """The GEMM chunks back to back; chunk k's reduce-scatter starts when its GEMM is done and the
    previous reduce-scatter is done."""
    gemm_end, comm_end = 0.0, 0.0
    for _ in range(splits):
        gemm_end += g
        comm_end = max(comm_end, gemm_end) + r
    return comm_end


def test_closed_forms_match_a_chunk_by_chunk_replay():
    rng = random.Random(7)
    for _ in range(200):
        g, c = rng.uniform(0, 1e-3), rng.uniform(0, 2e-3)
        tp = rng.choice([2, 4, 8])
        assert tp_overlap.ring_seconds(g, c, tp) == pytest.approx(_replay_ring(g, c, tp), rel=1e-12, abs=1e-15)
        splits = rng.choice([2, 4, 8])
        assert tp_overlap.pipeline_seconds(g, c, splits) == pytest.approx(_replay_pipeline(g, c, splits),
                                                                          rel=1e-12, abs=1e-15)


def _gemms(scale_comm: float, chunk_loss: float = 1.0, tp: int = 8) -> tp_overlap.LayerGemms:
    """A layer whose chunks cost their share of the whole GEMM times ``chunk_loss``."""
    whole = dict(qkv_fwd=0.4e-3, qkv_bwd=0.8e-3, proj_fwd=0.3e-3, proj_bwd=0.6e-3,
                 up_fwd=1.6e-3, up_bwd=3.2e-3, down_fwd=0.9e-3, down_bwd=1.8e-3)
    k = tp_overlap.PIPELINE_SPLITS
    chunks = dict(qkv_fwd_chunk=whole["qkv_fwd"] / tp, up_fwd_chunk=whole["up_fwd"] / tp,
                  proj_fwd_chunk=whole["proj_fwd"] / k, down_fwd_chunk=whole["down_fwd"] / k,
                  proj_bwd_chunk=whole["proj_bwd"] / tp, down_bwd_chunk=whole["down_bwd"] / tp)
    chunks = {n: v * chunk_loss for n, v in chunks.items()}
    comm = dict(gather=0.5e-3 * scale_comm, scatter=0.5e-3 * scale_comm, scatter_chunk=0.125e-3 * scale_comm)
    return tp_overlap.LayerGemms(**whole, **chunks, **comm)


def test_layer_extra_time_limits():
    # Free communication, perfectly divisible GEMMs, all SMs: the overlap costs nothing.
    assert tp_overlap.layer_extra_seconds(_gemms(0.0), 8, 1.0) == pytest.approx((0.0, 0.0), abs=1e-15)
    # A chunked GEMM is not costed below the whole one, even when the models say it is cheaper.
    assert tp_overlap.layer_extra_seconds(_gemms(0.0, chunk_loss=0.5), 8, 1.0) == \
        pytest.approx((0.0, 0.0), abs=1e-15)
    # Cheap communication hides under the GEMMs: far less than the serial collectives.
    g = _gemms(0.1)
    serial = 4 * (g.gather + g.scatter)
    f, b = tp_overlap.layer_extra_seconds(g, 8, 1.0)
    assert f + b < 0.25 * serial
    # The SMs a pipelined/bulk collective keeps slow the GEMMs beside it.
    f2, b2 = tp_overlap.layer_extra_seconds(g, 8, tp_overlap.margin_slowdown(132))
    assert f2 > f and b2 > b
    # Communication far longer than the GEMMs: the collectives set the time (the GEMMs hide under
    # them).  That is the serial costing's four all-reduces' worth, plus the backward's two
    # gathers of the layer-norm output, which the serial costing takes as hidden by Megatron's
    # asynchronous all-gather and the bulk overlap exposes when nothing covers them.
    g = _gemms(100.0)
    f, b = tp_overlap.layer_extra_seconds(g, 8, 1.0)
    serial = 4 * (g.gather + g.scatter)
    assert 0.98 * serial < f + b <= serial + 2 * g.gather + 4 * g.scatter_chunk


def test_sm_counts_come_from_the_gpu_name():
    assert tp_overlap.sm_count("NVIDIA H100 80GB HBM3") == (132, True)
    assert tp_overlap.sm_count("NVIDIA A100-SXM4-80GB") == (108, True)
    assert tp_overlap.sm_count("NVIDIA GH200 480GB") == (132, True)
    assert tp_overlap.sm_count("Some Future GPU") == (tp_overlap.DEFAULT_SMS, False)
    # measured on a 132-SM H100 (benchmarks/bench_sm_margin.py), below the proportional rule;
    # a GPU nobody measured gets the rule
    assert 1.0 < tp_overlap.margin_slowdown(132) == tp_overlap.MEASURED_MARGIN_SLOWDOWN[(132, 16)] < 132 / 116
    assert tp_overlap.margin_slowdown(108) == pytest.approx(108 / 92)


LLAMA_70B = {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672, "seq_len": 8192,
             "vocab": 128256, "norm": "rmsnorm", "activation": "swiglu", "attention": "flash",
             "pos_emb": "rotary", "tied_embeddings": False}


def _job(**layout) -> TrainingJob:
    lay = {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 1, "micro_batches": 4, "zero_stage": 1,
           "recompute": "none", "sequence_parallel": True}
    lay.update(layout)
    return TrainingJob.from_dict({"model": LLAMA_70B, "layout": lay,
                                  "run": {"precision": "bf16", "framework": "megatron"}})


@pytest.fixture(scope="module")
def h100():
    return load_platform("dgx-h100")


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_overlap_hides_tensor_parallel_communication(h100, recompute):
    serial = predict(_job(recompute=recompute), h100)
    ub = predict(_job(recompute=recompute, tp_comm_overlap=True), h100)
    s, u = serial.breakdown, ub.breakdown
    assert ub.iteration_seconds < serial.iteration_seconds
    assert u.tp_allreduce_seconds < s.tp_allreduce_seconds
    # It hides at most the serial communication: the GEMMs themselves are not faster.
    assert ub.iteration_seconds > serial.iteration_seconds - s.tp_allreduce_seconds
    assert ub.details.tp_hidden_seconds > 0 and serial.details.tp_hidden_seconds == 0
    # What it hid is the serial TP line less the exposed one (one stage: the same layers).
    assert ub.details.tp_hidden_seconds == pytest.approx(s.tp_allreduce_seconds - u.tp_allreduce_seconds)
    assert ub.to_dict()["details"]["tp_hidden_seconds"] == ub.details.tp_hidden_seconds
    parts = (u.forward_seconds + u.backward_seconds + u.bubble_seconds + u.gradient_reduce_seconds
             + u.optimizer_seconds + u.step_overhead_seconds)
    assert parts == pytest.approx(ub.iteration_seconds)


@pytest.fixture
def layers_seen(monkeypatch):
    """The LayerGemms every assembled prediction hands predictor.tp_overlap, in order."""
    seen = []
    real = tp_overlap.layer_extra_seconds

    def spy(g, tp, slowdown):
        seen.append(g)
        return real(g, tp, slowdown)
    monkeypatch.setattr(tp_overlap, "layer_extra_seconds", spy)
    return seen


def test_fp8_gathers_move_one_byte_an_entry(h100, layers_seen):
    seen = layers_seen
    predict(_job(tp_comm_overlap=True), h100)
    predict(_job(tp_comm_overlap=True).replace(run={"fp8": "delayed"}), h100)
    bf16, fp8 = seen[0], seen[len(seen) // 2]     # each prediction assembles its point first
    # The all-gather halves (less its latency, which stays); the reduce-scatters do not change.
    assert 0.45 * bf16.gather < fp8.gather < 0.75 * bf16.gather
    assert fp8.scatter == pytest.approx(bf16.scatter) and fp8.scatter_chunk == pytest.approx(bf16.scatter_chunk)


def test_the_key_does_nothing_without_tensor_parallelism(h100):
    one = _job(tp=1, dp=8, sequence_parallel=False)
    assert predict(one.replace(layout={"tp_comm_overlap": True}), h100).iteration_seconds == \
        pytest.approx(predict(one, h100).iteration_seconds, rel=1e-12)


def test_a_layer_is_costed_the_same_whatever_the_rest_of_the_layout(h100, layers_seen):
    # The layer's terms sit after every other term of the plan (pipeline, context-parallel ring,
    # data-parallel buckets, ZeRO-3 layers): whatever comes before them, the same layer shape
    # must read the same GEMMs and collectives.
    seen = layers_seen
    variants = [dict(dp=1), dict(dp=2, overlap_grad_reduce=True, overlap_param_gather=True),
                dict(pp=4, dp=2, micro_batches=8), dict(pp=2, virtual_stages=2, micro_batches=4),
                dict(dp=2, zero_stage=3)]
    firsts = []
    for v in variants:
        seen.clear()
        p = predict(_job(tp=8, cp=2, tp_comm_overlap=True, **v), h100)
        assert p.details.tp_hidden_seconds > 0
        firsts.append(seen[0])
    assert all(g == firsts[0] for g in firsts[1:])
    assert firsts[0].gather > 0 and firsts[0].qkv_fwd_chunk > 0


def test_overlapped_layers_add_their_chunk_launches_to_the_host(h100):
    from predictor.estimate import QuerySet, _plan
    if h100.host is None or h100.fitted is not None:
        pytest.skip("dgx-h100 carries no [host] costs, or fitted scales on them")
    serial_job = _job(tp=8)
    ub_job = _job(tp=8, tp_comm_overlap=True)
    q = QuerySet(h100)
    serial, ub = (_plan(j, h100, q).stage_host[0] for j in (serial_job, ub_job))
    # Each layer's chunk GEMMs and copies (predictor.tp_overlap.layer_launches, one launch each)
    # instead of the serial costing's four TP collectives (one collective call each).
    f, b = tp_overlap.layer_launches(8)
    layers = serial_job.model.layers
    h = h100.host
    assert ub - serial == pytest.approx(layers * ((f + b) * h.launch_seconds - 4 * h.collective_call_seconds))


def test_refused_without_sequence_parallelism_or_under_deepspeed():
    with pytest.raises(JobError) as exc:
        _job(sequence_parallel=False, tp_comm_overlap=True)
    assert exc.value.key == "layout.tp_comm_overlap" and "sequence_parallel" in str(exc.value)
    job = _job().to_dict()
    job["layout"]["tp_comm_overlap"] = True
    job["run"]["framework"] = "megatron-deepspeed"
    with pytest.raises(JobError) as exc:
        TrainingJob.from_dict(job)
    assert exc.value.key == "layout.tp_comm_overlap" and "DeepSpeed" in str(exc.value)
    job["run"]["framework"] = "torchtitan"
    with pytest.raises(JobError) as exc:
        TrainingJob.from_dict(job)
    assert exc.value.key == "layout.tp_comm_overlap" and "TorchTitan" in str(exc.value)
    job["run"]["framework"] = "megatron"
    job["model"]["parallel_residual"] = True
    with pytest.raises(JobError) as exc:
        TrainingJob.from_dict(job)
    assert exc.value.key == "layout.tp_comm_overlap" and "parallel_residual" in str(exc.value)


def test_unknown_gpu_is_said(h100):
    import dataclasses
    odd = dataclasses.replace(h100, gpu=dataclasses.replace(h100.gpu, name="Some Future GPU"))
    p = predict(_job(tp_comm_overlap=True), odd)
    assert any("SM count of Some Future GPU is not known" in w for w in p.warnings)


def test_advise_candidates_keep_the_overlap_where_they_keep_sequence_parallelism():
    from predictor.advise import SearchOptions, enumerate_layouts
    job = _job(tp=4, dp=2, tp_comm_overlap=True)
    layouts, _ = enumerate_layouts(job, 8, 8, SearchOptions(max_micro_batch=1))
    with_tp = [lay for lay in layouts if lay.tp > 1]
    assert with_tp and all(lay.tp_comm_overlap and lay.sequence_parallel for lay in with_tp)
    assert all(not lay.tp_comm_overlap for lay in layouts if lay.tp == 1)
