"""Prediction records, durable and off the daemon's failure path: a spool and a writer process.

The daemon appends each record as one JSON line to a spool segment next to the store
(``<store>.spool/0000000042.jsonl``, one ``write(2)`` to a local file, no SQLite), and only then
puts ``rec=<id>`` into the job's AdminComment: an id is given only for a record that is kept.  A
writer process of its own (``python -m slurm_plugin.daemon.recorder``) moves closed segments into
the SQLite store in batches and deletes them once committed.  So:

- no SQLite or file-system fault in the store (read-only, immutable, deleted, corrupt, locked for
  minutes, a SIGBUS from the mmap'd WAL index) reaches the daemon: the writer fails, is logged and
  restarted with a back-off, and the records wait in the spool;
- a SIGTERM lets the writer drain the spool for a moment; whatever is left, and everything left by a
  kill -9, is replayed by the next writer (ids are unique: a replayed record is stored once);
- the spool is bounded (:data:`SPOOL_MAX_BYTES`); a record that cannot be spooled (full, read-only
  file system) gets no id and is counted as lost by reason; the counts reach the store (and
  ``perf-calibrate report``) with the next spooled line.

The writer holds ``<spool>/lock`` (flock) while it runs, so a writer left draining by a killed
daemon and the next daemon's writer never work on the same segment at once.
"""
from __future__ import annotations

import argparse
import collections
import errno
import fcntl
import json
import logging
import os
import pwd
import select
import signal
import subprocess
import sys
import time
from dataclasses import fields
from typing import Optional

from ..records import DEFAULT_MAX_ROWS, PredictionRecord, RecordStore, RecordStoreError
from .logs import log_event

SPOOL_SUFFIX = ".spool"
_FIELDS = tuple(f.name for f in fields(PredictionRecord))
# json.dumps(..., separators=(",", ":"), allow_nan=False), without an encoder per record
_LINE_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# A line's first '"job":null' is the job's key while the fields before it are strings (inside
# which every '"' is escaped): then a job's text is spliced in there.
_SPLICE_JOB = all(f.type in (str, "str") for f in fields(PredictionRecord)[:_FIELDS.index("job")])
SEGMENT_SUFFIX = ".jsonl"
# 64 MiB is ~60,000 records (1.1 KiB each): a day of a busy site's submissions, kept through a
# store that is locked, corrupt or unwritable until an admin notices; beyond that records are lost
# (and counted) rather than filling the controller's disk.
SPOOL_MAX_BYTES = 64 << 20
SEGMENT_MAX_BYTES = 1 << 20        # a segment is closed (handed to the writer) at this size ...
SEGMENT_MAX_S = 1.0                # ... or this old: records reach the store within seconds
BATCH = 500                        # records per transaction (one fsync-free commit each)
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)   # writer back-off after a store error or a crash
STOP_GRACE_S = 2.0                 # SIGTERM: the writer drains this long (systemd allows 5 s)
LOSS_LOG_S = 60.0                  # at most one "records lost" warning per minute (plus the first)
OPEN_RETRY_S = 10.0                # a spool directory that could not be made is tried again this often
EXIT_SPOOL_UNUSABLE = 3            # the writer's exit status when it cannot take the spool's lock

log = logging.getLogger("perfcast.daemon")
# (not ``-m``: this module is already imported by the package the writer is started from)
_WRITER_MAIN = ("import sys; from slurm_plugin.daemon.recorder import writer_main; "
                "sys.exit(writer_main(sys.argv[1:]))")


def job_line_text(job: object) -> str:
    """A record's job as its spool line spells it; "" where that line could not hold it (NaN)."""
    try:
        return _LINE_JSON.encode(job)
    except (TypeError, ValueError):
        return ""


def spool_dir(store_path: str) -> str:
    return store_path + SPOOL_SUFFIX


def _segments(directory: str) -> list[tuple[int, str]]:
    """(sequence number, path) of the spool's segments, oldest first."""
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        stem = name[:-len(SEGMENT_SUFFIX)]
        if name.endswith(SEGMENT_SUFFIX) and stem.isascii() and stem.isdigit():
            out.append((int(stem), os.path.join(directory, name)))
    return sorted(out)


def _spool_bytes(directory: str) -> int:
    total = 0
    for _, path in _segments(directory):
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total


# --------------------------------------------------------------------------------------------
# the daemon's side

class RecordSpool:
    """Appends records to the current segment (the daemon's event-loop thread only)."""

    def __init__(self, store_path: str, *, max_bytes: int = SPOOL_MAX_BYTES):
        self.dir = spool_dir(store_path)
        self.max_bytes = max_bytes
        self.seq = 0                      # the segment being written (or next to be written)
        self.fd: Optional[int] = None
        self.segment_bytes = 0
        self.segment_opened = 0.0
        self.pending_bytes = 0            # in the spool, written or not yet moved to the store
        self.lost: collections.Counter[str] = collections.Counter()      # since start
        self.unreported: collections.Counter[str] = collections.Counter()  # not yet in a spool line
        self.kept = 0
        self._last_loss_log = -LOSS_LOG_S
        self._lost_since_log = 0

    def open(self) -> None:
        """Create the directory and start after the newest segment there (those are a previous
        daemon's: replayed by the writer, never appended to -- a kill may have cut their last line)."""
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        existing = _segments(self.dir)
        self.seq = max(self.seq, existing[-1][0] + 1 if existing else 1)
        self.pending_bytes = _spool_bytes(self.dir)

    def append(self, record: PredictionRecord, job_text: str = "") -> bool:
        """Spool ``record`` (its id already set); True when it is kept, False when lost (counted).
        ``job_text``: :func:`job_line_text` of ``record.job`` where the caller has it already."""
        # (not dataclasses.asdict: it deep-copies, a third of the cost on the request path)
        values = {name: getattr(record, name) for name in _FIELDS}
        if not (job_text and _SPLICE_JOB):
            line = _LINE_JSON.encode({"r": values})
        else:
            values["job"] = None
            line = _LINE_JSON.encode({"r": values}).replace('"job":null', '"job":' + job_text, 1)
        return self._write((line + "\n").encode(), 1)

    def _write(self, data: bytes, records: int) -> bool:
        if self.pending_bytes + len(data) > self.max_bytes:
            self._lose("spool-full", records, f"spool {self.dir} holds {self.pending_bytes >> 20} MiB: "
                       "the record store is not keeping up")
            return False
        try:
            self._write_losses()
            self._write_all(data)
        except OSError as exc:
            self.close_segment()
            self._lose("unwritable", records, f"{self.dir}: {exc.strerror or exc}")
            return False
        self.kept += records
        if self.segment_bytes >= SEGMENT_MAX_BYTES:
            self.close_segment()
        return True

    def _write_losses(self) -> None:
        """Records lost so far, as a line of their own: the writer adds them to the store's count."""
        if self.unreported:
            self._write_all(json.dumps({"lost": dict(self.unreported)}).encode() + b"\n")
            self.unreported.clear()

    def flush_losses(self) -> None:
        try:
            self._write_losses()
        except OSError:
            self.close_segment()

    def _write_all(self, data: bytes) -> None:
        if self.fd is None:
            path = os.path.join(self.dir, f"{self.seq:010d}{SEGMENT_SUFFIX}")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            self.segment_bytes, self.segment_opened = 0, time.monotonic()
        n = os.write(self.fd, data)
        if n != len(data):
            # A full disk mid-line: cut the line off again, or the writer would count it lost
            # ("truncated") beside the loss the caller counts ("unwritable"): one record, twice.
            try:
                os.ftruncate(self.fd, self.segment_bytes)
            except OSError:
                pass
            raise OSError(errno.ENOSPC, "short write (disk full?)")
        self.segment_bytes += n
        self.pending_bytes += n

    def _lose(self, reason: str, n: int, why: str) -> None:
        if not n:
            return
        self.lost[reason] += n
        self.unreported[reason] += n
        self._lost_since_log += n
        now = time.monotonic()
        if now - self._last_loss_log >= LOSS_LOG_S:
            log_event("records_lost", level=logging.WARNING, reason=reason, count=self._lost_since_log,
                      total=sum(self.lost.values()), why=why)
            self._last_loss_log, self._lost_since_log = now, 0

    def due(self) -> bool:
        """The current segment should be handed to the writer (old enough, with records in it)."""
        return self.fd is not None and time.monotonic() - self.segment_opened >= SEGMENT_MAX_S

    def close_segment(self) -> None:
        """Close the current segment; the next record starts a new one."""
        if self.fd is None:
            return
        try:
            os.close(self.fd)
        except OSError:
            pass
        if self.segment_bytes == 0:
            # Opened, then its first write failed (a full disk): nothing for the writer, and a
            # full disk would otherwise leave one empty file per request until the writer came.
            try:
                os.unlink(os.path.join(self.dir, f"{self.seq:010d}{SEGMENT_SUFFIX}"))
            except OSError:
                pass
        self.fd = None
        self.seq += 1

    def refresh(self) -> None:
        """Re-measure what the spool holds (the writer deletes segments as it stores them)."""
        self.pending_bytes = _spool_bytes(self.dir)


class Recorder:
    """The spool plus the writer process that empties it, as the daemon runs them.

    :meth:`record` is all the request path does; :meth:`tick` (once a second, on the loop) closes
    segments, tells the writer, and restarts it if it died; :meth:`close` (SIGTERM) lets it drain.
    """

    def __init__(self, store_path: str, *, max_rows: int = DEFAULT_MAX_ROWS,
                 max_bytes: int = SPOOL_MAX_BYTES, log_fd: Optional[int] = None):
        self.store_path = store_path
        self.max_rows = max_rows
        self.spool = RecordSpool(store_path, max_bytes=max_bytes)
        self.log_fd = log_fd
        self.proc: Optional[subprocess.Popen] = None
        self.opened = False
        self.crashes = 0
        self._next_try = 0.0
        self._told = 0
        self._open_error = ""

    def start(self) -> None:
        self._open()
        if self.opened:         # (no spool directory: nothing to store, and no lock to take)
            self._ensure_writer()

    def _open(self) -> None:
        if self.opened:
            return
        try:
            self.spool.open()
            self.opened = True
        except OSError as exc:
            self._next_try = time.monotonic() + OPEN_RETRY_S
            error = exc.strerror or str(exc)
            if error != self._open_error:       # said once, not at every retry
                log_event("records_unwritable", level=logging.WARNING, spool=self.spool.dir, error=error,
                          note=f"no record is kept; retried every {OPEN_RETRY_S:g} s")
            self._open_error = error

    def record(self, record: PredictionRecord, job_text: str = "") -> bool:
        """Keep ``record`` (True) or count it lost (False); never raises, never blocks on SQLite.
        ``job_text``: as for :meth:`RecordSpool.append`."""
        if not self.opened:
            self.spool._lose("unwritable", 1, f"{self.spool.dir} cannot be created")
            return False
        try:
            return self.spool.append(record, job_text)
        except (TypeError, ValueError):      # not JSON-able: a bug upstream, never the job's problem
            self.spool._lose("invalid", 1, "record is not JSON")
            return False

    def tick(self) -> None:
        if not self.opened and time.monotonic() >= self._next_try:
            self._open()
        if not self.opened:
            return
        if self.spool.due():
            self.spool.close_segment()
        self.spool.refresh()
        self._ensure_writer()
        self._tell()

    def _tell(self) -> None:
        """Tell the writer which segment is being written (it stores every older one)."""
        proc = self.proc
        if proc is None or proc.stdin is None or self._told == self.spool.seq:
            return
        try:
            os.write(proc.stdin.fileno(), f"{self.spool.seq}\n".encode())
            self._told = self.spool.seq
        except OSError:
            pass      # it died: the next tick notices and restarts it

    def _ensure_writer(self) -> None:
        proc = self.proc
        if proc is not None:
            code = proc.poll()
            if code is None:
                return
            self.proc = None
            self.crashes += 1
            delay = RETRY_S[min(self.crashes - 1, len(RETRY_S) - 1)]
            self._next_try = time.monotonic() + delay
            why = f"signal {signal.Signals(-code).name}" if code < 0 else \
                "its spool is not writable" if code == EXIT_SPOOL_UNUSABLE else f"exit {code}"
            log_event("record_writer_died", level=logging.ERROR, pid=proc.pid, why=why,
                      restart_in_s=delay, spooled_kib=self.spool.pending_bytes >> 10)
            if proc.stdin is not None:
                proc.stdin.close()
        if time.monotonic() < self._next_try:
            return
        cmd = [sys.executable, "-c", _WRITER_MAIN, "--store", self.store_path,
               "--current", str(self.spool.seq), "--max-rows", str(self.max_rows)]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=self.log_fd, close_fds=True,
                                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        except OSError as exc:
            self._next_try = time.monotonic() + RETRY_S[-1]
            log_event("record_writer_failed", level=logging.ERROR, error=exc.strerror or str(exc))
            return
        self._told = self.spool.seq
        if self.crashes and self.proc is not None:
            log_event("record_writer_restarted", pid=self.proc.pid, crashes=self.crashes)

    def flush(self) -> None:
        """Hand the current segment to the writer now (tests and tools; the tick does it within
        a second anyway)."""
        if self.opened:
            self.spool.flush_losses()
        self.spool.close_segment()
        self._tell()

    def stored(self) -> bool:
        """Every closed segment has been moved into the store (tests and tools)."""
        return not [seq for seq, _ in _segments(self.spool.dir) if seq < self.spool.seq]

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []

    def stats(self) -> dict[str, int]:
        return {"records_kept": self.spool.kept, "records_lost": sum(self.spool.lost.values()),
                "record_writer_crashes": self.crashes}

    def close_nowait(self) -> Optional[subprocess.Popen]:
        """Close the spool and tell the writer to drain everything and exit (EOF on its stdin)."""
        if self.opened:
            self.spool.flush_losses()
        self.spool.close_segment()
        proc, self.proc = self.proc, None
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        return proc

    @staticmethod
    def finish(proc: Optional[subprocess.Popen], spool: "RecordSpool") -> None:
        """After ``grace``: kill a writer still draining (its segments wait for the next start)."""
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
            spool.refresh()
            log_event("records_pending", level=logging.WARNING, spool=spool.dir,
                      kib=spool.pending_bytes >> 10, note="stored at the next start")


# --------------------------------------------------------------------------------------------
# the writer process

class _Writer:
    def __init__(self, store: RecordStore, directory: str):
        self.store, self.dir = store, directory
        self.failures = 0
        self.retry_at = 0.0
        self.stored = 0
        self.users: dict[int, str] = {}

    def drain(self, below: Optional[int]) -> bool:
        """Store every segment numbered below ``below`` (None: all); False after a store error."""
        if time.monotonic() < self.retry_at:
            return False
        for seq, path in _segments(self.dir):
            if below is not None and seq >= below:
                break
            try:
                self._segment(path)
            except RecordStoreError as exc:
                delay = RETRY_S[min(self.failures, len(RETRY_S) - 1)]
                self.failures += 1
                self.retry_at = time.monotonic() + delay
                if self.failures == 1 or self.failures % 20 == 0:
                    log_event("record_store_failed", level=logging.ERROR, error=str(exc),
                              failures=self.failures, retry_in_s=delay)
                return False
            if self.failures:
                log_event("record_store_recovered", failures=self.failures)
                self.failures = 0
        return True

    def _user(self, uid: object) -> str:
        """The submitter's name, looked up here and not on the request path: a site's name service
        (LDAP, say) may take its time, and the writer is the one process that can wait."""
        if not isinstance(uid, int) or uid < 0:
            return ""
        if uid not in self.users:
            try:
                self.users[uid] = pwd.getpwuid(uid).pw_name
            except (KeyError, OSError):
                self.users[uid] = ""
        return self.users[uid]

    def _segment(self, path: str) -> None:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise RecordStoreError(f"{path}: {exc.strerror or exc}") from None
        lost: collections.Counter[str] = collections.Counter()
        records: list[PredictionRecord] = []
        lines = data.split(b"\n")
        if lines and lines[-1]:
            lost["truncated"] += 1          # cut by a kill or a full disk mid-write
        for raw in lines[:-1]:
            if not raw:
                continue
            try:
                msg = json.loads(raw)
                if "lost" in msg:
                    for reason, n in dict(msg["lost"]).items():
                        lost[str(reason)] += int(n)
                    continue
                d = dict(msg["r"])
                d["interval_seconds"] = tuple(d.get("interval_seconds") or (0.0, 0.0))
                if not d.get("user"):
                    d["user"] = self._user(d.get("uid"))
                records.append(PredictionRecord(**d))
            except (ValueError, TypeError, KeyError, AttributeError):
                lost["invalid"] += 1
        for i in range(0, len(records), BATCH):
            batch = records[i:i + BATCH]
            try:
                self.stored += self.store.add_many(batch)
            except RecordStoreError as exc:
                if not str(exc).startswith("record:"):
                    raise
                for one in batch:            # one bad record must not hold up the others
                    try:
                        self.stored += self.store.add_many([one])
                    except RecordStoreError as e:
                        if not str(e).startswith("record:"):
                            raise
                        lost["invalid"] += 1
        self.store.add_losses(lost)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def writer_main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="perf-predictd record writer")
    ap.add_argument("--store", required=True)
    ap.add_argument("--current", type=int, required=True,
                    help="the segment the daemon writes now (older ones are stored)")
    ap.add_argument("--max-rows", type=int, default=DEFAULT_MAX_ROWS)
    args = ap.parse_args(argv)
    from .logs import exception_summary, setup_logging
    setup_logging("info")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return _write(args.store, args.current, args.max_rows)
    except Exception as exc:  # noqa: BLE001 - a bug: one line in the daemon's log, never a traceback
        # (its message may quote a record; the type and the code location say where)
        log_event("record_writer_crashed", level=logging.ERROR, error=exception_summary(exc),
                  note="the daemon restarts it; records wait in the spool")
        return 1


def _write(store_path: str, current_seq: int, max_rows: int) -> int:
    """The writer's work: take the spool's lock, store segments as the daemon closes them, drain
    at EOF.  :data:`EXIT_SPOOL_UNUSABLE` when the spool's lock cannot be taken (a read-only file
    system, the directory gone): said in one line, and the daemon retries later."""
    directory = spool_dir(store_path)
    try:
        lock = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log_event("record_spool_unusable", level=logging.ERROR, spool=directory,
                  error=exc.strerror or type(exc).__name__, note="no record is kept until it is writable")
        return EXIT_SPOOL_UNUSABLE
    while True:   # a writer left draining by a killed daemon finishes first
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            time.sleep(0.1)
    store = RecordStore(store_path, max_rows=max_rows)
    try:
        store.check()
        store.count()      # created now if missing: harvest and report find it from the start
    except (RecordStoreError, OSError) as exc:
        # Records wait in the spool (bounded) until the file is recovered or repaired.
        log_event("record_store_unusable", level=logging.ERROR, error=str(exc),
                  note="records are spooled until it is fixed")
    writer = _Writer(store, directory)
    current: Optional[int] = current_seq
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    fd = stdin.fileno()
    pending = b""
    while current is not None:
        writer.drain(current)
        ready, _, _ = select.select([fd], [], [], SEGMENT_MAX_S / 2)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:              # the daemon closed the pipe (stopping) or died
            current = None
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip().isdigit():
                current = int(line)
    # Drain everything: the daemon has closed its last segment (or is gone).
    writer.retry_at = 0.0
    for _ in range(3):
        if writer.drain(None):
            break
        time.sleep(min(RETRY_S[0], max(0.0, writer.retry_at - time.monotonic())))
        writer.retry_at = 0.0
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(writer_main())
