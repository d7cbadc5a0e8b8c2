"""perf-calibrate watch without Slurm: the decision rule, the fairness cap, the AdminComment line,
and whole passes against a stand-in Slurm client with a real record store and real log files."""
from __future__ import annotations

import dataclasses
import os
import stat
import time
from pathlib import Path

import pytest

from calibrate.watch import (Decision, Limits, Progress, WatchOptions, admin_comment_with, decide, fairness_cap,
                             read_logs, starting_seconds, watch_once)
from calibrate.watch_log import WatchLog, read_actions
from predictor.job import TrainingJob
from slurm_plugin.records import PredictionRecord, RecordStore, parse_admin_comment
from slurm_plugin.siteconfig import SiteConfigError, WatchPolicy, parse_site_config
from slurm_plugin.slurm_client import (PartitionInfo, PlannedStart, RunningJob, SlurmClient, SlurmError,
                                       command_name, parse_planned_starts, parse_running_jobs)

JOB = {"model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 512, "vocab": 50257},
       "layout": {"micro_batch": 1, "micro_batches": 8}, "run": {"train_iters": 1000, "save_interval": 100}}
POLICY = WatchPolicy(enabled=True, margin=0.1, margin_minutes=1.0, shrink_min_minutes=2.0, min_samples=3,
                     max_growth=10.0, extend_user_limits=False)


def record(**kw) -> PredictionRecord:
    base = dict(partition="gpu", platform="perlmutter-a100", bundle="b", job=TrainingJob.from_dict(JOB).to_dict(),
                iteration_seconds=0.5, iterations=1000, total_seconds=500.0, interval_seconds=(0.45, 0.55),
                time_limit_minutes=10, action="set", uid=os.geteuid(), gid=os.getegid(), user="alice")
    base.update(kw)
    return PredictionRecord(**base)


def progress(iteration=200, seconds=1.0, samples=10, planned=1000) -> Progress:
    return Progress(iteration=iteration, iteration_seconds=seconds, samples=samples, log_format="megatron",
                    planned_iterations=planned, iterations_spanned=iteration - 10)


def run(limit_s, prog, now=10_000.0, start=9_800.0, limits=Limits(), policy=POLICY, rec=None, perfcast=True):
    return decide(now=now, start=start, limit_seconds=limit_s, record=rec or record(), progress=prog,
                  policy=policy, limits=limits, perfcast_limit=perfcast)


# ------------------------------------------------------------------------------ decide

def test_slow_job_is_extended_to_cover_the_rest_plus_margins():
    # 800 iterations left at 1 s (2x the predicted 0.5 s): 880 s + 60 s margin after 200 s run.
    d = run(900.0, progress())
    assert d.action == "extend" and d.from_seconds == 900.0
    assert d.to_seconds == 60 * -(-(200 + 880 + 60) // 60)       # whole minutes, rounded up
    assert "iteration 200 of 1000" in d.reason


def test_user_limits_are_extended_only_when_the_policy_says_so():
    d = run(900.0, progress(), perfcast=False)
    assert d.action == "none" and d.code == "user-limit"
    d = run(900.0, progress(), perfcast=False, policy=dataclasses.replace(POLICY, extend_user_limits=True))
    assert d.action == "extend"


def test_rest_beyond_the_cap_extends_to_the_last_checkpoint_that_fits():
    cap = 600.0                                        # MaxTime: 10 min
    d = run(300.0, progress(iteration=200), limits=Limits(max_time_seconds=cap))
    assert d.action == "extend" and d.code == "checkpoint"
    assert d.to_seconds <= cap
    # elapsed 200 + (c - 200) * 1.1 + 60 <= 600  ->  c <= 509: the checkpoint at 500
    assert d.checkpoint_iteration == 500 and "iteration 500" in d.reason and "MaxTime" in d.reason
    assert d.to_seconds == 60 * -(-(200 + 300 * 1.1 + 60) // 60)


def test_no_checkpoint_interval_means_no_pointless_extension():
    rec = record(job={**TrainingJob.from_dict({**JOB, "run": {"train_iters": 1000}}).to_dict()})
    d = run(300.0, progress(), limits=Limits(max_time_seconds=600.0), rec=rec)
    assert d.action == "none" and d.code == "no-fit" and "checkpoint" in d.reason


def test_the_tightest_cap_wins_and_is_named():
    lim = Limits(max_time_seconds=3600.0, growth_seconds=700.0, fairness_seconds=650.0, fairness_job=77)
    d = run(300.0, progress(), limits=lim)
    assert d.to_seconds <= 650.0 and "pending job 77" in d.reason


def test_fast_job_under_a_perfcast_limit_is_shrunk_never_below_its_end():
    # 800 left at 0.1 s: 88 s + 60 s after 200 s -> 348 s -> 6 min; the limit was 30 min.
    d = run(1800.0, progress(seconds=0.1))
    assert d.action == "shrink" and d.to_seconds == 360.0
    assert run(1800.0, progress(seconds=0.1), perfcast=False).code == "user-limit"
    assert run(1800.0, progress(seconds=0.1), policy=dataclasses.replace(POLICY, shrink=False)).code == "shrink-off"
    # A shrink returning less than shrink_min_minutes is not worth a change.
    assert run(420.0, progress(seconds=0.1)).action == "none"


def test_doubts_mean_no_action():
    assert run(900.0, progress(samples=2)).code == "warm-up"
    assert run(900.0, progress(planned=5000)).code == "plan-mismatch"
    assert run(900.0, progress(iteration=1200, planned=None)).code == "plan-mismatch"
    assert run(None, progress()).code == "unlimited"


def test_fairness_cap_reads_the_plan_of_the_jobs_nodes():
    job = RunningJob(1, "j", "alice", 1, 1, "gpu", "normal", 10, 1000.0, 60.0, "dev[001-002]", "dev001",
                     "", "", "")
    plans = [PlannedStart(2, 10, 5000.0, ("dev002",), "gpu", "bob"),
             PlannedStart(3, 10, 3000.0, ("dev009",), "gpu", "carol"),      # other nodes
             PlannedStart(4, 10, 4000.0, (), "cpu", "dan")]                 # other partition, nodes unknown
    assert fairness_cap(job, plans, ("dev001", "dev002"), 600.0) == (5600.0, 2)
    plans.append(PlannedStart(5, 10, 4500.0, (), "gpu", "eve"))             # may be planned there
    assert fairness_cap(job, plans, ("dev001", "dev002"), 0.0) == (4500.0, 5)


def test_admin_comment_keeps_the_record_and_holds_one_watch_line():
    comment = "perfcast:v1 iter_s=0.5 iters=1000 total_min=8.3 action=set rec=0123456789ab"
    d1 = Decision("extend", "extend", "slow", 600.0, 1200.0)
    c1 = admin_comment_with(comment, d1, 0.0, 1)
    assert parse_admin_comment(c1)["rec"] == "0123456789ab"
    assert "perfcast-watch: extend 00:10:00->00:20:00 at 1970-01-01T00:00:00Z (slow); actions=1" in c1
    c2 = admin_comment_with(c1, Decision("shrink", "shrink", "fast\nnow", 1200.0, 900.0), 60.0, 2)
    assert c2.count("perfcast-watch:") == 1 and "\n" not in c2 and "shrink 00:20:00->00:15:00" in c2
    assert parse_admin_comment(c2) == parse_admin_comment(comment)


# ------------------------------------------------------------------------------ config and parsing

def test_watch_section_of_the_site_config():
    cfg = parse_site_config({"watch": {"enabled": True, "partitions": ["gpu"], "extend_user_limits": True}})
    assert cfg.watch.watches("gpu") and not cfg.watch.watches("cpu") and cfg.watch.extend_user_limits
    assert not parse_site_config({}).watch.watches("gpu")          # off unless enabled
    for bad, key in (({"margn": 1}, "watch.margn"), ({"max_growth": -1}, "watch.max_growth"),
                     ({"partitions": "gpu"}, "watch.partitions"), ({"shrink": "yes"}, "watch.shrink")):
        with pytest.raises(SiteConfigError, match=key):
            parse_site_config({"watch": bad})


def test_per_partition_watch_tables_override_the_watch_section():
    cfg = parse_site_config({
        "partitions": {"gpu": {"platform": "perlmutter-a100", "watch": {"max_growth": 0.5, "extend": False}},
                       "cpu": {"platform": "perlmutter-a100"}},
        "watch": {"enabled": True, "partitions": ["gpu", "cpu"], "margin": 0.2, "max_growth": 3.0}})
    gpu, cpu = cfg.watch.for_partition("gpu"), cfg.watch.for_partition("cpu")
    assert (gpu.max_growth, gpu.extend, gpu.margin) == (0.5, False, 0.2)      # the rest from [watch]
    assert cpu == cfg.watch and (cpu.max_growth, cpu.extend) == (3.0, True)
    assert cfg.partitions["gpu"].platform == "perlmutter-a100"                 # the fill policy unchanged
    bad_cases = (({"max_growth": -1}, "partitions.gpu.watch.max_growth: must be between"),
                 ({"margn": 1}, "partitions.gpu.watch.margn: unknown key"),
                 ({"shrink": "no"}, "partitions.gpu.watch.shrink: must be true or false"),
                 ({"enabled": False}, "partitions.gpu.watch.enabled: set in .watch. only"),
                 ({"user_extra_hours": 2}, "partitions.gpu.watch.user_extra_hours: set in .watch. only"),
                 ({"pass_budget_seconds": 5}, "partitions.gpu.watch.pass_budget_seconds: set in .watch. only"),
                 ("fast", r"\[partitions.gpu.watch\] must be a table"))
    for bad, msg in bad_cases:
        with pytest.raises(SiteConfigError, match=f"^perfcast.toml: {msg}"):
            parse_site_config({"partitions": {"gpu": {"platform": "perlmutter-a100", "watch": bad}},
                               "watch": {"enabled": True}}, "perfcast.toml")
    with pytest.raises(SiteConfigError, match="partitions.cpu.watch: partition cpu is not in watch.partitions"):
        parse_site_config({"partitions": {"cpu": {"platform": "perlmutter-a100", "watch": {"shrink": False}}},
                           "watch": {"enabled": True, "partitions": ["gpu"]}})


def test_scontrol_and_squeue_listings():
    line = ("JobId=7 ArrayJobId=6 ArrayTaskId=1 JobName=x y UserId=alice(1001) GroupId=g(100) QOS=normal "
            "JobState=RUNNING Restarts=0 RunTime=00:01:05 TimeLimit=00:10:00 StartTime=2026-01-01T00:00:00 "
            "Partition=gpu NodeList=dev[001-002] BatchHost=dev001 WorkDir=/w "
            "AdminComment=perfcast:v1 iters=5 rec=0123456789ab StdOut=/w/o.out")
    (j,) = parse_running_jobs(line + "\nJobId=8 JobState=PENDING TimeLimit=1\n")
    assert (j.job_id, j.uid, j.gid, j.name, j.run_seconds, j.time_limit_minutes) == (7, 1001, 100, "x y", 65.0, 10)
    assert (j.array_job_id, j.array_task_id, j.std_out) == (6, 1, "/w/o.out")
    assert "rec=0123456789ab" in j.admin_comment
    d = "|#pc#|"
    plans = parse_planned_starts(f"3{d}100{d}2026-01-01T01:00:00{d}dev[001-003]{d}gpu{d}bob\n"
                                 f"4{d}90{d}N/A{d}(null){d}gpu{d}bob\n")
    assert [p.job_id for p in plans] == [3] and plans[0].nodes == ("dev001", "dev002", "dev003")


# ------------------------------------------------------------------------------ whole passes

# scontrol show config of a cluster whose accounting enforces no limits: no QOS or association MaxWall.
NOT_ENFORCED = "AccountingStorageType   = accounting_storage/slurmdbd\nAccountingStorageEnforce = associations\n" \
               "ClusterName = dev\n"


class FakeSlurm(SlurmClient):
    """``walls``: what ``scontrol show config`` and ``sacctmgr show qos|assoc|user`` print, by
    :func:`command_name` (the QOS and association MaxWall the watch looks up with the fill's
    :func:`slurm_plugin.qos_limits.lookup_wall_limits`); by default limits are not enforced.
    ``part_qos``: each partition's own QOS (scontrol's ``QoS``)."""

    def __init__(self, jobs, *, max_time=60, plans=(), fail=(), walls=None, reservations=(), part_qos=None):
        super().__init__(runner=lambda *a, **k: None)
        self.jobs, self.max_time, self.plans, self.fail = list(jobs), max_time, list(plans), set(fail)
        self.walls = {"scontrol show config": NOT_ENFORCED, **(walls or {})}
        self.part_qos = dict(part_qos or {})
        self.asked: list[str] = []
        self.resvs = list(reservations)
        self.limits: dict[int, int] = {}
        self.time_mins: dict[int, object] = {}
        self.comments: dict[int, str] = {}

    def running_jobs(self):
        return self.jobs

    def partitions(self):
        if "partitions" in self.fail:
            raise SlurmError("scontrol: down")
        return [PartitionInfo(p, self.max_time, None, 1, "dev001", 8, raw={"QoS": self.part_qos.get(p, "N/A")})
                for p in ("gpu", "debug")]

    def planned_starts(self):
        if "squeue" in self.fail:
            raise SlurmError("squeue: timeout")
        return self.plans

    def reservations(self):
        if "reservations" in self.fail:
            raise SlurmError("scontrol: Unable to contact slurm controller")
        return self.resvs

    def text(self, args):
        name = command_name(args)
        self.asked.append(name)
        if "walls" in self.fail and name.startswith("sacctmgr"):
            raise SlurmError(f"{name}: Problem talking to the database: Connection refused")
        return self.walls.get(name, "")

    def set_time_limit(self, job_id, minutes, time_min=None):
        self.time_mins[job_id] = time_min
        if "update" in self.fail:
            raise SlurmError("scontrol update: Access/permission denied")
        self.limits[job_id] = minutes

    def set_admin_comment(self, job_id, text):
        self.comments[job_id] = text


def megatron_log(path: Path, iteration_seconds: float, last: int, planned: int = 1000, every: int = 10) -> None:
    path.write_text("".join(
        f" iteration {i:8d}/{planned:8d} | consumed samples: {i * 8:10d} | elapsed time per iteration (ms): "
        f"{1000 * iteration_seconds:.1f} | learning rate: 1.0E-04 |\n" for i in range(every, last + 1, every)))


@pytest.fixture
def site(tmp_path):
    store = RecordStore(tmp_path / "records.sqlite")
    store.count()
    return tmp_path, store


def running(rid: str, job_id: int, log: Path, *, limit_min: int, start: float, **kw) -> RunningJob:
    base = dict(job_id=job_id, name="j", user="alice", uid=os.geteuid(), gid=os.getegid(), partition="gpu",
                qos="normal", time_limit_minutes=limit_min, start=start, run_seconds=None, node_list="dev001",
                batch_host="dev001", std_out=str(log), work_dir=str(log.parent),
                admin_comment=f"perfcast:v1 iter_s=0.5 iters=1000 action=set rec={rid}")
    base.update(kw)
    return RunningJob(**base)


def test_a_pass_extends_shrinks_and_records_each_action(site):
    tmp, store = site
    now = time.time()
    slow = store.add(record())
    fast = store.add(record(time_limit_minutes=60))
    megatron_log(tmp / "slow.out", 1.0, 200)         # 2x slower than predicted, 200 s in
    megatron_log(tmp / "fast.out", 0.1, 200)         # 5x faster
    slurm = FakeSlurm([running(slow, 11, tmp / "slow.out", limit_min=10, start=now - 200),
                       running(fast, 12, tmp / "fast.out", limit_min=60, start=now - 20, time_min_minutes=50)])
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=tmp / "runs")
    res = watch_once(opts, slurm, now=now)
    by = {j.job_id: j for j in res.jobs}
    assert by[11].decision.action == "extend" and by[11].applied and slurm.limits[11] == 19
    assert by[12].decision.action == "shrink" and slurm.limits[12] < 60
    assert slurm.time_mins == {11: None, 12: slurm.limits[12]}     # Slurm refuses a limit below TimeMin
    assert "perfcast-watch: extend 00:10:00->00:19:00" in slurm.comments[11]
    assert parse_admin_comment(slurm.comments[11])["rec"] == slow
    acts = read_actions(tmp / "records.sqlite")
    assert [(a.slurm_job_id, a.action) for a in acts] == [(11, "extend"), (12, "shrink")]
    # A later pass finds the job on track: the store says so, the AdminComment keeps the change.
    comment = slurm.comments[11]
    slurm.jobs[0] = dataclasses.replace(slurm.jobs[0], time_limit_minutes=19, admin_comment=comment)
    again = {j.job_id: j for j in watch_once(opts, slurm, now=now).jobs}
    assert again[11].decision.code == "on-track"
    assert slurm.comments[11] == comment
    assert [a.code for a in read_actions(tmp / "records.sqlite") if a.slurm_job_id == 11][-1] == "on-track"
    # The running jobs' rates are harvestable runs of the partition.
    text = (tmp / "runs" / "gpu.toml").read_text()
    assert "slurm job 11" in text and "slurm job 12" in text and "perf-calibrate watch" in text


def test_the_run_and_the_comment_are_in_place_before_the_action_is_in_the_store(site, monkeypatch):
    # Whoever polls the store (a report, the dev-cluster test) must find the run an action was
    # measured from and the AdminComment that tells it; CI once read the runs file in the gap.
    tmp, store = site
    now = time.time()
    slow = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(slow, 11, tmp / "slow.out", limit_min=10, start=now - 200)])
    seen = []
    add = WatchLog.add

    def add_and_look(self, action):
        path = tmp / "runs" / "gpu.toml"
        seen.append((action.action, path.exists() and f"slurm job {action.slurm_job_id}" in path.read_text(),
                     "perfcast-watch: extend" in slurm.comments.get(action.slurm_job_id, "")))
        return add(self, action)

    monkeypatch.setattr(WatchLog, "add", add_and_look)
    watch_once(WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=tmp / "runs"), slurm, now=now)
    assert seen == [("extend", True, True)]


def test_unreadable_log_stalled_job_and_doubts_lead_to_no_action(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    jobs = [running(rid, 21, tmp / "missing.out", limit_min=10, start=now - 200),
            running(rid, 22, tmp / "slow.out", limit_min=10, start=now - 200, restarts=1),
            running(rid, 23, tmp / "slow.out", limit_min=10, start=now - 200, het_job_id=23),
            running(rid, 24, tmp / "slow.out", limit_min=10, start=now - 20)]   # claims 190 s of 20 s
    slurm = FakeSlurm(jobs)
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None)
    res = watch_once(opts, slurm, now=now)
    codes = {j.job_id: j.decision.code for j in res.jobs}
    assert codes == {21: "unreadable", 22: "requeued", 23: "het", 24: "claims"}
    assert slurm.limits == {}
    # A "none" is written once per reason, not every pass.
    watch_once(opts, slurm, now=now + 15)
    assert sum(1 for a in read_actions(tmp / "records.sqlite") if a.slurm_job_id == 21) == 1


def test_a_job_that_stops_progressing_is_left_alone(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(rid, 31, tmp / "slow.out", limit_min=20, start=now - 200)])
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None)
    assert watch_once(opts, slurm, now=now).jobs[0].decision.code == "on-track"
    later = now + POLICY.stall_minutes * 60 + 1          # the log never moved
    assert watch_once(opts, slurm, now=later).jobs[0].decision.code == "stalled"


def test_slurm_doubts_fail_closed(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None)
    job = running(rid, 41, tmp / "slow.out", limit_min=10, start=now - 200)
    slurm = FakeSlurm([job], fail={"squeue"})
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.action == "none" and d.code == "doubt" and "backfill plan" in d.reason and not slurm.limits
    slurm = FakeSlurm([dataclasses.replace(job, job_id=42)], fail={"update"})
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.code == "update-failed" and "permission denied" in d.reason
    # A pending job planned on the node 4 minutes after the job's current end caps the extension:
    # the checkpoint at 700 is reached at 200 + 500 x 1.1 + 60 = 810 s, in the 14th minute.
    plan = PlannedStart(99, 10, (now - 200) + 14 * 60, ("dev001",), "gpu", "bob")
    slurm = FakeSlurm([dataclasses.replace(job, job_id=43)], plans=[plan])
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.action == "extend" and d.code == "checkpoint" and d.to_seconds == 14 * 60
    assert d.checkpoint_iteration == 700
    assert "pending job 99" in d.reason


def test_disabled_policy_changes_nothing(site):
    tmp, store = site
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(rid, 51, tmp / "slow.out", limit_min=10, start=time.time() - 200)])
    res = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=WatchPolicy(), out_dir=None), slurm)
    assert res.jobs == [] and slurm.limits == {}


def test_a_fifo_stalls_only_its_own_job(tmp_path):
    fifo = tmp_path / "hung.out"
    os.mkfifo(fifo)
    megatron_log(tmp_path / "ok.out", 1.0, 50)
    policy = dataclasses.replace(POLICY, read_timeout_seconds=0.5, max_parallel_reads=2)
    got = read_logs([(1, str(fifo), os.geteuid(), os.getegid()), (2, str(tmp_path / "ok.out"), os.geteuid(),
                                                                 os.getegid())], policy)
    assert isinstance(got[1], str) and "within" in got[1]
    assert isinstance(got[2], bytes) and b"iteration" in got[2]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_array_tasks_are_watched_one_by_one(site):
    """Each task of an array is a job of its own: its limit, its log (``%A_%a``), one record for all."""
    tmp, store = site
    now = time.time()
    rid = store.add(record(std_out="log-%A_%a.out", work_dir=str(tmp)))
    megatron_log(tmp / "log-60_1.out", 1.0, 200)        # slow task
    megatron_log(tmp / "log-60_2.out", 0.5, 200)        # on time
    tasks = [running(rid, 61, tmp / "unused", limit_min=10, start=now - 200, std_out="", array_job_id=60,
                     array_task_id=1),
             running(rid, 62, tmp / "unused", limit_min=10, start=now - 100, std_out="", array_job_id=60,
                     array_task_id=2)]
    slurm = FakeSlurm(tasks)
    res = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None), slurm, now=now)
    by = {j.job_id: j.decision for j in res.jobs}
    assert by[61].action == "extend" and by[62].code == "on-track"
    assert set(slurm.limits) == {61}


def test_cli_says_what_stops_it(tmp_path, capsys, monkeypatch):
    from calibrate.cli import main
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    assert main(["watch", "--config", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert "nope.toml: no such file" in err and "Traceback" not in err
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text('[watch]\nenabled = false\n')
    assert main(["watch", "--config", str(cfg), "--records", str(tmp_path / "r.sqlite")]) == 0
    assert "enabled = false" in capsys.readouterr().err
    cfg.write_text('[watch]\nenabled = true\nmargn = 0.1\n')
    assert main(["watch", "--config", str(cfg)]) == 2
    assert "watch.margn: unknown key" in capsys.readouterr().err


def test_a_cut_tail_is_read_from_its_first_whole_line(site):
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)          # ~2.5 KiB; only the last 700 bytes are read
    slurm = FakeSlurm([running(rid, 71, tmp / "slow.out", limit_min=10, start=now - 200)])
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None, max_log_bytes=700)
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.action == "extend" and "iteration 200 of 1000" in d.reason


def test_dry_run_changes_and_records_nothing(site):
    tmp, store = site
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(rid, 81, tmp / "slow.out", limit_min=10, start=time.time() - 200)])
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=tmp / "runs", dry_run=True)
    res = watch_once(opts, slurm)
    assert res.jobs[0].decision.action == "extend" and not res.jobs[0].applied
    assert slurm.limits == {} and slurm.comments == {} and not (tmp / "runs").exists()
    assert read_actions(tmp / "records.sqlite") == [] and WatchLog(tmp / "records.sqlite").job(81) is None


def test_a_log_without_iteration_numbers_is_not_acted_on(site):
    tmp, store = site
    rid = store.add(record())
    (tmp / "ds.out").write_text("".join("[Rank 0] time (ms) | fwd: 400.0 | bwd: 500.0 | step: 100.0\n"
                                        for _ in range(20)))
    slurm = FakeSlurm([running(rid, 91, tmp / "ds.out", limit_min=10, start=time.time() - 200)])
    d = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None), slurm).jobs[0].decision
    assert d.code == "no-samples" and "no iteration number" in d.reason and slurm.limits == {}


def test_each_partition_is_watched_with_its_own_policy(site, tmp_path):
    """[partitions.debug.watch] turns extending off and lowers max_growth there; gpu keeps [watch]."""
    tmp, store = site
    now = time.time()
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text('[partitions.gpu]\nplatform = "perlmutter-a100"\n[partitions.debug]\nplatform = "perlmutter-a100"\n'
                   '[partitions.debug.watch]\nextend = false\n[partitions.short]\nplatform = "perlmutter-a100"\n'
                   '[partitions.short.watch]\nmax_growth = 0.2\nmargin_minutes = 1\n'
                   '[watch]\nenabled = true\nmargin_minutes = 1\nmin_samples = 3\nmax_growth = 10\n')
    from slurm_plugin.siteconfig import load_site_config
    policy = load_site_config(str(cfg)).watch
    ids = {p: store.add(record(partition=p)) for p in ("gpu", "debug", "short")}
    for p in ids:
        megatron_log(tmp / f"{p}.out", 1.0, 200)                    # 2x slower than predicted
    slurm = FakeSlurm([running(ids["gpu"], 101, tmp / "gpu.out", limit_min=10, start=now - 200),
                       running(ids["debug"], 102, tmp / "debug.out", limit_min=10, start=now - 200,
                               partition="debug"),
                       running(ids["short"], 103, tmp / "short.out", limit_min=10, start=now - 200,
                               partition="short")])
    res = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=policy, out_dir=None), slurm, now=now)
    by = {j.job_id: j.decision for j in res.jobs}
    assert by[101].action == "extend" and slurm.limits[101] == 19
    assert by[102].action == "none" and by[102].code == "extend-off"
    assert "[partitions.debug.watch] extend" in by[102].reason
    # max_growth 0.2 of the first 10 min: at most 12 min, short of the 19 needed: to the last
    # checkpoint that fits (iteration 600 at 200 + 440 + 60 s = 700 s -> 12 min).
    assert by[103].code == "checkpoint" and by[103].checkpoint_iteration == 600 and slurm.limits[103] == 12
    assert "max_growth" in by[103].reason
    assert set(slurm.limits) == {101, 103}


# scontrol and sacctmgr as the dev cluster prints them with AccountingStorageEnforce=limits: user alice's
# association in account proj has MaxWall 12 min on partition gpu, 30 min on all others; QOS normal none.
ENFORCED = {
    "scontrol show config": "AccountingStorageEnforce = associations,limits,qos\n"
                            "AccountingStorageType = accounting_storage/slurmdbd\nClusterName = dev\n",
    "sacctmgr show qos": "normal||\nlong|00:13:00|\n",
    "sacctmgr show assoc": ("root||||||normal\nproj|||root|||normal,long\nproj|alice|gpu||00:12:00||normal,long\n"
                            "proj|alice|||00:30:00||normal,long\nproj|bob|||00:05:00||normal\n"),
    "sacctmgr show user": "alice|proj\nbob|proj\n"}


def _slow_job_of_proj(site, job_id: int, **kw):
    """A job of account proj under a 10-minute limit whose log shows it 2x slower than predicted:
    (now, the watch's options, the job)."""
    tmp, store = site
    now = time.time()
    rid = store.add(record())
    megatron_log(tmp / "slow.out", 1.0, 200)
    opts = WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None)
    return now, opts, running(rid, job_id, tmp / "slow.out", limit_min=10, start=now - 200, account="proj", **kw)


def test_the_associations_maxwall_caps_an_extension(site):
    """A 2x slow job under account proj: its association's MaxWall (12 min on partition gpu, 30 min
    on all partitions) is the tightest cap, named in the reason.  The watch asks what the fill
    asks (slurm_plugin.qos_limits), once per pass."""
    tmp, store = site
    now, opts, job = _slow_job_of_proj(site, 131)
    slurm = FakeSlurm([job, dataclasses.replace(job, job_id=136)], walls=ENFORCED)
    res = watch_once(opts, slurm, now=now)
    d = res.jobs[0].decision
    # the checkpoint at 600 is reached at 200 + 400 x 1.1 + 60 = 700 s: 12 min
    assert d.code == "checkpoint" and d.checkpoint_iteration == 600 and slurm.limits == {131: 12, 136: 12}
    assert "the association's MaxWall allows (00:12:00)" in d.reason
    assert slurm.asked == ["scontrol show config", "sacctmgr show qos", "sacctmgr show assoc", "sacctmgr show user"]
    # In a partition without a row of its own: the user's row for all partitions (30 min: the 19 fit).
    rid_debug = store.add(record(partition="debug"))
    slurm = FakeSlurm([running(rid_debug, 132, tmp / "slow.out", limit_min=10, start=now - 200, account="proj",
                               partition="debug")], walls=ENFORCED)
    assert watch_once(opts, slurm, now=now).jobs[0].decision.to_seconds == 19 * 60


def test_a_qos_maxwall_caps_an_extension_before_the_association(site):
    """Slurm 22.05's order, as the fill applies it: a QOS with a MaxWall (the job's, or its
    partition's own QOS) sets the cap, and the association's is then not looked at."""
    now, opts, job = _slow_job_of_proj(site, 141, qos="long")
    slurm = FakeSlurm([job], walls=ENFORCED)
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    # QOS long's 13 min, not the association's 12: the checkpoint at 600 (12 min) still fits, 700
    # (200 + 500 x 1.1 + 60 = 810 s) does not.
    assert d.code == "checkpoint" and "more than the QOS MaxWall allows (00:13:00)" in d.reason
    assert slurm.limits == {141: 12}
    # The partition's own QOS counts for a job of QOS normal too.
    slurm = FakeSlurm([dataclasses.replace(job, job_id=142, qos="normal")], walls=ENFORCED, part_qos={"gpu": "long"})
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert "the QOS MaxWall allows (00:13:00)" in d.reason


def test_a_partition_time_limit_qos_lets_an_extension_pass_maxtime(site):
    """Partition MaxTime 15 min, the slow job needs 19: under QOS normal MaxTime caps the extension;
    under a QOS with flag PartitionTimeLimit (no MaxWall of its own) Slurm lets the job pass
    MaxTime, and the association's 30 min is the cap (in partition debug: the user's row for all)."""
    tmp, store = site
    now, opts, _ = _slow_job_of_proj(site, 171)
    walls = dict(ENFORCED, **{"sacctmgr show qos": "normal||\nlift||PartitionTimeLimit\n"})
    rid = store.add(record(partition="debug"))
    job = running(rid, 171, tmp / "slow.out", limit_min=10, start=now - 200, account="proj", partition="debug")
    slurm = FakeSlurm([job, dataclasses.replace(job, job_id=172, qos="lift")], walls=walls, max_time=15)
    by = {j.job_id: j.decision for j in watch_once(opts, slurm, now=now).jobs}
    assert by[171].code == "checkpoint" and "MaxTime" in by[171].reason and slurm.limits[171] <= 15
    assert by[172].action == "extend" and slurm.limits[172] == 19, by[172].reason


def test_a_qos_or_association_sacctmgr_does_not_list_extends_nothing(site):
    """Slurm enforces limits, but the job's QOS, or its association, is not in sacctmgr's answer:
    its MaxWall cannot be known, and the watch, which updates limits as root past any such limit,
    does not extend (the fill adds no cap there: Slurm still holds a submitted job)."""
    now, opts, job = _slow_job_of_proj(site, 161, qos="gold")
    slurm = FakeSlurm([job], walls=ENFORCED)
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.code == "doubt" and d.reason.startswith("QOS 'gold' unknown to sacctmgr: not extending"), d.reason
    slurm = FakeSlurm([dataclasses.replace(job, job_id=162, qos="normal", user="carol")], walls=ENFORCED)
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.code == "doubt" and "no association of user carol, account proj" in d.reason, d.reason
    assert slurm.limits == {}


def test_no_enforcement_no_maxwall_and_a_failed_lookup_extends_nothing(site):
    """Without AccountingStorageEnforce=limits Slurm applies no MaxWall, nor does the watch; a
    lookup that fails is a doubt: the watch updates limits as root, past any QOS limit, so it
    extends nothing it cannot check (shrinks need no cap and go on)."""
    now, opts, job = _slow_job_of_proj(site, 151)
    not_enforced = {k: v for k, v in ENFORCED.items() if k != "scontrol show config"}
    slurm = FakeSlurm([job], walls=not_enforced)
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.action == "extend" and d.code == "extend" and slurm.limits == {151: 19}
    assert slurm.asked == ["scontrol show config"]             # no sacctmgr without enforcement
    slurm = FakeSlurm([dataclasses.replace(job, job_id=152)], walls=ENFORCED, fail={"walls"}, max_time=15)
    d = watch_once(opts, slurm, now=now).jobs[0].decision
    assert d.action == "none" and d.code == "doubt", d
    assert d.reason.startswith("QOS and association limits unreadable (sacctmgr show qos: Problem talking to the "
                               "database"), d.reason
    assert slurm.limits == {}
    # A job without an account (no associations kept) is capped by nothing of the kind either.
    slurm = FakeSlurm([dataclasses.replace(job, job_id=153, account="")], walls=not_enforced)
    assert watch_once(opts, slurm, now=now).jobs[0].decision.to_seconds == 19 * 60


def test_the_jobs_account_is_read_from_scontrol():
    line = ("JobId=7 JobName=x UserId=alice(1001) GroupId=g(100) Account={} QOS=normal JobState=RUNNING "
            "RunTime=00:01:05 TimeLimit=00:10:00 StartTime=2026-01-01T00:00:00 Partition=gpu NodeList=dev001")
    assert parse_running_jobs(line.format("proj"))[0].account == "proj"
    assert parse_running_jobs(line.format("(null)"))[0].account == ""


def test_a_job_still_starting_is_warming_up_not_news_in_its_admin_comment(site):
    """An empty log a minute into the job used to put "none ... no iteration times" into the
    AdminComment, which docs/watch.md §4 keeps for news; past the prediction's start-up it is news."""
    tmp, store = site
    rid = store.add(record(total_seconds=800.0))           # 300 s outside iterations
    (tmp / "young.out").write_text("> building GPT model ...\n")
    grace = starting_seconds(record(total_seconds=800.0), POLICY.min_samples)
    assert grace >= 600.0
    slurm = FakeSlurm([running(rid, 95, tmp / "young.out", limit_min=30, start=time.time() - 60)])
    d = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None), slurm).jobs[0].decision
    assert d.code == "warm-up" and "still starting" in d.reason
    assert slurm.comments == {} and slurm.limits == {}
    old = FakeSlurm([running(rid, 96, tmp / "young.out", limit_min=30, start=time.time() - grace - 60)])
    d = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None), old).jobs[0].decision
    assert d.code == "no-samples" and 96 in old.comments
