"""The fill capped by the job's QOS or association MaxWall (policy only, no predictor)."""
from __future__ import annotations

import pytest

from slurm_plugin.policy import PredictionFacts, WallCap, decide
from slurm_plugin.siteconfig import PartitionPolicy

# 1000 iterations x 2.4 s + 60 s overhead = 41 min; filled: 41 x 1.15 + 5 = 52.15 -> 55 min.
PRED = PredictionFacts(iteration_seconds=2.4, iterations=1000, total_seconds=2460.0,
                       platform="perlmutter-a100", bundle="b123")
PART = PartitionPolicy(name="watch", platform="perlmutter-a100", margin=0.15, startup_minutes=5,
                       cover_interval=False)
QOS12 = WallCap(12, "qos", "qa10")
ASSOC30 = WallCap(30, "assoc", "alice/proj")


def test_the_qos_maxwall_caps_the_filled_limit_and_says_so():
    d = decide(PRED, None, PART, max_time=60, wall=QOS12)
    assert d.time_limit_minutes == 12 and d.recommended_minutes == 12 and d.action == "set"
    assert d.time_min_minutes is None                     # capped: no --time-min, as at MaxTime
    assert "time limit set to 00:12:00 (QOS qa10's MaxWall)" in d.message
    # 12 min - 5 start-up - 60 s overhead = 360 s / 2.4 = 150 iterations
    assert "needs about 00:55:00 but QOS qa10 allows 00:12:00: only about 150 of 1000 iterations fit" in d.message
    assert "warn=capped cap=qos" in d.admin_comment and "rec_min=12" in d.admin_comment


def test_the_associations_maxwall_is_named_as_such():
    d = decide(PRED, None, PART, max_time=60, wall=ASSOC30)
    assert d.time_limit_minutes == 30
    assert "time limit set to 00:30:00 (the MaxWall of user alice's association in account proj)" in d.message
    assert "but user alice's association in account proj allows 00:30:00" in d.message
    assert "cap=assoc" in d.admin_comment


@pytest.mark.parametrize("wall", [None, WallCap(60, "qos", "q"), WallCap(90, "qos", "q"),
                                  WallCap(55, "assoc", "a/b"), WallCap(120, "assoc", "a/b")])
def test_no_change_when_no_maxwall_binds(wall):
    """A MaxWall at or above what perfcast fills (or the partition's MaxTime) changes nothing,
    nor does one above a --time the user gave."""
    for user_limit in (None, 30, 50, 500):
        if wall is not None and user_limit is not None and user_limit > wall.minutes:
            continue
        for max_time in (None, 60, 2880):
            assert decide(PRED, user_limit, PART, max_time, wall) == decide(PRED, user_limit, PART, max_time)
    assert decide(PRED, 500, PART, 2880, WallCap(1000, "qos", "q")) == decide(PRED, 500, PART, 2880)


def test_a_maxwall_above_the_partitions_maxtime_leaves_maxtimes_wording():
    d = decide(PRED, None, PART, max_time=30, wall=WallCap(40, "qos", "q"))
    assert d.time_limit_minutes == 30 and "(the partition's MaxTime)" in d.message and "cap=" not in d.admin_comment


def test_the_smaller_of_maxtime_and_maxwall():
    assert decide(PRED, None, PART, max_time=10, wall=QOS12).time_limit_minutes == 10
    site = PartitionPolicy(name="watch", max_time_minutes=8, startup_minutes=5)
    assert decide(PRED, None, site, max_time=60, wall=QOS12).time_limit_minutes == 8
    assert decide(PRED, None, PART, max_time=None, wall=QOS12).time_limit_minutes == 12


def test_time_min_stays_below_a_maxwall_that_does_not_bind():
    d = decide(PRED, None, PartitionPolicy(name="watch", startup_minutes=5), max_time=2880)
    assert d.time_min_minutes is not None
    again = decide(PRED, None, PartitionPolicy(name="watch", startup_minutes=5), max_time=2880,
                   wall=WallCap(d.time_limit_minutes, "qos", "q"))
    assert again == d


def test_a_time_above_the_maxwall_is_kept_but_named():
    d = decide(PRED, 30, PART, max_time=60, wall=QOS12)
    assert d.time_limit_minutes is None and d.action == "keep"
    (w,) = [w for w in d.warnings if "exceeds" in w]
    assert w == ("--time 00:30:00 exceeds QOS qa10's MaxWall 00:12:00: Slurm keeps such a job pending "
                 "(QOSMaxWallDurationPerJobLimit) or rejects it; ask for --time=00:12:00")
    assert "warn=overwall" in d.admin_comment and "warn=overmax" not in d.admin_comment
    d = decide(PRED, 40, PART, max_time=60, wall=ASSOC30)
    assert any("AssocMaxWallDurationPerJobLimit" in w for w in d.warnings)


def test_enforce_and_advise_are_capped_too():
    enforce = PartitionPolicy(name="watch", policy="enforce", margin=0.15, startup_minutes=5, cover_interval=False)
    d = decide(PRED, 120, enforce, max_time=60, wall=QOS12)
    assert d.time_limit_minutes == 12 and "replaced by 00:12:00" in d.message
    advise = PartitionPolicy(name="watch", policy="advise", margin=0.15, startup_minutes=5, cover_interval=False)
    d = decide(PRED, None, advise, max_time=60, wall=QOS12)
    assert d.time_limit_minutes is None and "suggested --time=00:12:00" in d.message


def test_a_cap_between_the_prediction_and_the_safe_limit_says_every_iteration_fits_at_the_predicted_rate():
    """46 min needed at the predicted rate, 55 with the margin, the QOS allows 50: every one of the
    1000 iterations fits at 2.4 s, (50 min - 5 - 1) / 2.76 s = 956 at 15 % over it."""
    d = decide(PRED, None, PART, max_time=60, wall=WallCap(50, "qos", "q50"))
    assert d.time_limit_minutes == 50 and "warn=capped" in d.admin_comment
    assert ("needs about 00:55:00 to be safe but QOS q50 allows 00:50:00: all 1000 iterations fit at the "
            "predicted rate, only about 956 at 15% over the prediction") in d.message, d.message
    assert "only about 1000 of 1000" not in d.message
