"""The Slurm client's parsing, against canned command output (the real CLI is exercised in
tests/slurm)."""
from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_plugin.slurm_client import (SlurmClient, SlurmError, gpus_in_gres, job_is_running,
                                       parse_oneliner, parse_running_jobs, parse_slurm_time,
                                       scontrol_job_lines)
from slurm_plugin.slurm_client import _MAY_RUN_RE

PART = ("PartitionName=gpu AllowGroups=ALL Default=YES DefaultTime=NONE MaxNodes=UNLIMITED "
        "MaxTime=2-00:00:00 Nodes=dev[001-064] State=UP TotalCPUs=4096 TotalNodes=64\n"
        "PartitionName=short Default=NO DefaultTime=00:30:00 MaxNodes=8 MaxTime=01:00:00 "
        "Nodes=dev[001-064] State=UP TotalCPUs=4096 TotalNodes=64\n")
SINFO = {"errors": [], "nodes": [
    {"name": "dev001", "state": "idle", "cpus": 64, "gres": "gpu:a100:8(S:0-1)",
     "partitions": ["gpu", "short"], "real_memory": 512000},
    {"name": "dev002", "state": "down", "cpus": 64, "gres": "gpu:4", "partitions": ["gpu"]}]}
SQUEUE = {"errors": [], "jobs": [
    {"job_id": 7, "name": "a", "job_state": "PENDING", "partition": "gpu", "time_limit": 55,
     "user_name": "alice", "node_count": 4, "state_reason": "Resources",
     "admin_comment": "perfcast:v1 iter_s=1 iters=2 total_min=0.1 platform=p bundle=b"},
    {"job_id": 8, "name": "b", "job_state": "RUNNING", "partition": "cpu", "time_limit": 10,
     "user_name": "bob", "node_count": 1, "state_reason": "None"}]}
JOB = ("JobId=7 JobName=a UserId=alice(1000) GroupId=alice(1000) JobState=PENDING "
       "Reason=ReqNodeNotAvail,_UnavailableNodes:dev[002-064] TimeLimit=00:55:00 Partition=gpu "
       "NumNodes=4-4 AdminComment=perfcast:v1 iter_s=2.5 iters=1000 total_min=42.7 "
       "platform=perlmutter-a100 bundle=b1 policy=fill  StdErr=/tmp/x.out TresPerNode=gres:gpu:4\n")


def runner(outputs: dict):
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw))
        key = " ".join(a for a in argv if not a.startswith("/"))
        for prefix, (rc, out, err) in outputs.items():
            if key.startswith(prefix) or (argv[:3] == ["runuser", "-u", "nobody"] and prefix == "runuser"):
                return subprocess.CompletedProcess(argv, rc, out.encode(), err.encode())
        raise FileNotFoundError(argv[0])
    run.calls = calls
    return run


@pytest.mark.parametrize("text, minutes", [
    ("2-00:00:00", 2880), ("01:00:00", 60), ("1:30:00", 90), ("30:00", 30), ("30:01", 31),
    ("45", 45), ("1-12", 2160), ("1-00:30", 1470), ("UNLIMITED", None), ("NONE", None),
    ("INFINITE", None)])
def test_parse_slurm_time(text, minutes):
    assert parse_slurm_time(text) == minutes


def test_parse_slurm_time_rejects_junk():
    with pytest.raises(SlurmError):
        parse_slurm_time("soon")


def test_oneliner_keeps_values_with_spaces_and_lowercase_pairs():
    kv = parse_oneliner(JOB.strip())
    assert kv["AdminComment"].startswith("perfcast:v1 iter_s=2.5 iters=1000")
    assert kv["AdminComment"].endswith("policy=fill")
    assert kv["TresPerNode"] == "gres:gpu:4" and kv["NumNodes"] == "4-4"


def test_gpus_in_gres():
    assert gpus_in_gres("gpu:a100:8(S:0-1)") == 8
    assert gpus_in_gres("gpu:a100:2,gpu:v100:2") == 4
    assert gpus_in_gres("(null)") == 0


def test_partitions():
    c = SlurmClient(runner=runner({"scontrol -o show partition": (0, PART, ""),
                                   "sinfo --json": (0, json.dumps(SINFO), "")}))
    gpu, short = c.partitions()
    assert (gpu.name, gpu.max_time_minutes, gpu.nodes, gpu.gpus_per_node, gpu.is_default) == \
        ("gpu", 2880, 64, 8, True)
    assert (short.max_time_minutes, short.default_time_minutes, short.max_nodes) == (60, 30, 8)
    assert c.partition().name == "gpu" and c.partition("short").name == "short"
    with pytest.raises(SlurmError):
        c.partition("nope")


def test_submit_parses_id_and_keeps_messages():
    run = runner({"sbatch --parsable": (0, "123;cluster1\n", "sbatch: perfcast: predicted ...\n"),
                  "runuser": (0, "124\n", "")})
    c = SlurmClient(conf="/etc/x/slurm.conf", runner=run)
    r = c.submit("/tmp/job.sh", ["--hold"])
    assert (r.job_id, r.cluster, r.messages) == (123, "cluster1", ["sbatch: perfcast: predicted ..."])
    assert run.calls[0][1]["env"]["SLURM_CONF"] == "/etc/x/slurm.conf"
    assert c.submit(None, text="#!/bin/bash\n", user="nobody").job_id == 124
    assert run.calls[1][0][:4] == ["runuser", "-u", "nobody", "--"]
    assert run.calls[1][1]["input"] == b"#!/bin/bash\n"


def test_errors_carry_slurms_reason():
    run = runner({"sbatch --parsable": (1, "", "sbatch: error: Batch job submission failed: "
                                               "Invalid partition name specified\n")})
    with pytest.raises(SlurmError, match="Invalid partition name"):
        SlurmClient(runner=run).submit("/tmp/job.sh")
    with pytest.raises(SlurmError, match="not installed"):
        SlurmClient(runner=runner({})).jobs()


def test_jobs_and_job():
    run = runner({"squeue --json": (0, json.dumps(SQUEUE), ""),
                  "scontrol -o show job": (0, JOB, "")})
    c = SlurmClient(runner=run)
    assert [j.job_id for j in c.jobs()] == [7, 8]
    assert [j.job_id for j in c.jobs(user="bob")] == [8]
    assert [j.job_id for j in c.jobs(states=["pending"])] == [7]
    assert [j.job_id for j in c.jobs(ids=[8])] == [8]
    j = c.job(7)
    assert (j.user, j.time_limit_minutes, j.nodes, j.partition) == ("alice", 55, 4, "gpu")
    assert j.admin_comment.startswith("perfcast:v1")


def test_wait_returns_the_final_state():
    states = iter(["PENDING", "RUNNING", "COMPLETED"])

    def run(argv, **kw):
        line = JOB.replace("JobState=PENDING", f"JobState={next(states)}")
        return subprocess.CompletedProcess(argv, 0, line.encode(), b"")
    assert SlurmClient(runner=run).wait(7, poll=0.01).state == "COMPLETED"
    with pytest.raises(SlurmError, match="still PENDING"):
        SlurmClient(runner=lambda argv, **kw: subprocess.CompletedProcess(argv, 0, JOB.encode(), b"")
                    ).wait(7, timeout=0.05, poll=0.01)


RUNNING_LINE = ("JobId=7 JobName=train x UserId=alice(1000) GroupId=alice(1000) Account=proj "
                "QOS=normal JobState=RUNNING Reason=None RunTime=00:10:00 TimeLimit=02:00:00 "
                "TimeMin=N/A StartTime=2026-11-27T00:30:00 Partition=gpu NodeList=dev[001-002] "
                "BatchHost=dev001 WorkDir=/home/alice StdOut=/home/alice/o.txt "
                "AdminComment=perfcast:v1 iter_s=1 rec=abc")


def test_running_jobs_skip_other_states_before_parsing_them():
    pending = RUNNING_LINE.replace("JobId=7", "JobId=8").replace("JobState=RUNNING", "JobState=PENDING")
    # A job whose name says RUNNING is still pending: the cheap test lets it through, the parse not.
    named = pending.replace("JobId=8", "JobId=9").replace("JobName=train x", "JobName=JobState=RUNNING")
    ended = RUNNING_LINE.replace("JobId=7", "JobId=10").replace("JobState=RUNNING", "JobState=COMPLETED")
    jobs = parse_running_jobs("\n".join([pending, RUNNING_LINE, named, ended]) + "\n")
    assert [j.job_id for j in jobs] == [7]
    assert (jobs[0].partition, jobs[0].time_limit_minutes, jobs[0].admin_comment) == \
        ("gpu", 120, "perfcast:v1 iter_s=1 rec=abc")


# A JobState spelled every which way, amid other pieces of a line (a value running into a key,
# tabs, a job name that says RUNNING).
_STATE = st.tuples(st.sampled_from(["", " ", "\t", "  "]),
                   st.sampled_from(["RUNNING", "running", "RuNnInG", "RUNNINGX", "PENDING", "Running"]),
                   st.sampled_from(["", " ", "\t", "X", " Reason=None", "\tReason=None", " x y"]))
_NOISE = st.lists(st.sampled_from(["JobName=", "RUNNING", "JobState=", " ", "x", "=", "Reason=None "]),
                  max_size=6)


@given(_NOISE, _STATE, _NOISE)
def test_the_pre_filter_lets_every_running_line_through(before, state, after):
    # parse_running_jobs skips a line before parsing it unless _MAY_RUN_RE finds it may be
    # RUNNING: every line the parse reads as RUNNING must pass, however it is spelled.
    line = ("JobId=5 Partition=gpu " + "".join(before) + " JobState=" + "".join(state) + " "
            + "".join(after))
    for _, kv in scontrol_job_lines(line):
        if job_is_running(kv):
            assert _MAY_RUN_RE.search(line)
