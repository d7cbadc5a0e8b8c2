"""perf-predictd's log: one ``key=value`` line per event, for grep and journald.

Nothing a user wrote or a file contained goes into a line: events carry numbers, codes, paths of
the admin's own files and the like.  Exceptions are rendered as their type and the code locations
of the traceback only, because an exception's message may quote the data it choked on (a config
value, a line of a script).
"""
from __future__ import annotations

import functools
import json
import logging
import re
import sys
import time
import traceback
from typing import Any, Optional

log = logging.getLogger("perfcast.daemon")


class KVFormatter(logging.Formatter):
    """``2024-05-01T12:00:00.123Z level=info event=request status=ok ms=3.2 ...``"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_stamp(record.created, record.msecs)} level={record.levelname.lower()} {record.getMessage()}"
        if record.exc_info and record.exc_info[0] is not None:
            line += " exc=" + kv(exception_summary(record.exc_info[1]))
        return line


def exception_summary(exc: Optional[BaseException]) -> str:
    """``ValueError at launch/shell.py:120 < launch/parse.py:43``: where, never what."""
    if exc is None:
        return "-"
    frames = traceback.extract_tb(exc.__traceback__)[-4:]
    where = " < ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno}" for f in reversed(frames))
    return f"{type(exc).__name__} at {where}" if where else type(exc).__name__


_QUOTE = re.compile(r'[ "=\\]')    # (tabs and newlines: not printable)


def kv(value: Any) -> str:
    if type(value) is int or type(value) is float:   # digits, '.', '-', 'e', inf/nan: nothing to quote
        return str(value)
    text = value if type(value) is str else str(value)
    if text and text.isprintable() and _QUOTE.search(text) is None:
        return text
    return json.dumps(text)


def _stamp(created: float, msecs: float) -> str:
    """``2024-05-01T12:00:00.123Z`` (UTC)."""
    return _second(int(created)) + f".{int(msecs):03d}Z"


@functools.lru_cache(maxsize=4)
def _second(seconds: int) -> str:
    # (a burst's lines share their second: formatted once)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def log_event(event: str, level: int = logging.INFO, *, logger: Optional[logging.Logger] = None,
              **fields: Any) -> None:
    """One ``event=NAME key=value ...`` line on the daemon's logger, or on ``logger`` (a module the
    daemon's processes share with the CLIs, such as the record store's, logs its events so too)."""
    to = log if logger is None else logger
    if to.isEnabledFor(level):
        body = " ".join([f"{k}={kv(v)}" for k, v in fields.items()])
        handler = _own_handler(level) if to is log else None
        if handler is not None:
            # The daemon's own log (setup_logging): the line written straight to its stream, as
            # KVFormatter would write it -- no LogRecord, no filter or handler chain (this runs
            # twice per submission, on the path slurmctld waits on).
            now = time.time()
            line = (f"{_stamp(now, (now - int(now)) * 1000)} level={logging.getLevelName(level).lower()}"
                    f" event={event} {body}{handler.terminator}")
            handler.acquire()
            try:
                handler.stream.write(line)
                handler.flush()
            except Exception:  # noqa: BLE001 - as logging does: a full disk must not stop answers
                pass
            finally:
                handler.release()
            return
        # Handed to the handlers directly: no search of the call stack for the caller's file and
        # line, which no line shows.
        to.handle(to.makeRecord(to.name, level, "", 0, "event=%s %s", (event, body), None))


def _own_handler(level: int) -> Optional[logging.StreamHandler]:
    """The handler setup_logging installed, when it alone takes this logger's lines unfiltered."""
    if log.handlers or log.filters or not log.propagate:
        return None
    parent = log.parent
    if parent is None or parent.propagate or parent.filters or len(parent.handlers) != 1:
        return None
    handler = parent.handlers[0]
    if (type(handler) not in (logging.FileHandler, logging.StreamHandler) or handler.filters
            or type(handler.formatter) is not KVFormatter or level < handler.level
            or getattr(handler, "stream", None) is None):
        return None
    return handler  # type: ignore[return-value]


def setup_logging(level: str = "info", log_file: Optional[str] = None) -> None:
    handler: logging.Handler = (logging.FileHandler(log_file) if log_file
                                else logging.StreamHandler(sys.stderr))
    handler.setFormatter(KVFormatter())
    root = logging.getLogger("perfcast")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    root.propagate = False
    # The launch parser and the predictor log under their own module names; route them through
    # the same formatter (a parser bug's traceback must not quote the script).
    for name in ("slurm_plugin", "predictor"):
        other = logging.getLogger(name)
        other.handlers[:] = [handler]
        other.setLevel(root.level)
        other.propagate = False


def log_fds() -> set[int]:
    """File descriptors the log handlers write to (a worker process keeps these open)."""
    fds: set[int] = set()
    for name in ("perfcast", "slurm_plugin", "predictor", ""):
        for h in logging.getLogger(name or None).handlers:
            stream = getattr(h, "stream", None)
            try:
                if stream is not None:
                    fds.add(stream.fileno())
            except (OSError, ValueError, AttributeError):
                pass
    return fds
