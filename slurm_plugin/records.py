"""What perf-predictd answered, kept on the controller: an embedded SQLite store of predictions.

Every prediction the daemon turns into a limit (or advice) becomes one :class:`PredictionRecord`:
a short record id (which the daemon appends to the job's AdminComment as ``rec=<id>``), the
partition, platform and bundle, the resolved job, the predicted iteration and total seconds and
interval, the limit and time-min perfcast set, and where the job's output goes and whose it is.
job_submit.lua runs before Slurm has a job id, so a record is matched to its job later through
the record id that the AdminComment carries (:func:`parse_admin_comment`); ``perf-calibrate
harvest`` then stores each finished job's :class:`JobOutcome` next to its record.

The store is one SQLite file (stdlib ``sqlite3``) in WAL mode, so readers (``perf-calibrate
report``) never block the daemon's writes and several writer processes (the daemon's record writer, a
harvest, a watch) take turns through SQLite's own lock, waiting up to :data:`BUSY_TIMEOUT_S`.  Any
other process may open the file with its own ``sqlite3`` connection (and keep tables of its own in
it).  It is bounded: at most ``max_rows`` records, the oldest pruned with their outcomes.  Every
failure (a full disk, a corrupt or foreign file, a lock held too long) raises
:class:`RecordStoreError` with a one-line reason.  A store of an older schema is upgraded in place
by the first process that opens it (one transaction, every record kept); one of a newer perfcast's
schema is refused.

perf-predictd itself never opens this file: it appends each record to a spool file and a writer
process of its own moves the spool into the store (:mod:`slurm_plugin.daemon.recorder`), so that no
fault of SQLite or of the file system -- a read-only or immutable file, a SIGBUS from the mmap'd WAL
index (``-shm``), a corrupt page, a lock held for minutes -- can stop the daemon answering.  Records
that could not be kept are counted by reason (:meth:`RecordStore.losses`, shown by ``perf-calibrate
report``).

Stdlib only: the daemon imports this module, and it must stay cheap to import.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import sqlite3
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from .daemon.logs import log_event

# (its events are key=value lines, as every line of perf-predictd's log is: the record writer logs
# what this module says; ``perf-calibrate -v`` shows it too)
log = logging.getLogger("perfcast.records")


DEFAULT_PATH = "/var/lib/perfcast/records.sqlite"
RECORD_TAG = "perfcast:v1"          # the AdminComment record's tag (slurm_plugin.policy.RECORD_TAG)
RECORD_KEY = "rec"                  # the AdminComment key that carries the record id
# 48 random bits as 12 hex digits: short enough for an AdminComment, and with the 50,000 rows the
# store keeps, the chance that a new id collides with a kept one is 50,000 / 2**48 ~ 2e-10 (and a
# collision is retried, never overwritten: record_id is UNIQUE).
RECORD_ID_HEX = 12
_RECORD_ID_RE = re.compile(rf"^[0-9a-f]{{{RECORD_ID_HEX}}}$")
# A record of the paper's GPT-20B job takes 1.1 KiB of file (measured: 9,000 rows, 1,085 bytes
# each); 50,000 rows are ~55 MiB on the controller's disk and, at 500 perfcast jobs a day, 100
# days of history -- more than the daily harvest needs (docs/harvest.md) and the report shows.
DEFAULT_MAX_ROWS = 50_000
# How long a writer waits for another one's transaction (SQLite's busy handler).  An insert takes
# ~0.4 ms (measured on the 2-core dev machine); a harvest commits one job at a time.  Five seconds
# is thousands of queued inserts; the daemon's spool keeps even that off sbatch.
BUSY_TIMEOUT_S = 5.0
# Bounds on what one record may carry, so that a runaway value cannot bloat the controller's disk:
# PATH_MAX (4096) for paths, 1024 characters for names (partition, platform, bundle, user and job
# names are tens of characters), 64 KiB for the job JSON (a job dict is under 1 KiB; the rest is
# headroom for future job-file keys).
_MAX_PATH = 4096
_MAX_NAME = 1024
_MAX_JOB_JSON = 64 * 1024
SCHEMA_VERSION = 2
# What takes a store of schema N to N + 1.  A site's store holds the records of jobs not yet
# harvested, so an older one is upgraded in place when a newer perfcast opens it (one transaction,
# every step and the new version together), never dropped or refused.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    # 2: the job's --error, for a harvest from sacct (which names no StdErr).  ADD COLUMN with a
    # constant default only rewrites the schema, not the rows: instant on a full store.
    1: ("ALTER TABLE records ADD COLUMN std_err TEXT NOT NULL DEFAULT ''",),
}
_LOSS_PREFIX = "lost:"
# What a damaged store is said to be, and what to do about it: moving it aside alone costs the
# records of every job not harvested yet (docs/harvest.md), so the advice is to recover first.
CORRUPT = "corrupt or not a perfcast record store"
DAMAGED_ADVICE = "recover what it holds before replacing it (docs/harvest.md, 'When the store is damaged')"


class RecordStoreError(Exception):
    """The record store cannot be used (full disk, corrupt or foreign file, locked); one line."""


# --------------------------------------------------------------------------------------------
# records

@dataclass(frozen=True)
class PredictionRecord:
    """One prediction as the daemon answered it (times are UNIX seconds, durations seconds or minutes
    as the names say).  ``slurm_job_id`` is None at submission (the job has no id yet)."""

    partition: str
    platform: str
    bundle: str
    job: Mapping[str, Any]                     # TrainingJob.to_dict()
    iteration_seconds: float
    iterations: int
    total_seconds: float
    interval_seconds: tuple[float, float] = (0.0, 0.0)   # per iteration
    time_limit_minutes: Optional[int] = None   # the --time perfcast set (None: it left the limit)
    time_min_minutes: Optional[int] = None     # the --time-min perfcast set
    recommended_minutes: Optional[int] = None
    action: str = ""                           # set | keep | advise (slurm_plugin.policy.Decision)
    policy: str = ""
    std_out: str = ""                          # --output as submitted (may hold %j patterns); "" = default
    std_err: str = ""                          # --error as submitted; "" = none (stderr goes with stdout)
    work_dir: str = ""
    job_name: str = ""
    uid: Optional[int] = None
    gid: Optional[int] = None
    user: str = ""
    slurm_job_id: Optional[int] = None
    record_id: str = ""                        # "" = assigned by RecordStore.add
    created: float = 0.0                       # 0 = now, at add

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["job"] = dict(self.job)
        d["interval_seconds"] = list(self.interval_seconds)
        return d


@dataclass(frozen=True)
class JobOutcome:
    """What a finished job did, from Slurm accounting and its own log (``perf-calibrate harvest``)."""

    record_id: str
    slurm_job_id: int
    state: str                                  # COMPLETED, TIMEOUT, FAILED, CANCELLED, ...
    elapsed_seconds: Optional[float] = None
    time_limit_seconds: Optional[float] = None  # None: unlimited
    start: Optional[float] = None               # UNIX seconds
    end: Optional[float] = None
    nodes: Optional[int] = None
    exit_code: str = ""
    measured_iteration_seconds: Optional[float] = None   # steady-state median from the job's log
    log_format: str = ""
    log_samples: int = 0
    note: str = ""                              # why there is no measurement, or what was odd
    source: str = ""                            # sacct | scontrol
    harvested: float = 0.0                      # 0 = now, at put_outcome

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_record_id() -> str:
    """A fresh record id (12 hex digits) for the AdminComment, before the record is stored."""
    return secrets.token_hex(RECORD_ID_HEX // 2)


def is_record_id(text: Any) -> bool:
    return isinstance(text, str) and bool(_RECORD_ID_RE.match(text))


# --------------------------------------------------------------------------------------------
# the AdminComment record

_TAG_RE = re.compile(r"(?:^|(?<=\s))" + re.escape(RECORD_TAG) + r"(?=\s|$)")
_PAIR_RE = re.compile(r"([a-z][a-z0-9_]{0,31})=(\S{1,256})$")
# An AdminComment is at most a few hundred bytes from perfcast; scanning further than this on a
# hostile or garbled string buys nothing.
_MAX_COMMENT = 64 * 1024


def parse_admin_comment(text: Optional[str]) -> dict[str, str]:
    """The ``perfcast:v1 key=value ...`` record inside an AdminComment, as strings; {} if none.

    Tolerates other text around it (a site's own notes before or after): the record is the run of
    ``key=value`` tokens that follows the tag and ends at the first token of another shape.  With
    several records (a comment appended to twice) the last one wins.  Values stay strings; the
    caller converts (``float(d["iter_s"])``) and checks ``rec`` with :func:`is_record_id`.
    """
    if not isinstance(text, str) or RECORD_TAG not in text:
        return {}
    text = text[:_MAX_COMMENT]
    tags = list(_TAG_RE.finditer(text))
    if not tags:
        return {}
    out: dict[str, str] = {}
    for token in text[tags[-1].end():].split():
        m = _PAIR_RE.match(token)
        if not m:
            break
        out[m.group(1)] = m.group(2)
    return out


def record_key(record_id: str) -> str:
    """``rec=<id>``: what the daemon appends to the AdminComment record of :mod:`slurm_plugin.policy`."""
    if not is_record_id(record_id):
        raise ValueError(f"not a record id: {record_id!r}")
    return f"{RECORD_KEY}={record_id}"


# --------------------------------------------------------------------------------------------
# the store

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    record_id TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    partition TEXT NOT NULL,
    platform TEXT NOT NULL,
    bundle TEXT NOT NULL,
    job_json TEXT NOT NULL,
    iteration_seconds REAL NOT NULL,
    iterations INTEGER NOT NULL,
    total_seconds REAL NOT NULL,
    interval_lo REAL NOT NULL,
    interval_hi REAL NOT NULL,
    time_limit_minutes INTEGER,
    time_min_minutes INTEGER,
    recommended_minutes INTEGER,
    action TEXT NOT NULL,
    policy TEXT NOT NULL,
    std_out TEXT NOT NULL,
    work_dir TEXT NOT NULL,
    job_name TEXT NOT NULL,
    uid INTEGER,
    gid INTEGER,
    user TEXT NOT NULL,
    slurm_job_id INTEGER,
    std_err TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS records_created ON records (partition, created);
CREATE INDEX IF NOT EXISTS records_job ON records (slurm_job_id);
CREATE TABLE IF NOT EXISTS outcomes (
    record_id TEXT PRIMARY KEY,
    slurm_job_id INTEGER NOT NULL,
    state TEXT NOT NULL,
    elapsed_seconds REAL,
    time_limit_seconds REAL,
    start REAL,
    "end" REAL,
    nodes INTEGER,
    exit_code TEXT NOT NULL,
    measured_iteration_seconds REAL,
    log_format TEXT NOT NULL,
    log_samples INTEGER NOT NULL,
    note TEXT NOT NULL,
    source TEXT NOT NULL,
    harvested REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outcomes_job ON outcomes (slurm_job_id);
"""

_RECORD_COLUMNS = ("record_id", "created", "partition", "platform", "bundle", "job_json",
                   "iteration_seconds", "iterations", "total_seconds", "interval_lo", "interval_hi",
                   "time_limit_minutes", "time_min_minutes", "recommended_minutes", "action", "policy",
                   "std_out", "work_dir", "job_name", "uid", "gid", "user", "slurm_job_id", "std_err")
_OUTCOME_COLUMNS = ("record_id", "slurm_job_id", "state", "elapsed_seconds", "time_limit_seconds",
                    "start", "end", "nodes", "exit_code", "measured_iteration_seconds", "log_format",
                    "log_samples", "note", "source", "harvested")


class RecordStore:
    """``RecordStore(path).add(record) -> record_id``; ``get``, ``find``, outcomes.

    Each thread of each process has its own connection, opened on first use and kept (a WAL
    database checkpoints when its last connection closes: opening and closing per call would pay
    that every time).  A connection is opened again after ``fork``, after a failed call, and when
    the file was replaced (an admin moved a corrupt one aside), so a long-running daemon follows
    the file at ``path``.  Every writer process goes through SQLite's file lock.  The file and its
    directory are created on first use (mode 0600: the records name users and their output paths).
    """

    def __init__(self, path: "str | os.PathLike[str]" = DEFAULT_PATH, *,
                 max_rows: int = DEFAULT_MAX_ROWS, create: bool = True):
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        self.path = Path(path)
        self.max_rows = int(max_rows)
        self.create = create
        self._local = threading.local()

    # -- connections and errors

    def _connect(self) -> sqlite3.Connection:
        """A fresh connection (isolation_level=None: transactions are explicit, BEGIN IMMEDIATE)."""
        con = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        # In WAL mode NORMAL syncs at checkpoints, not at every commit: a power cut may lose the
        # last records, never corrupt the file -- the right trade for a log of predictions.
        con.execute("PRAGMA synchronous=NORMAL")
        return con

    def _why(self, exc: BaseException) -> RecordStoreError:
        text = str(exc)
        low = text.lower()
        if "not a database" in low or "malformed" in low or "corrupt" in low:
            return RecordStoreError(f"{self.path}: {CORRUPT} ({text}): {DAMAGED_ADVICE}")
        if "full" in low:
            what = "disk full (or the file system's quota reached)"
        elif "locked" in low or "busy" in low:
            what = f"locked by another process for more than {BUSY_TIMEOUT_S:g} s"
        elif "readonly" in low or "read-only" in low or "permission" in low:
            what = _path_problem(self.path) or "not writable (file or directory permissions)"
        elif "unable to open" in low:
            what = _path_problem(self.path) or "cannot open (missing directory or permissions)"
        elif "disk i/o error" in low:
            # (SQLite's word for a directory opened read-only, among others)
            what = _path_problem(self.path) or text
        else:
            what = text or type(exc).__name__
        return RecordStoreError(f"{self.path}: {what} ({text})" if text and text not in what
                                else f"{self.path}: {what}")

    @contextmanager
    def _db(self, write: bool) -> Iterator[sqlite3.Connection]:
        """This thread's connection in a transaction: BEGIN IMMEDIATE for writes (take the write lock
        up front, so two writers never deadlock upgrading a read lock), a deferred read otherwise."""
        try:
            con = self._conn()
            con.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield con
            except BaseException:
                con.rollback()
                raise
            con.commit()
        except sqlite3.Error as exc:
            self.close()          # the next call starts from a fresh connection
            raise self._why(exc) from None
        except OSError as exc:
            self.close()
            raise RecordStoreError(f"{self.path}: {exc.strerror or exc}") from None

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        key = (os.getpid(), _inode(self.path))
        con = getattr(local, "con", None)
        if con is not None and getattr(local, "key", None) == key:
            return con
        self.close()
        self._create_file()
        con = self._connect()
        try:
            if not self._check_schema(con):
                if not self.create:
                    raise RecordStoreError(f"{self.path}: empty, not a perfcast record store yet")
                self._create_schema(con)
        except BaseException:
            con.close()
            raise
        local.con, local.key = con, (os.getpid(), _inode(self.path))
        return con

    def close(self) -> None:
        """Close this thread's connection (a connection inherited through fork is only dropped)."""
        local = self._local
        con, key = getattr(local, "con", None), getattr(local, "key", None)
        local.con = local.key = None
        if con is not None and key is not None and key[0] == os.getpid():
            try:
                con.close()
            except sqlite3.Error:
                pass

    def _create_file(self) -> None:
        if self.path.exists():
            return
        if not self.create:
            raise RecordStoreError(f"{self.path}: no record store here (perf-predictd writes it; "
                                   "is [daemon] records set to this path?)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Created 0600 before SQLite opens it: records name users and their output paths.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise RecordStoreError(f"{self.path}: cannot create: {exc.strerror or exc}") from None

    def _check_schema(self, con: sqlite3.Connection) -> bool:
        """True when the file already is a record store of our schema (a read: no write access needed,
        so an admin's ``report`` can read the daemon's file), upgrading an older one first (a write,
        once); False when it is empty."""
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return False
        if "records" not in tables or "meta" not in tables:
            raise RecordStoreError(f"{self.path}: an SQLite file, but not a perfcast record store "
                                   "(no records table); choose another path")
        version = self._schema_version(con)
        if version != SCHEMA_VERSION:
            self._migrate(con)
        return True

    def _schema_version(self, con: sqlite3.Connection) -> int:
        """The store's schema version, or RecordStoreError unless this perfcast can read or upgrade it."""
        row = con.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            raise RecordStoreError(f"{self.path}: has no schema version: not a perfcast record store, "
                                   "or a damaged one")
        text = str(row[0])
        version = int(text) if text.isascii() and text.isdigit() else None
        if version is not None and (version == SCHEMA_VERSION or version in _MIGRATIONS):
            return version
        newer = version is not None and version > SCHEMA_VERSION
        raise RecordStoreError(f"{self.path}: record store schema {text}, this perfcast reads {SCHEMA_VERSION}"
                               + (" (the store was written by a newer perfcast: upgrade this one)"
                                  if newer else ""))

    def _migrate(self, con: sqlite3.Connection) -> None:
        """Upgrade an older store to :data:`SCHEMA_VERSION` in place, keeping every row."""
        try:
            con.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._upgrade_failed(exc) from None
        try:
            # Read again under the write lock: another process may have upgraded it meanwhile.
            start = version = self._schema_version(con)
            while version < SCHEMA_VERSION:
                for stmt in _MIGRATIONS[version]:
                    con.execute(stmt)
                version += 1
            con.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))
        except BaseException as exc:
            con.rollback()
            if isinstance(exc, sqlite3.Error):
                raise self._upgrade_failed(exc) from None
            raise
        con.commit()
        if start != SCHEMA_VERSION:
            log_event("record_store_upgraded", logger=log, store=self.path, from_schema=start,
                      to_schema=SCHEMA_VERSION)

    def _upgrade_failed(self, exc: sqlite3.Error) -> RecordStoreError:
        # (a reader without write access, say an admin's report, cannot upgrade the daemon's file:
        # its record writer does at its next start)
        return RecordStoreError(f"{self._why(exc)}; upgrading it to record store schema {SCHEMA_VERSION} "
                                "needs a process that may write it (perf-predictd's record writer does, "
                                "when it starts)")

    def _create_schema(self, con: sqlite3.Connection) -> None:
        # WAL persists in the file: readers never block the writer and vice versa.
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log_event("record_store_journal_mode", logging.WARNING, logger=log, store=self.path, mode=mode,
                       note="WAL unavailable on this file system")
        con.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have created it while this one waited for the lock.
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "records" not in tables:
                raise RecordStoreError(f"{self.path}: an SQLite file, but not a perfcast record store "
                                       "(no records table); choose another path")
            # One statement at a time inside the transaction (executescript would commit).
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    con.execute(stmt)
            con.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        except BaseException:
            con.rollback()
            raise
        con.commit()

    # -- records

    def add(self, record: PredictionRecord) -> str:
        """Store ``record`` (assigning its id and time if unset); prune beyond ``max_rows``; its id."""
        rec = _checked(record)
        created = rec.created or time.time()
        job_json = json.dumps(dict(rec.job), sort_keys=True, allow_nan=False)
        for attempt in range(3):
            rid = rec.record_id or new_record_id()
            row = _row(rec, rid, created, job_json)
            try:
                with self._db(write=True) as con:
                    con.execute(f"INSERT INTO records ({', '.join(_RECORD_COLUMNS)}) VALUES "
                                f"({', '.join('?' * len(_RECORD_COLUMNS))})", row)
                    self._prune(con)
                return rid
            except RecordStoreError as exc:
                if "UNIQUE" in str(exc) and not rec.record_id and attempt < 2:
                    continue       # a fresh random id collided with a kept one: draw again
                if "UNIQUE" in str(exc):
                    raise RecordStoreError(f"{self.path}: record id {rid} already stored") from None
                raise
        raise RecordStoreError(f"{self.path}: could not draw a free record id")   # pragma: no cover

    def add_many(self, records: Sequence[PredictionRecord]) -> int:
        """Store records that already carry their ids (the daemon's spool), in one transaction; a
        record whose id is already stored is skipped (a spool replayed after a kill).  How many were
        new; a record that fails its checks raises before anything is written."""
        rows = []
        for record in records:
            rec = _checked(record)
            if not rec.record_id:
                raise RecordStoreError("record: record_id: add_many needs ids assigned")
            rows.append(_row(rec, rec.record_id, rec.created or time.time(),
                             json.dumps(dict(rec.job), sort_keys=True, allow_nan=False)))
        if not rows:
            return 0
        with self._db(write=True) as con:
            # Kept ids are left out first (INSERT OR IGNORE would still use up seq numbers, and the
            # pruning counts on seq having no gaps).
            have: set[str] = set()
            ids = [r[0] for r in rows]
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                have.update(r[0] for r in con.execute(
                    f"SELECT record_id FROM records WHERE record_id IN ({', '.join('?' * len(part))})", part))
            new = [r for r in rows if r[0] not in have]
            con.executemany(f"INSERT OR IGNORE INTO records ({', '.join(_RECORD_COLUMNS)}) VALUES "
                            f"({', '.join('?' * len(_RECORD_COLUMNS))})", new)
            self._prune(con)
        return len(new)

    def check(self) -> None:
        """Raise :class:`RecordStoreError` unless the file is a sound record store (SQLite's
        ``quick_check``: every page and index readable).  A missing or empty file passes."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        try:
            con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
            try:
                rows = [r[0] for r in con.execute("PRAGMA quick_check(5)")]
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise self._why(exc) from None
        if rows != ["ok"]:
            raise RecordStoreError(f"{self.path}: corrupt ({'; '.join(map(str, rows))[:200]}): "
                                   f"{DAMAGED_ADVICE}")
        with self._db(write=False):
            pass                    # and of our schema (a foreign SQLite file is refused)

    def add_losses(self, counts: Mapping[str, int]) -> None:
        """Count records that could not be kept, by reason (kept in the meta table as
        ``lost:<reason>``; :meth:`losses` reads them)."""
        counts = {str(k)[:64]: int(v) for k, v in counts.items() if int(v) > 0}
        if not counts:
            return
        with self._db(write=True) as con:
            for reason, n in counts.items():
                con.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                            "SET value = CAST(value AS INTEGER) + excluded.value",
                            (_LOSS_PREFIX + reason, str(n)))
            con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_loss', ?)",
                        (repr(time.time()),))

    def losses(self) -> dict[str, int]:
        """Records perf-predictd answered with (or without) an id but could not keep, by reason:
        ``unwritable`` (the spool could not be written), ``spool-full`` (the store fell too far
        behind), ``truncated`` (a line cut by a kill), ``invalid`` (failed its checks)."""
        with self._db(write=False) as con:
            rows = con.execute("SELECT key, value FROM meta WHERE key LIKE 'lost:%'").fetchall()
        return {k[len(_LOSS_PREFIX):]: int(v) for k, v in rows}

    def _prune(self, con: sqlite3.Connection) -> None:
        """Drop the records (and their outcomes) older than the newest ``max_rows`` sequence numbers.

        seq is AUTOINCREMENT (never reused, increasing), so this keeps at most ``max_rows`` rows
        (fewer where seq has gaps) at the cost of two index lookups -- not a count of the table.
        """
        top = con.execute("SELECT MAX(seq) FROM records").fetchone()[0]
        if top is None or top <= self.max_rows:
            return
        cut = top - self.max_rows
        con.execute("DELETE FROM outcomes WHERE record_id IN (SELECT record_id FROM records WHERE seq <= ?)",
                    (cut,))
        n = con.execute("DELETE FROM records WHERE seq <= ?", (cut,)).rowcount
        if n:
            log_event("records_pruned", logger=log, store=self.path, count=n, max_rows=self.max_rows)

    def get(self, record_id: str) -> Optional[PredictionRecord]:
        if not is_record_id(record_id):
            return None
        with self._db(write=False) as con:
            row = con.execute(f"SELECT {', '.join(_RECORD_COLUMNS)} FROM records WHERE record_id = ?",
                              (record_id,)).fetchone()
        return _record(row) if row else None

    def find(self, *, partition: Optional[str] = None, since: Optional[float] = None,
             until: Optional[float] = None, slurm_job_id: Optional[int] = None,
             user: Optional[str] = None, limit: int = DEFAULT_MAX_ROWS) -> list[PredictionRecord]:
        """Records matching every given filter, oldest first (``since``/``until``: UNIX seconds)."""
        where, args = [], []
        for col, op, val in (("partition", "=", partition), ("created", ">=", since),
                             ("created", "<", until), ("slurm_job_id", "=", slurm_job_id),
                             ("user", "=", user)):
            if val is not None:
                where.append(f"{col} {op} ?")
                args.append(val)
        sql = f"SELECT {', '.join(_RECORD_COLUMNS)} FROM records"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq LIMIT ?"
        with self._db(write=False) as con:
            rows = con.execute(sql, (*args, int(limit))).fetchall()
        return [_record(r) for r in rows]

    def attach_job(self, record_id: str, slurm_job_id: int) -> bool:
        """Set the record's Slurm job id (once known); False if the record is gone or has another."""
        with self._db(write=True) as con:
            cur = con.execute("UPDATE records SET slurm_job_id = ? WHERE record_id = ? AND "
                              "(slurm_job_id IS NULL OR slurm_job_id = ?)",
                              (int(slurm_job_id), record_id, int(slurm_job_id)))
            return cur.rowcount == 1

    def count(self) -> int:
        with self._db(write=False) as con:
            return int(con.execute("SELECT COUNT(*) FROM records").fetchone()[0])

    # -- outcomes

    def put_outcome(self, outcome: JobOutcome) -> None:
        """Store (or replace) the outcome of a record's job, and attach the job id to the record."""
        o = replace(outcome, harvested=outcome.harvested or time.time())
        for name in ("elapsed_seconds", "time_limit_seconds", "start", "end", "measured_iteration_seconds"):
            v = getattr(o, name)
            if v is not None and (isinstance(v, bool) or not math.isfinite(float(v))):
                raise RecordStoreError(f"outcome of {o.record_id}: {name} must be a finite number, got {v!r}")
        with self._db(write=True) as con:
            if con.execute("SELECT 1 FROM records WHERE record_id = ?", (o.record_id,)).fetchone() is None:
                raise RecordStoreError(f"{self.path}: no record {o.record_id} (pruned?)")
            con.execute(f"INSERT OR REPLACE INTO outcomes ({', '.join(_q(c) for c in _OUTCOME_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(_OUTCOME_COLUMNS))})",
                        tuple(getattr(o, c) for c in _OUTCOME_COLUMNS))
            con.execute("UPDATE records SET slurm_job_id = ? WHERE record_id = ? AND slurm_job_id IS NULL",
                        (o.slurm_job_id, o.record_id))

    def outcome(self, record_id: str) -> Optional[JobOutcome]:
        with self._db(write=False) as con:
            row = con.execute(f"SELECT {', '.join(_q(c) for c in _OUTCOME_COLUMNS)} FROM outcomes "
                              "WHERE record_id = ?", (record_id,)).fetchone()
        return JobOutcome(*row) if row else None

    def outcomes(self, *, partition: Optional[str] = None, since: Optional[float] = None
                 ) -> list[tuple[PredictionRecord, JobOutcome]]:
        """Every harvested job with its record, oldest record first."""
        cols = ", ".join(f"r.{c}" for c in _RECORD_COLUMNS) + ", " + \
            ", ".join(f"o.{_q(c)}" for c in _OUTCOME_COLUMNS)
        sql = f"SELECT {cols} FROM records r JOIN outcomes o ON o.record_id = r.record_id"
        where, args = [], []
        if partition is not None:
            where.append("r.partition = ?")
            args.append(partition)
        if since is not None:
            where.append("r.created >= ?")
            args.append(since)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.seq"
        with self._db(write=False) as con:
            rows = con.execute(sql, args).fetchall()
        n = len(_RECORD_COLUMNS)
        return [(_record(r[:n]), JobOutcome(*r[n:])) for r in rows]


def _path_problem(path: Path) -> str:
    """Why SQLite cannot open or write the store at ``path``, as the file system tells it ("" when it
    tells nothing): SQLite's own words ("unable to open database file", "disk I/O error") do not
    say that the path is a directory or on a read-only file system."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return exc.strerror or ""
    if st is not None and stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if st is not None and not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    directory = path.parent
    if not directory.is_dir():
        return f"no directory {directory}"
    try:
        if os.statvfs(path if st is not None else directory).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    if st is not None and not os.access(path, os.R_OK):
        return "not readable (file permissions)"
    if not os.access(directory, os.W_OK | os.X_OK):
        # (SQLite makes the store's -wal and -shm files beside it, readers too)
        return f"directory {directory} not writable (permissions)"
    if st is not None and not os.access(path, os.W_OK):
        return "not writable (file permissions)"
    return ""


def _inode(path: Path) -> Optional[int]:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _q(col: str) -> str:
    return f'"{col}"' if col == "end" else col


def _row(rec: PredictionRecord, record_id: str, created: float, job_json: str) -> tuple[Any, ...]:
    """A checked record's values in :data:`_RECORD_COLUMNS` order."""
    return (record_id, created, rec.partition, rec.platform, rec.bundle, job_json,
            rec.iteration_seconds, rec.iterations, rec.total_seconds,
            rec.interval_seconds[0], rec.interval_seconds[1], rec.time_limit_minutes,
            rec.time_min_minutes, rec.recommended_minutes, rec.action, rec.policy, rec.std_out,
            rec.work_dir, rec.job_name, rec.uid, rec.gid, rec.user, rec.slurm_job_id, rec.std_err)


def _record(row: Sequence[Any]) -> PredictionRecord:
    d = dict(zip(_RECORD_COLUMNS, row))
    try:
        job = json.loads(d.pop("job_json"))
    except ValueError:
        job = {}
    lo, hi = d.pop("interval_lo"), d.pop("interval_hi")
    return PredictionRecord(job=job, interval_seconds=(lo, hi), **d)


def _checked(r: PredictionRecord) -> PredictionRecord:
    """A record fit to store, or RecordStoreError naming the field (one line for the daemon's log)."""
    def bad(name: str, why: str) -> RecordStoreError:
        return RecordStoreError(f"record: {name}: {why}")

    for name in ("iteration_seconds", "total_seconds"):
        v = getattr(r, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise bad(name, f"must be a finite number >= 0, got {v!r}")
    iv = tuple(r.interval_seconds)
    if len(iv) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                               and math.isfinite(x) for x in iv):
        raise bad("interval_seconds", f"must be two finite numbers, got {r.interval_seconds!r}")
    for name in ("iterations", "time_limit_minutes", "time_min_minutes", "recommended_minutes",
                 "uid", "gid", "slurm_job_id"):
        v = getattr(r, name)
        if v is None and name != "iterations":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2 ** 63:
            raise bad(name, f"must be a non-negative integer, got {v!r}")
    for name, limit in (("partition", _MAX_NAME), ("platform", _MAX_NAME), ("bundle", _MAX_NAME),
                        ("action", 32), ("policy", 32), ("std_out", _MAX_PATH), ("std_err", _MAX_PATH),
                        ("work_dir", _MAX_PATH), ("job_name", _MAX_NAME), ("user", _MAX_NAME)):
        v = getattr(r, name)
        if not isinstance(v, str) or len(v) > limit or "\0" in v:
            raise bad(name, f"must be a string of at most {limit} characters")
    if r.record_id and not is_record_id(r.record_id):
        raise bad("record_id", f"must be {RECORD_ID_HEX} hex digits (new_record_id()), got {r.record_id!r}")
    if not isinstance(r.job, Mapping):
        raise bad("job", "must be a mapping (TrainingJob.to_dict())")
    try:
        size = len(json.dumps(dict(r.job), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise bad("job", f"not JSON-serialisable: {exc}") from None
    if size > _MAX_JOB_JSON:
        raise bad("job", f"{size} bytes of JSON, at most {_MAX_JOB_JSON}")
    if isinstance(r.created, bool) or not isinstance(r.created, (int, float)) or not math.isfinite(r.created):
        raise bad("created", "must be UNIX seconds")
    return replace(r, interval_seconds=(float(iv[0]), float(iv[1])))


__all__ = ["DEFAULT_PATH", "JobOutcome", "PredictionRecord", "RECORD_KEY",
           "RecordStore", "RecordStoreError", "is_record_id", "new_record_id", "parse_admin_comment",
           "record_key"]
