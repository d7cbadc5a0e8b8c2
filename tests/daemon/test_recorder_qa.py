"""QA (admin), finding 1: a record store whose spool cannot be made or locked (a read-only file
system, the tester's read-only bind mount of a directory holding a valid store) is one ``key=value``
line in the daemon's log, never a Python traceback, and leaves no ``<defunct>`` writer behind.

No real mount: the spool directory is made impossible to create (a file where it should be) or its
lock impossible to open (a directory named ``lock``).  Nothing waits on the machine's speed: a
writer's exit is awaited (``os.waitid(..., WNOWAIT)``, which leaves it for the daemon to reap).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from slurm_plugin.daemon import recorder as recorder_mod
from slurm_plugin.daemon.recorder import EXIT_SPOOL_UNUSABLE, Recorder, spool_dir
from slurm_plugin.records import PredictionRecord, new_record_id

from .fakes import req
from .conftest import RunningDaemon


def _record() -> PredictionRecord:
    return PredictionRecord(record_id=new_record_id(), created=time.time(), partition="gpu", platform="p",
                            bundle="b", job={"fake": 1}, iteration_seconds=1.0, iterations=10,
                            total_seconds=70.0, interval_seconds=(0.9, 1.1), action="set", policy="fill")


def _run_writer(store: str) -> subprocess.CompletedProcess:
    """The record writer as the daemon starts it, its stdin at EOF (the daemon gone)."""
    cmd = [sys.executable, "-c", recorder_mod._WRITER_MAIN, "--store", store, "--current", "1"]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def _state(pid: int) -> str:
    """The process's state letter from /proc (``Z``: a zombie), "" when it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("State:"):
                    return line.split()[1]
    except FileNotFoundError:
        return ""
    return "?"


def test_a_writer_that_cannot_make_its_lock_says_one_line_not_a_traceback(tmp_path):
    # the tester's case: the store's directory holds no spool, and none can be made there
    out = _run_writer(str(tmp_path / "records.sqlite"))
    assert out.returncode == EXIT_SPOOL_UNUSABLE
    assert "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert " level=error event=record_spool_unusable " in line
    assert f"spool={tmp_path}/records.sqlite.spool " in line and 'error="No such file or directory"' in line


def test_a_writer_bug_is_its_type_and_code_location_only(tmp_path):
    # (an exception's message may quote a record: INSTALL.md, "an exception is logged as its type
    # and code location only")
    boom = ("import sys; import slurm_plugin.daemon.recorder as r\n"
            "def store(*a, **k): raise RuntimeError('a secret line of a script')\n"
            "r.RecordStore = store; sys.exit(r.writer_main(sys.argv[1:]))")
    cmd = [sys.executable, "-c", boom, "--store", str(tmp_path / "records.sqlite"), "--current", "1"]
    os.makedirs(spool_dir(str(tmp_path / "records.sqlite")))
    out = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr and "secret" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert ' level=error event=record_writer_crashed error="RuntimeError at <string>:2 < daemon/recorder.py:' in line


def test_a_corrupt_store_is_said_once_with_the_advice_to_recover_it(tmp_path):
    # the writer says it is unusable and goes on (the records wait in the spool)
    store = tmp_path / "records.sqlite"
    store.write_bytes(os.urandom(8192))
    os.makedirs(spool_dir(str(store)))
    out = _run_writer(str(store))
    assert out.returncode == 0 and "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert "event=record_store_unusable" in line and "(file is not a database): recover what it holds" in line
    assert "move it aside" not in line


def test_no_writer_is_started_for_a_spool_that_could_not_be_made(tmp_path, caplog):
    store = str(tmp_path / "records.sqlite")
    with open(spool_dir(store), "w"):
        pass                                   # a file where the spool directory should be
    rec = Recorder(store)
    try:
        rec.start()
        assert not rec.opened
        assert rec.proc is None and rec.pids() == []     # nothing to become <defunct>
        assert not rec.record(_record())                 # the job is answered; the record counted lost
        rec.tick()
        assert rec.proc is None
        assert dict(rec.spool.lost) == {"unwritable": 1}
        said = [r.getMessage() for r in caplog.records if "event=records_unwritable" in r.getMessage()]
        assert len(said) == 1 and 'error="File exists"' in said[0]      # once, not at every tick
    finally:
        Recorder.finish(rec.close_nowait(), rec.spool)


def test_a_writer_that_exits_at_once_is_reaped_and_logged(tmp_path, caplog):
    store = str(tmp_path / "records.sqlite")
    os.makedirs(os.path.join(spool_dir(store), "lock"))   # the spool is there; its lock cannot be opened
    log = tmp_path / "writer.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rec = Recorder(store, log_fd=fd)
    try:
        rec.start()
        pid = rec.proc.pid
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)   # it has exited; not reaped yet
        assert _state(pid) == "Z"
        rec.tick()
        assert _state(pid) == ""                             # reaped by the daemon's tick
        died = [r.getMessage() for r in caplog.records if "event=record_writer_died" in r.getMessage()]
        assert died and 'why="its spool is not writable"' in died[0]
    finally:
        Recorder.finish(rec.close_nowait(), rec.spool)
        os.close(fd)
    said = log.read_text()
    assert "Traceback" not in said and said.count("event=record_spool_unusable") == 1
    assert 'error="Is a directory"' in said


def test_the_daemon_answers_and_logs_no_traceback_across_a_reload(tmp_path):
    store = tmp_path / "store" / "records.sqlite"
    store.parent.mkdir()
    with open(spool_dir(str(store)), "w"):
        pass
    d = RunningDaemon(records=str(store))
    try:
        a = d.ask(req())
        assert a["status"] == "ok" and "rec=" not in (a.get("admin_comment") or "")   # fail open
        d.call(d.server.reload)
        assert d.ask(req())["status"] == "ok"
        assert d.state(lambda: d.server.records.proc) is None
        assert d.state(lambda: d.server.records.spool.lost["unwritable"]) == 2
        assert "Traceback" not in d.writer_said()
    finally:
        d.stop()
