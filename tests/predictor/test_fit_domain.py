"""[fitted] scales apply to jobs like the runs they were fitted on (predictor.platform.FitDomain):
a scale can absorb the error of a mechanism every fitted run had, so a job without it, or of a size
none of them had, is predicted from the measured models alone and told so.  The fit that writes the
domain: tests/calibrate/test_fit_domain.py."""
from __future__ import annotations

import dataclasses

import pytest

from predictor import load_platform
from predictor.errors import BundleError
from predictor.estimate import predict, predict_many
from predictor.platform import FitDomain, FittedTerms, job_traits

from .conftest import small_job as _job

# dp 2 jobs on one DGX node, hidden 2048-4096.
DP2 = [_job(hidden=h, heads=h // 128, dp=2, layers=L) for h, L in ((2048, 8), (3072, 8), (4096, 8), (2048, 16))]


def test_the_domain_holds_the_hidden_range_and_the_traits_seen():
    dom = FitDomain.of_jobs(DP2, gpus_per_node=8)
    assert (dom.hidden_min, dom.hidden_max) == (2048, 4096)
    assert dict(dom.traits) == {"dp": (True,), "tp": (False,), "pp": (False,), "cp": (False,), "nodes": (False,)}
    assert dom.outside(_job(hidden=3072, heads=24, dp=2), 8) == ""
    assert "dp > 1" in dom.outside(_job(hidden=3072, heads=24, dp=1), 8)
    assert "tp > 1" in dom.outside(_job(hidden=3072, heads=24, dp=2, tp=2), 8)
    assert "more than one node" in dom.outside(_job(hidden=3072, heads=24, dp=16), 8)
    assert "hidden 8192" in dom.outside(_job(hidden=8192, heads=64, dp=2), 8)
    assert dom.outside(_job(hidden=8192, heads=64, dp=2), 8, sizes=False) == ""
    assert job_traits(_job(dp=4, pp=2), 4)["nodes"] is True


def test_the_domain_round_trips_and_bad_tables_are_refused_by_key():
    dom = FitDomain.of_jobs(DP2, 8)
    terms = FittedTerms(compute_scale=1.2, domain=dom)
    assert FittedTerms.from_dict(terms.to_dict(), "x") == terms
    assert FittedTerms.from_dict(FittedTerms(compute_scale=1.2).to_dict(), "x").domain is None
    for bad, key in (({"hidden": [4096, 2048]}, "hidden"), ({"hidden": [1, 2], "dp": []}, "dp"),
                     ({"hidden": [1, 2], "dp": ["yes"]}, "dp"), ({"hidden": [1, 2], "xx": [True]}, "xx"),
                     ({"hidden": "big"}, "hidden")):
        with pytest.raises(BundleError, match=f"fitted.domain.{key}"):
            FittedTerms.from_dict({"compute_scale": 1.2, "domain": bad}, "platform.toml")


def test_a_job_outside_the_domain_is_predicted_without_the_scales_and_told_so():
    base = load_platform("dgx-a100")
    fitted = dataclasses.replace(base, fitted=FittedTerms(compute_scale=1.3, domain=FitDomain.of_jobs(DP2, 8)))
    inside, no_dp, bigger = (_job(hidden=3072, heads=24, dp=2), _job(hidden=3072, heads=24),
                             _job(hidden=8192, heads=64, dp=2))
    got = predict_many([inside, no_dp, bigger], fitted)
    plain = predict_many([inside, no_dp, bigger], base)
    assert got[0].iteration_seconds > 1.2 * plain[0].iteration_seconds
    assert got[0].details.fitted_scales["compute"] == 1.3
    assert not any("not applied" in w for w in got[0].warnings)
    for g, p in zip(got[1:], plain[1:]):
        assert g.iteration_seconds == p.iteration_seconds          # bit for bit: the models alone
        assert g.interval_seconds == p.interval_seconds
        assert any("fitted scales of platform dgx-a100 are not applied" in w for w in g.warnings)
    assert "dp > 1" in next(w for w in got[1].warnings if "not applied" in w)
    # details.kind says whose factors predicted it: the platform's inside, none outside.
    assert [g.details.kind["factors"] for g in got] == ["platform", "none", "none"]
    assert "hidden 8192" in next(w for w in got[2].warnings if "not applied" in w)
    # One job at a time, the same answers.
    assert predict(no_dp, fitted).iteration_seconds == got[1].iteration_seconds
    # A network scale alone does not care about sizes: the hidden range does not bound it.
    net = dataclasses.replace(base, fitted=FittedTerms(network_scale=1.3, domain=FitDomain.of_jobs(DP2, 8)))
    assert not any("not applied" in w for w in predict(bigger, net).warnings)


def test_a_kept_predictor_answers_a_job_outside_the_fit_domain_the_same_every_time():
    # A job outside the fitted domain goes to the Predictor's unfitted twin, which keeps its own
    # memo: reused, or with the answers forgotten, it gives the same bits as a new Predictor.
    from predictor import Predictor
    base = load_platform("dgx-a100")
    fitted = dataclasses.replace(base, fitted=FittedTerms(compute_scale=1.3, domain=FitDomain.of_jobs(DP2, 8)))
    job = _job(hidden=3072, heads=24)
    first = predict(job, fitted)
    assert any("not applied" in w for w in first.warnings)
    held = Predictor(fitted)
    for forget in (False, False, True):
        if forget:
            held.forget_answers()
        assert held.predict(job).to_dict() == first.to_dict()
