"""perf-calibrate watch on a real Slurm: the dev cluster runs it every 15 s (up.sh) on partitions
`watch` and `watchshort` with a policy that extends users' limits too.  Four real jobs, each a
Megatron stand-in whose log claims (and really takes) a chosen time per iteration relative to what
perf-predictd predicted for it:

- 2x slower than predicted under a 2-minute user limit: extended before it expires, COMPLETED,
  after running well past the two minutes it had;
- 3x faster under the limit perfcast set: the limit is lowered, and it still COMPLETES;
- 2x slower in partition `watchshort` (MaxTime 5 min) with far more work than 5 minutes: extended only
  to just after the last checkpoint that fits;
- a log its own user made unreadable: no action, limit unchanged.

Each stand-in pauses after a few log lines until its limit changes (at most a bound), so that the
outcome does not depend on how fast this machine runs a watch pass: a job waits for the watch
instead of racing it.  Then harvest + report show each job's watch actions.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from calibrate.cli import main as calibrate_main
from calibrate.harvest import duration_seconds
from calibrate.watch_log import read_actions
from slurm_plugin.records import parse_admin_comment
from slurm_plugin.slurm_client import SlurmError, parse_slurm_time

from .conftest import SCRIPTS, script_text

# Slurm enforces a limit on its periodic timer (tens of seconds on 22.05) with OverTimeLimit 0: a
# job that ran this much past its first limit was saved by the extension, not by that slack.
CONTROLLER_SLACK_S = 30.0
LINE_EVERY_S = 4.0          # about one log line every 4 s


def _script(cluster, wdir: Path, name: str, iteration_seconds: float, iters: int, every: int, save: int,
            gate: int, gate_max: int, pre: str = "") -> Path:
    text = script_text("watch_job.sh", NAME=name, OUT=str(wdir / f"{name}-%j.out"), ITER_S=f"{iteration_seconds:.6g}",
                       EVERY=str(every), GATE=str(gate), GATE_MAX=str(gate_max), PRE=pre,
                       STANDIN="pretrain_gpt.py", ITERS=str(iters), SAVE=str(save))
    path = wdir / f"{name}.sh"
    path.write_text(text)
    path.chmod(0o644)
    return path


def _plan(predicted_s: float, factor: float, run_s: float) -> tuple[float, int, int]:
    """(claimed s/iter, iterations, log interval) for a job running ``factor`` x the prediction for
    about ``run_s`` seconds with a line every ~4 s."""
    s = predicted_s * factor
    every = max(1, round(LINE_EVERY_S / s))
    iters = every * max(10, round(run_s / (every * s)))
    return s, iters, every


@pytest.fixture(scope="module")
def watched(cluster):
    """Submit the four jobs at once (they share dev001's 8 GPUs, one each) and yield their ids."""
    wdir = cluster.jobs_dir / "watch"
    wdir.mkdir(exist_ok=True)
    wdir.chmod(0o1777)
    shutil.copy(SCRIPTS / "standin_megatron.py", wdir / "pretrain_gpt.py")
    (wdir / "pretrain_gpt.py").chmod(0o644)
    probe = _script(cluster, wdir, "probe", 1.0, 1000, 10, 100, 0, 0)
    answer = cluster.ask(probe.read_text(), work_dir=str(wdir))
    assert answer["status"] == "ok", answer
    p = answer["prediction"]["iteration_seconds"]
    assert p > 0

    jobs: dict[str, int] = {}
    # Limits of 2 minutes: a loaded machine has two minutes to run a 15-s watch pass in time.
    s, n, every = _plan(p, 2.0, 210)
    jobs["extend"] = cluster.client.submit(_script(cluster, wdir, "w-extend", s, n, every, every * 10, 6, 150),
                                           ["--time=2", "--partition=watch"], cwd=str(wdir)).job_id
    s, n, every = _plan(p, 1 / 3, 60)
    jobs["shrink"] = cluster.client.submit(_script(cluster, wdir, "w-shrink", s, n, every, every * 10, 5, 240),
                                           ["--partition=watch"], cwd=str(wdir)).job_id
    s, n, every = _plan(p, 2.0, 900)
    save, iters_maxtime = every * 10, n                 # a checkpoint every ~40 s
    jobs["maxtime"] = cluster.client.submit(_script(cluster, wdir, "w-maxtime", s, n, every, save, 6, 150),
                                            ["--time=2", "--partition=watchshort"], cwd=str(wdir)).job_id
    s, n, every = _plan(p, 2.0, 170)
    jobs["unreadable"] = cluster.client.submit(
        _script(cluster, wdir, "w-unreadable", s, n, every, every * 10, 0, 0,
                pre='chmod 000 "$(readlink -f /proc/$$/fd/1)"   # the log, unreadable even to its user'),
        ["--time=3", "--partition=watch"], cwd=str(wdir), user="nobody").job_id
    info = {"predicted_s": p, "save_maxtime": save, "iters_maxtime": iters_maxtime, "wdir": wdir}
    try:
        yield jobs, info
    finally:
        _cancel(cluster, *jobs.values())


def _cancel(cluster, *job_ids: int) -> None:
    for jid in job_ids:
        try:
            cluster.client.cancel([jid])
        except SlurmError:          # already ended
            pass


def _actions(cluster, job_id: int):
    return read_actions(cluster.base / "var" / "records.sqlite", [job_id])


def _wait_action(cluster, job_id: int, want, timeout: float = 240.0):
    """The first watch action of the job that ``want`` accepts (polling the store)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        hits = [a for a in _actions(cluster, job_id) if want(a)]
        if hits:
            return hits[0]
        time.sleep(1.0)
    raise AssertionError(f"job {job_id}: no such watch action within {timeout:.0f} s; actions: "
                         f"{_actions(cluster, job_id)}; see {cluster.base}/log/watch.log")


def _limit_s(cluster, job_id: int) -> float:
    return 60.0 * parse_slurm_time(cluster.show(job_id)["TimeLimit"])


def test_slow_job_is_extended_and_completes(cluster, watched):
    jobs, _ = watched
    jid = jobs["extend"]
    ext = _wait_action(cluster, jid, lambda a: a.action == "extend")
    assert ext.from_seconds == 120.0 and ext.to_seconds > 120.0
    assert ext.measured_iteration_seconds == pytest.approx(2 * ext.predicted_iteration_seconds, rel=0.01)
    # The running job's rate is already a harvestable run of its partition (up.sh: --out var/runs).
    runs = (cluster.base / "var" / "runs" / "watch.toml").read_text()
    assert f'name = "slurm job {jid}"' in runs and "perf-calibrate watch" in runs
    info = cluster.client.wait(jid, timeout=600, poll=1.0)
    assert info.state == "COMPLETED", (info, _actions(cluster, jid))
    raw = cluster.show(jid)
    run_s = duration_seconds(raw["RunTime"])
    # It ran well past the two minutes it started with: only the extension let it finish.
    assert run_s > 120.0 + CONTROLLER_SLACK_S, raw["RunTime"]
    assert 60.0 * parse_slurm_time(raw["TimeLimit"]) >= run_s
    comment = raw["AdminComment"]
    assert "perfcast-watch: extend 00:02:00->" in comment
    assert parse_admin_comment(comment)["rec"] == ext.record_id        # the record is kept


def test_fast_job_gets_its_limit_lowered(cluster, watched):
    jobs, _ = watched
    jid = jobs["shrink"]
    shrink = _wait_action(cluster, jid, lambda a: a.action == "shrink")
    assert shrink.limit_set_by_perfcast
    assert shrink.to_seconds < shrink.from_seconds
    assert shrink.measured_iteration_seconds == pytest.approx(shrink.predicted_iteration_seconds / 3, rel=0.01)
    info = cluster.client.wait(jid, timeout=600, poll=1.0)
    assert info.state == "COMPLETED", (info, _actions(cluster, jid))
    assert _limit_s(cluster, jid) < shrink.from_seconds


def test_job_beyond_maxtime_is_extended_to_its_last_fitting_checkpoint(cluster, watched):
    jobs, info = watched
    jid = jobs["maxtime"]
    ext = _wait_action(cluster, jid, lambda a: a.action != "none" or a.code == "no-fit")
    assert ext.action == "extend" and ext.code == "checkpoint", ext
    assert ext.from_seconds == 120.0 and 120.0 < ext.to_seconds <= 5 * 60.0      # MaxTime 5 min
    m = re.search(r"last checkpoint that fits \(iteration (\d+)\)", ext.reason)
    assert m and "MaxTime" in ext.reason, ext.reason
    ckpt = int(m.group(1))
    assert ckpt % info["save_maxtime"] == 0 and ext.iteration < ckpt < info["iters_maxtime"]
    assert _limit_s(cluster, jid) == ext.to_seconds
    assert "perfcast-watch: extend 00:02:00->" in cluster.show(jid)["AdminComment"]
    _cancel(cluster, jid)


def test_unreadable_log_leads_to_no_action(cluster, watched):
    jobs, _ = watched
    jid = jobs["unreadable"]
    none = _wait_action(cluster, jid, lambda a: True)
    assert none.action == "none" and none.code == "unreadable", none
    assert "permission denied" in none.reason
    assert none.from_seconds == none.to_seconds == 180.0
    time.sleep(16)                                      # another pass: still nothing done
    assert all(a.action == "none" for a in _actions(cluster, jid))
    assert _limit_s(cluster, jid) == 180.0
    _cancel(cluster, jid)


def test_report_shows_each_jobs_watch_actions(cluster, watched, tmp_path, capsys, monkeypatch):
    jobs, _ = watched
    for jid in jobs.values():
        cluster.client.wait(jid, timeout=600, poll=1.0)
    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    config = str(cluster.base / "etc" / "perfcast.toml")
    assert calibrate_main(["harvest", "--config", config, "--source", "scontrol", "--since", "1d",
                           "--out", str(tmp_path / "runs"), "--rescan", "--json"]) == 0
    capsys.readouterr()
    assert calibrate_main(["report", "--config", config, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {int(j["job_id"]): j for j in report["jobs"]}
    kinds = {}
    for name, jid in jobs.items():
        acts = rows[jid]["watch_actions"]
        assert acts and all(set(a) >= {"action", "from_seconds", "to_seconds", "at"} for a in acts), acts
        assert all(a["action"] in ("extend", "shrink", "none") for a in acts)
        kinds[name] = {a["action"] for a in acts}
    assert "extend" in kinds["extend"] and "shrink" in kinds["shrink"] and "extend" in kinds["maxtime"]
    assert kinds["unreadable"] == {"none"}
    assert rows[jobs["extend"]]["state"] == "COMPLETED" and rows[jobs["extend"]]["kill_avoided"] is True
    assert rows[jobs["unreadable"]]["measured_iteration_seconds"] is None
    assert "permission denied" in rows[jobs["unreadable"]]["no_measurement_reason"]
    watch = report["partitions"]["watch"]["watch"]
    assert watch["kills_avoided"] >= 1 and watch["shrinks"] >= 1 and watch["extensions_per_user"].get("root")
    assert calibrate_main(["report", "--config", config]) == 0
    table = capsys.readouterr().out
    assert "watch actions (perf-calibrate watch):" in table and f"job {jobs['unreadable']}: log unreadable" in table


def test_extension_does_not_push_back_a_pending_job_planned_on_the_nodes(cluster, watched):
    """Runs after the four jobs ended: a 2x slow job on dev001, then a job that needs all of
    dev001's GPUs; once the backfill plan puts that one at the slow job's end, the slow job
    starts logging, and the watch must not extend past that planned start (allowance 0)."""
    jobs, info = watched
    for jid in jobs.values():
        cluster.client.wait(jid, timeout=600, poll=1.0)
    wdir = info["wdir"]
    flag = wdir / "fair.start"
    flag.unlink(missing_ok=True)
    s, n, every = _plan(info["predicted_s"], 2.0, 600)
    script = _script(cluster, wdir, "w-fair", s, n, every, every * 10, 0, 180)
    text = script.read_text().replace("export STANDIN_ITER_S", f"export STANDIN_START_FILE={flag} STANDIN_ITER_S")
    script.write_text(text)
    slow = cluster.client.submit(script, ["--time=6", "--partition=watch"], cwd=str(wdir)).job_id
    blocker = None
    try:
        _wait_running(cluster, slow)
        blocker = cluster.client.submit(script, ["--time=2", "--partition=watch", "--gres=gpu:8",
                                                 "--job-name=w-blocker"], cwd=str(wdir)).job_id
        _wait_planned(cluster, blocker)
        flag.write_text("go\n")
        none = _wait_action(cluster, slow, lambda a: a.action != "none" or a.code == "no-fit")
        assert none.action == "none" and f"pending job {blocker}'s planned start" in none.reason, none
        assert _limit_s(cluster, slow) == 360.0
    finally:
        _cancel(cluster, *(j for j in (slow, blocker) if j))


def _wait_running(cluster, job_id: int, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while cluster.client.job(job_id).state.split()[0] != "RUNNING":
        if time.monotonic() > end:
            raise AssertionError(f"job {job_id} did not start within {timeout:.0f} s")
        time.sleep(0.5)


def _wait_planned(cluster, job_id: int, timeout: float = 150.0) -> float:
    """The start the scheduler planned for a pending job (squeue --start), once it has one."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for p in cluster.client.planned_starts():
            if p.job_id == job_id and "dev001" in p.nodes:
                return p.start
        time.sleep(1.0)
    raise AssertionError(f"no planned start for job {job_id} within {timeout:.0f} s (backfill's bf_interval "
                         f"is 30 s); squeue --start: {cluster.client.planned_starts()}")
