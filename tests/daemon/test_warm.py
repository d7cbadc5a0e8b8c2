"""cli_filter.lua's warm-up: the daemon computes a submission's outcome ahead of job_submit.lua's
request, which then gets the same answer without waiting for a worker -- and only the user who
warmed it up can be served from it.

Whether job_submit's request finds the warm-up finished or still in flight depends on timing; the
assertions hold either way (one computation, the same answer).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import pytest

from slurm_plugin import daemon
from slurm_plugin.daemon import engine as engine_mod
from slurm_plugin.daemon.protocol import parse_request
from slurm_plugin.records import RecordStore, parse_admin_comment

from . import fakes
from .conftest import RunningDaemon
from .test_protocol import JOB, ROOT_ONLY, _as_user, req
from .test_workers import _started

ARGV = ["/tmp/job.sh"]


@pytest.fixture
def running(monkeypatch):
    """A daemon whose parse budget no loaded machine exhausts: whether an outcome is kept must not
    depend on how busy the machine is (the budget itself: test_a_warm_up_cut_short_by_its_budget)."""
    monkeypatch.setattr(engine_mod, "PARSE_BUDGET_S", 10.0)
    d = RunningDaemon()
    yield d
    d.stop()


@pytest.fixture
def budgeted():
    """A daemon with the real parse budget."""
    d = RunningDaemon()
    yield d
    d.stop()


def warm_body(script: str, **cli) -> dict:
    """What cli_filter.lua sends with ``prewarm = true``."""
    return {"format": "lines", "script": script, "submit_uid": -1, "warm": True,
            "cli_options": {"partition": "gpu", "chdir": "/tmp", "argv": ARGV, **cli}}


def warm(running, script: str, **cli) -> dict:
    return daemon.ask_daemon(running.user_socket, warm_body(script, **cli), 30)


def settled(running, within: float = 30.0) -> None:
    """Until no computation is in flight."""
    end = time.monotonic() + within
    while running.state(lambda: bool(running.server.engine.pending)):
        assert time.monotonic() < end, "warm-up never finished"
        time.sleep(0.01)


def submit(running, script: str, **kw) -> dict:
    """What job_submit.lua sends for the same submission."""
    return running.ask(req(script=script, argv=ARGV, **kw))


def without_record_id(answer: dict) -> dict:
    return dict(answer, admin_comment=re.sub(r" rec=\w+", "", answer["admin_comment"]))


def test_a_warmed_submission_gets_the_cold_answer_without_a_second_computation(running):
    cold = submit(running, JOB + "# FAKE tag=cold\n")
    script = JOB + "# FAKE tag=warm\n"
    n = len(fakes.seen())
    assert warm(running, script) == {"status": "ok", "reason": "warm"}
    settled(running)
    assert len(fakes.seen()) == n + 1
    hot = submit(running, script)
    assert len(fakes.seen()) == n + 1                  # served from the warm-up
    assert hot["status"] == "ok" and without_record_id(hot) == without_record_id(cold)
    # ... and recorded like any prediction, under the id in its AdminComment
    rid = parse_admin_comment(hot["admin_comment"])["rec"]
    running.wait_stored()
    rec = RecordStore(os.path.join(running.dir, "records.sqlite")).get(rid)
    assert rec is not None and rec.time_limit_minutes == hot["time_limit"]


def test_a_request_joins_a_warm_up_still_in_flight(monkeypatch):
    # A parse of 0.3 s that is within its budget: the warm-up's outcome is complete.
    monkeypatch.setattr(engine_mod, "PARSE_BUDGET_S", 10.0)
    running = RunningDaemon()
    try:
        cold = submit(running, JOB + "# FAKE tag=cold2 sleep=0.3\n")
        script = JOB + "# FAKE tag=joined sleep=0.3\n"
        n = len(fakes.seen())
        warm(running, script)
        hot = submit(running, script)
        assert len(fakes.seen()) == n + 1
        assert without_record_id(hot) == without_record_id(cold)
    finally:
        running.stop()


def test_a_warm_up_cut_short_by_its_budget_is_computed_again(budgeted):
    script = JOB + "# FAKE tag=slow sleep=0.2\n"     # over the parse budget: not complete
    n = len(fakes.seen())
    warm(budgeted, script)
    submit(budgeted, script)
    assert len(fakes.seen()) == n + 2


def test_the_policy_is_applied_to_the_request_not_the_warm_up(running):
    script = JOB + "# FAKE tag=policy\n"
    warm(running, script)
    settled(running)
    n = len(fakes.seen())
    free = submit(running, script)
    capped = submit(running, script, max_time=30)       # the partition's MaxTime, from Lua
    assert len(fakes.seen()) == n
    assert free["time_limit"] > 30 and capped["time_limit"] == 30
    # the user's own --time reaches the parser, so it is part of what was warmed up
    warm(running, script, time="999")
    settled(running)
    users = submit(running, script, time_limit=999)
    assert len(fakes.seen()) == n + 1
    assert users["status"] == "ok" and users["reason"] == "keep" and users["time_limit"] is None


def test_a_warm_up_that_read_files_serves_one_request_only(running, tmp_path):
    config = tmp_path / "neox.yml"
    config.write_text("num_layers: 2\n")
    os.chmod(tmp_path, 0o755)
    config.chmod(0o644)
    script = JOB + f"# FAKE config={config}\n"
    cold = submit(running, script)
    warm(running, script)
    settled(running)
    n = len(fakes.seen())
    warm(running, script)                              # warmed up already: kept, not redone
    settled(running)
    assert len(fakes.seen()) == n
    first = submit(running, script)
    assert len(fakes.seen()) == n                      # the warm-up's outcome
    second = submit(running, script)
    assert len(fakes.seen()) == n + 1                  # files may have changed since: read again
    assert without_record_id(first) == without_record_id(second) == without_record_id(cold)


def test_a_warm_up_of_another_job_shape_is_not_used(running):
    script = JOB + "# FAKE tag=shape\n"
    warm(running, script, nodes="2")
    settled(running)
    n = len(fakes.seen())
    submit(running, script, min_nodes=4)
    assert len(fakes.seen()) == n + 1


@ROOT_ONLY
def test_another_user_can_neither_use_nor_poison_a_warm_up(running):
    script = JOB + "# FAKE tag=nobody\n"
    # nobody warms it up, claiming to be root: the kernel's word (65534) is what counts
    body = dict(warm_body(script), submit_uid=0, submit_gid=0)
    out = _as_user(lambda: json.dumps(daemon.ask_daemon(running.user_socket, body, 30)).encode())
    assert json.loads(out) == {"status": "ok", "reason": "warm"}
    settled(running)
    n = len(fakes.seen())
    assert fakes.seen()[-1]["request"]["nodes"] is None     # what nobody asked for was computed
    submit(running, script)                                 # root's job: not from nobody's entry
    assert len(fakes.seen()) == n + 1
    submit(running, script, submit_uid=65534, submit_gid=65534)   # nobody's own job: it is
    assert len(fakes.seen()) == n + 1


def test_warm_up_only_on_managed_partitions(running):
    n = len(fakes.seen())
    assert warm(running, JOB + "# FAKE tag=cpu\n", partition="cpu") == {"status": "ok",
                                                                        "reason": "warm"}
    settled(running)
    assert len(fakes.seen()) == n


def test_warm_request_describes_the_job_as_sbatch_hands_it_to_job_submit():
    cli = {"nodes": "4", "ntasks": None, "ntasks-per-node": "4", "gres": "gpu:4", "argv": ARGV}
    body = {"script": JOB, "cli_options": cli, "submit_uid": -1, "warm": True}
    r = parse_request(json.dumps(body).encode(), max_script=1 << 20, peer=(1000, 1000),
                      peer_cwd="/home/u/run")
    # sbatch fills --ntasks from nodes x tasks per node; the work_dir is sbatch's own cwd
    assert (r.warm, r.num_tasks, r.work_dir, r.submit_uid) == (True, 16, "/home/u/run", 1000)
    assert (r.min_nodes, r.max_nodes) == (4, 4)     # as sbatch hands job_submit.lua --nodes=4
    cli["nodes"] = "2-4"                       # a node range: sbatch leaves the count unset
    r = parse_request(json.dumps(body).encode(), max_script=1 << 20, peer=(1000, 1000))
    assert r.num_tasks is None and r.work_dir == "/"
    assert (r.min_nodes, r.max_nodes) == (2, 4)
    cli["nodes"] = "2-"                        # no maximum: not known, as job_submit.lua gets it
    r = parse_request(json.dumps(body).encode(), max_script=1 << 20, peer=(1000, 1000))
    assert (r.min_nodes, r.max_nodes) == (2, None)
    body["warm"] = False                       # the older cli_filter mode: unchanged
    cli["nodes"] = "4"
    r = parse_request(json.dumps(body).encode(), max_script=1 << 20, peer=(1000, 1000))
    assert r.num_tasks is None and not r.warm


def _finishing_order(size: int, jobs: list[tuple[str, bytes, bool]], promote: str = "") -> list[str]:
    """The names of ``jobs`` (name, payload, urgent), submitted in this order to a pool of
    ``size`` workers (``promote`` promoted after the last), in the order they finished."""
    async def go():
        pool = await _started(size=size)
        done: list[str] = []
        far = time.monotonic() + 30
        try:
            futs = {name: pool.submit(payload, far, urgent=urgent) for name, payload, urgent in jobs}
            if promote:
                pool.promote(futs[promote])
            for name, fut in futs.items():
                fut.add_done_callback(lambda f, name=name: done.append(name))
            await asyncio.gather(*futs.values())
        finally:
            await pool.close()
        return done
    return asyncio.run(go())


def test_urgent_jobs_go_ahead_of_warm_ups_and_a_promoted_one_joins_them():
    done = _finishing_order(1, [("busy", b'{"sleep": 0.3}', True),    # holds the only worker
                                ("warm-a", b'{"n": "a"}', False), ("warm-b", b'{"n": "b"}', False),
                                ("urgent", b'{"n": "u"}', True)], promote="warm-b")
    assert done == ["busy", "urgent", "warm-b", "warm-a"]


def test_warm_ups_leave_a_worker_free_for_requests_slurmctld_waits_on():
    # Two workers: the warm-ups take one at a time, the urgent job starts at once beside them.
    done = _finishing_order(2, [("warm-a", b'{"sleep": 1.0}', False),
                                ("warm-b", b'{"sleep": 1.0}', False), ("urgent", b'{"n": "u"}', True)])
    assert done == ["urgent", "warm-a", "warm-b"]


def test_a_queued_warm_up_that_somebody_joins_starts_at_once_on_the_free_worker():
    # Two workers: warm-a holds one, warm-b waits (the other is kept for requests slurmctld waits
    # on).  Once such a request joins warm-b, it is one of them: it starts now, not after warm-a.
    done = _finishing_order(2, [("warm-a", b'{"sleep": 1.0}', False), ("warm-b", b'{"n": "b"}', False)],
                            promote="warm-b")
    assert done == ["warm-b", "warm-a"]


def _may_lower_nice() -> bool:
    """Whether this process may lower a nice value again (root with CAP_SYS_NICE, or a high enough
    RLIMIT_NICE) -- tried in a child, because raising our own would be for good without it."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.nice(1)
            os.setpriority(os.PRIO_PROCESS, 0, 0)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_a_running_warm_up_stops_yielding_the_cpu_once_somebody_waits_for_it():
    # Containers often run root without CAP_SYS_NICE: then nobody may lower a worker's nice value
    # back, and every job runs at WORKER_NICE (a promotion still makes the job urgent).
    from slurm_plugin.daemon.pool import WORKER_NICE
    may_lower = _may_lower_nice()

    async def go():
        pool = await _started(size=1)
        try:
            fut = pool.submit(b'{"sleep": 10}', time.monotonic() + 30, urgent=False)
            (w,) = pool.workers
            assert os.getpriority(os.PRIO_PROCESS, w.pid) == WORKER_NICE   # set before it was sent
            pool.promote(fut)
            assert w.job is not None and w.job.urgent
            assert os.getpriority(os.PRIO_PROCESS, w.pid) == (0 if may_lower else WORKER_NICE)
        finally:
            await pool.close()
    asyncio.run(go())


def test_a_promotion_holds_when_the_worker_reads_its_job_after_it():
    # The worker is stopped, so it reads the warm-up's frame only after slurmctld's request has
    # joined it: the job must still run at the promoted nice value, not at the warm-up's.
    from slurm_plugin.daemon.pool import WORKER_NICE
    may_lower = _may_lower_nice()

    async def go():
        pool = await _started(size=1)
        try:
            (w,) = pool.workers
            os.kill(w.pid, signal.SIGSTOP)
            try:
                fut = pool.submit(b'{"n": 1}', time.monotonic() + 30, urgent=False)
                pool.promote(fut)
            finally:
                os.kill(w.pid, signal.SIGCONT)
            ran = json.loads(await fut)
            assert ran["pid"] == w.pid and ran["nice"] == (0 if may_lower else WORKER_NICE)
        finally:
            await pool.close()
    asyncio.run(go())
