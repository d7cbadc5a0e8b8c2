"""perf-predictd never dies of its record store, leaves no process behind, and keeps its records
through kills (issue 32).  Each test reproduces one finding of the issue; none depends on the
machine's speed (waits are for an event, with a generous bound).  Figures: benchmarks/bench_faults.py.
"""
from __future__ import annotations

import configparser
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_plugin.daemon import recorder as recorder_mod
from slurm_plugin.daemon import ask_daemon
from slurm_plugin.records import (BUSY_TIMEOUT_S, DEFAULT_PATH, PredictionRecord, RecordStore, new_record_id,
                                  parse_admin_comment)

from .fakes import JOB, req, until
from .conftest import RunningDaemon, write_config

REPO = Path(__file__).resolve().parents[2]


def rec_id(answer: dict):
    return parse_admin_comment(answer.get("admin_comment") or "").get("rec")


def ask_many(d: RunningDaemon, n: int) -> list[str]:
    out = []
    for _ in range(n):
        a = d.ask(req())
        assert a["status"] == "ok", a
        out.append(rec_id(a))
    return out


def store_ids(path: str) -> set[str]:
    if not os.path.exists(path):
        return set()
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as con:
        return {r[0] for r in con.execute("SELECT record_id FROM records")}


def writer_pid(d: RunningDaemon) -> int:
    return until(lambda: d.state(d.server.records.pids), what="the record writer")[0]


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` read-only as ProtectSystem=strict makes /var/lib: a read-only bind mount (root), or
    the mode bits (anybody else: they bind an unprivileged process)."""
    if os.geteuid() == 0:
        if subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode:
            pytest.skip("root, but bind mounts are not permitted here")
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True, capture_output=True)
            yield
        finally:
            subprocess.run(["umount", str(path)], check=True, capture_output=True)
    else:
        os.chmod(path, 0o555)
        try:
            yield
        finally:
            os.chmod(path, 0o755)


# --- the store's faults never reach the daemon ---------------------------------------------------

def test_a_writer_killed_by_sigbus_costs_no_answer_and_no_record():
    # The fault class of an immutable or truncated -shm (SIGBUS from SQLite's mmap'd WAL index):
    # it can only hit the writer process, never the daemon.
    d = RunningDaemon()
    try:
        first = ask_many(d, 5)
        pid = writer_pid(d)
        os.kill(pid, signal.SIGBUS)
        more = ask_many(d, 20)                       # answered meanwhile, ids given (spooled)
        assert all(more)
        until(lambda: d.state(d.server.records.pids) not in ([], [pid]), what="a new writer")
        d.wait_stored()
        assert set(first + more) <= store_ids(os.path.join(d.dir, "records.sqlite"))
        assert d.state(lambda: d.server.records.crashes) == 1
    finally:
        d.stop()


@pytest.fixture
def stored():
    """A daemon whose store exists (a few records in it, the writer connected); and its path."""
    d = RunningDaemon()
    try:
        ask_many(d, 3)
        d.wait_stored()
        yield d, os.path.join(d.dir, "records.sqlite")
    finally:
        d.stop()


def test_immutable_shm_does_not_kill_the_daemon(stored):
    d, path = stored
    shm = path + "-shm"
    assert os.path.exists(shm)
    if subprocess.run(["chattr", "+i", shm], capture_output=True).returncode:
        pytest.skip("chattr +i not permitted here (test_a_writer_killed_by_sigbus_... covers the class)")
    try:
        ids = ask_many(d, 30)
        d.state(d.server.records.flush)
        time.sleep(1.0)                          # the writer meets the file meanwhile
        assert len(ask_many(d, 5)) == 5          # still answering, in this process
    finally:
        subprocess.run(["chattr", "-i", shm], capture_output=True)
    d.wait_stored(60)                            # once the attribute is gone, nothing was lost
    assert set(ids) <= store_ids(path)


def test_a_deleted_store_is_started_again(stored):
    d, path = stored
    for suffix in ("", "-wal", "-shm"):
        os.unlink(path + suffix)                 # an admin's rm, the daemon running
    ids = ask_many(d, 10)
    d.wait_stored()
    assert store_ids(path) == set(ids)


def test_records_name_the_submitting_user(stored):
    """docs/harvest.md keeps the user's name with each record: the writer looks it up from the
    submitting uid (off the request path)."""
    import pwd

    d, path = stored
    ids = ask_many(d, 2)
    d.wait_stored()
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as con:
        users = {r[0] for r in con.execute("SELECT user FROM records WHERE record_id IN (?, ?)", ids)}
    assert users == {pwd.getpwuid(os.geteuid()).pw_name}


def test_read_only_store_gives_no_record_id_and_counts_the_losses(tmp_path):
    # /var/lib/perfcast under the old unit's ProtectSystem=strict: every record failed with
    # "Read-only file system" while the answers still carried rec=<id>.
    lib = tmp_path / "lib"
    lib.mkdir()
    store = str(lib / "records.sqlite")
    with read_only(lib):
        d = RunningDaemon(records=store)
        try:
            answers = [d.ask(req()) for _ in range(6)]
        except BaseException:
            d.stop()
            raise
    try:
        assert all(a["status"] == "ok" and a["time_limit"] for a in answers)   # still predicted
        assert not any(rec_id(a) for a in answers)       # but no id: a harvest would find nothing
        assert d.state(lambda: d.server.records.stats())["records_lost"] == 6
        # Writable again (the unit fixed): the next record is kept and the losses reach the store.
        d.state(lambda: setattr(d.server.records, "_next_try", 0.0))
        d.state(d.server.records.tick)
        kept = rec_id(d.ask(req()))
        assert kept
        d.wait_stored()
        assert RecordStore(store).get(kept) is not None
        assert RecordStore(store).losses() == {"unwritable": 6}
    finally:
        d.stop()


def test_locked_store_loses_nothing(stored):
    # A harvest (or an admin's sqlite3 shell) holding the write lock longer than the busy timeout.
    d, path = stored
    holder = sqlite3.connect(path, isolation_level=None, timeout=30)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        ids = ask_many(d, 40)
        d.state(d.server.records.flush)
        # Longer than SQLite's busy timeout: the writer gives up (at least) once meanwhile.
        time.sleep(BUSY_TIMEOUT_S + 1.5)
        assert len(ask_many(d, 5)) == 5
    finally:
        holder.execute("COMMIT")
        holder.close()
    d.wait_stored(60)
    assert set(ids) <= store_ids(path)


def test_records_are_drained_at_sigterm_and_a_leftover_spool_is_stored_at_the_next_start():
    d = RunningDaemon()
    path = os.path.join(d.dir, "records.sqlite")
    ids = ask_many(d, 25)
    d.stop(keep=True)                                   # SIGTERM's path: the writer drains
    assert set(ids) <= store_ids(path)
    # What a kill -9 leaves: segments of the dead daemon, the last one cut mid-line.
    spool = recorder_mod.RecordSpool(path)
    spool.open()
    left = [new_record_id() for _ in range(3)]
    for rid in left:
        assert spool.append(_record(rid))
    spool.close_segment()
    with open(os.path.join(spool.dir, f"{spool.seq:010d}.jsonl"), "wb") as fh:
        fh.write(b'{"r": {"record_id": "0123456789ab", "partit')
    d2 = RunningDaemon(directory=d.dir)
    try:
        d2.wait_stored()
        assert set(left) <= store_ids(path)
        assert RecordStore(path).losses() == {"truncated": 1}
    finally:
        d2.stop()


def _record(rid: str) -> PredictionRecord:
    return PredictionRecord(record_id=rid, created=time.time(), partition="gpu", platform="p",
                            bundle="b", job={"fake": 1}, iteration_seconds=1.0, iterations=10,
                            total_seconds=70.0, interval_seconds=(0.9, 1.1), action="set", policy="fill")


def test_kill_9_of_the_daemon_loses_no_answered_record(tmp_path):
    directory = Path(os.path.realpath("/tmp")) / f"pck{os.getpid()}"
    directory.mkdir()
    try:
        cfg = Path(write_config(str(directory)))
        cmd = [sys.executable, "-m", "tests.daemon.fakes", "--config", str(cfg), "--pid-file",
               str(directory / "pid"), "--log-file", str(directory / "log")]

        def start() -> subprocess.Popen:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory / "pid")
            proc = subprocess.Popen(cmd, cwd=str(REPO))
            until(lambda: (directory / "pid").exists() or proc.poll() is not None, what="the daemon")
            assert proc.poll() is None, (directory / "log").read_text()
            return proc
        proc = start()
        sock = str(directory / "d.sock")
        ids = [rec_id(ask_daemon(sock, req(), 30)) for _ in range(60)]
        assert all(ids)
        proc.kill()                                    # no SIGTERM: nothing is drained by the daemon
        proc.wait()
        proc = start()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert set(ids) <= store_ids(str(directory / "records.sqlite"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_corrupt_store_is_detected_at_start_and_records_wait_for_it_to_be_moved(tmp_path):
    d = RunningDaemon()
    path = os.path.join(d.dir, "records.sqlite")
    ask_many(d, 30)
    d.stop(keep=True)
    data = bytearray(Path(path).read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page: 3 * page] = b"\xa5" * (2 * page)       # garbage over the pages after the schema
    Path(path).write_bytes(bytes(data))
    d2 = RunningDaemon(directory=d.dir)
    try:
        until(lambda: "record_store_unusable" in d2.writer_said(), what="the corruption to be logged")
        assert "corrupt" in d2.writer_said()
        ids = ask_many(d2, 5)                            # answered, ids kept in the spool
        os.rename(path, path + ".bad")                   # what the log line tells the admin to do
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.rename(path + suffix, path + ".bad" + suffix)
        d2.wait_stored(60)
        assert set(ids) <= store_ids(path)
    finally:
        d2.stop()


# --- no process outlives its request ------------------------------------------------------------

def _readers_of(path: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if path.encode() in argv:
                out.append(int(pid))
    return out


@pytest.mark.parametrize("how", ["worker-killed", "deadline", "daemon-stopped"])
def test_a_reader_blocked_on_a_fifo_never_outlives_its_worker(tmp_path, how):
    fifo = str(tmp_path / "config.fifo")
    os.mkfifo(fifo)
    deadline_ms = 1500 if how == "deadline" else 60_000
    d = RunningDaemon(deadline_ms=deadline_ms, extra="\nfile_read_timeout_ms = 60000")
    pidfile = str(tmp_path / "worker.pid")
    script = JOB + f"# FAKE config={fifo} pidfile={pidfile}\n"
    import threading
    answers = []
    t = threading.Thread(target=lambda: answers.append(d.ask(req(script=script), timeout=90)))
    t.start()
    try:
        reader = until(lambda: _readers_of(fifo), what="the reader to block on the FIFO")
        worker = int(until(lambda: Path(pidfile).read_text().strip() if Path(pidfile).exists() else "",
                           what="the worker's pid"))
        if how == "worker-killed":
            os.kill(worker, signal.SIGKILL)
        elif how == "daemon-stopped":
            d.stop(keep=True)
        t.join(90)
        until(lambda: not _readers_of(fifo), within=20, what=f"reader {reader} to go")
        if how != "daemon-stopped":
            assert answers and answers[0]["status"] == "skip"
    finally:
        with contextlib.suppress(OSError):       # unblock anything left, whatever happened
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        t.join(5)
        if how != "daemon-stopped":
            d.stop()
        else:
            shutil.rmtree(d.dir, ignore_errors=True)


# --- the packaged unit --------------------------------------------------------------------------

def test_systemd_unit_lets_the_daemon_write_its_records():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read_string((REPO / "packaging" / "systemd" / "perf-predictd.service").read_text())
    service = unit["Service"]
    state = os.path.dirname(DEFAULT_PATH)                     # /var/lib/perfcast
    writable = ["/var/lib/" + d for d in service.get("StateDirectory", "").split()]
    writable += service.get("ReadWritePaths", "").split()
    if service.get("ProtectSystem", "no") in ("strict",):
        assert any(state == w or state.startswith(w.rstrip("/") + "/") for w in writable), \
            f"{state} is read-only under ProtectSystem=strict: {writable}"
    # INSTALL.md says so too, for a store kept elsewhere.
    assert "StateDirectory=perfcast" in (REPO / "packaging" / "INSTALL.md").read_text()
