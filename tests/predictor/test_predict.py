import math

import numpy as np
import pytest

from predictor import BundleError, load_platform, predict, predict_many

from .conftest import GPT20B, copy_shipped_platform, make_job


def test_prediction_shape_and_json(perlmutter):
    p = predict(make_job(), perlmutter)
    d = p.to_dict()
    for key in ("iteration_seconds", "interval_seconds", "total_seconds", "breakdown", "platform",
                "bundle", "warnings", "job"):
        assert key in d
    for key in ("forward_seconds", "backward_seconds", "bubble_seconds", "gradient_reduce_seconds",
                "optimizer_seconds", "tp_allreduce_seconds", "pp_p2p_seconds"):
        assert d["breakdown"][key] >= 0
    # One vocabulary: the breakdown's keys are its parts' names, each printed as LABELS says.
    assert list(d["breakdown"]) == [name for name, _ in p.breakdown.TERMS]
    for name in d["breakdown"]:
        assert d["breakdown"][name] == getattr(p.breakdown, name)
    assert d["details"]["stage_forward_seconds"] == list(p.details.stages.forward_seconds)
    lo, hi = p.interval_seconds
    assert lo < p.iteration_seconds < hi
    b = p.breakdown
    assert math.isclose(p.iteration_seconds, b.forward_seconds + b.backward_seconds + b.bubble_seconds
                        + b.gradient_reduce_seconds + b.optimizer_seconds + b.step_overhead_seconds, rel_tol=1e-9)
    assert d["job"]["layout"]["pp"] == 4
    assert math.isclose(p.total_seconds, 120 + 100 * p.iteration_seconds, rel_tol=1e-9)


def test_predict_many_equals_one_by_one(perlmutter):
    jobs = [make_job(), make_job(pp=8, tp=4, dp=4), make_job(pp=2, tp=8, dp=8, micro_batch=2, micro_batches=32)]
    many = predict_many(jobs, perlmutter)
    for job, p in zip(jobs, many):
        assert math.isclose(predict(job, perlmutter).iteration_seconds, p.iteration_seconds, rel_tol=1e-9)


def test_timeline_eq7(perlmutter):
    p = predict(make_job(), perlmutter)
    F = max(p.details.stages.forward_seconds)
    B = max(p.details.stages.backward_seconds)
    assert math.isclose(p.breakdown.forward_seconds, 16 * F)
    assert math.isclose(p.breakdown.bubble_seconds, 3 * (F + B))


def test_more_layers_more_time_and_recompute_costs(perlmutter):
    t = [predict(make_job(model=dict(GPT20B, layers=n)), perlmutter).iteration_seconds for n in (12, 24, 44)]
    assert t[0] < t[1] < t[2]
    full = predict(make_job(recompute="full"), perlmutter).breakdown.backward_seconds
    sel = predict(make_job(recompute="selective"), perlmutter).breakdown.backward_seconds
    none = predict(make_job(recompute="none"), perlmutter).breakdown.backward_seconds
    assert none < sel < full


def test_pp1_costs_the_real_layer_count(perlmutter):
    small = dict(GPT20B, layers=8, hidden=2048, heads=16)
    p = predict(make_job(model=small, pp=1, tp=1, dp=4, micro_batch=1), perlmutter)
    assert list(p.details.stages.layers) == [8]
    assert p.breakdown.bubble_seconds == 0
    assert p.breakdown.pp_p2p_seconds == 0


def test_parallel_residual_saves_one_tp_allreduce(perlmutter):
    a = predict(make_job(model=dict(GPT20B, parallel_residual=True), recompute="none"), perlmutter)
    b = predict(make_job(model=dict(GPT20B, parallel_residual=False), recompute="none"), perlmutter)
    assert a.breakdown.tp_allreduce_seconds < b.breakdown.tp_allreduce_seconds
    assert math.isclose(a.breakdown.tp_allreduce_seconds / b.breakdown.tp_allreduce_seconds, 3 / 4, rel_tol=0.05)


def test_interleaving_shrinks_the_bubble(perlmutter):
    a = predict(make_job(), perlmutter)
    b = predict(make_job(model=dict(GPT20B, layers=48), virtual_stages=2), perlmutter)
    c = predict(make_job(model=dict(GPT20B, layers=48)), perlmutter)
    assert b.breakdown.bubble_seconds < c.breakdown.bubble_seconds
    assert a.iteration_seconds > 0


def test_zero_stages(perlmutter):
    base = dict(pp=1, tp=4, dp=8, micro_batch=1, micro_batches=16)
    small = dict(GPT20B, layers=8)
    z = {s: predict(make_job(model=small, zero_stage=s, **base), perlmutter) for s in (0, 1, 2, 3)}
    # ZeRO-0 updates the whole replica; ZeRO-1 shards the optimizer step and all-gathers.
    assert z[1].breakdown.optimizer_seconds != z[0].breakdown.optimizer_seconds
    # ZeRO-3 gathers parameters every micro-batch: the slowest.
    assert z[3].iteration_seconds > z[1].iteration_seconds


def test_unmeasured_topology_says_so_and_uses_analytic(perlmutter):
    # tp = 8 on 2 nodes × 4 is measured on Perlmutter; dp over 16 nodes × 1 is not.
    p = predict(make_job(pp=1, tp=4, dp=16, model=dict(GPT20B, layers=8), micro_batches=4), perlmutter)
    assert any("allreduce over 16×1 GPUs was not measured" in w for w in p.warnings)
    measured = predict(make_job(pp=1, tp=4, dp=8, model=dict(GPT20B, layers=8), micro_batches=4), perlmutter)
    assert not any("allreduce over 8×1" in w for w in measured.warnings)


def test_extrapolation_flagged_with_wider_interval(perlmutter, monkeypatch):
    from predictor import estimate
    # Operator uncertainty only: the timeline spread of the recorded runs would dilute the factor.
    from predictor.interval import IntervalRule
    monkeypatch.setattr(estimate.IntervalRule, "for_platform",
                        classmethod(lambda cls, p: IntervalRule(0.0, 0.0, "own", 9)))
    job = make_job(model=dict(GPT20B, hidden=16384, heads=128))
    outside = predict(job, perlmutter)
    assert outside.extrapolated
    assert any("outside the sampled range" in w for w in outside.warnings)
    width = lambda p: p.interval_seconds[1] - p.interval_seconds[0]
    monkeypatch.setattr(estimate, "EXTRAPOLATION_ERROR_ABOVE", 0.0)
    unwidened = predict(job, perlmutter)
    assert width(outside) > 1.1 * width(unwidened)


def test_extrapolation_below_the_range_counts_at_least_as_much_as_above():
    from predictor import estimate
    assert estimate.EXTRAPOLATION_ERROR_BELOW >= estimate.EXTRAPOLATION_ERROR_ABOVE > 0.0
    assert estimate.extrapolation_error(0) == 0.0
    assert estimate.extrapolation_error(-1) == estimate.EXTRAPOLATION_ERROR_BELOW
    assert list(estimate.extrapolation_error(np.array([-1, 0, 1]))) == [
        estimate.EXTRAPOLATION_ERROR_BELOW, 0.0, estimate.EXTRAPOLATION_ERROR_ABOVE]


def test_range_side_names_the_side_a_row_leaves_by(perlmutter):
    lm = next(m for k, m in perlmutter.compute.models.items() if k.startswith("linear3.fwd"))
    lo, hi = np.asarray(lm.info.feature_min, float), np.asarray(lm.info.feature_max, float)
    mid = np.sqrt(lo * hi)
    rows = np.array([mid, np.r_[hi[0] * 2, mid[1:]], np.r_[lo[0] / 2, mid[1:]],
                     np.r_[lo[0] / 2, hi[1] * 2, mid[2:]]])
    assert lm.range_side(rows).tolist() == [0, 1, -1, -1]          # below wins over above
    assert [lm.row_range_side(r.tolist()) for r in rows] == [0, 1, -1, -1]


def test_roofline_scaling_beyond_samples(perlmutter):
    # Hidden 16384 and 32768 lie beyond Perlmutter's samples (≤ 8192): a GEMM whose k and n double
    # must take about 4× as long (FLOPs), not stay flat as raw tree regressors would.
    from predictor.estimate import QuerySet
    q = QuerySet(perlmutter)
    hs = [q.op("linear3", "fwd", "fp16", {"m": 8192, "k": h, "n": 4 * h / 8}) for h in (8192, 16384, 32768)]
    secs, _, extra = q.evaluate()
    assert not extra[hs[0]] and extra[hs[1]] and extra[hs[2]]
    for a, b in zip(hs, hs[1:]):
        assert 3.5 < secs[b] / secs[a] < 4.6


def _platform_copy(tmp_path, name, **changes):
    """A shipped platform, changed, loaded from tmp_path."""
    return load_platform(copy_shipped_platform(tmp_path, name, **changes))


def test_uncalibrated_platform_warns(tmp_path):
    plat = _platform_copy(tmp_path, "dgx-h100", calibrated=False)
    p = predict(make_job(pp=4, tp=8, dp=4), plat)
    assert any("uncalibrated" in w for w in p.warnings)
    a100 = predict(make_job(pp=4, tp=8, dp=4), load_platform("dgx-a100"))
    assert p.iteration_seconds < a100.iteration_seconds   # H100 compute is faster


def test_host_bound_micro_batches_cost_the_hosts_issue_time(tmp_path):
    # A tiny layer: the device finishes long before the host has issued the next kernels, so a
    # micro-batch costs the measured host time per layer, whatever its (small) device work.
    plat = load_platform("dgx-h100")
    assert plat.host is not None and plat.host.layer_seconds > 0
    small = {"layers": 16, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 32000}
    job = make_job(small, pp=1, tp=1, dp=1, micro_batch=1, micro_batches=4, recompute="none")
    p = predict(job, plat)
    per_mb = plat.host.stage_seconds(16, 0, "none")
    assert p.breakdown.host_wait_seconds > 0
    assert p.breakdown.forward_seconds + p.breakdown.backward_seconds == pytest.approx(4 * per_mb, rel=1e-6)
    # Without the [host] table the same job is costed on device time alone, and is faster.
    bare = predict(job, _platform_copy(tmp_path, "dgx-h100", host=None))
    assert bare.breakdown.host_wait_seconds == 0
    # A big layer is device-bound: the host adds nothing.
    wide = {"layers": 4, "hidden": 8192, "heads": 64, "seq_len": 4096, "vocab": 32000}
    big = predict(make_job(wide, pp=1, tp=1, dp=1, micro_batch=4, micro_batches=4, recompute="none"), plat)
    assert big.breakdown.host_wait_seconds == 0


def _engines(step=2e-3, micro_batch=5e-4, layer=1e-4):
    return {"deepspeed_pipeline": {"step_seconds": step, "micro_batch_seconds": micro_batch,
                                   "layer_seconds": layer, "source": "test"},
            "deepspeed": {"step_seconds": step / 2, "micro_batch_seconds": micro_batch / 2,
                          "layer_seconds": 0.0, "source": "test"}}


def _with_framework(job, framework):
    d = job.to_dict()
    d["run"]["framework"] = framework
    return job.__class__.from_dict(d)


def _host_with(plat_name, engines):
    import tomllib

    from predictor.platform import resolve_platform
    raw = tomllib.loads((resolve_platform(plat_name) / "platform.toml").read_text(encoding="utf-8"))
    host = dict(raw["host"])
    host.pop("engines", None)
    if engines is not None:
        host["engines"] = engines
    return host


@pytest.mark.parametrize("framework,pp,engine", [("megatron-deepspeed", 2, "deepspeed_pipeline"),
                                                  ("deepspeed", 1, "deepspeed"),
                                                  ("neox", 1, "deepspeed_pipeline")])
def test_deepspeed_engine_adds_its_host_work(tmp_path, framework, pp, engine):
    eng = _engines()
    with_engine = _platform_copy(tmp_path, "dgx-h100", host=_host_with("dgx-h100", eng))
    without = _platform_copy(tmp_path / "bare", "dgx-h100", host=_host_with("dgx-h100", None))
    e = with_engine.host.engines[engine]
    # Host-bound (tiny layers): every micro-batch on the slowest stage pays the engine's work per
    # micro-batch and per layer, and the step its per-step work.
    small = {"layers": 8, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 32000}
    job = make_job(small, pp=pp, tp=1, dp=1, micro_batch=1, micro_batches=4, recompute="none")
    job = _with_framework(job, framework)
    a, b = predict(job, with_engine), predict(job, without)
    assert a.breakdown.host_wait_seconds > 0 and b.breakdown.host_wait_seconds > 0
    per_stage = max(a.details.stages.layers)
    waves = 4 + (pp - 1)
    expected = waves * (e.micro_batch_seconds + per_stage * e.layer_seconds) + e.step_seconds
    assert a.iteration_seconds - b.iteration_seconds == pytest.approx(expected, rel=1e-6)
    assert a.breakdown.step_overhead_seconds - b.breakdown.step_overhead_seconds == pytest.approx(e.step_seconds)
    # Device-bound (wide layers): the host keeps ahead; only the step's own work shows.
    wide = {"layers": 4, "hidden": 8192, "heads": 64, "seq_len": 4096, "vocab": 32000}
    big = make_job(wide, pp=pp, tp=1, dp=1, micro_batch=4, micro_batches=4, recompute="none")
    big = _with_framework(big, framework)
    a, b = predict(big, with_engine), predict(big, without)
    assert a.breakdown.host_wait_seconds == 0
    assert a.iteration_seconds - b.iteration_seconds == pytest.approx(e.step_seconds, rel=1e-6)


def test_engine_step_takes_the_fitted_host_scale(tmp_path):
    # perf-calibrate validate --fit scales every host cost of the platform; the engine's per-step
    # work is host work too.
    fitted = {"host_scale": 2.0}
    with_engine = _platform_copy(tmp_path, "dgx-h100", host=_host_with("dgx-h100", _engines()), fitted=fitted)
    without = _platform_copy(tmp_path / "bare", "dgx-h100", host=_host_with("dgx-h100", None), fitted=fitted)
    wide = {"layers": 4, "hidden": 8192, "heads": 64, "seq_len": 4096, "vocab": 32000}
    job = _with_framework(make_job(wide, pp=2, tp=1, dp=1, micro_batch=4, micro_batches=4,
                                   recompute="none"), "deepspeed")
    a, b = predict(job, with_engine), predict(job, without)
    assert a.breakdown.host_wait_seconds == 0
    step = with_engine.host.engines["deepspeed_pipeline"].step_seconds
    assert a.iteration_seconds - b.iteration_seconds == pytest.approx(2.0 * step, rel=1e-6)


@pytest.mark.parametrize("framework", ["", "megatron", "nemo", "torchtitan"])
def test_no_engine_cost_without_a_deepspeed_framework(tmp_path, framework):
    # A job that names no framework (the paper's runs, perfcast's own steps) or a Megatron-core /
    # TorchTitan one runs no DeepSpeed engine: the table changes nothing.
    with_engine = _platform_copy(tmp_path, "dgx-h100", host=_host_with("dgx-h100", _engines()))
    without = _platform_copy(tmp_path / "bare", "dgx-h100", host=_host_with("dgx-h100", None))
    small = {"layers": 8, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 32000}
    job = make_job(small, pp=2, tp=1, dp=1, micro_batch=1, micro_batches=4, recompute="none")
    job = _with_framework(job, framework)
    assert predict(job, with_engine).iteration_seconds == predict(job, without).iteration_seconds


@pytest.mark.parametrize("engines,match", [
    ({"megatron": {"step_seconds": 0, "micro_batch_seconds": 0, "layer_seconds": 0}}, "unknown \\[host.engines\\]"),
    ({"deepspeed": {"step_seconds": 0, "micro_batch_seconds": 0}}, "missing \\['layer_seconds'\\]"),
    ({"deepspeed": {"step_seconds": -1e-3, "micro_batch_seconds": 0, "layer_seconds": 0}},
     "host.engines.deepspeed.step_seconds"),
    ({"deepspeed": {"step_seconds": 0, "micro_batch_seconds": 0, "layer_seconds": 0, "layer_us": 1}},
     "unknown \\['layer_us'\\]"),
    ({"deepspeed": 3}, "\\[host.engines.deepspeed\\] must be a table"),
    (7, "\\[host.engines\\] must be a table"),
])
def test_bad_engine_table_is_refused_naming_the_key(tmp_path, engines, match):
    with pytest.raises(BundleError, match=match):
        _platform_copy(tmp_path, "dgx-h100", host=_host_with("dgx-h100", engines))


def test_bad_host_table_is_refused_naming_the_key(tmp_path):
    with pytest.raises(BundleError, match="host.layer_seconds"):
        _platform_copy(tmp_path, "dgx-h100", host={"layer_seconds": "fast", "micro_batch_seconds": 0.001})
    with pytest.raises(BundleError, match="unknown \\[host\\] keys"):
        _platform_copy(tmp_path, "dgx-h100", host={"layer_seconds": 0.001, "micro_batch_seconds": 0.001,
                                                    "layer_us": 3})


def test_missing_operator_named(perlmutter, monkeypatch):
    from predictor import estimate
    monkeypatch.setitem(estimate.SUBSTITUTES, "swiglu", None)
    monkeypatch.delitem(perlmutter.compute.models, "gelu.fwd.fp16")
    monkeypatch.setitem(estimate.SUBSTITUTES, "gelu", None)
    with pytest.raises(BundleError, match="operator gelu"):
        predict(make_job(), perlmutter)


def test_swiglu_uses_substitute_with_warning(perlmutter):
    llama = dict(GPT20B, activation="swiglu", ffn_hidden=16384, norm="rmsnorm")
    p = predict(make_job(model=llama), perlmutter)
    assert any("operator swiglu has no model" in w for w in p.warnings)


def test_total_time_counts_eval_and_checkpoints(perlmutter):
    job = make_job().replace(run={"train_iters": 1000, "eval_interval": 100, "eval_iters": 10,
                                  "save_interval": 500})
    p = predict(job, perlmutter)
    assert p.details.total.evaluations == 10 and p.details.total.checkpoints == 2
    assert p.total_seconds > 120 + 1000 * p.iteration_seconds + p.details.total.eval_seconds


def test_a_backward_without_model_is_costed_at_the_forward_efficiency(vista):
    # Vista's flash-attention backward samples are impossible (faster than the forward): the
    # importer drops them, the bundle says why, and the backward is costed at the forward's
    # measured efficiency -- its time is then the forward's scaled by the roofline ratio.
    from predictor.estimate import QuerySet
    from predictor.operators import OPERATORS
    assert vista.compute.get("flash_atten.bwd.fp16") is None
    assert "not measured" in vista.compute.not_fitted_reason("flash_atten.bwd.fp16")
    shape = {"b": 4, "heads": 16, "l": 4096, "d": 128}
    q = QuerySet(vista)
    hf = q.op("flash_atten", "fwd", "fp16", dict(shape))
    hb = q.op("flash_atten", "bwd", "fp16", dict(shape))
    secs, _, _ = q.evaluate()
    arr = {k: __import__("numpy").array([float(v)]) for k, v in shape.items()}
    roof = lambda d: OPERATORS["flash_atten"].roofline_seconds(arr, d, "fp16", vista.gpu)[0]
    assert secs[hb] / secs[hf] == pytest.approx(roof("bwd") / roof("fwd"), rel=1e-9)
    assert secs[hb] > 2 * secs[hf]
    job = make_job(pp=4, tp=2, dp=2, model=dict(GPT20B, attention="flash", layers=32, hidden=4096, heads=32))
    assert any("flash_atten bwd has no model" in w and "fwd pass's measured efficiency" in w
               for w in predict(job, vista).warnings)


@pytest.mark.parametrize("name", ["perlmutter-a100", "vista-gh200", "dgx-a100"])
def test_host_prior_platforms_say_so_and_subtract_nothing(name):
    # Per-call host costs describe how a bundle's own samples were timed: a prior from another
    # machine must carry only the per-layer costs, and say where they came from.
    host = load_platform(name).host
    assert host is not None and host.source.startswith("prior:")
    assert not host.operators and host.layer_seconds > 0


def test_memoised_answers_are_the_answers(perlmutter):
    # A Predictor memoises operator and collective answers: a job asked again (or another job
    # with the same shapes) gets the same prediction, interval and warnings as on a fresh load.
    from predictor import Predictor, load_platform
    jobs = [make_job(), make_job(micro_batch=2, micro_batches=32), make_job(pp=8, tp=4, dp=4, micro_batches=32)]
    fresh = [predict(j, load_platform("perlmutter-a100", reload=True)) for j in jobs]
    warm = Predictor(load_platform("perlmutter-a100", reload=True))
    first = [warm.predict(j) for j in jobs]
    again = [warm.predict(j) for j in jobs]
    assert warm._answers
    for a, b, c in zip(fresh, first, again):
        assert a.iteration_seconds == b.iteration_seconds == c.iteration_seconds
        assert a.interval_seconds == b.interval_seconds == c.interval_seconds
        assert a.breakdown == b.breakdown == c.breakdown
        assert a.warnings == b.warnings == c.warnings


def test_memoised_collective_warning_is_kept():
    from predictor import load_platform
    from predictor import Predictor
    held = Predictor(load_platform("vista-gh200", reload=True))
    job = make_job(pp=2, tp=1, dp=64, micro_batches=16)      # a DP group no calibration measured
    a, b = held.predict(job), held.predict(job)
    assert a.warnings == b.warnings


def test_a_job_of_more_gpus_per_node_than_the_platform_is_told_how_to_cost_its_real_nodes():
    job = make_job(tp=8, dp=1, pp=1)
    job = job.replace(cluster={"gpus_per_node": 8})
    (w,) = [w for w in predict(job, load_platform("vista-gh200")).warnings if "GPUs per node" in w]
    assert "the job says 8 GPUs per node, platform vista-gh200 has 1" in w and "give 1 per node" in w
    assert not any("GPUs per node" in w for w in predict(job, load_platform("dgx-h100")).warnings)
