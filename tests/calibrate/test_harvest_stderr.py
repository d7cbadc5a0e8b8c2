"""perf-calibrate harvest finds iteration lines in a job's StdErr (``#SBATCH --error`` apart from
``--output``: a training log written through Python's logging goes to stderr), read as the job's
user like its StdOut; the watch uses the same path (calibrate.harvest.log_paths)."""
from __future__ import annotations

from calibrate.harvest import (AccountingClient, AccountingJob, HarvestOptions, error_path, harvest, log_paths,
                               parse_scontrol_jobs)
from calibrate.validate import load_runs
from slurm_plugin.records import PredictionRecord

from .test_harvest import (JOB, T0, FakeSlurm, _own, cluster, megatron_log, nemo_log, sacct_doc,  # noqa: F401
                           sacct_job, scontrol_line, user_dir)


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


def test_stderr_path_from_the_record_when_scontrol_has_forgotten_the_job():
    rec = PredictionRecord(partition="gpu", platform="p", bundle="b", job=JOB, iteration_seconds=1.0,
                           iterations=1, total_seconds=1.0, work_dir="/home/alice/run", std_err="logs/%x-%j.err")
    sacct = AccountingJob(job_id=101, state="COMPLETED", name="gpt", work_dir="/home/alice/run")
    assert error_path(sacct, rec) == "/home/alice/run/logs/gpt-101.err"
    assert log_paths(sacct, rec) == [("StdOut", "/home/alice/run/slurm-101.out"),
                                     ("StdErr", "/home/alice/run/logs/gpt-101.err")]
    # An array task's patterns, and an absolute --error, as sbatch expands them.
    arr = AccountingJob(job_id=205, state="COMPLETED", array_job_id=200, array_task_id=5)
    assert error_path(arr, PredictionRecord(**{**rec.to_dict(), "std_err": "/s/e-%A_%a.log"})) == "/s/e-200_5.log"
    # The record's --error names stdout's file (both given alike): stdout only.
    both = PredictionRecord(**{**rec.to_dict(), "std_out": "o-%j.log", "std_err": "o-%j.log"})
    assert error_path(sacct, both) is None and log_paths(sacct, both) == [("StdOut", "/home/alice/run/o-101.log")]
    # scontrol's StdErr, while it knows the job, is Slurm's own word: it wins over the record.
    known = AccountingJob(job_id=101, state="COMPLETED", std_out="/s/101.out", std_err="/s/101.err")
    assert error_path(known, rec) == "/s/101.err"
    # Relative, with no absolute working directory anywhere: not guessed.
    assert error_path(arr, PredictionRecord(**{**rec.to_dict(), "work_dir": ""})) is None


def test_sacct_only_harvest_reads_iteration_lines_from_the_records_stderr_file(tmp_path, cluster):
    """A daily harvest: slurmctld has forgotten the job (scontrol lists nothing), sacct names no
    file, and the training log (Python logging) is in the job's --error file."""
    store, ids, doc, d, uid, gid, name = cluster
    rid = store.add(PredictionRecord(
        partition="gpu", platform="dgx-a100", bundle="a100@1", job=JOB, iteration_seconds=2.0, iterations=200,
        total_seconds=400.0, interval_seconds=(1.8, 2.4), time_limit_minutes=30, action="set", policy="fill",
        std_out="train-%j.out", std_err="train-%j.err", work_dir=str(d), job_name="stderr", uid=uid, gid=gid,
        user=name))
    (d / "train-109.out").write_text("> building GPT model ...\n")
    (d / "train-109.err").write_text(nemo_log(40, 2.25))
    for f in ("train-109.out", "train-109.err"):
        _own(d / f, uid, gid)
    job = sacct_job(109, "COMPLETED", f"perfcast:v1 iter_s=2 iters=200 rec={rid}", user=name, elapsed=900,
                    work_dir=str(d))
    fake = FakeSlurm(sacct_json=sacct_doc(job))
    res = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600),
                  AccountingClient(runner=fake))
    assert res.source == "sacct" and not any(c[0] == "scontrol" for c in fake.calls)
    (o,) = res.outcomes
    assert o.slurm_job_id == 109 and o.source == "sacct"
    assert o.measured_iteration_seconds == 2.25 and o.log_samples > 0, o.note
    (r,) = load_runs(tmp_path / "runs" / "gpu.toml")
    assert f"from its StdErr {d / 'train-109.err'}" in r.source
