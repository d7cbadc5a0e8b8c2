"""The layout search against a fake predictor: constraints, batching, ranking, the JSON shape."""
from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from predictor import memory as mem
from predictor.advise import (AdviseError, SearchOptions, advise, enumerate_layouts, layout_key,
                              model_flops_per_step, sweep)
from predictor.recipe import stage_layers
from predictor.job import PIPE_SPLITS, Layout, ModelSpec, TrainingJob

from .advise_fakes import FakePlatform, FakePredictMany

PLAT = FakePlatform()


def gpt20b(pp=4, tp=8, dp=4, mb=4, m=16, iters=1000, **layout) -> TrainingJob:
    return TrainingJob.from_dict({
        "model": {"layers": 44, "hidden": 6144, "heads": 64, "seq_len": 2048, "vocab": 50257,
                  "parallel_residual": True},
        "layout": {"pp": pp, "tp": tp, "dp": dp, "micro_batch": mb, "micro_batches": m,
                   "zero_stage": 1, "recompute": "full", **layout},
        "run": {"precision": "fp16", "train_iters": iters},
        "cluster": {"gpus_per_node": 4},
    })


def check_constraints(job: TrainingJob, c, gpus: int, gpn: int, cross_node: bool = False) -> None:
    lay, m = c.layout, job.model
    assert lay.pp * lay.tp * lay.cp * lay.dp == gpus
    assert lay.global_batch == job.layout.global_batch
    assert m.heads % lay.tp == 0 and m.kv_heads % lay.tp == 0
    if not cross_node:
        assert lay.tp <= gpn and gpn % lay.tp == 0
    assert lay.pp <= m.layers
    if lay.zero_stage >= 2:
        assert lay.pp == 1
    if lay.virtual_stages > 1:
        assert m.layers % (lay.pp * lay.virtual_stages) == 0
        assert lay.micro_batches % lay.pp == 0


def test_every_candidate_meets_the_constraints_and_fits():
    job = gpt20b()
    fake = FakePredictMany()
    adv = advise(job, PLAT, SearchOptions(), fake)
    assert adv.candidates, "the search found nothing"
    for c in adv.candidates:
        check_constraints(job, c, 128, 4)
        assert c.fits and c.memory.total_gib <= 80
        assert c.memory.total == mem.estimate(job.model, c.layout, "fp16").total


def test_one_batched_predict_call_with_only_fitting_layouts():
    job = gpt20b()
    fake = FakePredictMany()
    adv = advise(job, PLAT, SearchOptions(), fake)
    assert len(fake.calls) == 1
    # every fitting candidate, plus the job's own layout (outside the space: cross-node TP)
    assert fake.calls[0] == len(adv.candidates) + 1
    assert adv.dropped.get("over 80 GiB per GPU", 0) > 0


def test_ranked_best_first():
    adv = advise(gpt20b(), PLAT, SearchOptions(), FakePredictMany())
    times = [c.iteration_seconds for c in adv.candidates]
    assert times == sorted(times)
    assert adv.best is adv.candidates[0]


def test_cross_node_tensor_parallelism_needs_the_flag():
    job = gpt20b()
    adv = advise(job, PLAT, SearchOptions(), FakePredictMany())
    assert max(c.layout.tp for c in adv.candidates) <= 4
    wide = advise(job, PLAT, SearchOptions(allow_cross_node_tp=True), FakePredictMany())
    assert max(c.layout.tp for c in wide.candidates) > 4
    for c in wide.candidates:
        check_constraints(job, c, 128, 4, cross_node=True)


def test_current_layout_rank_and_gpu_hours_saved():
    job = gpt20b()
    adv = advise(job, PLAT, SearchOptions(allow_cross_node_tp=True), FakePredictMany())
    cur = adv.current
    assert cur is not None and cur.key == layout_key(job.layout)
    faster = [c for c in adv.candidates if c.iteration_seconds < cur.iteration_seconds]
    assert adv.current_rank == len(faster) + 1
    saved = (cur.iteration_seconds - adv.best.iteration_seconds) * 1000 * 128 / 3600
    assert adv.gpu_hours_saved == pytest.approx(saved)
    # The fake makes cross-node TP slow: the paper's slowest layout is far from first.
    assert adv.current_rank > 10


def test_best_layout_as_current_ranks_first():
    first = advise(gpt20b(), PLAT, SearchOptions(), FakePredictMany()).best.layout
    job = gpt20b().replace(layout={k: getattr(first, k) for k in (
        "pp", "tp", "dp", "micro_batch", "micro_batches", "zero_stage", "recompute", "virtual_stages")})
    adv = advise(job, PLAT, SearchOptions(), FakePredictMany())
    assert adv.current_rank == 1
    assert adv.gpu_hours_saved == 0


def test_pinned_knobs_are_respected():
    opts = SearchOptions(micro_batch=2, recompute="selective", zero_stage=1, virtual_stages=1)
    adv = advise(gpt20b(), PLAT, opts, FakePredictMany())
    assert adv.candidates
    for c in adv.candidates:
        lay = c.layout
        assert (lay.micro_batch, lay.recompute, lay.zero_stage, lay.virtual_stages) == (2, "selective", 1, 1)


def test_dominated_recompute_is_not_predicted():
    adv = advise(gpt20b(), PLAT, SearchOptions(), FakePredictMany())
    seen = set()
    for c in adv.candidates:
        k = layout_key(c.layout)
        rest = k[:5] + k[6:]          # everything but recompute
        assert rest not in seen, f"{k} predicted with two recompute settings"
        seen.add(rest)
    assert adv.dropped.get("dominated (a cheaper variant of it fits)", 0) > 0


def test_zero3_is_dropped_where_zero2_fits_with_no_more_recompute():
    adv = advise(gpt20b(), PLAT, SearchOptions(), FakePredictMany())
    z2 = {(c.layout.pp, c.layout.tp, c.layout.dp, c.layout.micro_batch): c.layout.recompute
          for c in adv.candidates if c.layout.zero_stage == 2}
    cost = {"none": 0, "selective": 1, "full": 2}
    for c in adv.candidates:
        if c.layout.zero_stage == 3:
            k = (c.layout.pp, c.layout.tp, c.layout.dp, c.layout.micro_batch)
            assert k not in z2 or cost[z2[k]] > cost[c.layout.recompute]
    pinned = advise(gpt20b(), PLAT, SearchOptions(zero_stage=3), FakePredictMany())
    assert pinned.candidates and {c.layout.zero_stage for c in pinned.candidates} == {3}


def test_all_interleaves_unfit_layouts_by_time():
    adv = advise(gpt20b(), PLAT, SearchOptions(include_unfit=True), FakePredictMany())
    fits = [c.fits for c in adv.candidates]
    assert True in fits and False in fits
    times = [c.iteration_seconds for c in adv.candidates]
    assert times == sorted(times)
    assert adv.best is next(c for c in adv.candidates if c.fits)
    for c in adv.candidates:
        assert c.fits == (c.memory.total_gib <= 80)


def test_json_shape():
    d = advise(gpt20b(), PLAT, SearchOptions(), FakePredictMany()).to_dict()
    keys = {"pp", "tp", "dp", "micro_batch", "micro_batches", "recompute", "zero_stage",
            "virtual_stages", "iteration_seconds", "memory_gib", "fits"}
    assert keys <= set(d["candidates"][0])
    assert keys | {"rank"} <= set(d["current"])
    times = [c["iteration_seconds"] for c in d["candidates"]]
    assert times == sorted(times)


def test_other_gpu_count_scales_the_current_dp():
    adv = advise(gpt20b(pp=4, tp=4, dp=8, m=8), PLAT, SearchOptions(gpus=64), FakePredictMany())
    cur = adv.current.layout
    assert (cur.pp, cur.tp, cur.dp, cur.micro_batches) == (4, 4, 4, 16)
    assert "scaled" in adv.current.note


def test_gpu_count_must_fill_nodes():
    with pytest.raises(AdviseError, match="whole nodes"):
        advise(gpt20b(), PLAT, SearchOptions(gpus=130), FakePredictMany())


def test_impossible_model_reports_no_fit():
    job = TrainingJob.from_dict({
        "model": {"layers": 4, "hidden": 65536, "heads": 64, "seq_len": 8192},
        "layout": {"pp": 1, "tp": 4, "dp": 1, "micro_batch": 1, "micro_batches": 1, "zero_stage": 0}})
    adv = advise(job, PLAT, SearchOptions(), FakePredictMany())
    assert adv.best is None and any("fits" in n for n in adv.notes)


def test_sweep_batches_all_counts_in_one_call():
    fake = FakePredictMany()
    pts = sweep(gpt20b(), PLAT, [256, 64, 128], SearchOptions(), fake)
    assert [p.gpus for p in pts] == [64, 128, 256]
    assert len(fake.calls) == 1
    for p in pts:
        assert p.best is not None
        assert p.gpu_hours == pytest.approx(p.train_seconds * p.gpus / 3600)
        assert p.nodes == p.gpus // 4


def test_model_flops_match_narayanan():
    # 72·B·s·L·h²·(1 + s/(6h) + V/(12·h·L)) for a GPT with ffn = 4h.
    m = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200)
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    expected = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    # the bias-free GEMM count of the module differs from 12h² by nothing; allow float noise
    assert model_flops_per_step(m, B) == pytest.approx(expected, rel=1e-9)


def test_metrics_are_consistent():
    adv = advise(gpt20b(), PLAT, SearchOptions(), FakePredictMany())
    c = adv.best
    assert c.tokens_per_second == pytest.approx(256 * 2048 / c.iteration_seconds)
    assert c.mfu == pytest.approx(c.tflops_per_gpu / 312.0)
    assert 0 <= c.bubble_share <= 1 and 0 <= c.comm_share <= 1


def test_time_split_is_additive():
    adv = advise(gpt20b(), PLAT, SearchOptions(allow_cross_node_tp=True), FakePredictMany())
    for c in adv.candidates + [adv.current]:
        split = c.time_split()
        assert all(v >= 0 for v in split.values())
        assert sum(split.values()) == pytest.approx(c.iteration_seconds)
        assert c.comm_share + c.bubble_share <= 1 + 1e-9
        # the fake's pure compute is the same work on every layout: ≈ FLOPs / GPUs / speed
        assert split["compute"] > 0


# ------------------------------------------------------------------------- property test
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(1, 48), heads_exp=st.integers(0, 5), kv_div=st.integers(0, 3),
       gpus_exp=st.integers(0, 7), gpn=st.sampled_from([1, 4, 8]), gb_mult=st.integers(1, 24))
def test_enumeration_agrees_with_job_validation(layers, heads_exp, kv_div, gpus_exp, gpn, gb_mult):
    """Every enumerated layout is one TrainingJob accepts, and keeps the global batch."""
    heads = 2 ** heads_exp * 3
    kv = max(1, heads // 2 ** kv_div) if heads % max(1, heads // 2 ** kv_div) == 0 else heads
    gpus = 2 ** gpus_exp
    if gpus > gpn and gpus % gpn:
        return
    model = ModelSpec(layers=layers, hidden=heads * 64, heads=heads, kv_heads=kv, seq_len=512)
    job = TrainingJob(model=model, layout=Layout(micro_batch=1, micro_batches=gb_mult * 4))
    layouts, _ = enumerate_layouts(job, gpus, gpn, SearchOptions(max_micro_batch=8))
    for lay in layouts:
        assert lay.gpus == gpus
        assert lay.global_batch == job.layout.global_batch
        assert lay.tp <= gpn
        TrainingJob(model=model, layout=lay)          # raises JobError if validation disagrees


# ------------------------------------------------------------------------- the pipeline split
def test_candidates_report_the_split_they_were_timed_with():
    d = advise(gpt20b(), PLAT, SearchOptions(), FakePredictMany()).to_dict()
    job = gpt20b()
    for c in d["candidates"]:
        lay = Layout(**{k: c[k] for k in ("pp", "tp", "dp", "micro_batch", "micro_batches",
                                          "recompute", "zero_stage", "virtual_stages")})
        assert c["stage_layers"] == stage_layers(job.model, lay)
        assert sum(c["stage_layers"]) == 44
    assert d["current"]["stage_layers"] == [11, 12, 11, 10]        # NeoX's default rule


def test_megatron_rule_rules_out_a_pp_that_does_not_divide_the_layers():
    job = gpt20b(pipe_split="megatron")
    adv = advise(job, PLAT, SearchOptions(include_unfit=True), FakePredictMany())
    pps = {c.layout.pp for c in adv.candidates}
    assert 4 in pps and 8 not in pps and 16 not in pps           # 44 layers: 8 and 16 do not divide
    assert any("megatron pipeline split" in k for k in adv.ruled_out)
    assert all(c.layout.pipe_split == "megatron" for c in adv.candidates)
    for c in adv.candidates:
        assert c.stage_layers == [44 // c.layout.pp] * c.layout.pp
    # The default rule (GPT-NeoX) splits any pp.
    assert 8 in {c.layout.pp for c in advise(gpt20b(), PLAT, SearchOptions(include_unfit=True),
                                             FakePredictMany()).candidates}


def test_explicit_split_is_kept_where_it_fits_and_the_rule_used_elsewhere():
    job = gpt20b(stage_layers=[8, 12, 12, 12])
    adv = advise(job, PLAT, SearchOptions(include_unfit=True), FakePredictMany())
    assert adv.current is not None and adv.current.stage_layers == [8, 12, 12, 12]
    for c in adv.candidates:
        if (c.layout.pp, c.layout.virtual_stages) == (4, 1):
            assert c.layout.stage_layers == (8, 12, 12, 12)
        else:
            assert c.layout.stage_layers == ()
            assert c.stage_layers == stage_layers(job.model, c.layout)


def test_megatron_first_last_kept_where_they_fit():
    job = gpt20b(pipe_split="megatron", first_stage_layers=8, last_stage_layers=10)   # 8, 13, 13, 10
    layouts, dropped = enumerate_layouts(job, 128, 4, SearchOptions())
    four = [lay for lay in layouts if lay.pp == 4 and lay.virtual_stages == 1]
    assert four and all((lay.first_stage_layers, lay.last_stage_layers) == (8, 10) for lay in four)
    # pp = 2: 8 + 10 ≠ 44, so the even rule (22, 22) without the first/last counts.
    two = [lay for lay in layouts if lay.pp == 2]
    assert two and all((lay.first_stage_layers, lay.last_stage_layers) == (0, 0) for lay in two)
    for lay in layouts:
        TrainingJob(model=job.model, layout=lay)          # every one is a job Megatron would run


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(8, 48), rule=st.sampled_from(PIPE_SPLITS), gpus_exp=st.integers(0, 6))
def test_enumerated_splits_are_valid_jobs_for_every_rule(layers, rule, gpus_exp):
    model = ModelSpec(layers=layers, hidden=1024, heads=16, seq_len=512)
    pp = 2 if layers % 2 == 0 else 1
    job = TrainingJob(model=model, layout=Layout(pp=pp, micro_batch=1, micro_batches=16, pipe_split=rule,
                                                 zero_stage=1))
    layouts, _ = enumerate_layouts(job, 2 ** gpus_exp, 8, SearchOptions(max_micro_batch=4))
    for lay in layouts:
        assert lay.pipe_split == rule
        j = TrainingJob(model=model, layout=lay)
        assert mem.stage_layers(model, lay) == stage_layers(j)


def test_options_validate():
    with pytest.raises(AdviseError):
        SearchOptions(recompute="sometimes")
    with pytest.raises(AdviseError):
        SearchOptions(zero_stage=4)
    with pytest.raises(AdviseError):
        SearchOptions(gpus=0)



def _long_context(cp: int = 1, seq: int = 16384, attention: str = "flash") -> TrainingJob:
    return TrainingJob.from_dict({
        "model": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
                  "seq_len": seq, "vocab": 128256, "norm": "rmsnorm", "activation": "swiglu",
                  "attention": attention, "tied_embeddings": False},
        "layout": {"pp": 1, "tp": 4, "cp": cp, "dp": 2 if cp == 2 else 4, "micro_batch": 1,
                   "micro_batches": 8, "zero_stage": 1, "recompute": "selective"},
        "run": {"precision": "bf16", "train_iters": 100},
        "cluster": {"gpus_per_node": 8},
    })


def test_context_parallelism_is_searched_for_long_flash_sequences():
    layouts, _ = enumerate_layouts(_long_context(), 16, 8, SearchOptions())
    cps = {lay.cp for lay in layouts}
    # seq 16384: each rank keeps ≥ 4096 tokens up to cp = 4.
    assert cps == {1, 2, 4}
    for lay in layouts:
        assert lay.pp * lay.tp * lay.cp * lay.dp == 16
        TrainingJob(model=_long_context().model, layout=lay)    # every one passes the job rules
    # Short sequences or no flash attention: no context parallelism.
    assert {lay.cp for lay in enumerate_layouts(_long_context(seq=2048), 16, 8, SearchOptions())[0]} == {1}
    fused = _long_context(attention="fused_softmax")
    assert {lay.cp for lay in enumerate_layouts(fused, 16, 8, SearchOptions())[0]} == {1}
    # A pinned cp is the only one searched.
    assert {lay.cp for lay in enumerate_layouts(_long_context(), 16, 8, SearchOptions(cp=2))[0]} == {2}


def test_a_cp_job_is_compared_like_for_like():
    job = _long_context(cp=2)
    adv = advise(job, FakePlatform(gpus_per_node=8), SearchOptions(gpus=32), predict_many=FakePredictMany())
    cur = adv.current
    assert cur is not None and cur.layout.cp == 2 and cur.layout.dp == 4       # 32 / (tp 4 × cp 2)
    assert any(c.layout.cp == 2 for c in adv.candidates) and cur.name == "1-4-4-2"
