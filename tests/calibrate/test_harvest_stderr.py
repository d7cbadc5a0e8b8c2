"""perf-calibrate harvest finds iteration lines in a job's StdErr (``#SBATCH --error`` apart from
``--output``: a training log written through Python's logging goes to stderr), read as the job's
user like its StdOut; the watch uses the same path (calibrate.harvest.log_paths)."""
from __future__ import annotations

from calibrate.harvest import (AccountingClient, AccountingJob, HarvestOptions, error_path, harvest, log_paths,
                               parse_scontrol_jobs)
from calibrate.validate import load_runs
from slurm_plugin.records import PredictionRecord

from .test_harvest import (JOB, T0, FakeSlurm, _own, cluster, megatron_log, scontrol_line,  # noqa: F401
                           user_dir)


def _with_stderr(line: str, std_err: str) -> str:
    head, _, tail = line.partition(" StdErr=")
    return f"{head} StdErr={std_err} {tail.split(' ', 1)[1]}"


def test_stderr_paths():
    rec = PredictionRecord(partition="gpu", platform="p", bundle="b", job=JOB, iteration_seconds=1.0,
                           iterations=1, total_seconds=1.0, work_dir="/home/alice/run")
    same = AccountingJob(job_id=101, state="COMPLETED", std_out="/s/101.out", std_err="/s/101.out")
    assert error_path(same, rec) is None and log_paths(same, rec) == [("StdOut", "/s/101.out")]
    apart = AccountingJob(job_id=101, state="COMPLETED", std_out="/s/101.out", std_err="err-%j.log")
    assert log_paths(apart, rec) == [("StdOut", "/s/101.out"), ("StdErr", "/home/alice/run/err-101.log")]
    # sacct (22.05) says nothing of StdErr: stdout only, as before.
    assert log_paths(AccountingJob(job_id=101, state="COMPLETED"), rec) == [("StdOut", "/home/alice/run/slurm-101.out")]
    (j,) = parse_scontrol_jobs(_with_stderr(scontrol_line(101, "COMPLETED", None), "/home/alice/e-101.err"))
    assert (j.std_out, j.std_err) == ("/home/alice/slurm-101.out", "/home/alice/e-101.err")


def test_harvest_reads_iteration_lines_from_stderr(tmp_path, cluster):
    store, ids, doc, d, uid, gid, name = cluster
    (d / "quiet.out").write_text("> building GPT model ...\n")
    (d / "train.err").write_text(megatron_log(40, 1500.0))
    for f in ("quiet.out", "train.err"):
        _own(d / f, uid, gid)
    line = scontrol_line(102, "TIMEOUT", f"perfcast:v1 iter_s=2 rec={ids['timeout']}", user=f"{name}({uid})",
                         work_dir=str(d), std_out=str(d / "quiet.out"), run_time="00:30:00")
    fake = FakeSlurm(scontrol=_with_stderr(line, str(d / "train.err")) + "\n",
                     sacct_error="sacct: error: Slurm accounting storage is disabled\n")
    res = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600),
                  AccountingClient(runner=fake))
    (o,) = res.outcomes
    assert o.measured_iteration_seconds == 1.5 and o.log_format == "megatron", o.note
    (r,) = load_runs(tmp_path / "runs" / "gpu.toml")
    assert f"from its StdErr {d / 'train.err'}" in r.source
