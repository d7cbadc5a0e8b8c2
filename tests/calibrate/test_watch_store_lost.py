"""perf-calibrate watch when the record store lets it down (QA F6, F12): a store moved aside (every
running job's record missing from the new one), a corrupt store, a store locked by another writer,
and array tasks named as Slurm names them.  Against the stand-in Slurm client of test_watch.py,
with a real record store and real logs; the AdminComments are the daemon's own
(:func:`slurm_plugin.policy.decide`)."""
from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from pathlib import Path

import pytest

import calibrate.watch_log as watch_log
from calibrate.watch import (Decision, WatchOptions, _store_problem, admin_comment_with, comment_fields,
                             first_limit_seen, job_name, record_from_comment, watch_change, watch_once)
from calibrate.watch_log import WatchLog, read_actions
from slurm_plugin.policy import PredictionFacts
from slurm_plugin.policy import decide as daemon_decide
from slurm_plugin.records import DAMAGED_ADVICE, RecordStore, RecordStoreError, parse_admin_comment
from slurm_plugin.siteconfig import PartitionPolicy

from .test_watch import POLICY, FakeSlurm, megatron_log, record, running, site  # noqa: F401

RID = "2c836a714e5d"


def daemon_comment(user_limit=None, rid=RID) -> str:
    """What perf-predictd puts into the AdminComment of a job predicted at 0.5 s x 1000 iterations
    (perfcast's limit: 11 min, --time-min 10) -- with ``rec=<id>`` as the daemon appends it."""
    d = daemon_decide(PredictionFacts(0.5, 1000, 520.0, "perlmutter-a100", "b", (0.45, 0.55)), user_limit,
                      PartitionPolicy(name="gpu", margin=0.1, startup_minutes=1, round_minutes=1,
                                      cover_interval=False))
    return f"{d.admin_comment} rec={rid}" if rid else d.admin_comment


def opts_for(tmp: Path, out_dir=None) -> WatchOptions:
    return WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=out_dir)


# ------------------------------------------------------------------------------ F6a: record missing

def test_a_job_whose_record_went_with_a_store_moved_aside_is_extended_from_its_admin_comment(site):
    """The store was moved aside and the daemon started a new one: the running jobs' records are
    not in it.  The watch still extends a slow job (from the AdminComment's plan and limit), never
    shrinks a fast one on that basis, says why in the reason, and writes no harvestable run."""
    tmp, _ = site                                 # a new, empty store
    now = time.time()
    megatron_log(tmp / "slow.out", 1.0, 200)      # 2x slower than the predicted 0.5 s, 200 s in
    megatron_log(tmp / "fast.out", 0.1, 200)      # 5x faster, 20 s in
    comment = daemon_comment()
    assert "action=set rec_min=11 min_min=10" in comment
    slurm = FakeSlurm([running(RID, 11, tmp / "slow.out", limit_min=11, start=now - 200, admin_comment=comment),
                       running("0123456789ab", 12, tmp / "fast.out", limit_min=11, start=now - 20,
                               admin_comment=daemon_comment(rid="0123456789ab"))])
    res = watch_once(opts_for(tmp, out_dir=tmp / "runs"), slurm, now=now)
    by = {j.job_id: j for j in res.jobs}
    slow, fast = by[11], by[12]
    # 800 left at 1 s: 200 + 880 + 60 s -> 19 min, within max_growth of the 11 perfcast set.
    assert slow.decision.action == "extend" and slow.applied and slurm.limits == {11: 19}
    assert slow.decision.reason.endswith(f"; from its AdminComment (record {RID} is not in the store)")
    assert "iteration 200 of 1000" in slow.decision.reason and slow.from_comment
    # The user reads why in the AdminComment; the daemon's record in it stays as it was.
    assert "perfcast-watch: extend 00:11:00->00:19:00" in slurm.comments[11]
    assert "from its AdminComment (record 2c836a714e5d is not in the store)" in slurm.comments[11]
    assert comment_fields(slurm.comments[11]) == parse_admin_comment(comment)
    # A record rebuilt from the AdminComment never shrinks a limit.
    assert fast.decision.action == "none" and fast.decision.code == "no-shrink" and 12 not in slurm.limits
    assert "never shrinks" in fast.decision.reason
    # The actions are in the new store; no run (the job file went with the old store).
    acts = read_actions(tmp / "records.sqlite")
    assert [(a.slurm_job_id, a.action, a.record_id) for a in acts] == [(11, "extend", RID),
                                                                       (12, "none", "0123456789ab")]
    assert not (tmp / "runs").exists()
    (warning,) = res.warnings
    assert "2 running perfcast jobs without a record there" in warning
    assert "2 running jobs worked from their AdminComments (1 extended; never shrunk): 11, 12" in warning
    assert "limits changed this pass: 11" in warning


def test_an_admin_comment_without_what_the_watch_needs_says_what_it_lacks(site):
    tmp, _ = site
    now = time.time()
    megatron_log(tmp / "slow.out", 1.0, 200)
    bare = f"perfcast:v1 iter_s=0.5 total_min=8.7 action=set rec={RID}"          # no iters=, no rec_min=
    slurm = FakeSlurm([running(RID, 21, tmp / "slow.out", limit_min=11, start=now - 200, admin_comment=bare),
                       running(RID, 22, tmp / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=bare.replace("iter_s=0.5", "iter_s=fast iters=1000 rec_min=11"))])
    res = watch_once(opts_for(tmp), slurm, now=now)
    by = {j.job_id: j.decision for j in res.jobs}
    assert by[21].code == "no-record" and slurm.limits == {}
    assert by[21].reason == (f"record {RID} is not in the store, and its AdminComment lacks iters= (the planned "
                             "iterations), rec_min= (the limit perfcast set): nothing to work from")
    assert "a valid iter_s= (the predicted seconds per iteration; it says 'fast')" in by[22].reason
    assert "2 left alone, their AdminComments lacking what the watch needs: 21, 22" in res.warnings[0]
    assert "no limits were changed this pass" in res.warnings[0]


def test_a_job_whose_record_was_never_kept_is_watched_from_its_admin_comment(site):
    """A prediction whose record the daemon could not spool gets no rec= id: same fallback."""
    tmp, _ = site
    now = time.time()
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running("", 23, tmp / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=daemon_comment(rid=""))])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.action == "extend" and slurm.limits == {23: 19}
    assert "from its AdminComment (its AdminComment names no record (no rec= id" in d.reason


def test_the_record_rebuilt_from_the_admin_comment_holds_what_the_daemon_wrote():
    job = running(RID, 1, Path("/w/x.out"), limit_min=11, start=0.0, admin_comment=daemon_comment())
    rec, why = record_from_comment(job)
    assert why == ""
    assert (rec.iterations, rec.iteration_seconds, rec.total_seconds) == (1000, 0.5, pytest.approx(522.0))
    assert (rec.action, rec.time_limit_minutes, rec.time_min_minutes, rec.record_id) == ("set", 11, 10, RID)
    assert (rec.uid, rec.gid, rec.partition, rec.platform) == (job.uid, job.gid, "gpu", "perlmutter-a100")
    # A limit the user set (action=keep) is theirs: no limit perfcast set to compare with.
    kept, _ = record_from_comment(dataclasses.replace(job, admin_comment=daemon_comment(user_limit=30)))
    assert kept.action == "keep" and kept.time_limit_minutes is None
    # The watch's segment (its reason may quote the user's log path) never passes for the daemon's.
    spoof = admin_comment_with(daemon_comment(), Decision("none", "unreadable", "cannot read /h/ perfcast:v1 "
                                                          "iters=99999 rec_min=999 x", 660.0, 660.0), 0.0, 1)
    assert parse_admin_comment(spoof)["iters"] == "99999"           # the parser alone is fooled
    assert record_from_comment(dataclasses.replace(job, admin_comment=spoof))[0].iterations == 1000


def test_after_the_store_lost_the_watchs_state_its_admin_comment_bounds_the_next_extension():
    """The watch extended 11 -> 19 min, then the store (with its first-limit state) was moved aside:
    max_growth counts from the limit perfcast set, not from the extended one."""
    told = admin_comment_with(daemon_comment(), Decision("extend", "extend", "slow", 660.0, 1140.0), 0.0, 1)
    job = running(RID, 1, Path("/w/x.out"), limit_min=19, start=0.0, admin_comment=told)
    assert watch_change(told) == ("extend", 660.0, 1140.0)
    assert first_limit_seen(job, 1140.0) == 660.0
    # Without a change of the watch in it, the limit now is the first one seen (as before).
    assert first_limit_seen(dataclasses.replace(job, admin_comment=daemon_comment()), 1140.0) == 1140.0


# ------------------------------------------------------------------------------ F6a: corrupt store

def corrupt(path: Path) -> None:
    con = sqlite3.connect(str(path))
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")       # every page in the file itself
    con.close()
    data = bytearray(path.read_bytes())
    data[0:100] = b"\xa5" * 100                    # the header: "file is not a database"
    path.write_bytes(bytes(data))


def test_a_corrupt_store_does_not_stop_the_watch_from_protecting_jobs(site, caplog):
    tmp, store = site
    now = time.time()
    rid = store.add(record(time_limit_minutes=11))
    wlog = WatchLog(tmp / "records.sqlite")
    wlog.job(0)                                    # the watch's tables exist too
    wlog.close()
    store.close()
    corrupt(tmp / "records.sqlite")
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(rid, 31, tmp / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=daemon_comment(rid=rid))])
    with caplog.at_level(logging.WARNING, logger="calibrate.watch"):
        res = watch_once(opts_for(tmp), slurm, now=now)
    d = res.jobs[0].decision
    assert d.action == "extend" and slurm.limits == {31: 19}
    assert d.reason.endswith(f"; from its AdminComment (record {rid} could not be read from the store)")
    (warning,) = res.warnings
    assert [r.getMessage() for r in caplog.records if r.name == "calibrate.watch"] == [warning]   # one per pass
    assert "records.sqlite: corrupt or not a perfcast record store (file is not a database)" in warning
    # What moving it aside costs, and how to keep the rows.
    assert 'sqlite3 records.sqlite ".recover" | sqlite3 recovered.sqlite' in warning
    assert "every running job loses its record" in warning and "the harvest cannot match it" in warning
    assert "the daemon starts a new one" not in warning
    assert warning.count("When the store is damaged") == 1         # the advice once, the watch's own
    assert "1 of this pass's actions not recorded in the store" in warning
    assert "limits changed this pass: 31" in warning and "the next pass retries the store" in warning


def test_a_store_with_a_bad_page_gives_the_records_it_can(site, monkeypatch):
    """A corrupt page costs the records on it, not the others'."""
    tmp, store = site
    now = time.time()
    good, bad = store.add(record(time_limit_minutes=11)), store.add(record(time_limit_minutes=11))
    get = RecordStore.get

    def get_or_fail(self, record_id):
        if record_id == bad:
            raise RecordStoreError(f"{self.path}: corrupt or not a perfcast record store (database disk image "
                                   f"is malformed): {DAMAGED_ADVICE}")
        return get(self, record_id)

    monkeypatch.setattr(RecordStore, "get", get_or_fail)
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(good, 41, tmp / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=daemon_comment(rid=good)),
                       running(bad, 42, tmp / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=daemon_comment(rid=bad))])
    res = watch_once(opts_for(tmp), slurm, now=now)
    by = {j.job_id: j for j in res.jobs}
    assert by[41].from_comment == "" and "AdminComment" not in by[41].decision.reason
    assert by[42].from_comment == f"record {bad} could not be read from the store"
    assert slurm.limits == {41: 19, 42: 19}
    assert "(database disk image is malformed); to keep its records" in res.warnings[0]


# ------------------------------------------------------------------------------ F12b: locked store

@pytest.fixture
def locked(site, monkeypatch):
    """The store with another writer holding its write lock (an admin's sqlite3 shell in a
    transaction, a hung harvest); the busy timeout shortened from 5 s."""
    tmp, store = site
    WatchLog(tmp / "records.sqlite").job(0)
    monkeypatch.setattr(watch_log, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(str(tmp / "records.sqlite"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    yield tmp, store
    holder.rollback()
    holder.close()


def test_a_locked_store_says_no_limit_changed_and_that_the_next_pass_retries(locked):
    tmp, _ = locked
    now = time.time()
    megatron_log(tmp / "ok.out", 0.5, 200)                      # on time
    slurm = FakeSlurm([running(RID, 51, tmp / "ok.out", limit_min=11, start=now - 100,
                               admin_comment=daemon_comment())])
    res = watch_once(opts_for(tmp), slurm, now=now)
    assert res.jobs[0].decision.code == "on-track" and slurm.limits == {}
    (warning,) = res.warnings
    assert "records.sqlite: database is locked (another process has held its write lock for more than 5 s)" \
        in warning
    assert "no limits were changed this pass" in warning and "the next pass retries the store" in warning


def test_a_locked_store_does_not_keep_a_slow_job_from_its_extension(locked):
    tmp, _ = locked
    now = time.time()
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(RID, 52, tmp / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=daemon_comment())])
    res = watch_once(opts_for(tmp), slurm, now=now)
    assert res.jobs[0].applied and slurm.limits == {52: 19}
    assert "perfcast-watch: extend 00:11:00->00:19:00" in slurm.comments[52]
    (warning,) = res.warnings
    assert "database is locked" in warning and "1 of this pass's actions not recorded in the store" in warning
    assert "limits changed this pass: 52" in warning and "no limits were changed" not in warning


def test_store_problems_name_their_cost():
    said = _store_problem(f"/s/records.sqlite: corrupt or not a perfcast record store (file is not a database): "
                          f"{DAMAGED_ADVICE}")
    assert said.startswith("/s/records.sqlite: corrupt or not a perfcast record store (file is not a database); "
                           "to keep its records, recover them") and said.count("When the store is damaged") == 1
    assert _store_problem("/s/records.sqlite: disk full") == "/s/records.sqlite: disk full"


# ------------------------------------------------------------------------------ F12a: array tasks

def test_array_tasks_are_named_as_slurm_names_them(site, caplog):
    tmp, store = site
    now = time.time()
    rid = store.add(record(std_out="log-%A_%a.out", work_dir=str(tmp), time_limit_minutes=10))
    megatron_log(tmp / "log-76_2.out", 1.0, 200)
    task = running(rid, 78, tmp / "unused", limit_min=10, start=now - 200, std_out="", array_job_id=76,
                   array_task_id=2)
    assert job_name(task) == "76_2" and job_name(dataclasses.replace(task, array_task_id=None)) == "78"

    class NoComment(FakeSlurm):
        def set_admin_comment(self, job_id, text):
            from slurm_plugin.slurm_client import SlurmError
            raise SlurmError("scontrol update: Invalid job id specified")

    slurm = NoComment([task])
    with caplog.at_level(logging.WARNING, logger="calibrate.watch"):
        res = watch_once(opts_for(tmp, out_dir=tmp / "runs"), slurm, now=now)
    assert slurm.limits == {78: 19}                              # scontrol update takes the job id
    assert "  job 76_2 (gpu, alice): extend" in res.summary()
    assert res.to_dict()["jobs"][0]["job"] == "76_2" and res.to_dict()["jobs"][0]["job_id"] == 78
    assert any(r.getMessage().startswith("job 76_2: AdminComment not updated") for r in caplog.records)
    text = (tmp / "runs" / "gpu.toml").read_text()
    assert "slurm job 78" in text and "array task 76_2" in text   # the harvest's name, the task's too


def test_with_the_watchs_tables_unreadable_the_users_cap_counts_extensions_from_admin_comments(site):
    """user_extra_hours = 0.5: alice's other job holds 29 min the watch gave it (11 -> 40 min, as its
    AdminComment tells), so a slow job of hers may grow by 1 min, short of its next checkpoint --
    which the AdminComment does not name anyway."""
    tmp, store = site
    store.close()
    corrupt(tmp / "records.sqlite")
    now = time.time()
    megatron_log(tmp / "slow.out", 1.0, 200)
    megatron_log(tmp / "ok.out", 0.5, 200)
    extended = admin_comment_with(daemon_comment(), Decision("extend", "extend", "slow", 660.0, 2400.0), now, 1)
    slurm = FakeSlurm([running(RID, 61, tmp / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=daemon_comment()),
                       running(RID, 62, tmp / "ok.out", limit_min=40, start=now - 100, admin_comment=extended)])
    policy = dataclasses.replace(POLICY, user_extra_hours=0.5)
    res = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=policy, out_dir=None), slurm, now=now)
    by = {j.job_id: j.decision for j in res.jobs}
    assert by[61].code == "no-fit" and slurm.limits == {}
    assert "more than the user's extension cap allows (00:12:00)" in by[61].reason
    assert "its AdminComment names no checkpoint interval (its record did)" in by[61].reason
    assert by[62].code == "no-shrink"


def test_no_store_at_all_still_protects_jobs(tmp_path):
    """Moved aside, and no job submitted since (the daemon creates the new store at its next
    record): no file at the path."""
    now = time.time()
    megatron_log(tmp_path / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(RID, 71, tmp_path / "slow.out", limit_min=11, start=now - 200,
                               admin_comment=daemon_comment())])
    res = watch_once(opts_for(tmp_path), slurm, now=now)
    assert slurm.limits == {71: 19} and not (tmp_path / "records.sqlite").exists()
    assert "records.sqlite: no record store here" in res.warnings[0]
    assert "limits changed this pass: 71; the next pass retries the store" in res.warnings[0]


def test_an_arrays_other_tasks_keep_its_record_once_one_task_was_harvested(site):
    """The tasks of an array share one record; the harvest of the first task to end attaches that
    task's own job id (61) to it.  The tasks still running are still watched with it."""
    from slurm_plugin.records import JobOutcome
    tmp, store = site
    now = time.time()
    rid = store.add(record(std_out="log-%A_%a.out", work_dir=str(tmp)))
    store.put_outcome(JobOutcome(rid, 61, "COMPLETED"))          # task 60_1 ended and was harvested
    megatron_log(tmp / "log-60_2.out", 1.0, 200)
    task = running(rid, 62, tmp / "unused", limit_min=10, start=now - 200, std_out="", array_job_id=60,
                   array_task_id=2)
    slurm = FakeSlurm([task])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0]
    assert d.name == "60_2" and d.decision.action == "extend" and not d.from_comment and slurm.limits == {62: 19}
    # A job that is no task of an array still may not use a record attached to another job.
    slurm = FakeSlurm([dataclasses.replace(task, job_id=63, array_job_id=None, array_task_id=None,
                                           std_out=str(tmp / "log-60_2.out"))])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.code == "no-record" and d.reason == f"record {rid} belongs to job 61" and not slurm.limits
