"""The stall check counts the job's run time (Slurm's RunTime, which leaves out time suspended),
not wall-clock time: a job suspended for longer than ``stall_minutes`` and resumed has not stalled.
Only a report ("stalled", no action), as before."""
from __future__ import annotations

import dataclasses
import time

from calibrate.watch import WatchOptions, watch_once
from calibrate.watch_log import JobState, WatchLog, read_actions

from .test_watch import POLICY, FakeSlurm, megatron_log, record, running, site  # noqa: F401


def test_time_suspended_does_not_count_toward_a_stall(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record(time_limit_minutes=20))
    megatron_log(tmp / "slow.out", 1.0, 200)                    # the log never moves after this
    job = running(rid, 301, tmp / "slow.out", limit_min=20, start=now - 200, run_seconds=200.0)
    slurm = FakeSlurm([job])
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None)
    assert watch_once(opts, slurm, now=now).jobs[0].decision.code == "on-track"
    # Suspended for 39 of the next 40 minutes (scontrol suspend/resume, a preemption): 1 minute of
    # run time without a new iteration is no stall, whatever the wall clock says.
    t2 = now + 40 * 60
    slurm.jobs = [dataclasses.replace(job, run_seconds=260.0)]
    d = watch_once(opts, slurm, now=t2).jobs[0].decision
    assert d.code == "on-track", d.reason
    # Running again, stall_minutes (30) of run time later still at the same iteration: stalled.
    slurm.jobs = [dataclasses.replace(job, run_seconds=260.0 + POLICY.stall_minutes * 60 + 61)]
    d = watch_once(opts, slurm, now=t2 + POLICY.stall_minutes * 60 + 61).jobs[0].decision
    assert d.action == "none" and d.code == "stalled"
    assert "no new iteration for 32 min of run time" in d.reason and "suspended not counted" in d.reason
    assert not slurm.limits
    assert [a.code for a in read_actions(tmp / "records.sqlite") if a.slurm_job_id == 301][-1] == "stalled"


def test_a_progress_time_kept_by_an_older_watch_starts_the_count_again(site):
    """An older watch kept when the log last moved as a UNIX time: no run time of the job (larger
    than any), so the count starts again rather than reading it as hours of stall or none ever."""
    tmp, store = site
    now = time.time()
    rid = store.add(record(time_limit_minutes=20))
    megatron_log(tmp / "slow.out", 1.0, 200)
    wlog = WatchLog(tmp / "records.sqlite")
    wlog.put_job(JobState(311, rid, 1200.0, 200, now - 3600.0, "on-track", None, now - 60))
    wlog.close()
    job = running(rid, 311, tmp / "slow.out", limit_min=20, start=now - 200, run_seconds=200.0)
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None)
    slurm = FakeSlurm([job])
    assert watch_once(opts, slurm, now=now).jobs[0].decision.code == "on-track"
    assert WatchLog(tmp / "records.sqlite").job(311).progress_at == 200.0
    slurm.jobs = [dataclasses.replace(job, run_seconds=200.0 + POLICY.stall_minutes * 60 + 1)]
    assert watch_once(opts, slurm, now=now + POLICY.stall_minutes * 60 + 1).jobs[0].decision.code == "stalled"
