"""validate --fit with the host cost split in its physical terms (per layer, per micro-batch, per
launch): what the runs identify is fitted and carries to other depths; what they cannot tell apart
stays at 1; old [fitted] tables with one host_scale mean what they meant."""
from __future__ import annotations

import dataclasses

import pytest

from calibrate.validate import fit_terms, load_runs
from predictor import load_platform
from predictor.estimate import predict, predict_many
from predictor.platform import FittedTerms

from .test_fit import _copy, _job, _runs_file

SMALL = dict(seq=1024, mb=1, recompute="none", attention="flash", vocab=32000)


def _mape(jobs, plat, truth):
    got = [p.iteration_seconds for p in predict_many(jobs, plat)]
    want = [p.iteration_seconds for p in predict_many(jobs, truth)]
    return sum(abs(g / w - 1) for g, w in zip(got, want)) / len(jobs)


def _fit(tmp_path, base, truth, jobs):
    measured = [p.iteration_seconds for p in predict_many(jobs, truth)]
    return fit_terms(base, load_runs(_runs_file(tmp_path / "r.toml", jobs, measured)))


def test_per_layer_cost_fitted_on_a_few_depths_carries_to_deeper_and_shallower_jobs(tmp_path):
    d = _copy(tmp_path, "dgx-h100")
    base = load_platform(d)
    truth = dataclasses.replace(base, fitted=FittedTerms(host_layer_scale=1.3))
    jobs = [_job(layers=L, hidden=h, heads=h // 64, mbs=m, **SMALL)
            for L, h, m in ((2, 512, 2), (4, 512, 4), (4, 1024, 2), (8, 768, 2), (8, 1024, 4), (6, 512, 3))]
    res = _fit(tmp_path, base, truth, jobs)
    assert "host_layer_scale" in res.fitted and res.improves
    assert res.host_layer_scale == pytest.approx(1.3, rel=0.02)
    assert res.host_micro_batch_scale == pytest.approx(1.0, abs=0.05)
    fitted = dataclasses.replace(base, fitted=res.terms())
    held = [_job(layers=L, hidden=768, heads=12, mbs=m, **SMALL) for L, m in ((1, 4), (16, 2), (24, 4), (32, 2))]
    before, after = _mape(held, base, truth), _mape(held, fitted, truth)
    assert before > 0.15 and after < 0.02


def test_runs_of_one_depth_cannot_tell_per_layer_from_per_micro_batch_cost(tmp_path):
    # Every run 4 layers deep: the per-layer and per-micro-batch costs move every run in the same
    # proportion, so the runs say how slow the host is at 4 layers, not why.  Neither is moved (an
    # old single host scale of 1.3 would have taken 1-layer and 32-layer jobs 20-30 % off).
    d = _copy(tmp_path, "dgx-h100")
    base = load_platform(d)
    truth = dataclasses.replace(base, fitted=FittedTerms(host_micro_batch_scale=2.0))
    jobs = [_job(layers=4, hidden=h, heads=h // 64, mbs=m, **SMALL)
            for h, m in ((512, 2), (768, 4), (1024, 2), (512, 3), (768, 2), (1024, 4))]
    res = _fit(tmp_path, base, truth, jobs)
    for f in ("host_layer_scale", "host_micro_batch_scale"):     # collinear: no bound from the runs
        assert res.identification[f] is None or res.identification[f] > 1.0
    assert not res.host_fitted
    assert res.host_layer_scale == res.host_micro_batch_scale == 1.0
    # What the old single scale would have done at other depths: worse than leaving it alone.
    one = dataclasses.replace(base, fitted=FittedTerms(host_scale=1.27))
    held = [_job(layers=L, hidden=768, heads=12, mbs=2, **SMALL) for L in (16, 32)]
    assert _mape(held, one, truth) > _mape(held, base, truth)


def test_the_per_micro_batch_cost_is_fitted_where_depths_separate_it(tmp_path):
    d = _copy(tmp_path, "dgx-h100")
    base = load_platform(d)
    truth = dataclasses.replace(base, fitted=FittedTerms(host_micro_batch_scale=1.8, host_layer_scale=1.1))
    jobs = [_job(layers=L, hidden=512, heads=8, mbs=m, **SMALL) for L, m in ((1, 2), (1, 4), (2, 2), (4, 2), (8, 4), (16, 2))]
    res = _fit(tmp_path, base, truth, jobs)
    assert {"host_layer_scale", "host_micro_batch_scale"} <= set(res.fitted)
    assert res.host_micro_batch_scale == pytest.approx(1.8, rel=0.03)
    assert res.host_layer_scale == pytest.approx(1.1, rel=0.02)


def test_a_legacy_host_scale_means_what_it_meant(tmp_path):
    d = _copy(tmp_path, "dgx-h100", fitted={"compute_scale": 1.0, "host_scale": 1.25, "runs": ["a"]})
    plat = load_platform(d)
    assert plat.fitted.host_scale == 1.25 and plat.fitted.host_layer_scale == 1.0
    job = _job(layers=4, hidden=512, heads=8, mbs=2, **SMALL)
    # The whole host time times 1.25: the same as every term times 1.25.
    split = dataclasses.replace(plat, fitted=FittedTerms(host_layer_scale=1.25, host_micro_batch_scale=1.25,
                                                         host_launch_scale=1.25))
    assert predict(job, plat).iteration_seconds == pytest.approx(predict(job, split).iteration_seconds, rel=1e-9)
    unscaled = dataclasses.replace(plat, fitted=None)
    assert predict(job, plat).iteration_seconds > 1.15 * predict(job, unscaled).iteration_seconds
    assert predict(job, plat).details.fitted_scales["host"] == 1.25
    # Written back with the split terms at 1, it still loads the same.
    assert FittedTerms.from_dict(plat.fitted.to_dict(), "x") == plat.fitted


def test_a_slower_fabric_is_fitted_on_multi_node_runs_and_carries_to_other_layouts(tmp_path):
    """The network scale: inter-node communication 1.4x what calibration timed alone.  Runs that
    span nodes identify it; it carries to other multi-node layouts and leaves one-node jobs alone."""
    d = _copy(tmp_path, "perlmutter-a100")
    base = load_platform(d)
    truth = dataclasses.replace(base, fitted=FittedTerms(network_scale=1.4))
    # 4 GPUs per node: dp 4+ or tp·pp past 4 spans nodes; the first job stays on one node.
    jobs = [_job(layers=8, hidden=2048, heads=16, dp=2),
            _job(layers=8, hidden=2048, heads=16, dp=8),
            _job(layers=8, hidden=4096, heads=32, tp=4, dp=4),
            _job(layers=8, hidden=4096, heads=32, pp=2, tp=4, dp=2, mbs=16),
            _job(layers=16, hidden=2048, heads=16, pp=4, dp=4, mbs=16),
            _job(layers=8, hidden=3072, heads=24, tp=2, dp=8)]
    res = _fit(tmp_path, base, truth, jobs)
    assert "network_scale" in res.fitted and res.improves
    assert res.network_scale == pytest.approx(1.4, rel=0.03)
    assert res.compute_scale == pytest.approx(1.0, abs=0.02)
    fitted = dataclasses.replace(base, fitted=res.terms())
    held = [_job(layers=12, hidden=5120, heads=40, tp=4, dp=8),
            _job(layers=24, hidden=2048, heads=16, pp=8, dp=2, mbs=16)]
    before, after = _mape(held, base, truth), _mape(held, fitted, truth)
    assert before > 0.03 and after < before / 4
    one_node = _job(layers=8, hidden=2048, heads=16, tp=2, dp=2)
    assert predict(one_node, fitted).iteration_seconds == predict(one_node, base).iteration_seconds
    # Written and read back like the other scales.
    again = FittedTerms.from_dict(res.terms(runs=("a",)).to_dict(), "test")
    assert again.network_scale == pytest.approx(res.network_scale, abs=1e-4)
