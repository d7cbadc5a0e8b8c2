"""A job's kind (predictor.kinds: its stack as the launch reveals it), the [[fitted_kind]] tables a
platform file carries, and the interval a kind gets by its run count (predictor.interval).  The
fit that learns them: tests/calibrate/test_kinds_fit.py."""
from __future__ import annotations

import pytest

from predictor import load_platform
from predictor.errors import BundleError
from predictor.interval import IntervalRule
from predictor.kinds import JobKind, kind_of

from .conftest import copy_shipped_platform
from .conftest import small_job as _job
from .conftest import with_run as _with


def test_a_jobs_kind_is_its_stack_as_the_launch_reveals_it():
    j = _job(recompute="selective", attention="flash")
    assert kind_of(j).key == "-/flash/fp16/selective"
    k = kind_of(_with(j, framework="deepspeed"))
    assert k.key == "deepspeed/flash/fp16/selective"
    assert JobKind.from_key(k.key, "x") == k and JobKind.from_key("-/flash/fp16/none", "x").framework == ""
    for bad in ("deepspeed/flash", "a//b/c", 3, "/".join(["x" * 65] * 4)):
        with pytest.raises(BundleError, match="where: kind"):
            JobKind.from_key(bad, "where")


@pytest.mark.parametrize("kind, needle", [
    ({"kind": "nope", "runs": 3}, "fitted_kind[0].kind: kind 'nope' must be"),
    ({"kind": "-/flash/bf16/none", "runs": 3, "compute_scale": 5.0}, "fitted_kind[0].compute_scale must be"),
    ({"kind": "-/flash/bf16/none", "runs": -1}, "fitted_kind[0].runs must be"),
    ({"kind": "-/flash/bf16/none", "runs": 3, "speed": 1}, "fitted_kind[0].speed: unknown key"),
    ({"kind": "-/flash/bf16/none", "runs": 3, "scores": ["a"]}, "fitted_kind[0].scores must be"),
])
def test_a_malformed_fitted_kind_is_refused_naming_the_file_and_key(tmp_path, kind, needle):
    d = copy_shipped_platform(tmp_path, "dgx-a100", validation=None, fitted={"compute_scale": 1.0}, fitted_kind=[kind])
    with pytest.raises(BundleError, match=r"platform\.toml: " + needle.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_platform(d, reload=True)


def test_fitted_kind_without_fitted_is_refused(tmp_path):
    d = copy_shipped_platform(tmp_path, "dgx-a100", validation=None,
                              fitted_kind=[{"kind": "-/flash/bf16/none", "runs": 3}])
    with pytest.raises(BundleError, match=r"\[\[fitted_kind\]\] without \[fitted\]"):
        load_platform(d, reload=True)


def test_interval_of_a_kind_by_its_run_count():
    plat_rule = IntervalRule(0.2, 0.2, "own", 40)
    own = plat_rule.for_kind([0.01 * i for i in range(-5, 6)], 0.6)            # 11 runs: its own quantile
    assert own.source == "kind" and own.low == own.high == pytest.approx(0.05)
    few = plat_rule.for_kind([0.3, -0.25, 0.0], 0.6)                           # 3 runs: widened to its worst
    assert few.source == "kind-pooled" and (few.low, few.high) == (0.25, 0.3)
    unseen = plat_rule.for_kind(None, 0.6)
    assert unseen.source == "unseen-kind" and unseen.low == unseen.high == 0.6
    assert plat_rule.for_kind(None, 0.1).low == 0.2                            # never below the platform's
