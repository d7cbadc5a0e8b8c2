"""Per-kind fits (issue 28) leave every platform without one as it was: on each shipped platform,
its recorded runs and the examples/ job files are predicted through the per-kind entry point
exactly as through the path that existed before it (Predictor._predict_in_domain, the interval
rule of the platform's runs alone), to the bit; the answer only gains ``details.kind``."""
from __future__ import annotations

from pathlib import Path

import pytest

from predictor import TrainingJob, list_platforms, load_platform
from predictor.estimate import Predictor
from predictor.interval import SHIPPED_BUNDLE_RUNS, IntervalRule, run_scores
from predictor.kinds import kind_of
from predictor.platform import SHIPPED_DIR

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _jobs(plat):
    jobs = [r.job for r in plat.validation]
    for f in sorted(EXAMPLES.glob("*.toml")):
        jobs.append(TrainingJob.from_toml(f))
    return jobs


@pytest.mark.parametrize("name", sorted(p["name"] for p in list_platforms()
                                        if Path(p["path"]).resolve().parent == SHIPPED_DIR.resolve()))
def test_a_platform_without_a_per_kind_fit_predicts_bit_for_bit_as_before(name):
    plat = load_platform(name)
    assert plat.fitted is None or not plat.fitted.kinds
    jobs = _jobs(plat)
    new = Predictor(plat).predict_many(jobs)
    old = Predictor(plat)._predict_in_domain(jobs)
    for job, a, b in zip(jobs, new, old):
        da, db = a.to_dict(), b.to_dict()
        assert da["details"].pop("kind") == {"key": kind_of(job).key, "factors": "platform" if plat.fitted else "none"}
        assert "kind" not in db["details"]
        assert da == db
    # The interval rule is the platform's runs' rule as it was computed before kinds existed.
    bundle = SHIPPED_BUNDLE_RUNS.get(plat.compute.manifest_sha256)
    if bundle is not None and (bundle.platform == plat.name or plat.transferred or not plat.calibrated):
        bundle = None
    assert IntervalRule.for_platform(plat) == IntervalRule.from_scores(
        run_scores(plat.validation), calibrated=plat.calibrated, bundle=bundle)
