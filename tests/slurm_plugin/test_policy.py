"""The time-limit policy, on made-up predictions (no predictor needed)."""
from __future__ import annotations

import re

import pytest

from slurm_plugin.policy import (FILL_LEVEL, NO_VAL, INFINITE, PredictionFacts, decide, iterations_within,
                                 recommended_minutes)
from slurm_plugin.siteconfig import PartitionPolicy

# 1000 iterations x 2.4 s + 60 s overhead = 2460 s = 41 min
PRED = PredictionFacts(iteration_seconds=2.4, iterations=1000, total_seconds=2460.0,
                       platform="perlmutter-a100", bundle="b123")
PART = PartitionPolicy(name="gpu", platform="perlmutter-a100", margin=0.15, startup_minutes=5)


def test_recommended_is_margin_plus_startup_rounded_up_to_5():
    # 41 min x 1.15 = 47.15 + 5 = 52.15 -> 55
    assert recommended_minutes(PRED, PART) == 55


def test_recommended_is_at_least_one_step_and_exact_multiples_stay():
    tiny = PredictionFacts(0.01, 10, 0.1, "p", "b")
    assert recommended_minutes(tiny, PART) == 10   # 5 min startup alone lands on 5.0... plus a bit
    exact = PredictionFacts(1.0, 1500, 1500.0, "p", "b")           # 25 min, no margin, no startup
    assert recommended_minutes(exact, PartitionPolicy(margin=0, startup_minutes=0)) == 25


def test_no_time_given_fills_limit_and_records():
    d = decide(PRED, None, PART, max_time=2880)
    assert d.time_limit_minutes == 55 and d.action == "set"
    assert re.match(r"perfcast:v1 iter_s=2\.4 iters=1000 total_min=41\.0 platform=perlmutter-a100 "
                    r"bundle=b123 ", d.admin_comment)
    assert "time limit set to 00:55:00" in d.message and "\n" not in d.message
    assert not d.warnings


def test_no_val_means_no_time_given():
    assert decide(PRED, NO_VAL, PART).time_limit_minutes == 55
    assert decide(PRED, INFINITE, PART).time_limit_minutes == 55


def test_capped_at_max_time_says_how_many_iterations_fit():
    d = decide(PRED, None, PART, max_time=30)
    assert d.time_limit_minutes == 30
    # 30 min - 5 startup - 60 s overhead = 1440 s / 2.4 = 600 iterations
    assert "only about 600 of 1000 iterations fit" in d.message
    assert "warn=capped" in d.admin_comment


def test_site_max_time_overrides_slurms():
    part = PartitionPolicy(name="gpu", max_time_minutes=20, startup_minutes=5)
    assert decide(PRED, None, part, max_time=2880).time_limit_minutes == 20


def test_unlimited_max_time_does_not_cap():
    assert decide(PRED, None, PART, max_time=INFINITE).time_limit_minutes == 55


def test_given_time_is_kept():
    d = decide(PRED, 60, PART)
    assert d.time_limit_minutes is None and d.action == "keep"
    assert not d.warnings and "keeping --time 01:00:00" in d.message


def test_too_short_time_warns_at_which_iteration():
    d = decide(PRED, 20, PART)
    assert d.time_limit_minutes is None
    # 20 min - 5 startup - 60 s = 840 s / 2.4 = 350
    assert "killed at about iteration 350 of 1000" in d.message
    assert "warn=short" in d.admin_comment


def test_over_asking_warns_about_backfill():
    d = decide(PRED, 48 * 60, PART)
    assert d.time_limit_minutes is None
    assert "backfill" in d.message and "--time=00:55:00" in d.message   # a form --time accepts
    assert "warn=overask" in d.admin_comment


def test_enforce_replaces_given_time():
    part = PartitionPolicy(name="gpu", policy="enforce", startup_minutes=5)
    d = decide(PRED, 20, part)
    assert d.time_limit_minutes == 55 and "replaced by 00:55:00" in d.message
    assert "was too short" in d.message


def test_advise_never_sets():
    part = PartitionPolicy(name="gpu", policy="advise", startup_minutes=5)
    d = decide(PRED, None, part)
    assert d.time_limit_minutes is None and "suggested --time=00:55:00" in d.message
    assert d.time_min_minutes is None


def test_iterations_within_never_negative_or_above_total():
    assert iterations_within(1, PRED, PART) == 0
    assert iterations_within(10_000, PRED, PART) == 1000


@pytest.mark.parametrize("limit", [1, 30, 55, 200, 5000])
def test_never_rejects_and_message_is_one_line(limit):
    d = decide(PRED, limit, PART, max_time=2880)
    assert "\n" not in d.message and d.admin_comment.startswith("perfcast:v1 ")


def test_limit_covers_the_interval_upper_end_when_it_is_longer():
    # 2.4 s/iter, interval up to 3.6 s (+50 % at its 95 % one-sided level); at 98 % the log
    # half-width grows by z(0.98) / z(0.95) = 1.249: 2.4 x 1.5^1.249 = 3.98 s, 1000 x 1.58 s more
    # than the point -> 2460 + 1582 s = 67.4 min; + 5 startup = 72.4 -> 75; the 15 % margin alone
    # would give 55, the 95 % upper end alone 70.
    wide = PredictionFacts(2.4, 1000, 2460.0, "vista-gh200", "b", interval_seconds=(2.3, 3.6))
    d = decide(wide, None, PART)
    assert d.time_limit_minutes == 75
    assert f"the prediction's {100 * FILL_LEVEL:g} % upper bound" in d.message
    from dataclasses import replace
    assert decide(wide, None, replace(PART, cover_interval=False)).time_limit_minutes == 55
    # A site's fill_level: 0.95 is the interval's own upper end; a level outside 0.95-0.999 is refused.
    assert decide(wide, None, replace(PART, fill_level=0.95)).time_limit_minutes == 70
    assert "95 % upper bound" in decide(wide, None, replace(PART, fill_level=0.95)).message
    assert "99.9 % upper bound" in decide(wide, None, replace(PART, fill_level=0.999)).message
    # A narrow interval changes nothing: the margin is longer.
    narrow = PredictionFacts(2.4, 1000, 2460.0, "p", "b", interval_seconds=(2.3, 2.5))
    assert decide(narrow, None, PART).time_limit_minutes == 55
    assert "15% margin" in decide(narrow, None, PART).message


def test_startup_is_counted_once():
    """The prediction's own start-up and the site's allowance cover the same minutes: the longer
    stands. 1000 x 2.4 s + 120 s start-up = 2520 s; without it 2400 s x 1.15 = 2760 s, + the
    site's 5 min = 3060 s = 51 min -> 55 (adding both would give 2520 x 1.15 + 300 = 3198 s -> 55
    too, so the point prediction tells them apart: 2400 + 300 = 2700 s = 45 min, not 47)."""
    pred = PredictionFacts(2.4, 1000, 2520.0, "p", "b", startup_seconds=120.0)
    d = decide(pred, None, PART, max_time=2880)
    assert d.time_min_minutes == 45 and "= 00:45:00 with start-up" in d.message
    long_startup = PredictionFacts(2.4, 1000, 2400.0 + 600.0, "p", "b", startup_seconds=600.0)
    d = decide(long_startup, None, PART, max_time=2880)
    assert d.time_min_minutes == 50 and "start-up 00:10:00" in d.message       # 2400 + 600 s


def test_one_duration_format():
    from slurm_plugin.policy import slurm_duration
    assert slurm_duration(59) == "00:00:59" and slurm_duration(3600) == "01:00:00"
    assert slurm_duration(3 * 86400 + 16 * 3600 + 9 * 60 + 0.2) == "3-16:09:01"


def test_the_daemon_passes_the_predictions_start_up_to_the_policy():
    """What the daemon answers counts start-up once: facts_from_prediction carries the
    prediction's own start-up (the policy then takes the longer of it and the site's allowance)."""
    from predictor import load_platform, predict
    from slurm_plugin.daemon import facts_from_prediction

    from tests.predictor.conftest import make_job

    plat = load_platform("perlmutter-a100")
    pred = predict(make_job(), plat)
    facts = facts_from_prediction(pred, "perlmutter-a100", plat)
    assert facts.startup_seconds == pred.details.total.startup_seconds > 0
