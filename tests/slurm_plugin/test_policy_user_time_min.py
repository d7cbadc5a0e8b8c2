"""A user's own --time-min with no --time: the filled limit never lands below it (Slurm refuses a
job whose --time-min exceeds its limit: "Invalid time-min specification")."""
from __future__ import annotations

from slurm_plugin.policy import NO_VAL, PredictionFacts, WallCap, decide
from slurm_plugin.daemon.protocol import parse_request
from slurm_plugin.siteconfig import PartitionPolicy

# 1000 iterations x 2.4 s + 60 s overhead = 41 min; filled: 41 x 1.15 + 5 = 52.15 -> 55 min.
PRED = PredictionFacts(iteration_seconds=2.4, iterations=1000, total_seconds=2460.0,
                       platform="perlmutter-a100", bundle="b123")
PART = PartitionPolicy(name="watch", platform="perlmutter-a100", margin=0.15, startup_minutes=5,
                       cover_interval=False)


def test_a_time_min_above_the_fill_raises_the_limit_to_it():
    d = decide(PRED, None, PART, max_time=600, user_time_min=90)
    assert d.action == "set" and d.time_limit_minutes == 90
    assert d.time_min_minutes is None                  # the user's --time-min stands, none of ours
    assert "time limit set to 01:30:00 (your --time-min" in d.message
    assert "rec_min=90" in d.admin_comment             # the limit set, as the watch reads it back


def test_a_time_min_below_the_fill_keeps_the_fill_and_sets_no_time_min_of_ours():
    plain = decide(PRED, None, PART, max_time=600)
    d = decide(PRED, None, PART, max_time=600, user_time_min=20)
    assert d.time_limit_minutes == plain.time_limit_minutes == 55
    assert plain.time_min_minutes is not None and d.time_min_minutes is None


def test_no_time_min_given_changes_nothing():
    for tm in (None, NO_VAL):
        assert decide(PRED, None, PART, 600, user_time_min=tm) == decide(PRED, None, PART, 600)
    # with the user's --time the fill policy keeps it: --time-min plays no part
    assert decide(PRED, 30, PART, 600, user_time_min=20) == decide(PRED, 30, PART, 600)


def test_a_time_min_beyond_the_cap_is_warned_not_followed():
    d = decide(PRED, None, PART, max_time=60, wall=WallCap(40, "qos", "q"), user_time_min=50)
    assert d.time_limit_minutes == 40
    assert "--time-min 00:50:00 is more than QOS q allows (00:40:00)" in d.message


def test_the_request_carries_the_users_time_min():
    raw = (b'{"script":"#!/bin/bash\\n","submit_uid":0,"submit_gid":0,"time_min":90}\n')
    assert parse_request(raw, max_script=1 << 20).time_min == 90
    cli = (b'{"script":"#!/bin/bash\\n","submit_uid":0,"submit_gid":0,'
           b'"cli_options":{"time-min":"1:30:00"}}\n')
    assert parse_request(cli, max_script=1 << 20).time_min == 90
