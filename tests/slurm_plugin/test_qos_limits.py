"""The QOS and association MaxWall a job gets (slurm_plugin.qos_limits), on sacctmgr's own text."""
from __future__ import annotations

import functools
import logging
import subprocess
import threading

import pytest

from slurm_plugin.policy import WallCap
from slurm_plugin.qos_limits import (Assoc, Qos, WallLimits, WallLimitsSource, limits_enforced, lookup_wall_limits,
                                     parse_assocs, parse_config, parse_qos, parse_users)
from slurm_plugin.slurm_client import SlurmError

# What Slurm 22.05's sacctmgr printed on the dev cluster (-n -P, the formats lookup_wall_limits asks).
QOS_TEXT = "normal||\nqa10|00:12:00|\nlong|2-00:00:00|DenyOnLimit,OverPartQOS\npartq|01:00:00|\n"
ASSOC_TEXT = """root||||||normal
root|root|||||normal,qa10
pa|||root|00:30:00|qa10|normal,qa10
pb|||pa|00:30:00|qa10|normal,qa10
pb|root|short||00:20:00|qa10|normal,qa10
pb|root|||00:30:00|qa10|normal,qa10
solo|||root|||long
solo|alice|||||long
"""
USERS_TEXT = "root|root\nalice|solo\n"
CONFIG_TEXT = """Configuration data as of 2026-11-27T14:52:38
AccountingStorageEnforce = associations,limits,qos
AccountingStorageType   = accounting_storage/slurmdbd
ClusterName             = perfcastdev
"""


def limits() -> WallLimits:
    users, accounts = parse_assocs(ASSOC_TEXT)
    return WallLimits(enforced=True, qos=parse_qos(QOS_TEXT), users=users, accounts=accounts,
                      default_accounts=parse_users(USERS_TEXT))


def test_parsing_sacctmgrs_listings():
    qos = parse_qos(QOS_TEXT)
    assert qos["normal"] == Qos(None) and qos["qa10"] == Qos(12)
    assert qos["long"] == Qos(2880, over_part_qos=True)
    users, accounts = parse_assocs(ASSOC_TEXT)
    assert users[("root", "pb", "short")] == Assoc(20, "", "qa10", ("normal", "qa10"))
    assert accounts["pb"].parent == "pa" and accounts["root"].max_wall is None
    assert parse_users(USERS_TEXT) == {"root": "root", "alice": "solo"}
    assert parse_config(CONFIG_TEXT)["ClusterName"] == "perfcastdev"


@pytest.mark.parametrize("enforce,storage,expect", [
    ("associations,limits,qos", "accounting_storage/slurmdbd", True),
    ("associations,limits,qos,safe", "accounting_storage/slurmdbd", True),
    ("safe", "accounting_storage/slurmdbd", True),
    ("associations,qos", "accounting_storage/slurmdbd", False),    # MaxWall applies only with limits
    ("none", "accounting_storage/slurmdbd", False),
    ("associations,limits,qos", "accounting_storage/none", False),
])
def test_limits_apply_only_where_slurm_enforces_them(enforce, storage, expect):
    enforced, why = limits_enforced({"AccountingStorageEnforce": enforce, "AccountingStorageType": storage})
    assert enforced is expect and (why == "") is expect


def test_the_qos_named_by_the_job():
    assert limits().cap(user="root", account=None, qos="qa10", partition="watch") == WallCap(12, "qos", "qa10")


def test_a_qos_without_maxwall_leaves_the_association_and_none_leaves_nothing():
    lim = limits()
    # root/root (the default account): QOS normal has no MaxWall, nor does the association.
    assert lim.cap(user="root", account=None, qos="normal", partition="watch") is None
    assert lim.cap(user="root", account=None, qos=None, partition="watch") is None
    # ... in account pb the association's 30 minutes (inherited from pa), 20 on partition short.
    assert lim.cap(user="root", account="pb", qos="normal", partition="watch") == WallCap(30, "assoc", "root/pb")
    assert lim.cap(user="root", account="pb", qos="normal", partition="short") == WallCap(20, "assoc", "root/pb")


def test_the_default_qos_when_no_qos_is_given():
    lim = limits()
    # slurmctld's own answer (job_desc.default_qos) first ...
    assert lim.cap(user="root", account="pb", qos=None, partition="watch",
                   default_qos="qa10") == WallCap(12, "qos", "qa10")
    # ... else the association's default QOS (pb inherits qa10 from pa) ...
    assert lim.cap(user="root", account="pb", qos=None, partition="watch") == WallCap(12, "qos", "qa10")
    # ... else its only QOS (alice in solo: long), the account being the user's default one.
    assert lim.cap(user="alice", account=None, qos=None, partition="gpu") == WallCap(2880, "qos", "long")
    assert lim.cap(user="alice", account=None, qos=None, partition="gpu",
                   default_account="solo") == WallCap(2880, "qos", "long")
    # ... else the root association's default QOS, else "normal".
    assert lim.job_qos("nobody", "nowhere", "gpu") == "normal"
    users, accounts = parse_assocs(ASSOC_TEXT.replace("root||||||normal", "root|||||qa10|normal,qa10"))
    assert WallLimits(True, users=users, accounts=accounts).job_qos("nobody", None, "gpu") == "qa10"


def test_the_partitions_qos_comes_first_unless_the_job_qos_overrides_it():
    lim = limits()
    assert lim.cap(user="root", account=None, qos="qa10", partition="p",
                   partition_qos="partq") == WallCap(60, "qos", "partq")
    assert lim.cap(user="root", account=None, qos="long", partition="p",
                   partition_qos="partq") == WallCap(2880, "qos", "long")       # OverPartQOS
    # The first QOS *with* a MaxWall sets it.
    assert lim.cap(user="root", account=None, qos="qa10", partition="p",
                   partition_qos="normal") == WallCap(12, "qos", "qa10")


def test_a_qos_maxwall_beats_the_associations():
    lim = limits()
    assert lim.cap(user="root", account="pb", qos="long", partition="short") == WallCap(2880, "qos", "long")


def test_the_smallest_maxwall_on_the_account_chain():
    users, accounts = parse_assocs(ASSOC_TEXT.replace("pb|root|||00:30:00", "pb|root|||02:00:00")
                                   .replace("pa|||root|00:30:00", "pa|||root|00:45:00"))
    lim = WallLimits(True, users=users, accounts=accounts)
    assert lim.cap(user="root", account="pb", qos="normal", partition="gpu") == WallCap(30, "assoc", "root/pb")


def test_unknown_users_accounts_and_qos_add_no_cap():
    lim = limits()
    assert lim.cap(user=None, account="pb", qos="normal", partition="gpu") is None
    assert lim.cap(user="bob", account="pb", qos="nosuchqos", partition="gpu") is None
    assert lim.cap(user="root", account="nosuch", qos="normal", partition="gpu") is None


def test_not_enforced_means_no_cap_and_the_user_is_only_looked_up_when_needed():
    asked = []

    def who():
        asked.append(1)
        return "root"
    assert WallLimits(enforced=False).cap(user=who, account=None, qos="qa10", partition="gpu") is None
    assert limits().cap(user=who, account=None, qos="qa10", partition="gpu") == WallCap(12, "qos", "qa10")
    assert not asked
    assert limits().cap(user=who, account="pb", qos="normal", partition="gpu") == WallCap(30, "assoc", "root/pb")
    assert asked == [1]


def _runner(answers: dict, calls: list):
    def run(argv, **kw):
        calls.append(argv[:3])
        for key, (rc, out, err) in answers.items():
            if " ".join(argv).startswith(key):
                return subprocess.CompletedProcess(argv, rc, out.encode(), err.encode())
        raise AssertionError(f"unexpected command {argv}")
    return run


def test_lookup_asks_scontrol_then_sacctmgr():
    calls: list = []
    run = _runner({"scontrol show config": (0, CONFIG_TEXT, ""),
                   "sacctmgr -n -P show qos": (0, QOS_TEXT, ""),
                   "sacctmgr -n -P show assoc cluster=perfcastdev": (0, ASSOC_TEXT, ""),
                   "sacctmgr -n -P show user": (0, USERS_TEXT, "")}, calls)
    found = lookup_wall_limits(run=run, env={})
    assert found == limits()
    assert len(calls) == 4


def test_lookup_without_enforced_limits_asks_no_sacctmgr():
    calls: list = []
    text = CONFIG_TEXT.replace("associations,limits,qos", "none")
    found = lookup_wall_limits(run=_runner({"scontrol show config": (0, text, "")}, calls), env={})
    assert not found.enforced and "AccountingStorageEnforce" in found.why and len(calls) == 1


def test_lookup_failures_are_slurm_errors():
    calls: list = []
    run = _runner({"scontrol show config": (0, CONFIG_TEXT, ""),
                   "sacctmgr": (1, "", "sacctmgr: error: Problem talking to the database: Connection refused")},
                  calls)
    with pytest.raises(SlurmError, match="Problem talking to the database"):
        lookup_wall_limits(run=run, env={})

    def missing(argv, **kw):
        raise FileNotFoundError(argv[0])
    with pytest.raises(SlurmError, match="not installed"):
        lookup_wall_limits(run=missing, env={})

    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, 10)
    with pytest.raises(SlurmError, match="no answer"):
        lookup_wall_limits(run=slow, env={})


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_source_fails_open_keeps_the_last_good_answer_and_logs_once():
    answers = [SlurmError("sacctmgr: not installed"), SlurmError("sacctmgr: not installed"), limits(),
               SlurmError("sacctmgr show: Connection refused"), SlurmError("sacctmgr show: Connection refused")]
    said = []
    clock = Clock()
    src = WallLimitsSource(lambda: _next(answers), log=lambda event, level=logging.INFO, **kw: said.append(event),
                           clock=clock, refresh_s=300, retry_s=30)

    def settle():
        assert src.refresh().wait(5)

    settle()
    assert src.limits is None and said == ["slurm_limits_failed"]        # no caps: as today
    assert src.current() is None and src.lookups == 1                    # not due again yet
    clock.t += 31
    src.current()
    assert src.wait(5) and src.lookups == 2 and said == ["slurm_limits_failed"]   # logged once
    clock.t += 31
    src.current()
    assert src.wait(5) and src.limits == limits() and said[-1] == "slurm_limits"
    clock.t += 299
    assert src.current() == limits() and src.lookups == 3                # fresh: no lookup
    clock.t += 2
    src.current()
    assert src.wait(5) and src.limits == limits()                        # failed: the last good kept
    clock.t += 31
    src.current()
    assert src.wait(5) and said == ["slurm_limits_failed", "slurm_limits", "slurm_limits_failed"]


def _next(answers):
    a = answers.pop(0)
    if isinstance(a, Exception):
        raise a
    return a


def test_source_runs_one_lookup_at_a_time_off_the_callers_thread():
    gate = threading.Event()
    threads = []

    def lookup():
        threads.append(threading.current_thread().name)
        gate.wait(5)
        return limits()
    src = WallLimitsSource(lookup, log=lambda *a, **k: None)
    first = src.refresh()
    assert src.refresh() is first and src.current() is None     # still running: served without
    gate.set()
    assert first.wait(5) and src.current() == limits()
    assert threads == ["slurm-limits"]


def test_a_bug_in_the_lookup_fails_open():
    said = []

    def lookup():
        raise KeyError("boom")
    src = WallLimitsSource(lookup, log=lambda event, level=logging.INFO, **kw: said.append((event, kw)))
    assert src.refresh().wait(5) and src.limits is None
    assert said == [("slurm_limits_failed", {"error": "KeyError", "kept": "none"})]


def test_a_partition_time_limit_qos_lifts_maxtime_for_its_own_jobs_only():
    """Flag PartitionTimeLimit: Slurm 22.05 lets a job whose own QOS has it run past the
    partition's MaxTime (it reads the job's QOS flags, not the partition QOS's)."""
    qos = parse_qos("normal||\nlong|10:00:00|PartitionTimeLimit,DenyOnLimit\npartq|01:00:00|\n")
    assert qos["long"] == Qos(600, part_time_limit=True) and not qos["normal"].part_time_limit
    users, accounts = parse_assocs("proj|alice||||long|long,normal\nproj|||root|||long,normal\n")
    walls = WallLimits(enforced=True, qos=qos, users=users, accounts=accounts)
    lifts = functools.partial(walls.lifts_max_time, user="alice", account="proj", partition="gpu")
    assert lifts(qos="long") and not lifts(qos="normal") and not lifts(qos="unknown")
    assert lifts(qos=None, default_qos="long") and not lifts(qos=None, default_qos="normal")
    # No --qos and no answer from slurmctld: the association's default QOS (long).
    assert lifts(qos=None)
    # Not enforced: the QOS list is not Slurm's word on the job: MaxTime stays.
    assert not WallLimits(enforced=False, qos=qos).lifts_max_time(user="alice", account="proj", qos="long",
                                                                 partition="gpu")
    # Its MaxWall still caps the job.
    assert walls.cap(user="alice", account="proj", qos="long", partition="gpu") == WallCap(600, "qos", "long")
