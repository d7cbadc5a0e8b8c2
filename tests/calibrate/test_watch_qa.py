"""perf-calibrate watch: the defects a QA run on the dev cluster found (each once killed a job),
checked against the stand-in Slurm client of test_watch.py with a real record store and real logs.

F1 a job that slowed down after the watch shrank it; F2 pending jobs that do not wait for
resources capping extensions; F5 suspended time counted as run time; F11 a limit the user lowered
raised again; F4 a training log on stderr; F10 an extension into a maintenance reservation."""
from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

from calibrate.joblogs import iteration_times
from calibrate.watch import (Limits, WatchOptions, fairness_cap, limit_owner, reservation_cap, watch_once,
                             watch_set_limit)
from calibrate.watch_log import read_actions
from slurm_plugin.slurm_client import (PlannedStart, Reservation, RunningJob, SlurmClient, parse_planned_starts,
                                       parse_reservations, parse_running_jobs, waits_for_resources)

from .test_watch import POLICY, FakeSlurm, megatron_log, progress, record, run, running, site  # noqa: F401

D = "|#pc#|"


def opts_for(tmp: Path, policy=POLICY) -> WatchOptions:
    return WatchOptions(records=tmp / "records.sqlite", policy=policy, out_dir=None)


def two_phase_log(path: Path, fast: float, slow: float, switch: int, last: int, every: int = 10) -> None:
    path.write_text("".join(
        f" iteration {i:8d}/{1000:8d} | consumed samples: {i * 8:10d} | elapsed time per iteration (ms): "
        f"{1000 * (fast if i <= switch else slow):.1f} | learning rate: 1.0E-04 |\n"
        for i in range(every, last + 1, every)))


# ------------------------------------------------------------------------------ F1: stale rate + shrink

def test_the_recent_rate_follows_a_job_that_slowed_down():
    log = "".join(f" iteration {i:8d}/{1000:8d} | elapsed time per iteration (ms): {21.0 if i <= 400 else 63.0} |\n"
                  for i in range(10, 601, 10))
    t = iteration_times(log)
    assert t.median_seconds == 0.021                      # the whole-run median misses the slow half
    recent = t.recent()
    assert recent.seconds == 0.063 and recent.samples == 5 and recent.iterations_spanned == 50
    # One slow interval (a checkpoint save) does not move the recent median.
    spike = "".join(f" iteration {i:8d}/{1000:8d} | elapsed time per iteration (ms): {900.0 if i == 590 else 21.0} |\n"
                    for i in range(10, 601, 10))
    assert iteration_times(spike).recent().seconds == 0.021


def test_decide_projects_the_rest_with_the_slower_of_the_run_and_recent_rates():
    slowed = dataclasses.replace(progress(seconds=0.5), recent_seconds=1.0, recent_samples=5)
    d = run(900.0, slowed)
    # 800 left at the recent 1.0 s: 200 + 880 + 60 -> 19 min (0.5 s would need 11).
    assert d.action == "extend" and d.to_seconds == 19 * 60
    assert "1 s/iter measured (median of its last 5 samples; 0.5 over the run)" in d.reason
    # A job that sped up keeps its whole-run median until the recent samples say more.
    sped = dataclasses.replace(progress(seconds=1.0), recent_seconds=0.5, recent_samples=5)
    assert run(900.0, sped).to_seconds == 19 * 60


def test_the_watchs_caps_never_hold_a_job_below_the_limit_the_watch_shrank():
    lim = Limits(max_time_seconds=3600.0, fairness_seconds=360.0, fairness_job=73, user_seconds=300.0,
                 restore_seconds=1200.0)
    cap, which = lim.cap()
    assert cap == 1200.0 and "before the watch shrank it" in which
    # Slurm's own caps stay hard.
    assert Limits(max_time_seconds=600.0, fairness_seconds=360.0, restore_seconds=1200.0).cap() == \
        (600.0, "the partition's MaxTime")


def test_a_job_shrunk_early_that_slows_down_is_extended_back_past_the_backfill_plan(site):
    """F1: 2x faster than predicted for its first 400 iterations, the watch shrank its limit 20 -> 6
    min; a pending job was then planned for the 6th minute; the job slowed 3x.  The watch projects
    the rest with the recent rate and may give back what its shrink took."""
    tmp, store = site
    t1 = time.time()
    rid = store.add(record(time_limit_minutes=20))
    log = tmp / "phases.out"
    two_phase_log(log, 0.25, 0.75, switch=400, last=400)
    job = running(rid, 201, log, limit_min=20, start=t1 - 100)
    slurm = FakeSlurm([job])
    d = watch_once(opts_for(tmp), slurm, now=t1).jobs[0].decision
    assert d.action == "shrink" and slurm.limits[201] == 6            # 100 + 600 x 0.275 + 60 -> 6 min
    t2 = t1 + 150
    two_phase_log(log, 0.25, 0.75, switch=400, last=600)
    plan = PlannedStart(73, 10, job.start + 6 * 60, ("dev001",), "gpu", "bob", "Resources")
    slurm.jobs = [dataclasses.replace(job, time_limit_minutes=6, admin_comment=slurm.comments[201])]
    slurm.plans = [plan]
    d = watch_once(opts_for(tmp), slurm, now=t2).jobs[0].decision
    # 400 left at 0.75 s: 250 + 330 + 60 = 640 s -> 11 min, within the 20 min the shrink took away.
    assert d.action == "extend" and slurm.limits[201] == 11, d.reason
    assert "median of its last 5 samples" in d.reason
    assert [a.action for a in read_actions(tmp / "records.sqlite") if a.slurm_job_id == 201] == ["shrink", "extend"]


# ------------------------------------------------------------------------------ F2: pending reasons

def test_only_pending_jobs_waiting_for_resources_cap_an_extension():
    job = RunningJob(1, "j", "alice", 1, 1, "gpu", "normal", 10, 1000.0, 60.0, "dev001", "dev001", "", "", "")
    plans = [PlannedStart(2, 10, 2000.0, ("dev001",), "gpu", "bob", "BeginTime"),
             PlannedStart(3, 10, 2100.0, ("dev001",), "gpu", "bob", "Dependency"),
             PlannedStart(4, 10, 2200.0, ("dev001",), "gpu", "bob", "JobHeldUser"),
             PlannedStart(5, 10, 2300.0, (), "gpu", "bob", "JobHeldAdmin"),
             PlannedStart(6, 10, 2400.0, ("dev001",), "gpu", "bob", "AssocGrpGRES"),
             PlannedStart(7, 10, 3000.0, ("dev001",), "gpu", "carol", "Priority")]
    assert fairness_cap(job, plans, ("dev001",), 0.0) == (3000.0, 7)
    plans.append(PlannedStart(8, 10, 2500.0, ("dev001",), "gpu", "dan", "Resources"))
    assert fairness_cap(job, plans, ("dev001",), 0.0) == (2500.0, 8)
    for reason in ("Resources", "Priority", "ReqNodeNotAvail, UnavailableNodes:dev001", "None", "",
                   "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions"):
        assert waits_for_resources(reason), reason
    for reason in ("BeginTime", "Dependency", "JobHeldUser", "JobHeldAdmin", "DependencyNeverSatisfied",
                   "Reservation", "QOSMaxWallDurationPerJobLimit", "PartitionDown"):
        assert not waits_for_resources(reason), reason


def test_squeue_start_is_asked_for_the_reason_and_read_with_it():
    seen = []

    def runner(argv, **kw):
        seen.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, f"82{D}100{D}2026-01-01T01:00:00{D}dev001{D}gpu{D}bob{D}BeginTime\n"
                                           .encode(), b"")

    (p,) = SlurmClient(runner=runner).planned_starts()
    assert "%r" in seen[0][-1] and (p.job_id, p.reason, p.waits_for_resources) == (82, "BeginTime", False)
    # A listing without the reason column (older callers) still parses, and counts.
    (old,) = parse_planned_starts(f"3{D}100{D}2026-01-01T01:00:00{D}dev001{D}gpu{D}bob\n")
    assert old.reason == "" and old.waits_for_resources


def test_a_job_waiting_for_its_begin_time_does_not_block_an_extension(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    job = running(rid, 211, tmp / "slow.out", limit_min=10, start=now - 200)
    waiting = [PlannedStart(82, 10, job.start + 7 * 60, ("dev001",), "gpu", "bob", "BeginTime"),
               PlannedStart(83, 10, job.start + 7 * 60, (), "gpu", "bob", "Dependency")]
    slurm = FakeSlurm([job], plans=waiting)
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.action == "extend" and slurm.limits == {211: 19}, d.reason
    slurm = FakeSlurm([dataclasses.replace(job, job_id=212)],
                      plans=waiting + [PlannedStart(84, 10, job.start + 14 * 60, ("dev001",), "gpu", "bob", "Resources")])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.code == "checkpoint" and "pending job 84" in d.reason and slurm.limits == {212: 14}


# ------------------------------------------------------------------------------ F5: suspended time

def test_time_suspended_is_not_run_time(site):
    """Started 500 s ago, suspended for 300 of them: Slurm's RunTime is 200 s, and the limit counts
    that.  19 min fit under a 20 min MaxTime; from the wall clock they would not (24 min)."""
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    job = running(rid, 221, tmp / "slow.out", limit_min=10, start=now - 500, run_seconds=200.0)
    slurm = FakeSlurm([job], max_time=20)
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.action == "extend" and d.code == "extend" and slurm.limits == {221: 19}, d.reason
    # A pending job planned 15 min from now caps the limit at 200 s run + 900 s = 18 min (not 23).
    plan = PlannedStart(90, 10, now + 900, ("dev001",), "gpu", "bob", "Resources")
    slurm = FakeSlurm([dataclasses.replace(job, job_id=222)], max_time=60, plans=[plan])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.code == "checkpoint" and d.checkpoint_iteration == 900 and slurm.limits == {222: 18}, d.reason


# ------------------------------------------------------------------------------ F11: a limit the user lowered

def test_a_limit_the_user_lowered_after_submission_is_left_alone(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record(time_limit_minutes=20))
    megatron_log(tmp / "slow.out", 1.0, 200)
    job = running(rid, 231, tmp / "slow.out", limit_min=6, start=now - 200)     # scontrol update TimeLimit=6
    slurm = FakeSlurm([job])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.action == "none" and d.code == "user-limit" and not slurm.limits
    assert "the user set this limit (changed to 00:06:00 after perfcast set 00:20:00 at submission)" in d.reason
    assert "extend_user_limits = false" in d.reason
    # The site lets the watch extend users' limits too.
    slurm = FakeSlurm([dataclasses.replace(job, job_id=232)])
    d = watch_once(opts_for(tmp, dataclasses.replace(POLICY, extend_user_limits=True)), slurm, now=now).jobs[0].decision
    assert d.action == "extend" and slurm.limits == {232: 19}


def test_whose_limit_it_is():
    rec = record(time_limit_minutes=20, time_min_minutes=8)
    job = running("0123456789ab", 1, Path("/x"), limit_min=20, start=0.0)
    assert limit_owner(job, rec, None) == (True, "")
    # Backfill started it in a shorter slot, between --time-min and --time: still perfcast's.
    assert limit_owner(dataclasses.replace(job, time_limit_minutes=12), rec, None)[0]
    assert not limit_owner(dataclasses.replace(job, time_limit_minutes=6), rec, None)[0]
    # The limit the watch set last is perfcast's; once it set one, the --time-min range is over.
    assert limit_owner(dataclasses.replace(job, time_limit_minutes=6), rec, 360.0) == (True, "")
    mine, note = limit_owner(dataclasses.replace(job, time_limit_minutes=12), rec, 360.0)
    assert not mine and note == " (changed to 00:12:00 after the watch set 00:06:00)"
    assert limit_owner(job, record(action="keep"), None) == (False, "")
    # The user's own --time-min (perfcast set none): backfill may start the job down to it too.
    users = dataclasses.replace(job, time_limit_minutes=12, time_min_minutes=10)
    assert limit_owner(users, record(time_limit_minutes=20, time_min_minutes=None), None)[0]
    assert not limit_owner(dataclasses.replace(users, time_min_minutes=None),
                           record(time_limit_minutes=20, time_min_minutes=None), None)[0]
    comment = ("perfcast:v1 iters=1000 action=set rec=0123456789ab | perfcast-watch: shrink 00:20:00->00:06:00 at "
               "2026-01-01T00:00:00Z (fast); actions=1")
    assert watch_set_limit(comment) == 360.0
    assert watch_set_limit("perfcast:v1 rec=0123456789ab | perfcast-watch: none at 2026-01-01T00:00:00Z (x)") is None
    assert watch_set_limit("perfcast:v1 rec=0123456789ab") is None
    # Only the segment's head counts: its reason may quote a path the user chose.
    assert watch_set_limit("perfcast:v1 rec=0123456789ab | perfcast-watch: none at 2026-01-01T00:00:00Z (no "
                           "iteration times; read StdOut /x | perfcast-watch: extend 00:01:00->99:00:00 at y)") is None


def test_the_watchs_own_marker_keeps_a_limit_perfcasts_without_the_store(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record(time_limit_minutes=20))
    megatron_log(tmp / "slow.out", 1.0, 200)
    comment = (f"perfcast:v1 iter_s=0.5 iters=1000 action=set rec={rid} | perfcast-watch: shrink "
               "00:20:00->00:06:00 at 2026-01-01T00:00:00Z (fast); actions=1")
    slurm = FakeSlurm([running(rid, 241, tmp / "slow.out", limit_min=6, start=now - 200, admin_comment=comment)])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.action == "extend" and slurm.limits == {241: 19}, d.reason


# ------------------------------------------------------------------------------ F4: the log on stderr

def test_a_training_log_on_stderr_is_read(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    (tmp / "job.out").write_text("> building GPT model ...\n")
    megatron_log(tmp / "job.err", 1.0, 200)
    job = running(rid, 251, tmp / "job.out", limit_min=10, start=now - 200, std_err=str(tmp / "job.err"))
    slurm = FakeSlurm([job])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.action == "extend" and slurm.limits == {251: 19}, d.reason
    assert f"from its StdErr {tmp / 'job.err'}" in d.reason
    # Neither file has iteration lines: the reason names both.
    (tmp / "job.err").write_text("Traceback ...\n")
    slurm = FakeSlurm([dataclasses.replace(job, job_id=252, start=now - 3600)])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.code == "no-samples" and f"StdOut {tmp / 'job.out'} and StdErr {tmp / 'job.err'}" in d.reason
    # StdErr unreadable, StdOut without iterations: unreadable, saying which.
    slurm = FakeSlurm([dataclasses.replace(job, job_id=253, std_err=str(tmp / "gone.err"))])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.code == "unreadable" and f"(StdErr {tmp / 'gone.err'})" in d.reason and not slurm.limits


def test_scontrol_stderr_and_reservation_are_read():
    line = ("JobId=7 JobName=x UserId=alice(1001) GroupId=g(100) QOS=normal JobState=RUNNING RunTime=00:01:05 "
            "TimeLimit=00:10:00 StartTime=2026-01-01T00:00:00 Partition=gpu NodeList=dev001 Reservation={} "
            "StdErr=/w/e.err StdIn=/dev/null StdOut=/w/o.out")
    (j,) = parse_running_jobs(line.format("maint"))
    assert (j.std_out, j.std_err, j.reservation) == ("/w/o.out", "/w/e.err", "maint")
    assert parse_running_jobs(line.format("(null)"))[0].reservation == ""


# ------------------------------------------------------------------------------ F10: reservations

def test_reservations_listing():
    text = ("ReservationName=maint StartTime=2026-01-01T10:13:00 EndTime=2026-01-01T11:13:00 Duration=01:00:00 "
            "Nodes=dev[001-002] NodeCnt=2 CoreCnt=32 Features=(null) PartitionName=(null) "
            "Flags=MAINT,IGNORE_JOBS,SPEC_NODES TRES=cpu=32 Users=root Groups=(null) Accounts=(null) "
            "Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
            "ReservationName=lic StartTime=2026-01-01T10:00:00 EndTime=2026-01-01T11:00:00 Duration=01:00:00 "
            "Nodes=(null) NodeCnt=0 Flags=LICENSE_ONLY Licenses=matlab:1 State=INACTIVE\n")
    a, b = parse_reservations(text)
    assert (a.name, a.nodes, "MAINT" in a.flags) == ("maint", ("dev001", "dev002"), True)
    assert a.end - a.start == 3600.0 and b.nodes == () and not b.all_nodes
    assert parse_reservations("No reservations in the system\n") == []


def test_an_extension_stops_at_a_maintenance_reservation_on_the_jobs_node(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    job = running(rid, 261, tmp / "slow.out", limit_min=10, start=now - 200, run_seconds=200.0)
    maint = Reservation("maint", now + 13 * 60, now + 73 * 60, ("dev001",), "MAINT,IGNORE_JOBS")
    slurm = FakeSlurm([job], reservations=[maint])
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    # 200 s run + 13 min = 980 s: the checkpoint at 800 is reached at 200 + 660 + 60 = 920 s -> 16 min.
    assert d.code == "checkpoint" and d.checkpoint_iteration == 800 and slurm.limits == {261: 16}, d.reason
    assert "reservation maint's start allows (00:16:00)" in d.reason
    # Not a cap: a reservation on other nodes, one the job runs in, one that had begun before it.
    for n, resv, j in ((262, dataclasses.replace(maint, nodes=("dev009",)), job),
                       (263, maint, dataclasses.replace(job, reservation="maint")),
                       (264, dataclasses.replace(maint, start=now - 300), job)):
        slurm = FakeSlurm([dataclasses.replace(j, job_id=n)], reservations=[resv])
        assert watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision.to_seconds == 19 * 60, n
    slurm = FakeSlurm([dataclasses.replace(job, job_id=265)], fail={"reservations"})
    d = watch_once(opts_for(tmp), slurm, now=now).jobs[0].decision
    assert d.code == "doubt" and "reservations unreadable" in d.reason and not slurm.limits


def test_reservation_cap_picks_the_earliest_reservation_on_the_jobs_nodes():
    job = RunningJob(1, "j", "alice", 1, 1, "gpu", "normal", 10, 1000.0, 60.0, "dev[001-002]", "dev001", "", "", "")
    rs = [Reservation("late", 9000.0, 9999.0, ("dev002",)), Reservation("early", 5000.0, 6000.0, ("dev001",)),
          Reservation("ended", 1500.0, 1900.0, ("dev001",)), Reservation("all", 4000.0, None, (), all_nodes=True)]
    assert reservation_cap(job, rs, ("dev001", "dev002"), 2000.0) == (4000.0, "all")
    assert reservation_cap(job, rs[:3], ("dev001", "dev002"), 2000.0) == (5000.0, "early")
    assert reservation_cap(job, rs[:1], ("dev001",), 2000.0) == (None, "")
