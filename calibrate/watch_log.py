"""What ``perf-calibrate watch`` did to running jobs, kept in the record store's SQLite file.

Two tables of the watch's own beside the daemon's (:mod:`slurm_plugin.records` never reads them):

- ``watch_actions``: one row per action on a job (``extend``, ``shrink``, or ``none`` with why),
  what ``perf-calibrate report`` lists as each job's ``watch_actions``;
- ``watch_jobs``: per watched job, what a later pass needs: the limit the job had when the watch
  first saw it (the base of ``max_growth``), the last iteration its log showed and when that
  changed (a job whose iteration stops moving is not progressing), the last ``none`` reason
  (a ``none`` is written again only when its reason changes, not every pass), and the rate last
  written to the runs file.

Writes take SQLite's write lock up front (``BEGIN IMMEDIATE``) and wait for the daemon's writer
like any other; errors are one-line :class:`WatchLogError`.  A pass goes through :class:`PassLog`,
which keeps in memory what the store cannot take (locked, corrupt, missing) so that the pass goes
on protecting jobs, and says once what failed.  Bounded: the oldest actions beyond
:data:`MAX_ACTIONS` and jobs not seen for :data:`KEEP_JOB_SECONDS` are pruned.
"""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from predictor.errors import PerfcastError

# A pass every 5 minutes acting on 1,000 running jobs that each change once an hour is 24,000
# actions a day; the report reads the last weeks.  200,000 rows are ~40 MiB.
MAX_ACTIONS = 200_000
# A job not seen by the watch for 30 days has long ended.
KEEP_JOB_SECONDS = 30 * 86400
BUSY_TIMEOUT_S = 5.0
ACTIONS = ("extend", "shrink", "none")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS watch_actions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    slurm_job_id INTEGER NOT NULL,
    record_id TEXT NOT NULL,
    partition TEXT NOT NULL,
    user TEXT NOT NULL,
    action TEXT NOT NULL,
    from_seconds REAL,
    to_seconds REAL,
    at REAL NOT NULL,
    code TEXT NOT NULL,
    reason TEXT NOT NULL,
    iteration INTEGER,
    planned_iterations INTEGER,
    measured_iteration_seconds REAL,
    predicted_iteration_seconds REAL,
    limit_set_by_perfcast INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS watch_actions_job ON watch_actions (slurm_job_id);
CREATE INDEX IF NOT EXISTS watch_actions_record ON watch_actions (record_id);
CREATE INDEX IF NOT EXISTS watch_actions_user ON watch_actions (user, at);
CREATE TABLE IF NOT EXISTS watch_jobs (
    slurm_job_id INTEGER PRIMARY KEY,
    record_id TEXT NOT NULL,
    first_limit_seconds REAL,
    last_iteration INTEGER,
    progress_at REAL,
    last_code TEXT NOT NULL DEFAULT '',
    run_iteration_seconds REAL,
    updated REAL NOT NULL
);
"""


class WatchLogError(PerfcastError):
    """The watch's tables cannot be read or written (one line, naming the file)."""


@dataclass(frozen=True)
class WatchAction:
    """One thing the watch did (or decided not to do) to a running job."""

    slurm_job_id: int
    record_id: str
    partition: str
    user: str
    action: str                                 # extend | shrink | none
    from_seconds: Optional[float]               # the limit before (None: unlimited/unknown)
    to_seconds: Optional[float]                 # the limit after (== from_seconds for none)
    at: float                                   # UNIX seconds
    code: str                                   # a short reason key (on-track, unreadable, ...)
    reason: str                                 # one line for the admin and the user
    iteration: Optional[int] = None
    planned_iterations: Optional[int] = None
    measured_iteration_seconds: Optional[float] = None
    predicted_iteration_seconds: Optional[float] = None
    limit_set_by_perfcast: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def brief(self) -> dict[str, Any]:
        """The report's ``watch_actions`` entry: action, from_seconds, to_seconds, at (+ reason)."""
        return {"action": self.action, "from_seconds": self.from_seconds, "to_seconds": self.to_seconds,
                "at": self.at, "reason": self.reason}


@dataclass(frozen=True)
class JobState:
    """What the watch remembers of one job between passes."""

    slurm_job_id: int
    record_id: str
    first_limit_seconds: Optional[float]
    last_iteration: Optional[int]
    progress_at: Optional[float]      # the job's run time (s, suspension left out) when the log last moved
    last_code: str = ""
    run_iteration_seconds: Optional[float] = None
    updated: float = 0.0


_ACTION_COLS = tuple(f for f in WatchAction.__dataclass_fields__)
_JOB_COLS = tuple(f for f in JobState.__dataclass_fields__)


class WatchLog:
    """The watch's tables in the record store file at ``path`` (which must exist)."""

    def __init__(self, path: "str | os.PathLike[str]"):
        self.path = Path(path)
        self._con: Optional[sqlite3.Connection] = None
        self._pid = 0

    def _conn(self) -> sqlite3.Connection:
        if self._con is not None and self._pid == os.getpid():
            return self._con
        if not self.path.exists():
            raise WatchLogError(f"{self.path}: no record store (perf-predictd creates it; "
                                "[daemon] records in perfcast.toml)")
        try:
            con = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                  check_same_thread=False)
            con.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise WatchLogError(f"{self.path}: {exc}") from None
        self._con, self._pid = con, os.getpid()
        return con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    @contextmanager
    def _db(self, write: bool) -> Iterator[sqlite3.Connection]:
        """The connection; a write holds SQLite's write lock from its first statement on (the
        connection's context commits it, or rolls it back on an exception)."""
        try:
            con = self._conn()
            with con:
                if write:
                    con.execute("BEGIN IMMEDIATE")
                yield con
        except sqlite3.Error as exc:
            self.close()
            raise WatchLogError(f"{self.path}: {exc}") from None

    # -- actions

    def add(self, action: WatchAction) -> None:
        if action.action not in ACTIONS:
            raise ValueError(f"not a watch action: {action.action!r}")
        d = action.to_dict()
        d["limit_set_by_perfcast"] = int(action.limit_set_by_perfcast)
        d["reason"] = str(d["reason"])[:500]
        cols = ", ".join(_ACTION_COLS)
        with self._db(write=True) as con:
            con.execute(f"INSERT INTO watch_actions ({cols}) VALUES ({', '.join('?' * len(_ACTION_COLS))})",
                        [d[c] for c in _ACTION_COLS])
            n = con.execute("SELECT COUNT(*) FROM watch_actions").fetchone()[0]
            if n > MAX_ACTIONS:
                con.execute("DELETE FROM watch_actions WHERE seq IN (SELECT seq FROM watch_actions "
                            "ORDER BY seq LIMIT ?)", (n - MAX_ACTIONS,))

    def actions(self, *, slurm_job_ids: Optional[Sequence[int]] = None,
                since: Optional[float] = None) -> list[WatchAction]:
        """Actions, oldest first (of some jobs, or since a time)."""
        with self._db(write=False) as con:
            return _select(con, slurm_job_ids, since)

    def extended_seconds(self, user: str, since: float) -> float:
        """Seconds of extension ``user`` was given since ``since`` (the per-user cap's count)."""
        with self._db(write=False) as con:
            row = con.execute("SELECT COALESCE(SUM(to_seconds - from_seconds), 0) FROM watch_actions "
                              "WHERE user = ? AND action = 'extend' AND at >= ?", (user, since)).fetchone()
        return float(row[0] or 0.0)

    # -- per-job state

    def job(self, slurm_job_id: int) -> Optional[JobState]:
        with self._db(write=False) as con:
            row = con.execute(f"SELECT {', '.join(_JOB_COLS)} FROM watch_jobs WHERE slurm_job_id = ?",
                              (int(slurm_job_id),)).fetchone()
        return JobState(*row) if row else None

    def put_job(self, state: JobState) -> None:
        d = asdict(state)
        d["updated"] = state.updated or time.time()
        cols = ", ".join(_JOB_COLS)
        with self._db(write=True) as con:
            con.execute(f"INSERT OR REPLACE INTO watch_jobs ({cols}) VALUES "
                        f"({', '.join('?' * len(_JOB_COLS))})", [d[c] for c in _JOB_COLS])
            con.execute("DELETE FROM watch_jobs WHERE updated < ?", (d["updated"] - KEEP_JOB_SECONDS,))


class PassLog:
    """The watch's tables for one pass, which never stop the pass (the record store may be
    corrupt, locked by another writer, moved aside or missing while jobs run out of time).

    Reads go to the store's tables while they can be read; what cannot be written there (a write
    lock held past :data:`BUSY_TIMEOUT_S`, a corrupt file) is kept in memory for the rest of the
    pass, so that a later step of the same pass still sees it (a job's state, the extensions given
    to a user).  After the first failure of a kind the store is not tried again in this pass (one
    wait for a held lock, not one per job).  ``read_error`` / ``write_error`` say what failed
    (None: nothing), for the pass's one warning; ``unrecorded`` counts the actions not stored."""

    def __init__(self, wlog: WatchLog):
        self.wlog = wlog
        self.read_error: Optional[str] = None
        self.write_error: Optional[str] = None
        self.unrecorded = 0
        self._jobs: dict[int, JobState] = {}
        self._actions: list[WatchAction] = []

    @property
    def path(self) -> Path:
        return self.wlog.path

    def _read(self, what, default):
        if self.read_error is None:
            try:
                return what()
            except WatchLogError as exc:
                self.read_error = str(exc)
        return default

    def _write(self, what) -> bool:
        if self.write_error is None:
            try:
                what()
                return True
            except WatchLogError as exc:
                self.write_error = str(exc)
        return False

    def job(self, slurm_job_id: int) -> Optional[JobState]:
        if int(slurm_job_id) in self._jobs:
            return self._jobs[int(slurm_job_id)]
        return self._read(lambda: self.wlog.job(slurm_job_id), None)

    def put_job(self, state: JobState) -> None:
        self._jobs[int(state.slurm_job_id)] = state
        self._write(lambda: self.wlog.put_job(state))

    def actions(self, *, slurm_job_ids: Optional[Sequence[int]] = None,
                since: Optional[float] = None) -> list[WatchAction]:
        kept = self._read(lambda: self.wlog.actions(slurm_job_ids=slurm_job_ids, since=since), [])
        ids = None if slurm_job_ids is None else {int(i) for i in slurm_job_ids}
        mine = [a for a in self._actions if (ids is None or a.slurm_job_id in ids)
                and (since is None or a.at >= since)]
        return kept + mine

    def add(self, action: WatchAction) -> None:
        if action.action not in ACTIONS:
            raise ValueError(f"not a watch action: {action.action!r}")
        if not self._write(lambda: self.wlog.add(action)):
            self._actions.append(action)
            self.unrecorded += 1

    def extended_seconds(self, user: str, since: float) -> float:
        kept = self._read(lambda: self.wlog.extended_seconds(user, since), 0.0)
        return kept + sum((a.to_seconds or 0.0) - (a.from_seconds or 0.0) for a in self._actions
                          if a.user == user and a.action == "extend" and a.at >= since)


def _select(con: sqlite3.Connection, slurm_job_ids: Optional[Sequence[int]],
            since: Optional[float]) -> list[WatchAction]:
    """Actions of these jobs (None: all) at or after ``since`` (None: ever), oldest first."""
    ids = None if slurm_job_ids is None else [int(i) for i in slurm_job_ids]
    if ids == []:
        return []
    clauses = ([f"slurm_job_id IN ({', '.join('?' * len(ids))})"] if ids is not None else []) + \
        (["at >= ?"] if since is not None else [])
    args = (ids or []) + ([since] if since is not None else [])
    sql = (f"SELECT {', '.join(_ACTION_COLS)} FROM watch_actions"
           + (" WHERE " + " AND ".join(clauses) if clauses else "") + " ORDER BY seq")
    return [_action(r) for r in con.execute(sql, args).fetchall()]


def _action(row: Sequence[Any]) -> WatchAction:
    d = dict(zip(_ACTION_COLS, row))
    d["limit_set_by_perfcast"] = bool(d["limit_set_by_perfcast"])
    return WatchAction(**d)


def read_actions(path: "str | os.PathLike[str]", slurm_job_ids: Optional[Sequence[int]] = None
                 ) -> list[WatchAction]:
    """The actions in the store at ``path``; [] when the watch never ran there."""
    p = Path(path)
    if not p.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise WatchLogError(f"{p}: {exc}") from None
    try:
        has = con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='watch_actions'"
                          ).fetchone()
        if not has:
            return []
        return _select(con, slurm_job_ids, None)
    except sqlite3.Error as exc:
        raise WatchLogError(f"{p}: {exc}") from None
    finally:
        con.close()


__all__ = ["ACTIONS", "JobState", "PassLog", "WatchAction", "WatchLog", "WatchLogError", "read_actions"]
