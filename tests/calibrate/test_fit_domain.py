"""[fitted] scales apply to jobs like the runs they were fitted on (predictor.platform.FitDomain):
a scale can absorb the error of a mechanism every fitted run had, so a job without it, or of a size
none of them had, is predicted from the measured models alone and told so.  This file: the fit
writes the domain and applies it; the domain itself: tests/predictor/test_fit_domain.py."""
from __future__ import annotations

import dataclasses

import pytest

from calibrate.cli import main
from calibrate.validate import fit_terms, load_runs
from predictor import load_platform
from predictor.estimate import predict
from predictor.platform import FitDomain
from tests.predictor.test_fit_domain import DP2

from .test_fit import _job, _truth_runs



def test_fitting_on_one_kind_of_job_leaves_other_kinds_as_they_were(tmp_path):
    # A slowdown only data-parallel jobs have (ranks contending for memory bandwidth, as this
    # machine's CPU runs show): fitted on dp 2 runs as a compute scale, it must not move dp 1 jobs.
    _, base, truth, measured, runs = _truth_runs(tmp_path, DP2, "r.toml")
    res = fit_terms(base, load_runs(runs))
    assert res.improves and res.compute_scale == pytest.approx(1.3, rel=0.03)
    assert res.domain == FitDomain.of_jobs(DP2, base.gpus_per_node)
    fitted = dataclasses.replace(base, fitted=res.terms())
    alone = _job(hidden=3072, heads=24)
    assert predict(alone, fitted).iteration_seconds == predict(alone, base).iteration_seconds
    like = _job(hidden=2560, heads=20, dp=2, layers=12)
    assert predict(like, fitted).iteration_seconds == pytest.approx(predict(like, truth).iteration_seconds,
                                                                    rel=0.03)


def test_leave_one_out_asks_whether_the_factors_are_real_not_where_they_apply(tmp_path):
    # The one dp 1 run among dp 2 runs: left out, it lies outside the others' domain, but its
    # leave-one-out prediction still uses their factor (a fit whose factor is exact is kept); the
    # fitted platform then predicts dp 1 jobs with it, since one run of the kind was fitted.
    jobs = DP2 + [_job(hidden=3072, heads=24)]
    _, base, truth, measured, runs = _truth_runs(tmp_path, jobs, "r.toml")
    res = fit_terms(base, load_runs(runs))
    assert res.loo_predictions[-1] == pytest.approx(measured[-1], rel=0.03)
    assert res.improves
    fitted = dataclasses.replace(base, fitted=res.terms())
    alone = _job(hidden=2560, heads=20)
    assert predict(alone, fitted).iteration_seconds == pytest.approx(predict(alone, truth).iteration_seconds,
                                                                     rel=0.03)


def test_validate_fit_writes_the_domain_and_says_where_the_fit_applies(tmp_path, capsys):
    d, _, _, _, f = _truth_runs(tmp_path, DP2)
    assert main(["validate", str(d), "--runs", str(f), "--fit"]) == 0
    out = capsys.readouterr().out
    assert "fit applies to jobs like the runs: hidden 2048–4096; dp > 1" in out
    plat = load_platform(d, reload=True)
    assert plat.fitted.domain == FitDomain.of_jobs(DP2, plat.gpus_per_node)
    assert any("not applied" in w for w in predict(_job(hidden=3072, heads=24), plat).warnings)


