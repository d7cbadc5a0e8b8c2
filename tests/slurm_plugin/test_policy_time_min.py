"""--time-min for backfill, and the one-line message's figures (policy only, no predictor)."""
from __future__ import annotations

import re

from slurm_plugin.policy import PredictionFacts, decide
from slurm_plugin.siteconfig import PartitionPolicy

# 4000 iterations x 10 s + 300 s overheads = 40,300 s = 671.7 min; the interval's upper end 13 s.
PRED = PredictionFacts(iteration_seconds=10.0, iterations=4000, total_seconds=40_300.0,
                       platform="dgx-h100", bundle="b", interval_seconds=(8.0, 13.0))
PART = PartitionPolicy(name="gpu", platform="dgx-h100", startup_minutes=5)


def test_fill_sets_time_from_the_upper_end_and_time_min_from_the_point():
    d = decide(PRED, None, PART)
    # upper end 13 s at 95 %, 10 x 1.3^1.249 = 13.88 s at 98 % (z(0.98) / z(0.95) = 1.249):
    # 40,300 + 4000 x 3.88 = 55,811 s = 930.2 min + 5 -> 940; point: 671.7 + 5 -> 680
    assert d.time_limit_minutes == 940
    assert d.time_min_minutes == 680
    assert "--time-min 11:20:00" in d.message and "min_min=680" in d.admin_comment


def test_time_min_can_be_switched_off_and_is_never_set_when_capped_or_kept():
    assert decide(PRED, None, PartitionPolicy(name="gpu", time_min=False)).time_min_minutes is None
    capped = decide(PRED, None, PART, max_time=600)
    assert capped.time_limit_minutes == 600 and capped.time_min_minutes is None
    assert "(the partition's MaxTime)" in capped.message and "margin" not in capped.message
    assert decide(PRED, 2000, PART).time_min_minutes is None      # the user's --time is kept


def test_one_predicted_figure_in_the_message():
    d = decide(PRED, 100, PART)
    shown = set(re.findall(r"predicted (?:10 s/iter x 4000 iters = )?(\d[\d:-]*\d)", d.message))
    assert shown == {"11:17:00"}, d.message


def test_a_time_above_the_partitions_max_time_is_named_at_submission():
    d = decide(PRED, 3000, PART, max_time=2880)
    assert d.time_limit_minutes is None
    assert any("exceeds" in w and "PartitionTimeLimit" in w for w in d.warnings)
    assert "warn=overmax" in d.admin_comment
    assert "--time=15:40:00" in d.message
