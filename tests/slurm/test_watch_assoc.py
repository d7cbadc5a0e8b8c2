"""perf-calibrate watch on a real Slurm caps an extension by the job's association's MaxWall.

The dev cluster runs slurmdbd; the test adds an account with a user association of root on
partition `watch` whose MaxWall (4 min) is far below the partition's MaxTime (1 h), submits a job 2x
slower than predicted with 15 minutes of work under a 2-minute limit, and expects the watch
(every 15 s, up.sh) to extend it only to the last checkpoint that fits in those 4 minutes, saying
that the association's MaxWall is the cap.  Slurm 22.05's `sacctmgr show assoc` lists user rows
with the limits they inherit from their accounts; it is what the watch reads.
"""
from __future__ import annotations

import re
import shutil
import time

from .conftest import SCRIPTS
from .test_watch import _cancel, _limit_s, _plan, _script, _wait_action

ACCOUNT = "pcwatchcap"
ASSOC_MAX_WALL_MIN = 4


def _gone(cluster, job_id: int, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = cluster.client.job(job_id).state.split()[0]
        if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            return
        time.sleep(0.5)


def test_extension_is_capped_by_the_associations_maxwall(accounting):
    cluster = accounting
    wdir = cluster.jobs_dir / "watch-assoc"
    wdir.mkdir(exist_ok=True)
    wdir.chmod(0o1777)
    shutil.copy(SCRIPTS / "standin_megatron.py", wdir / "pretrain_gpt.py")
    (wdir / "pretrain_gpt.py").chmod(0o644)
    cluster.sacctmgr("delete", "user", "root", f"account={ACCOUNT}", check=False)   # a killed run's leftovers
    cluster.sacctmgr("delete", "account", ACCOUNT, check=False)
    cluster.sacctmgr("add", "account", ACCOUNT, "cluster=perfcastdev")
    cluster.sacctmgr("add", "user", "root", f"account={ACCOUNT}", "partition=watch",
              f"maxwall={ASSOC_MAX_WALL_MIN}")
    jid = None
    try:
        shown = cluster.sacctmgr("-nP", "show", "assoc", "where", "user=root", f"account={ACCOUNT}",
                          "partition=watch", "format=MaxWall").strip()
        assert shown == f"00:0{ASSOC_MAX_WALL_MIN}:00", shown
        probe = _script(cluster, wdir, "a-probe", 1.0, 1000, 10, 100, 0, 0)
        answer = cluster.ask(probe.read_text(), work_dir=str(wdir))
        assert answer["status"] == "ok", answer
        s, n, every = _plan(answer["prediction"]["iteration_seconds"], 2.0, 900)
        save = every * 10                                   # a checkpoint every ~40 s
        script = _script(cluster, wdir, "w-assoc", s, n, every, save, 6, 150)
        jid = cluster.client.submit(script, ["--time=2", "--partition=watch", f"--account={ACCOUNT}"],
                                    cwd=str(wdir)).job_id
        assert cluster.show(jid)["Account"] == ACCOUNT
        ext = _wait_action(cluster, jid, lambda a: a.action != "none" or a.code in ("no-fit", "doubt"))
        assert ext.action == "extend" and ext.code == "checkpoint", ext
        # Within the association's 4 minutes, though partition watch allows an hour.
        assert ext.from_seconds == 120.0 and 120.0 < ext.to_seconds <= ASSOC_MAX_WALL_MIN * 60.0
        assert "more than the association's MaxWall allows (00:04:00)" in ext.reason, ext.reason
        m = re.search(r"last checkpoint that fits \(iteration (\d+)\)", ext.reason)
        assert m and int(m.group(1)) % save == 0 and ext.iteration < int(m.group(1)) < n
        assert _limit_s(cluster, jid) == ext.to_seconds
        assert "the association's MaxWall" in cluster.show(jid)["AdminComment"]
    finally:
        if jid is not None:
            _cancel(cluster, jid)
            _gone(cluster, jid)
        cluster.sacctmgr("delete", "user", "root", f"account={ACCOUNT}", check=False)
        cluster.sacctmgr("delete", "account", ACCOUNT, check=False)
