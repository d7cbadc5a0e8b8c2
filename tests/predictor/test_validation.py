"""Measured end-to-end runs recorded on platforms, and the interval they widen."""
from __future__ import annotations

import dataclasses
import shutil

import pytest

from predictor import BundleError, load_platform, predict, predict_many
from predictor.platform import SHIPPED_DIR
from predictor.interval import IntervalRule
from predictor.samples import dump_toml
from predictor.validation import (DEFAULT_TIMELINE_RATIO, MeasuredRun, parse_runs,
                                  ratio_range)

from .conftest import make_job

import sys
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MEASURED = ("perlmutter-a100", "vista-gh200")


@pytest.mark.parametrize("name", MEASURED)
def test_shipped_records_describe_the_shipped_models(name):
    # A record whose prediction went stale (bundles refitted, timeline changed) would widen the
    # interval by the wrong amount: predicting the same jobs again must give the stored numbers.
    plat = load_platform(name)
    assert len(plat.validation) == 5
    fresh = predict_many([r.job for r in plat.validation], plat)
    for run, p in zip(plat.validation, fresh):
        assert p.iteration_seconds == pytest.approx(run.predicted_iteration_seconds, rel=5e-3), run.name


def test_default_spread_covers_every_shipped_record():
    lo, hi = DEFAULT_TIMELINE_RATIO
    for name in MEASURED:
        for run in load_platform(name).validation:
            assert lo <= run.ratio <= hi, (name, run.name, run.ratio)


@pytest.mark.parametrize("name", MEASURED)
def test_recorded_runs_fall_inside_their_intervals(name):
    plat = load_platform(name)
    for run, p in zip(plat.validation, predict_many([r.job for r in plat.validation], plat)):
        lo, hi = p.interval_seconds
        assert lo <= run.measured_iteration_seconds <= hi, run.name
        assert p.details.timeline_runs == 5


def test_vista_interval_reaches_up_to_its_worst_under_prediction(vista):
    # Vista's runs are mostly under-predicted (by up to 37 %): with 5 runs (too few for a conformal
    # bound of its own, predictor.interval) the interval must still stretch upwards by that much,
    # and downwards at least as far as its slight over-prediction.
    worst = max(r.ratio for r in vista.validation)
    assert worst > 1.3
    p = predict(make_job(), vista)
    lo, hi = p.interval_seconds
    assert hi >= worst * p.iteration_seconds * (1 - 1e-12)          # exp(log(x)) may lose an ulp
    assert lo <= min(r.ratio for r in vista.validation) * p.iteration_seconds
    assert p.details.timeline_runs == 5


def test_platform_without_runs_gets_at_least_the_widest_recorded_error():
    # No run of its own and no run of its compute bundle anywhere: nothing says the platform is
    # better than the worst run any shipped platform recorded (Vista's, x1.59;
    # predictor.interval.SHIPPED_PRIOR.maximum).
    dgx = load_platform("dgx-a100")
    alone = dataclasses.replace(dgx, compute=dataclasses.replace(dgx.compute, manifest_sha256="0" * 64))
    assert dgx.validation == []
    assert IntervalRule.for_platform(alone).source == "prior"
    p = predict(make_job(), alone)
    assert p.details.timeline_runs == 0
    worst = max(r.ratio for name in MEASURED for r in load_platform(name).validation)
    assert p.interval_seconds[1] >= worst * p.iteration_seconds


def test_platform_sharing_a_measured_bundle_answers_with_that_bundle_s_runs():
    # dgx-a100 records no run, but its A100 bundle is Perlmutter's: its interval reaches at least
    # as far as Perlmutter's worst runs on each side, and no further than the pooled quantile
    # needs, which is narrower than a platform with no evidence at all gets.
    dgx, perl = load_platform("dgx-a100"), load_platform("perlmutter-a100")
    assert dgx.compute.manifest_sha256 == perl.compute.manifest_sha256 and dgx.validation == []
    rule = IntervalRule.for_platform(dgx)
    assert (rule.source, rule.evidence, rule.runs) == ("bundle", "perlmutter-a100", 0)
    lo, hi = rule.factors
    assert lo <= min(r.ratio for r in perl.validation) and hi >= max(r.ratio for r in perl.validation)
    prior = IntervalRule.from_runs([])
    assert rule.high < prior.high and rule.low < prior.low
    p = predict(make_job(), dgx)
    assert p.details.interval_rule["source"] == "bundle"
    assert p.details.interval_rule["evidence"] == "perlmutter-a100"
    # The bundle's runs say nothing about another GPU's peaks, nor about a spec-only platform.
    for other in (dataclasses.replace(dgx, calibrated=False),
                  dataclasses.replace(dgx, gpu=dataclasses.replace(dgx.gpu, name="Another GPU"))):
        assert IntervalRule.for_platform(other).source == "prior"


def _run(ratio: float, name="r") -> MeasuredRun:
    return MeasuredRun(name, make_job(), measured_iteration_seconds=ratio, predicted_iteration_seconds=1.0)


def test_ratio_range_always_brackets_one():
    assert ratio_range([]) == DEFAULT_TIMELINE_RATIO
    assert ratio_range([_run(1.2), _run(1.4)]) == (1.0, pytest.approx(1.4))
    assert ratio_range([_run(0.8), _run(0.9)]) == (pytest.approx(0.8), 1.0)
    assert ratio_range([_run(0.9), _run(1.1)]) == (pytest.approx(0.9), pytest.approx(1.1))


def test_log_ratio_is_the_residual_intervals_are_built_from():
    assert _run(1.25).log_ratio == pytest.approx(0.22314355)
    assert _run(0.8).log_ratio == pytest.approx(-0.22314355)


def _entry(**kw):
    e = {"name": "a", "measured_iteration_seconds": 2.0, "predicted_iteration_seconds": 1.5,
         "job": make_job().to_dict()}
    e.update(kw)
    return e


@pytest.mark.parametrize("entry, needle", [
    (dict(measured_iteration_seconds=-1.0), "v[0].measured_iteration_seconds: must be a number"),
    (dict(measured_iteration_seconds="7s"), "v[0].measured_iteration_seconds: must be a number"),
    (dict(measured_iteration_seconds=float("nan")), "v[0].measured_iteration_seconds"),
    (dict(predicted_iteration_seconds=True), "v[0].predicted_iteration_seconds"),
    (dict(name=""), "v[0].name"),
    (dict(wallclock=3), "v[0].wallclock: unknown key"),
    (dict(job=None), "v[0].job: missing"),
])
def test_bad_records_name_the_entry_and_field(entry, needle):
    from predictor.errors import RunRecordError
    with pytest.raises(RunRecordError, match=None) as exc:
        parse_runs([_entry(**entry)], "v", need_prediction=True)
    assert needle in str(exc.value)


def test_bad_job_in_a_record_names_the_job_key():
    from predictor.errors import RunRecordError
    job = make_job().to_dict()
    job["model"]["hiden"] = 1
    with pytest.raises(RunRecordError) as exc:
        parse_runs([_entry(job=job)], "v", need_prediction=True)
    assert "v[0].job: model.hiden: unknown key" in str(exc.value)
    e = _entry()
    del e["measured_iteration_seconds"]
    with pytest.raises(RunRecordError, match=r"v\[0\]\.measured_iteration_seconds: missing"):
        parse_runs([e], "v", need_prediction=False)


def test_platform_with_a_bad_record_is_refused_naming_the_file(tmp_path):
    d = tmp_path / "p"
    shutil.copytree(SHIPPED_DIR / "vista-gh200", d)
    raw = tomllib.loads((d / "platform.toml").read_text())
    raw["compute_bundle"] = str(SHIPPED_DIR / "_bundles" / "gh200-120gb")
    raw["validation"][2]["measured_iteration_seconds"] = 0
    (d / "platform.toml").write_text(dump_toml(raw))
    with pytest.raises(BundleError) as exc:
        load_platform(d)
    assert str(d / "platform.toml") in str(exc.value)
    assert "validation[2].measured_iteration_seconds" in str(exc.value)


def test_toml_writer_round_trips_arrays_of_tables():
    data = {"name": "x", "overheads": {"step_seconds": 0.5},
            "validation": [_entry(), _entry(name="b", source="log")]}
    assert tomllib.loads(dump_toml(data)) == data
