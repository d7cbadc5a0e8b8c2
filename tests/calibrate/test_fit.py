"""perf-calibrate validate --fit: physical end-to-end scales fitted with leave-one-out.

Synthetic runs are the platform's own predictions with known [fitted] scales applied: the fit must
recover them, carry them to a job it never saw, and write nothing when leave-one-out does not improve.
"""
from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from calibrate.cli import main
from calibrate.validate import fit_terms, load_runs
from predictor import load_platform
from predictor.errors import BundleError
from predictor.estimate import predict, predict_many
from predictor.platform import FittedTerms
from predictor.samples import dump_toml
from predictor.kinds import kind_of
from tests.predictor.conftest import copy_shipped_platform
from tests.predictor.conftest import small_job as _job

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _copy(tmp_path, name, **changes):
    """A shipped platform's platform.toml in tmp_path without its recorded runs, as a directory."""
    return copy_shipped_platform(tmp_path, name, validation=None, **changes)


# Device-bound jobs of a few shapes and layouts (the A100 platform has no host-bound regime here).
A100_JOBS = [_job(), _job(hidden=2048, heads=16), _job(tp=2, dp=2), _job(pp=2, tp=4, mbs=16),
             _job(layers=16, hidden=5120, heads=40, tp=4), _job(seq=4096, mb=1, tp=2)]


def _runs_file(path, jobs, seconds):
    path.write_text(dump_toml({"run": [{"name": f"run {i}", "source": "synthetic", "job": j.to_dict(),
                                        "measured_iteration_seconds": float(s)}
                                       for i, (j, s) in enumerate(zip(jobs, seconds))]}))
    return path


def _truth_runs(tmp_path, jobs, filename="runs.toml"):
    """A copy of dgx-a100 (its directory and platform), the same platform 30 % slower in compute
    (the truth a fit should recover), the jobs' iteration times under that truth, and those times
    as a runs file."""
    d = _copy(tmp_path, "dgx-a100")
    base = load_platform(d)
    truth = dataclasses.replace(base, fitted=FittedTerms(compute_scale=1.3))
    measured = [p.iteration_seconds for p in predict_many(jobs, truth)]
    return d, base, truth, measured, _runs_file(tmp_path / filename, jobs, measured)


def test_fit_recovers_a_compute_scale_and_carries_it_to_another_job(tmp_path, capsys):
    d, base, truth, measured, f = _truth_runs(tmp_path, A100_JOBS)
    assert main(["validate", str(d), "--runs", str(f), "--fit"]) == 0
    out = capsys.readouterr().out
    assert "leave-one-out MAPE before" in out and "written to [fitted]" in out
    plat = load_platform(d)
    # One kind of job: its runs alone cannot say how much of the offset is the partition's, so the
    # kind carries it (calibrate/fitting/kinds.py) and jobs of other kinds keep the models.
    (kind,) = plat.fitted.kinds
    assert kind.kind == kind_of(A100_JOBS[0]).key and kind.runs == len(A100_JOBS)
    assert kind.scale("compute_scale") == pytest.approx(1.3, rel=0.01)
    assert plat.fitted.compute_scale == pytest.approx(1.0, abs=0.01)
    assert plat.fitted.host_scale == 1.0                     # no run is host-bound: not a term here
    assert plat.fitted.loo_mape_after < 0.01 < plat.fitted.loo_mape_before
    assert list(plat.fitted.runs) == [f"run {i}" for i in range(len(A100_JOBS))]
    # A job the fit never saw: predicted as the truth predicts it, where before it was 20 % off.
    held = _job(layers=12, hidden=3072, heads=24, pp=2, tp=2, dp=2, mbs=12)
    want = predict(held, truth).iteration_seconds
    assert abs(predict(held, base).iteration_seconds / want - 1) > 0.15
    assert predict(held, plat).iteration_seconds == pytest.approx(want, rel=0.01)
    assert predict(held, plat).details.fitted_scales["compute"] == kind.scale("compute_scale")
    assert predict(held, plat).details.kind == {"key": kind.kind, "factors": "kind", "runs": len(A100_JOBS)}
    # The runs are recorded with their leave-one-out predictions (what widens the intervals).
    assert all(r.predicted_iteration_seconds == pytest.approx(r.measured_iteration_seconds, rel=0.01)
               for r in plat.validation)


def test_fit_recovers_a_host_scale_where_runs_are_host_bound(tmp_path):
    d = _copy(tmp_path, "dgx-h100")
    base = load_platform(d)
    assert base.host is not None
    small = dict(seq=1024, mb=1, recompute="none", attention="flash", vocab=32000)
    jobs = [_job(layers=4, hidden=512, heads=8, mbs=2, **small), _job(layers=4, hidden=1024, heads=8, mbs=4, **small),
            _job(layers=8, hidden=1024, heads=16, mbs=2, **small), _job(layers=16, hidden=768, heads=12, mbs=4, **small),
            _job(layers=4, hidden=4096, heads=32, mbs=2, **small), _job(layers=8, hidden=4096, heads=32, mbs=4, **small),
            _job(layers=4, hidden=6144, heads=48, mbs=2, **small),
            # Depths 1 and 2 tell the per-layer cost from the per-micro-batch one (all or none).
            _job(layers=1, hidden=512, heads=8, mbs=4, **small), _job(layers=2, hidden=768, heads=12, mbs=2, **small)]
    truth = dataclasses.replace(base, fitted=FittedTerms(compute_scale=1.1, host_layer_scale=1.4))
    preds = predict_many(jobs, truth)
    assert any(p.breakdown.host_wait_seconds > 0 for p in preds) and any(p.breakdown.host_wait_seconds == 0 for p in preds)
    res = fit_terms(base, load_runs(_runs_file(tmp_path / "r.toml", jobs, [p.iteration_seconds for p in preds])))
    assert res.host_fitted and "host_layer_scale" in res.fitted
    assert res.compute_scale == pytest.approx(1.1, rel=0.01) and res.host_layer_scale == pytest.approx(1.4, rel=0.01)
    assert res.host_micro_batch_scale == pytest.approx(1.0, abs=0.03) and res.host_launch_scale == 1.0
    assert res.loo_mape_after < 0.01 < res.mape_before and res.improves


def test_a_scale_too_few_runs_see_is_not_fitted(tmp_path):
    # Large device-bound models plus one host-bound run: the host scale moves that one run only,
    # which cannot identify it, so it stays 1 whatever that run wants (fitted on such a set, a host
    # scale used to drift far enough to ruin small host-bound jobs it never saw).
    d = _copy(tmp_path, "dgx-h100")
    base = load_platform(d)
    small = dict(seq=1024, mb=1, recompute="none", attention="flash", vocab=32000)
    jobs = [_job(layers=4, hidden=512, heads=8, mbs=2, **small)] + [
        _job(layers=4, hidden=h, heads=h // 128, mbs=4, **dict(small, mb=4)) for h in (4096, 5120, 6144, 8192)]
    truth = dataclasses.replace(base, fitted=FittedTerms(compute_scale=1.05, host_scale=1.6))
    preds = predict_many(jobs, truth)
    assert sum(p.breakdown.host_wait_seconds > 0 for p in preds) == 1
    res = fit_terms(base, load_runs(_runs_file(tmp_path / "r.toml", jobs, [p.iteration_seconds for p in preds])))
    assert not res.host_fitted and res.host_scale == 1.0
    assert res.host_layer_scale == res.host_micro_batch_scale == 1.0
    assert res.compute_scale == pytest.approx(1.05, rel=0.01)


def test_nothing_written_when_leave_one_out_does_not_improve(tmp_path, capsys):
    d = _copy(tmp_path, "dgx-a100")
    base = load_platform(d)
    # The platform already predicts these exactly: nothing can improve on it.
    f = _runs_file(tmp_path / "runs.toml", A100_JOBS, [p.iteration_seconds for p in predict_many(A100_JOBS, base)])
    assert main(["validate", str(d), "--runs", str(f), "--fit", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["fit"]["written"] is False and "does not improve" in rep["fit"]["reason"]
    raw = tomllib.loads((d / "platform.toml").read_text())
    assert len(raw["validation"]) == len(A100_JOBS)     # the runs are still recorded
    # ... with their kinds' intervals, every factor left at 1: no prediction moves.
    from predictor.platform import FITTED_SCALES
    assert all(raw["fitted"].get(k, 1.0) == 1.0 for k in FITTED_SCALES)
    assert raw["fitted"]["unseen_kind_bound"] > 0 and raw["fitted_kind"]
    after = predict_many(A100_JOBS, load_platform(d, reload=True))
    assert [p.iteration_seconds for p in after] == [p.iteration_seconds for p in predict_many(A100_JOBS, base)]
    assert "per-kind intervals recorded" in rep["fit"]["reason"]


def test_scattered_runs_no_single_scale_explains_are_not_fitted(tmp_path):
    d = _copy(tmp_path, "dgx-a100")
    base = load_platform(d)
    preds = [p.iteration_seconds for p in predict_many(A100_JOBS, base)]
    # Half the runs 30 % slower, half 30 % faster than predicted: a scale only trades one for the other.
    noisy = [p * (1.3 if i % 2 else 1 / 1.3) for i, p in enumerate(preds)]
    res = fit_terms(base, load_runs(_runs_file(tmp_path / "r.toml", A100_JOBS, noisy)))
    assert not res.improves


def test_too_few_runs_and_dry_run(tmp_path, capsys):
    d = _copy(tmp_path, "dgx-a100")
    truth = dataclasses.replace(load_platform(d), fitted=FittedTerms(compute_scale=1.5))
    measured = [p.iteration_seconds for p in predict_many(A100_JOBS, truth)]
    two = _runs_file(tmp_path / "two.toml", A100_JOBS[:2], measured[:2])
    assert main(["validate", str(d), "--runs", str(two), "--fit", "--dry-run"]) == 0
    assert "needs at least 3 runs" in capsys.readouterr().out
    before = (d / "platform.toml").read_text()
    f = _runs_file(tmp_path / "runs.toml", A100_JOBS, measured)
    assert main(["validate", str(d), "--runs", str(f), "--fit", "--dry-run", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["fit"]["kinds"][0]["factors"]["compute_scale"]["value"] == pytest.approx(1.5, rel=0.01)
    assert rep["fit"]["written"] is False and "dry run" in rep["fit"]["reason"]
    assert (d / "platform.toml").read_text() == before


def test_plain_validate_keeps_the_fitted_table(tmp_path):
    d = _copy(tmp_path, "dgx-a100", fitted={"compute_scale": 1.2, "host_scale": 1.0, "runs": ["a"],
                                            "loo_mape_before": 0.2, "loo_mape_after": 0.05,
                                            "fitted_at": "2024-05-01T00:00:00Z", "source": "test"})
    base = load_platform(d)
    assert base.fitted.compute_scale == 1.2
    f = _runs_file(tmp_path / "runs.toml", A100_JOBS[:1], [5.0])
    assert main(["validate", str(d), "--runs", str(f)]) == 0
    assert load_platform(d).fitted == base.fitted


def test_an_attention_scale_beyond_the_others_range_is_accepted(tmp_path):
    # Attention kernels on one GPU differ by up to 4x (predictor.platform.ATTENTION_SCALE_RANGE).
    d = _copy(tmp_path, "dgx-a100", fitted={"attention_scale": 3.5})
    assert load_platform(d).fitted.attention_scale == 3.5


@pytest.mark.parametrize("table, needle", [
    ({"compute_scale": 3.0}, "fitted.compute_scale must be a number in [0.5, 2.0]"),
    ({"host_scale": "fast"}, "fitted.host_scale"),
    ({"host_layer_scale": 0.1}, "fitted.host_layer_scale must be a number in [0.5, 2.0]"),
    ({"attention_scale": 0.3}, "fitted.attention_scale must be a number in [0.5, 4.0]"),
    ({"attention_scale": 4.5}, "fitted.attention_scale must be a number in [0.5, 4.0]"),
    ({"host_micro_batch_scale": True}, "fitted.host_micro_batch_scale"),
    ({"host_launch_scale": "x"}, "fitted.host_launch_scale"),
    ("compute_scale = nan", "fitted.compute_scale"),
    ({"link_scale": 1.0}, "fitted.link_scale: unknown key"),
    ({"runs": "all"}, "fitted.runs"),
])
def test_bad_fitted_table_is_refused_naming_the_key(tmp_path, table, needle):
    if isinstance(table, str):           # what our TOML writer refuses to write, an admin may
        d = _copy(tmp_path, "dgx-a100")
        with open(d / "platform.toml", "a") as fh:
            fh.write(f"\n[fitted]\n{table}\n")
    else:
        d = _copy(tmp_path, "dgx-a100", fitted=table)
    with pytest.raises(BundleError) as e:
        load_platform(d)
    assert needle in str(e.value) and str(d) in str(e.value)
