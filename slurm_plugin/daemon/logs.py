"""perf-predictd's log: one ``key=value`` line per event, for grep and journald.

Nothing a user wrote or a file contained goes into a line: events carry numbers, codes, paths of
the admin's own files and the like.  Exceptions are rendered as their type and the code locations
of the traceback only, because an exception's message may quote the data it choked on (a config
value, a line of a script).
"""
from __future__ import annotations

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
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts += f".{int(record.msecs):03d}Z"
        line = f"{ts} level={record.levelname.lower()} {record.getMessage()}"
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
    text = value if type(value) is str else str(value)
    if text and text.isprintable() and _QUOTE.search(text) is None:
        return text
    return json.dumps(text)


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    if log.isEnabledFor(level):
        # Handed to the handlers directly: no search of the call stack for the caller's file and
        # line, which no line shows (this runs twice per submission).
        log.handle(log.makeRecord(log.name, level, "", 0, "event=%s %s",
                                  (event, " ".join([f"{k}={kv(v)}" for k, v in fields.items()])),
                                  None))


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
