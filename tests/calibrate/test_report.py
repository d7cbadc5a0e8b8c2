"""perf-calibrate report: per-job rows and per-partition error, coverage, timeouts, over-reservation."""
from __future__ import annotations

import json

import pytest

from calibrate.cli import main
from calibrate.report import Spread, build_report
from slurm_plugin.records import JobOutcome, PredictionRecord, RecordStore

JOB = {"model": {"layers": 8, "hidden": 4096, "heads": 32, "seq_len": 2048},
       "layout": {"pp": 2, "tp": 4, "dp": 2, "micro_batch": 2, "micro_batches": 8}, "run": {"precision": "fp16"}}


def pair(job_id, *, partition="gpu", pred=1.0, meas=None, interval=(0.9, 1.2), state="COMPLETED",
         elapsed=1000.0, limit_min=30, action="set", total=900.0):
    rec = PredictionRecord(partition=partition, platform="dgx-a100", bundle="b", job=JOB, iteration_seconds=pred,
                           iterations=800, total_seconds=total, interval_seconds=interval,
                           time_limit_minutes=limit_min if action == "set" else None, time_min_minutes=20,
                           action=action, policy="fill", user="alice", record_id=f"{job_id:012x}")
    out = JobOutcome(record_id=rec.record_id, slurm_job_id=job_id, state=state, elapsed_seconds=elapsed,
                     time_limit_seconds=60.0 * limit_min, measured_iteration_seconds=meas,
                     log_format="megatron" if meas else "")
    return rec, out


def test_partition_figures():
    pairs = [pair(1, pred=1.0, meas=1.25, elapsed=1000.0, limit_min=30),       # under-predicted, outside
             pair(2, pred=1.1, meas=1.0, elapsed=1200.0, limit_min=40),        # over, inside
             pair(3, pred=1.0, meas=None, state="TIMEOUT", elapsed=1800.0),    # killed at perfcast's limit
             pair(4, pred=2.0, meas=2.0, interval=(0.0, 0.0), elapsed=600.0, limit_min=120, action="keep"),
             pair(5, partition="cpu", pred=3.0, meas=2.0, elapsed=100.0, limit_min=10)]
    rep = build_report(pairs)
    gpu = rep.partitions["gpu"]
    assert gpu.jobs == 4 and gpu.measured == 3
    errors = [1.0 / 1.25 - 1, 1.1 / 1.0 - 1, 0.0]
    assert gpu.mape == pytest.approx(sum(abs(e) for e in errors) / 3)
    assert gpu.signed_error == pytest.approx(sum(errors) / 3)
    assert gpu.coverage == pytest.approx(1 / 2)          # job 4 gave no interval: not counted
    assert gpu.limits_set == 3 and gpu.timeouts_at_perfcast_limit == 1 and gpu.timeout_jobs == [3]
    # limit / elapsed of completed jobs with perfcast's limits: 1800/1000, 2400/1200
    assert (gpu.over_reservation.n, gpu.over_reservation.median) == (2, pytest.approx(1.9))
    assert gpu.over_reservation.p90 == pytest.approx(1.8 + 0.9 * 0.2)
    assert (gpu.over_reservation_user_limits.n, gpu.over_reservation_user_limits.median) == (1, 12.0)
    assert rep.partitions["cpu"].mape == pytest.approx(0.5)
    only = build_report(pairs, partition="cpu")
    assert list(only.partitions) == ["cpu"] and [j.job_id for j in only.jobs] == [5]


def test_json_shape():
    rep = build_report([pair(7, meas=1.1)]).to_dict()
    assert set(rep) == {"jobs", "partitions"}
    job = rep["jobs"][0]
    for key in ("job_id", "state", "elapsed_seconds", "time_limit_seconds", "predicted_iteration_seconds",
                "measured_iteration_seconds", "predicted_total_seconds"):
        assert key in job
    assert job["job_id"] == 7 and job["time_limit_seconds"] == 1800.0 and job["inside_interval"] is True
    p = rep["partitions"]["gpu"]
    assert set(p["over_reservation"]) == {"n", "median", "p90"}
    json.dumps(rep)


def test_spread_percentile():
    s = Spread.of([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    assert s.n == 10 and s.median == 5.5 and s.p90 == pytest.approx(9.1)
    assert Spread.of([]) == Spread(0, None, None)
    assert Spread.of([float("nan"), 2.0]).n == 1


def test_table_and_empty():
    assert "run perf-calibrate harvest first" in build_report([]).table()
    text = build_report([pair(1, meas=1.25), pair(3, state="TIMEOUT", elapsed=1800.0)]).table()
    assert "partition gpu: 2 jobs, 1 with a measured iteration time" in text
    assert "ended TIMEOUT at one: 1 (jobs 3)" in text and "-20.0%" in text
    one = build_report([pair(1, meas=1.25)]).table()
    assert "partition gpu: 1 job, 1 with a measured iteration time" in one


def test_cli_report_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    store = RecordStore(tmp_path / "r.sqlite")
    for rec, out in [pair(1, meas=1.25), pair(2, meas=1.0, pred=1.1), pair(3, partition="cpu", meas=2.0)]:
        store.add(rec)
        store.put_outcome(out)
    png = tmp_path / "report.png"
    assert main(["report", "gpu", "--records", str(store.path), "--json", "--plot", str(png)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [j["job_id"] for j in rep["jobs"]] == [1, 2] and list(rep["partitions"]) == ["gpu"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["report", "--records", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "partition cpu" in out and "partition gpu" in out and "could not keep" not in out
    store.add_losses({"unwritable": 3, "truncated": 1})       # as the daemon's record writer counts them
    assert main(["report", "--records", str(store.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["record_losses"] == {"truncated": 1, "unwritable": 3}
    assert main(["report", "--records", str(store.path)]) == 0
    assert "records perf-predictd could not keep: 4" in capsys.readouterr().out


def _act(job_id, action, frm, to, at, user="alice", reason="r", measured=None):
    from calibrate.watch_log import WatchAction
    return WatchAction(slurm_job_id=job_id, record_id=f"{job_id:012x}", partition="gpu", user=user,
                       action=action, from_seconds=frm, to_seconds=to, at=at, code=action, reason=reason,
                       measured_iteration_seconds=measured)


def test_watch_actions_per_job_and_partition():
    pairs = [pair(1, meas=2.0, elapsed=2500.0, limit_min=60),             # extended 30 -> 60 min, finished
             pair(2, meas=0.5, elapsed=500.0, limit_min=15),              # shrunk 30 -> 15 min
             pair(3, meas=2.5, state="TIMEOUT", elapsed=2400.0, limit_min=40),
             pair(4, meas=None, elapsed=100.0)]
    pairs[3] = (pairs[3][0], JobOutcome(**{**pairs[3][1].to_dict(), "note": "log unreadable: permission denied"}))
    running_rec = pair(9)[0]
    acts = [_act(1, "none", 1800.0, 1800.0, 10.0, reason="warming up"), _act(1, "extend", 1800.0, 3600.0, 20.0),
            _act(2, "shrink", 1800.0, 900.0, 30.0), _act(3, "extend", 1800.0, 2400.0, 40.0, user="bob",
                                                        reason="extended to just after the last checkpoint"),
            _act(9, "extend", 1800.0, 2700.0, 50.0, measured=1.3)]
    rep = build_report(pairs, watch_actions=acts, watched_records={running_rec.record_id: running_rec})
    rows = {j.job_id: j.to_dict() for j in rep.jobs}
    assert [a["action"] for a in rows[1]["watch_actions"]] == ["none", "extend"]
    assert rows[1]["watch_actions"][1] == {"action": "extend", "from_seconds": 1800.0, "to_seconds": 3600.0,
                                           "at": 20.0, "reason": "r"}
    assert rows[1]["kill_avoided"] is True and rows[2]["kill_avoided"] is False
    assert rows[9]["state"] == "RUNNING" and rows[9]["measured_iteration_seconds"] == 1.3   # not harvested yet
    assert rows[4]["no_measurement_reason"] == "log unreadable: permission denied"
    w = rep.to_dict()["partitions"]["gpu"]["watch"]
    assert (w["extensions"], w["shrinks"], w["kills_avoided"], w["kills_avoided_jobs"]) == (3, 1, 1, [1])
    assert w["hours_returned"] == pytest.approx(0.25)
    assert w["extensions_per_user"] == {"alice": 2, "bob": 1}
    assert w["still_timed_out"] == [{"job_id": 3, "reason": "extend: extended to just after the last checkpoint"}]
    table = rep.table()
    assert "job 4: log unreadable: permission denied" in table
    assert "shrink 00:30:00 -> 00:15:00" in table and "kills avoided: 1 (jobs 1)" in table
