"""job_submit.lua + perf-predictd on a real Slurm that enforces QOS and association limits: the
limit perfcast fills is capped at the job's QOS MaxWall (the QOS it names, else its association's
default QOS) and at its association's MaxWall, and a QOS with DenyOnLimit does not make Slurm
reject the job (perfcast never rejects a job; QA found both on a dev cluster); and perf-calibrate
watch caps an extension at the job's association's MaxWall, as the fill caps a limit.

The dev cluster runs without AccountingStorageEnforce.  The module's fixture turns it on
(slurm.conf, and a slurmctld restart: ``scontrol reconfigure`` does not apply it), has perf-predictd
look the limits up again (SIGHUP, as ``perf-calibrate install`` sends it), and at the end turns it
off again through up.sh (which rewrites slurm.conf and restarts slurmctld when the accounting lines
changed) and SIGHUP.  Its QOS, account and association are its own, deleted at the end.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_plugin.slurm_client import SlurmError, parse_slurm_time

from .conftest import DEV, SCRIPTS, script_text
from .test_watch import _cancel, _limit_s, _plan, _script, _wait_action

QOS = "pcwall12"           # MaxWall 12 min
DENY = "pcwalldeny"        # MaxWall 12 min, flag DenyOnLimit: Slurm rejects a job asking more
LONG = "pcwalllong"        # MaxWall 10 h, flag PartitionTimeLimit: its jobs may pass the partition's MaxTime
ACCOUNT = "pcwallacct"     # default QOS pcwall12; root's association in it: MaxWall 20 min
ENFORCE = "AccountingStorageEnforce=associations,limits,qos"
CLEAN_ENV = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]


def _forget(cluster) -> None:
    cluster.sacctmgr("delete", "user", "root", f"account={ACCOUNT}", check=False)
    cluster.sacctmgr("delete", "account", ACCOUNT, check=False)
    cluster.sacctmgr("delete", "qos", QOS, DENY, LONG, check=False)


def _pid(path: Path, *comms: str) -> int:
    pid = int(path.read_text().strip())
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    assert comm in comms, f"{path}: pid {pid} is {comm!r}"
    return pid


def _restart_slurmctld(cluster) -> None:
    pid = _pid(cluster.base / "run" / "slurmctld.pid", "slurmctld")
    os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + 60          # it saves its state and hands slurmdbd its records first
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < end, "slurmctld did not stop"
        time.sleep(0.1)
    subprocess.run([*CLEAN_ENV, f"SLURM_CONF={cluster.conf}", "slurmctld", "-f", cluster.conf],
                   check=True, timeout=60)
    _wait_up(cluster)


def _wait_up(cluster) -> None:
    end = time.monotonic() + 60
    while True:
        ping = subprocess.run(["scontrol", "ping"], env=cluster.env(), capture_output=True, text=True,
                              timeout=30)
        if "is UP" in ping.stdout:
            return
        assert time.monotonic() < end, f"slurmctld not answering: {ping.stdout}{ping.stderr}"
        time.sleep(0.2)


def _reload_daemon(cluster) -> int:
    """SIGHUP perf-predictd (a reload looks the limits up again); the log's size before it."""
    log = cluster.base / "log" / "predictd.log"
    size = log.stat().st_size
    os.kill(_pid(cluster.base / "run" / "predictd.pid", "python3", "python", "perf-predictd",
                 Path(sys.executable).name, Path(os.path.realpath(sys.executable)).name), signal.SIGHUP)
    return size


def _logged_after(cluster, offset: int, pattern: str, timeout: float = 90.0) -> str:
    log = cluster.base / "log" / "predictd.log"
    end = time.monotonic() + timeout
    while True:
        with open(log, errors="replace") as fh:
            fh.seek(offset)
            m = re.search(pattern, fh.read())
        if m:
            return m.group(0)
        assert time.monotonic() < end, f"perf-predictd did not log {pattern!r} (see {log})"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def enforced(cluster):
    if not cluster.accounting:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but the dev cluster runs without accounting")
        pytest.skip("the dev cluster runs without accounting (PERFCAST_DEV_NO_ACCOUNTING=1)")
    if os.environ.get("PERFCAST_TEST_FAKE_PREDICTOR") == "1":
        pytest.skip("the fake predictor's daemon does not look QOS limits up")
    _forget(cluster)                                        # a killed run's leftovers
    conf = Path(cluster.conf)
    try:
        cluster.sacctmgr("add", "qos", QOS, "MaxWall=00:12:00")
        cluster.sacctmgr("add", "qos", DENY, "MaxWall=00:12:00", "Flags=DenyOnLimit")
        cluster.sacctmgr("add", "qos", LONG, "MaxWall=10:00:00", "Flags=PartitionTimeLimit")
        cluster.sacctmgr("add", "account", ACCOUNT, "cluster=perfcastdev", f"qos=normal,{QOS},{DENY},{LONG}",
                  f"defaultqos={QOS}")
        cluster.sacctmgr("add", "user", "root", f"account={ACCOUNT}", "maxwall=20")
        conf.write_text(conf.read_text().rstrip("\n") + f"\n{ENFORCE}\n")
        _restart_slurmctld(cluster)
        offset = _reload_daemon(cluster)
        _logged_after(cluster, offset, r"event=slurm_limits enforced=true [^\n]*qos_max_wall=[1-9]")
        yield cluster
    finally:
        _forget(cluster)
        # up.sh writes slurm.conf afresh (no AccountingStorageEnforce) and restarts slurmctld for it.
        up = subprocess.run([str(DEV / "up.sh")], env=cluster.dev_env, capture_output=True, text=True,
                            timeout=180)
        assert up.returncode == 0, up.stderr[-3000:]
        assert ENFORCE not in conf.read_text()
        _wait_up(cluster)
        offset = _reload_daemon(cluster)
        _logged_after(cluster, offset, r"event=slurm_limits enforced=false")


@pytest.fixture
def job(enforced):
    """A Megatron job that needs more than 12 and 20 minutes and less than partition short's hour."""
    script = enforced.write_script("qos-wall.sh", script_text("megatron_gpt.sh", ITERS="400"))
    rec = enforced.ask(script.read_text(), argv=[str(script)])
    assert rec["status"] == "ok" and 20 < rec["time_limit"] <= 60, rec
    return script


def _submit(cluster, held_jobs, script, *args):
    job_id, messages, _ = cluster.sbatch(script, "-p", "short", *args)
    held_jobs.append(job_id)
    info = cluster.show(job_id)
    (line,) = [m for m in messages if m.startswith("sbatch: perfcast:")]
    return info, line


def test_the_qos_maxwall_caps_the_filled_limit(enforced, held_jobs, job):
    info, line = _submit(enforced, held_jobs, job, f"--account={ACCOUNT}", f"--qos={QOS}")
    assert info["QOS"] == QOS and parse_slurm_time(info["TimeLimit"]) == 12
    assert f"time limit set to 00:12:00 (QOS {QOS}'s MaxWall)" in line, line
    assert re.search(rf"but QOS {QOS} allows 00:12:00: only about \d+ of 400 iterations fit", line), line
    assert "warn=capped cap=qos" in info["AdminComment"]
    # (what Slurm itself fills in without a limit: the same 12 minutes)
    assert info.get("TimeMin") in (None, "N/A")


def test_a_deny_on_limit_qos_no_longer_rejects_the_job(enforced, held_jobs, job):
    try:
        info, line = _submit(enforced, held_jobs, job, f"--account={ACCOUNT}", f"--qos={DENY}")
    except SlurmError as exc:    # what QA saw: "Job violates accounting/QOS policy"
        raise AssertionError(f"the job was rejected: {exc}") from None
    assert parse_slurm_time(info["TimeLimit"]) == 12 and f"(QOS {DENY}'s MaxWall)" in line


def test_the_default_qos_when_the_job_names_none(enforced, held_jobs, job):
    info, line = _submit(enforced, held_jobs, job, f"--account={ACCOUNT}")
    assert info["QOS"] == QOS and parse_slurm_time(info["TimeLimit"]) == 12, info
    assert f"(QOS {QOS}'s MaxWall)" in line


def test_a_partition_time_limit_qos_lets_the_limit_pass_maxtime(enforced, held_jobs):
    """A job needing more than partition short's hour: under a QOS with flag PartitionTimeLimit
    Slurm lets its limit pass MaxTime, so perfcast fills what it needs (capped by nothing here: the
    QOS allows 10 h, the association's 20 min apply only where no QOS has a MaxWall); under QOS
    normal the hour caps it as before."""
    script = enforced.write_script("qos-long.sh", script_text("megatron_gpt.sh", ITERS="1500"))
    info, line = _submit(enforced, held_jobs, script, f"--account={ACCOUNT}", f"--qos={LONG}")
    assert info["QOS"] == LONG and 60 < parse_slurm_time(info["TimeLimit"]) < 600, (info["TimeLimit"], line)
    assert "MaxTime" not in line and "MaxWall" not in line and "warn=capped" not in info["AdminComment"], line
    info, line = _submit(enforced, held_jobs, script, "--qos=normal")
    assert parse_slurm_time(info["TimeLimit"]) == 60 and "(the partition's MaxTime)" in line, line


def test_the_associations_maxwall_when_the_qos_has_none(enforced, held_jobs, job):
    info, line = _submit(enforced, held_jobs, job, f"--account={ACCOUNT}", "--qos=normal")
    assert parse_slurm_time(info["TimeLimit"]) == 20, info
    assert f"(the MaxWall of user root's association in account {ACCOUNT})" in line, line
    assert "cap=assoc" in info["AdminComment"]


def test_no_limit_no_change(enforced, held_jobs, job):
    """root's own account and QOS normal have no MaxWall: the limit is what perfcast recommends."""
    rec = enforced.ask(job.read_text(), argv=[str(job)], partition="short")["time_limit"]
    info, line = _submit(enforced, held_jobs, job)
    assert info["Account"] == "root" and info["QOS"] == "normal"
    assert parse_slurm_time(info["TimeLimit"]) == rec and "MaxWall" not in line


WATCH_ACCOUNT = "pcwatchcap"     # root's association in it, on partition watch: MaxWall 4 min
WATCH_ASSOC_MAX_WALL_MIN = 4


def _gone(cluster, job_id: int, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = cluster.client.job(job_id).state.split()[0]
        if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            return
        time.sleep(0.5)


def test_the_watch_caps_an_extension_at_the_associations_maxwall(enforced):
    """A job 2x slower than predicted, with 15 minutes of work under a 2-minute limit, in an account
    whose association on partition watch has a MaxWall of 4 minutes (the partition allows an hour):
    the watch (every 15 s, up.sh) extends it only to the last checkpoint that fits in those 4
    minutes, and says that the association's MaxWall is the cap (the same lookup as the fill)."""
    cluster = enforced
    wdir = cluster.jobs_dir / "watch-assoc"
    wdir.mkdir(exist_ok=True)
    wdir.chmod(0o1777)
    shutil.copy(SCRIPTS / "standin_megatron.py", wdir / "pretrain_gpt.py")
    (wdir / "pretrain_gpt.py").chmod(0o644)
    cluster.sacctmgr("delete", "user", "root", f"account={WATCH_ACCOUNT}", check=False)   # a killed run's
    cluster.sacctmgr("delete", "account", WATCH_ACCOUNT, check=False)
    cluster.sacctmgr("add", "account", WATCH_ACCOUNT, "cluster=perfcastdev")
    cluster.sacctmgr("add", "user", "root", f"account={WATCH_ACCOUNT}", "partition=watch",
                     f"maxwall={WATCH_ASSOC_MAX_WALL_MIN}")
    jid = None
    try:
        shown = cluster.sacctmgr("-nP", "show", "assoc", "where", "user=root", f"account={WATCH_ACCOUNT}",
                                 "partition=watch", "format=MaxWall").strip()
        assert shown == f"00:0{WATCH_ASSOC_MAX_WALL_MIN}:00", shown
        probe = _script(cluster, wdir, "a-probe", 1.0, 1000, 10, 100, 0, 0)
        answer = cluster.ask(probe.read_text(), work_dir=str(wdir))
        assert answer["status"] == "ok", answer
        s, n, every = _plan(answer["prediction"]["iteration_seconds"], 2.0, 900)
        save = every * 10                                   # a checkpoint every ~40 s
        script = _script(cluster, wdir, "w-assoc", s, n, every, save, 6, 150)
        jid = cluster.client.submit(script, ["--time=2", "--partition=watch", f"--account={WATCH_ACCOUNT}"],
                                    cwd=str(wdir)).job_id
        assert cluster.show(jid)["Account"] == WATCH_ACCOUNT
        ext = _wait_action(cluster, jid, lambda a: a.action != "none" or a.code in ("no-fit", "doubt"))
        assert ext.action == "extend" and ext.code == "checkpoint", ext
        # Within the association's 4 minutes, though partition watch allows an hour.
        assert ext.from_seconds == 120.0 and 120.0 < ext.to_seconds <= WATCH_ASSOC_MAX_WALL_MIN * 60.0
        assert "more than the association's MaxWall allows (00:04:00)" in ext.reason, ext.reason
        m = re.search(r"last checkpoint that fits \(iteration (\d+)\)", ext.reason)
        assert m and int(m.group(1)) % save == 0 and ext.iteration < int(m.group(1)) < n
        assert _limit_s(cluster, jid) == ext.to_seconds
        assert "the association's MaxWall" in cluster.show(jid)["AdminComment"]
    finally:
        if jid is not None:
            _cancel(cluster, jid)
            _gone(cluster, jid)
        cluster.sacctmgr("delete", "user", "root", f"account={WATCH_ACCOUNT}", check=False)
        cluster.sacctmgr("delete", "account", WATCH_ACCOUNT, check=False)
