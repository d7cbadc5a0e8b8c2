"""perf-calibrate harvest: accounting text -> outcomes and measured runs; logs read as the job's user.

No Slurm needed: sacct and scontrol answers are the documented Slurm 22.05 formats (sacct --json is
openapi/dbv0.0.38, scontrol -o one line per job), served by a fake runner or fake commands on PATH.
"""
from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from calibrate.cli import main
from calibrate.harvest import (AccountingClient, AccountingJob, HarvestOptions, LogReadError,
                               duration_seconds, expand_output_pattern, finished_jobs, harvest,
                               output_path, parse_sacct_json, parse_sacct_parsable, parse_scontrol_jobs,
                               parse_since, read_tail_as)
from calibrate.validate import load_runs
from slurm_plugin.records import PredictionRecord, RecordStore

JOB = {"model": {"layers": 8, "hidden": 4096, "heads": 32, "seq_len": 2048},
       "layout": {"pp": 2, "tp": 4, "dp": 2, "micro_batch": 2, "micro_batches": 8, "recompute": "full"},
       "run": {"precision": "fp16", "train_iters": 200}}
T0 = 1_714_557_600          # 2024-05-01 10:00 UTC


@pytest.fixture
def user_dir():
    """(directory, uid, gid, name) whose files the harvest reads as that user.  As root: `nobody`,
    in a directory it can reach (tmp_path's parents are root's 0700); otherwise oneself."""
    if os.geteuid() == 0:
        pw = pwd.getpwnam("nobody")
        base = Path(tempfile.mkdtemp(prefix="perfcast-harvest-", dir="/tmp"))
        base.chmod(0o755)
        d = base / "home"
        d.mkdir()
        os.chown(d, pw.pw_uid, pw.pw_gid)
        try:
            yield d, pw.pw_uid, pw.pw_gid, pw.pw_name
        finally:
            shutil.rmtree(base)
    else:
        pw = pwd.getpwuid(os.geteuid())
        d = Path(tempfile.mkdtemp(prefix="perfcast-harvest-"))
        try:
            yield d, pw.pw_uid, pw.pw_gid, pw.pw_name
        finally:
            shutil.rmtree(d)


def _own(path: Path, uid: int, gid: int) -> Path:
    if os.geteuid() == 0:
        os.chown(path, uid, gid)
    return path


def megatron_log(n: int, ms: float) -> str:
    lines = ["> building GPT model ...", "[after model, optimizer, and learning rate scheduler are built]"]
    for i in range(1, n + 1):
        lines.append(f" iteration {i:8d}/{n:8d} | consumed samples: {i * 32:10d} | elapsed time per iteration "
                     f"(ms): {9000.0 if i == 1 else ms:.1f} | learning rate: 3.000E-04 | global batch size:    32 "
                     f"| lm loss: 7.0E+00 | loss scale: 1.0 | number of skipped iterations:   0 |")
    return "\n".join(lines) + "\n"


def nemo_log(n: int, s: float) -> str:
    return "\n".join(f"Training epoch 0, iteration {i}/{n - 1} | lr: 1e-05 | global_batch_size: 32 | "
                     f"global_step: {i} | reduced_train_loss: 9.1 | train_step_timing in s: {s}" for i in range(n)) + "\n"


# ------------------------------------------------------------------------------ reading as the user
def test_reads_as_the_jobs_user_never_as_root(user_dir):
    d, uid, gid, _ = user_dir
    log = d / "slurm-1.out"
    log.write_text("hello\n")
    _own(log, uid, gid)
    assert read_tail_as(str(log), uid, gid) == b"hello\n"
    secret = d / "secret.txt"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    if os.geteuid() == 0:
        # Root could read it; the job's user cannot, and the harvest reads as the job's user.
        with pytest.raises(LogReadError) as e:
            read_tail_as(str(secret), uid, gid)
        assert e.value.errno == errno.EACCES and "permission denied" in e.value.strerror
    else:
        # Without root nobody else's file is read at all.
        with pytest.raises(LogReadError, match="without root"):
            read_tail_as(str(secret), uid + 1, gid)


def test_read_is_bounded_to_the_tail(user_dir):
    d, uid, gid, _ = user_dir
    big = d / "big.log"
    data = os.urandom(3 << 20)
    big.write_bytes(data)
    _own(big, uid, gid)
    got = read_tail_as(str(big), uid, gid, max_bytes=1 << 20)
    assert got == data[-(1 << 20):]


def test_a_fifo_times_out_instead_of_hanging(user_dir):
    d, uid, gid, _ = user_dir
    fifo = d / "fifo.out"
    os.mkfifo(fifo)
    _own(fifo, uid, gid)
    # Nobody ever writes into it: the reader blocks forever, whatever the machine's speed.
    with pytest.raises(LogReadError) as e:
        read_tail_as(str(fifo), uid, gid, timeout_s=1.0)
    assert e.value.errno == errno.ETIMEDOUT


@pytest.mark.parametrize("path", ["relative/slurm-1.out", "", "/tmp/a\0b"])
def test_bad_paths_are_refused(path):
    with pytest.raises(LogReadError):
        read_tail_as(path, os.geteuid(), os.getegid())


def test_missing_file_and_directory(user_dir):
    d, uid, gid, _ = user_dir
    with pytest.raises(LogReadError, match="no such file"):
        read_tail_as(str(d / "nope.out"), uid, gid)
    with pytest.raises(LogReadError, match="directory"):
        read_tail_as(str(d), uid, gid)


# ------------------------------------------------------------------------------ accounting formats
def sacct_job(job_id, state, comment, *, user="alice", elapsed=754, limit=30, partition="gpu",
              work_dir="/home/alice", start=T0, nodes=2):
    """One job of `sacct --json` as Slurm 22.05 prints it (openapi/dbv0.0.38)."""
    return {
        "account": "proj", "comment": {"administrator": comment, "job": None, "system": None},
        "allocation_nodes": nodes,
        "array": {"job_id": 0, "limits": {"max": {"running": {"tasks": 0}}}, "task": None, "task_id": None},
        "association": {"account": "proj", "cluster": "dev", "partition": None, "user": user},
        "cluster": "dev", "constraints": "", "derived_exit_code": {"status": "SUCCESS", "return_code": 0},
        "time": {"elapsed": elapsed, "eligible": start - 5, "end": start + elapsed, "start": start,
                 "submission": start - 5, "suspended": 0, "system": {"seconds": 0, "microseconds": 0},
                 "limit": limit, "total": {"seconds": 0, "microseconds": 0}, "user": {"seconds": 0, "microseconds": 0}},
        "exit_code": {"status": "SUCCESS" if state == "COMPLETED" else "ERROR", "return_code": 0 if state == "COMPLETED" else 1},
        "flags": ["CLEAR_SCHEDULING"], "group": user, "het": {"job_id": 0, "job_offset": None},
        "job_id": job_id, "name": "gpt", "mcs": {"label": ""}, "nodes": "node[1-2]", "partition": partition,
        "priority": 4294901759, "qos": "normal", "required": {"CPUs": 2, "memory": 0},
        "kill_request_user": None, "reservation": {"id": 0, "name": 0},
        "state": {"current": state, "reason": "None"}, "steps": [],
        "tres": {"allocated": [], "requested": []}, "user": user, "wckey": {"wckey": "", "flags": []},
        "working_directory": work_dir,
    }


def sacct_doc(*jobs):
    return {"meta": {"plugin": {"type": "openapi/dbv0.0.38", "name": "Slurm OpenAPI DB v0.0.38"},
                     "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}},
            "errors": [], "jobs": list(jobs)}


def scontrol_line(job_id, state, comment, *, user="alice(1001)", work_dir="/home/alice", std_out=None,
                  run_time="00:12:34", limit="00:30:00"):
    """`scontrol -o show job` of Slurm 22.05 (one line; AdminComment only when set)."""
    out = std_out or f"{work_dir}/slurm-{job_id}.out"
    return (f"JobId={job_id} JobName=gpt UserId={user} GroupId=alice(1001) MCS_label=N/A Priority=4294901758 "
            f"Nice=0 Account=proj QOS=normal JobState={state} Reason=None Dependency=(null) Requeue=1 "
            f"Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime={run_time} TimeLimit={limit} "
            f"TimeMin=00:20:00 SubmitTime=2024-05-01T10:00:00 EligibleTime=2024-05-01T10:00:00 "
            f"AccrueTime=2024-05-01T10:00:00 StartTime=2024-05-01T10:00:01 EndTime=2024-05-01T10:12:35 "
            f"Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2024-05-01T10:00:01 "
            f"Scheduler=Main Partition=gpu AllocNode:Sid=ctl:4242 ReqNodeList=(null) ExcNodeList=(null) "
            f"NodeList=node[1-2] BatchHost=node1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
            f"ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=1:0:*:* "
            f"CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
            f"OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command={work_dir}/train.sh "
            f"WorkDir={work_dir} " + (f"AdminComment={comment} " if comment else "")
            + f"StdErr={out} StdIn=/dev/null StdOut={out} Power=")


def test_parse_sacct_json():
    comment = "perfcast:v1 iter_s=1.5 iters=200 rec=0123456789ab"
    jobs = parse_sacct_json(sacct_doc(sacct_job(101, "COMPLETED", comment), sacct_job(102, "TIMEOUT", None)))
    a, b = jobs
    assert (a.job_id, a.state, a.elapsed_seconds, a.time_limit_seconds, a.nodes) == (101, "COMPLETED", 754.0, 1800.0, 2)
    assert a.start == T0 and a.end == T0 + 754 and a.admin_comment == comment and a.work_dir == "/home/alice"
    assert a.exit_code == "0:0" and a.user == "alice" and a.node_list == "node[1-2]"
    assert b.admin_comment == "" and b.state == "TIMEOUT"
    # Later Slurm wraps numbers and states; unlimited limits are None.
    j = sacct_job(103, "COMPLETED", comment)
    j["state"]["current"] = ["COMPLETED"]
    j["time"]["limit"] = {"set": True, "infinite": True, "number": 0}
    j["exit_code"]["return_code"] = {"set": True, "infinite": False, "number": 0}
    c, = parse_sacct_json(sacct_doc(j))
    assert c.state == "COMPLETED" and c.time_limit_seconds is None and c.exit_code == "0:0"


def test_parse_sacct_parsable_refuses_a_shifted_line():
    d = "|#pc#|"
    good = d.join(["101", "gpt", "gpu", "CANCELLED by 1001", "754", "30", "2024-05-01T10:00:01",
                   "2024-05-01T10:12:35", "2", "0:15", "alice", "1001", "/home/alice", "node[1-2]",
                   "perfcast:v1 iter_s=1.5 rec=0123456789ab"])
    # A user put the delimiter into their working directory to forge fields: the line is refused.
    forged = good.replace("/home/alice", f"/home/x{d}gpu{d}COMPLETED")
    jobs = parse_sacct_parsable(good + "\n" + forged + "\n")
    assert len(jobs) == 1
    j = jobs[0]
    assert (j.state, j.uid, j.elapsed_seconds, j.time_limit_seconds, j.exit_code) == ("CANCELLED", 1001, 754.0, 1800.0, "0:15")
    assert j.admin_comment.endswith("rec=0123456789ab")


def test_parse_scontrol_jobs():
    text = (scontrol_line(101, "COMPLETED", "perfcast:v1 iter_s=1.5 rec=0123456789ab") + "\n"
            + scontrol_line(102, "RUNNING", None, run_time="1-02:03:04", limit="2-00:00:00") + "\n")
    a, b = parse_scontrol_jobs(text)
    assert (a.job_id, a.state, a.user, a.uid, a.elapsed_seconds, a.time_limit_seconds) == \
        (101, "COMPLETED", "alice", 1001, 754.0, 1800.0)
    assert a.std_out == "/home/alice/slurm-101.out" and a.batch_host == "node1" and a.nodes == 2
    assert a.admin_comment == "perfcast:v1 iter_s=1.5 rec=0123456789ab"
    assert b.admin_comment == "" and b.elapsed_seconds == 93784.0 and b.time_limit_seconds == 172800.0
    assert parse_scontrol_jobs("No jobs in the system\n") == []
    # The harvest's own call: the jobs without a record are not parsed at all.
    assert [j.job_id for j in parse_scontrol_jobs(text, must_contain="perfcast:v1")] == [101]


@pytest.mark.parametrize("text, seconds", [("00:12:34", 754), ("1-00:00:00", 86400), ("12:34", 754),
                                           ("30", 1800), ("UNLIMITED", None), ("Partition_Limit", None),
                                           ("junk", None)])
def test_duration_seconds(text, seconds):
    assert duration_seconds(text) == seconds


def test_output_patterns():
    job = AccountingJob(job_id=101, state="COMPLETED", name="gpt", user="alice", node_list="gpu[007-008]")
    assert expand_output_pattern("train-%j.out", job) == "train-101.out"
    assert expand_output_pattern("%x-%6j.log", job) == "gpt-000101.log"
    assert expand_output_pattern("%u/%N-%J.%s", job) == "alice/gpu007-101.batch"
    assert expand_output_pattern("100%%-%j", job) == "100%-101"
    assert expand_output_pattern("\\%j.out", job) == "%j.out"
    arr = AccountingJob(job_id=205, state="COMPLETED", array_job_id=200, array_task_id=5)
    assert expand_output_pattern("r-%A_%3a.out", arr) == "r-200_005.out"
    rec = PredictionRecord(partition="gpu", platform="p", bundle="b", job=JOB, iteration_seconds=1.0,
                           iterations=1, total_seconds=1.0, work_dir="/home/alice/run")
    assert output_path(job, rec) == "/home/alice/run/slurm-101.out"
    assert output_path(arr, rec) == "/home/alice/run/slurm-200_5.out"
    assert output_path(job, PredictionRecord(**{**rec.to_dict(), "work_dir": "", "interval_seconds": (0, 0)})) is None
    scontrol = AccountingJob(job_id=101, state="COMPLETED", std_out="/scratch/o/101.txt")
    assert output_path(scontrol, rec) == "/scratch/o/101.txt"


def test_parse_since():
    assert parse_since("2d", now=1000000.0) == 1000000.0 - 2 * 86400
    assert parse_since("90m", now=1000000.0) == 1000000.0 - 5400
    assert parse_since("2024-05-01") > 0
    with pytest.raises(Exception, match="--since"):
        parse_since("yesterday")


# ------------------------------------------------------------------------------ the harvest
class FakeSlurm:
    """The runner SlurmClient calls: canned answers per command, every call recorded."""

    def __init__(self, *, sacct_json=None, sacct_parsable=None, scontrol="", sacct_error=None):
        self.sacct_json, self.sacct_parsable, self.scontrol = sacct_json, sacct_parsable, scontrol
        self.sacct_error = sacct_error
        self.calls = []

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        if argv[0] == "sacct":
            if self.sacct_error:
                return subprocess.CompletedProcess(argv, 1, b"", self.sacct_error.encode())
            if "--json" in argv:
                if self.sacct_json is None:
                    return subprocess.CompletedProcess(argv, 1, b"", b"sacct: error: unrecognized option '--json'\n")
                return subprocess.CompletedProcess(argv, 0, json.dumps(self.sacct_json).encode(), b"")
            return subprocess.CompletedProcess(argv, 0, (self.sacct_parsable or "").encode(), b"")
        if argv[:2] == ["scontrol", "-o"]:
            return subprocess.CompletedProcess(argv, 0, self.scontrol.encode(), b"")
        return subprocess.CompletedProcess(argv, 1, b"", b"unexpected command\n")


@pytest.fixture
def cluster(tmp_path, user_dir):
    """A record store with the daemon's records of five jobs, and their logs on disk."""
    d, uid, gid, name = user_dir
    store = RecordStore(tmp_path / "records.sqlite")

    def rec(job_name, **kw):
        base = dict(partition="gpu", platform="dgx-a100", bundle="a100@1", job=JOB, iteration_seconds=1.1,
                    iterations=200, total_seconds=340.0, interval_seconds=(1.0, 1.6), time_limit_minutes=30,
                    time_min_minutes=15, recommended_minutes=30, action="set", policy="fill",
                    std_out="train-%j.out", work_dir=str(d), job_name=job_name, uid=uid, gid=gid, user=name)
        base.update(kw)
        return store.add(PredictionRecord(**base))

    ids = {"done": rec("done"), "timeout": rec("timeout", iteration_seconds=2.0), "nolog": rec("nolog"),
           "liar": rec("liar"), "other": rec("other", user="mallory", uid=uid + 1 if uid else 4242)}
    (d / "train-101.out").write_text(megatron_log(60, 1234.5))
    (d / "train-102.out").write_text(nemo_log(40, 2.5))
    (d / "train-104.out").write_text(megatron_log(60, 50_000.0))      # 50 s/iter, but it ran 100 s
    for f in d.iterdir():
        _own(f, uid, gid)

    def comment(key):
        return f"perfcast:v1 iter_s=1.1 iters=200 total_min=5.7 platform=dgx-a100 rec={ids[key]}"

    jobs = [sacct_job(101, "COMPLETED", comment("done"), user=name, elapsed=754, limit=30, work_dir=str(d)),
            sacct_job(102, "TIMEOUT", comment("timeout"), user=name, elapsed=1800, limit=30, work_dir=str(d)),
            sacct_job(103, "FAILED", comment("nolog"), user=name, elapsed=20, work_dir=str(d)),
            sacct_job(104, "COMPLETED", comment("liar"), user=name, elapsed=100, work_dir=str(d)),
            sacct_job(105, "RUNNING", comment("done"), user=name, work_dir=str(d)),
            sacct_job(106, "COMPLETED", None, user=name, work_dir=str(d)),
            sacct_job(107, "COMPLETED", "perfcast:v1 iter_s=1 rec=ffffffffffff", user=name, work_dir=str(d)),
            sacct_job(108, "COMPLETED", comment("other"), user=name, work_dir=str(d))]
    return store, ids, sacct_doc(*jobs), d, uid, gid, name


def test_harvest_from_sacct(tmp_path, cluster):
    store, ids, doc, d, uid, gid, name = cluster
    fake = FakeSlurm(sacct_json=doc)
    opts = HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600)
    res = harvest(opts, AccountingClient(runner=fake))
    assert res.source == "sacct"
    assert fake.calls[0][:2] == ["sacct", "-a"] and "--json" in fake.calls[0]
    by_job = {o.slurm_job_id: o for o in res.outcomes}
    assert sorted(by_job) == [101, 102, 103, 104]
    assert by_job[101].measured_iteration_seconds == pytest.approx(1.2345)
    assert by_job[101].log_format == "megatron" and by_job[101].log_samples == 58
    assert by_job[102].state == "TIMEOUT" and by_job[102].measured_iteration_seconds == pytest.approx(2.5)
    assert by_job[103].measured_iteration_seconds is None and "no such file" in by_job[103].note
    assert by_job[104].measured_iteration_seconds is None and "not this job's log" in by_job[104].note
    skipped = dict(res.skipped)
    assert "not in" in skipped[107] and "mallory" in skipped[108]
    assert 105 not in skipped and 106 not in skipped        # running / not perfcast's: not even looked at
    # Stored, and the records now know their job ids.
    assert store.get(ids["done"]).slurm_job_id == 101
    assert {o.slurm_job_id for _, o in store.outcomes()} == {101, 102, 103, 104}
    # Measured runs of the partition, in the validate --runs format.
    runs = load_runs(tmp_path / "runs" / "gpu.toml")
    assert [r.name for r in runs] == ["slurm job 101", "slurm job 102"]
    assert runs[0].measured_iteration_seconds == pytest.approx(1.2345)
    assert runs[0].predicted_iteration_seconds == pytest.approx(1.1)
    assert runs[0].job.layout.tp == 4 and "record " + ids["done"] in runs[0].source
    assert res.runs_files["gpu"][1:] == (2, 2)

    # Again: nothing new, nothing duplicated; --rescan reads again but keeps one run per job.
    again = harvest(opts, AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    assert again.outcomes == [] and all("harvested before" in why for j, why in again.skipped if j <= 104)
    rescan = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600, rescan=True),
                     AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    assert len(rescan.outcomes) == 4 and rescan.runs_files["gpu"][1:] == (0, 2)
    assert [r.name for r in load_runs(tmp_path / "runs" / "gpu.toml")] == ["slurm job 101", "slurm job 102"]


def test_harvest_partition_filter_and_dry_run(tmp_path, cluster):
    store, ids, doc, *_ = cluster
    opts = HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600, partition="cpu",
                          dry_run=True)
    fake = FakeSlurm(sacct_json=doc)
    res = harvest(opts, AccountingClient(runner=fake))
    assert res.outcomes == [] and ["-r", "cpu"] == fake.calls[0][fake.calls[0].index("-r"):][:2]
    res = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600, dry_run=True),
                  AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    assert len(res.outcomes) == 4 and store.outcomes() == [] and not (tmp_path / "runs").exists()


def test_harvest_falls_back_to_sacct_parsable_then_scontrol(tmp_path, cluster):
    store, ids, doc, d, uid, gid, name = cluster
    d_ = "|#pc#|"
    line = d_.join(["101", "gpt", "gpu", "COMPLETED", "754", "30", "2024-05-01T10:00:01", "2024-05-01T10:12:35",
                    "2", "0:0", name, str(uid), str(d), "node[1-2]",
                    f"perfcast:v1 iter_s=1.1 rec={ids['done']}"])
    res = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600),
                  AccountingClient(runner=FakeSlurm(sacct_parsable=line + "\n")))
    assert res.source == "sacct" and [o.slurm_job_id for o in res.outcomes] == [101]
    assert res.outcomes[0].measured_iteration_seconds == pytest.approx(1.2345)

    # No accounting at all: slurmctld's own memory of the jobs, StdOut resolved by Slurm.
    (d / "elsewhere.log").write_text(nemo_log(20, 3.0))
    _own(d / "elsewhere.log", uid, gid)
    text = scontrol_line(102, "TIMEOUT", f"perfcast:v1 iter_s=2 rec={ids['timeout']}", user=f"{name}({uid})",
                         work_dir=str(d), std_out=str(d / "elsewhere.log"), run_time="00:30:00")
    fake = FakeSlurm(scontrol=text + "\n", sacct_error="sacct: error: Slurm accounting storage is disabled\n")
    res = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600),
                  AccountingClient(runner=fake))
    assert res.source == "scontrol" and [o.slurm_job_id for o in res.outcomes] == [102]
    assert res.outcomes[0].measured_iteration_seconds == pytest.approx(3.0)
    assert res.outcomes[0].elapsed_seconds == 1800.0 and res.outcomes[0].source == "scontrol"


def test_scontrol_uid_must_match_the_record(tmp_path, cluster):
    store, ids, doc, d, uid, gid, name = cluster
    text = scontrol_line(101, "COMPLETED", f"perfcast:v1 iter_s=1 rec={ids['done']}", user=f"eve({uid + 7})",
                         work_dir=str(d))
    res = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600, source="scontrol"),
                  AccountingClient(runner=FakeSlurm(scontrol=text)))
    assert res.outcomes == [] and "uid" in res.skipped[0][1]


def test_no_source_answers_is_one_clear_error(tmp_path, cluster):
    store = cluster[0]
    fake = FakeSlurm(sacct_error="sacct: error: Problem talking to the database: Connection refused\n")
    fake.scontrol = None

    def runner(argv, **kw):
        if argv[0] == "scontrol":
            return subprocess.CompletedProcess(argv, 1, b"", b"slurm_load_jobs error: Unable to contact slurm controller\n")
        return fake(argv, **kw)

    with pytest.raises(Exception, match="neither sacct nor scontrol"):
        harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0), AccountingClient(runner=runner))
    with pytest.raises(Exception, match="sacct:"):
        finished_jobs(AccountingClient(runner=fake), T0, source="sacct")


def test_harvest_report_cli_end_to_end(tmp_path, cluster, monkeypatch, capsys):
    """The admin's path: perf-calibrate harvest, then report --json, with sacct a command on PATH."""
    store, ids, doc, *_ = cluster
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "sacct.json").write_text(json.dumps(doc))
    sacct = bin_dir / "sacct"
    sacct.write_text(f"#!/bin/sh\ncat '{tmp_path / 'sacct.json'}'\n")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    out = tmp_path / "runs"
    assert main(["harvest", "--records", str(store.path), "--out", str(out), "--since", "2024-04-30"]) == 0
    text = capsys.readouterr().out
    assert "harvested 4 finished perfcast jobs from sacct (2 with iteration times" in text
    assert "skipped job 107" in text
    assert main(["report", "--records", str(store.path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    job = next(j for j in rep["jobs"] if j["job_id"] == 101)
    assert job["state"] == "COMPLETED" and job["elapsed_seconds"] == 754
    assert job["time_limit_seconds"] == 1800 and job["predicted_iteration_seconds"] == 1.1
    assert job["measured_iteration_seconds"] == pytest.approx(1.2345) and job["predicted_total_seconds"] == 340.0
    assert rep["partitions"]["gpu"]["timeouts_at_perfcast_limit"] == 1
    # A bad --since is one line, exit 2.
    assert main(["harvest", "--records", str(store.path), "--since", "last tuesday"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--since" in err and "Traceback" not in err


def test_cli_missing_store_and_corrupt_store_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    assert main(["report", "--records", str(tmp_path / "none.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "no record store here" in err and err.count("\n") == 1
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 1000)
    assert main(["report", "--records", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_records_path_from_a_bad_config_is_one_line(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text("[daemon]\nsocket = 3\n")
    monkeypatch.setenv("PERFCAST_CONFIG", str(cfg))
    assert main(["report"]) == 2
    err = capsys.readouterr().err
    assert str(cfg) in err and err.count("\n") == 1


def test_second_run_is_one_line_and_users_are_named(tmp_path, cluster):
    store, ids, doc, d, uid, gid, name = cluster
    opts = HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600)
    first = harvest(opts, AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    assert {j["user"] for j in first.to_dict()["jobs"]} == {name}
    assert f"job 101 ({name}): COMPLETED" in first.summary()
    assert f"user {name}" in load_runs(tmp_path / "runs" / "gpu.toml")[0].source
    again = harvest(opts, AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    text = again.summary().splitlines()
    assert "4 jobs harvested before (--rescan reads them again)" in text
    assert not any("skipped job 10" in ln and "harvested before" in ln for ln in text)
    assert sum("harvested before" in ln for ln in text) == 1
    assert any("skipped job 107" in ln for ln in text)          # a reason worth reading stays


def _fifo_logs(d, uid, gid, job_ids):
    for j in job_ids:
        path = d / f"train-{j}.out"
        if path.exists():
            path.unlink()
        os.mkfifo(path)
        _own(path, uid, gid)


def test_fifo_logs_are_read_in_parallel_within_their_timeout(tmp_path, cluster):
    """Every log is a FIFO nobody writes: each read ends at its own timeout, the run goes on."""
    store, ids, doc, d, uid, gid, name = cluster
    _fifo_logs(d, uid, gid, (101, 102, 104))
    opts = HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600,
                          log_timeout_s=0.5, log_workers=3, log_budget_s=600.0)
    res = harvest(opts, AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    by_job = {o.slurm_job_id: o for o in res.outcomes}
    assert sorted(by_job) == [101, 102, 103, 104]
    for j in (101, 102, 104):
        assert by_job[j].measured_iteration_seconds is None and "log unreadable" in by_job[j].note


def test_logs_not_read_within_the_budget_are_left_for_the_next_run(tmp_path, cluster):
    """A FIFO never answers, so with a budget shorter than the reads' own timeout those jobs are
    not read this run: skipped, not stored, and read again next time (whatever the machine's speed)."""
    store, ids, doc, d, uid, gid, name = cluster
    _fifo_logs(d, uid, gid, (101, 102))
    opts = HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600,
                          log_timeout_s=30.0, log_workers=2, log_budget_s=0.3)
    res = harvest(opts, AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    skipped = dict(res.skipped)
    assert "this run's 0 s for reading logs was spent" in skipped[101] and "the next harvest" in skipped[102]
    stored = {o.slurm_job_id for _, o in store.outcomes()}
    assert 101 not in stored and 102 not in stored
    for j in (101, 102):        # the writers the reads wait for, so their threads end now
        with open(d / f"train-{j}.out", "w") as fh:
            fh.write("")


def test_a_runs_file_held_by_another_writer_leaves_its_jobs_for_the_next_run(tmp_path, cluster, monkeypatch):
    """The watch (or another harvest) holds the partition's runs file: the jobs with runs are not
    stored as harvested, the run says why and fails (a timer shows it), and the next run takes them."""
    from calibrate import runs_files
    store, ids, doc, *_ = cluster
    monkeypatch.setattr(runs_files, "LOCK_WAIT_S", 0.2)
    out = tmp_path / "runs"
    out.mkdir()
    opts = HarvestOptions(records=store.path, out_dir=out, since=T0 - 3600)
    with runs_files.runs_lock(runs_files.runs_file(out, "gpu")):
        res = harvest(opts, AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    assert not res.ok and len(res.errors) == 1
    assert str(out / ".gpu.toml.lock") in res.errors[0] and f"held by pid {os.getpid()}" in res.errors[0]
    assert sorted(o.slurm_job_id for o in res.outcomes) == [103, 104]       # no runs of theirs to write
    skipped = dict(res.skipped)
    assert "its run was not written" in skipped[101] and "next harvest" in skipped[102]
    assert "error: runs of gpu not written" in res.summary()
    assert not (out / "gpu.toml").exists()
    again = harvest(opts, AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    assert again.ok and sorted(o.slurm_job_id for o in again.outcomes) == [101, 102]
    assert [r.name for r in load_runs(out / "gpu.toml")] == ["slurm job 101", "slurm job 102"]
