"""Errors the predictor raises on bad input.

Every error a user can trigger is a :class:`PerfcastError`; the CLIs turn it into one line and
exit code 2, never a traceback.  Each one names *where* the problem is (a job key, a file, a
bundle member), because "invalid value" alone does not let a user fix anything.
"""
from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn, Optional, Sequence


# Two names this close to a typo are both offered: ``micro_batchs`` is 0.960 from ``micro_batches``
# and 0.957 from ``micro_batch``, and naming only one would pick for the user.
_TIE_RATIO = 0.02


def did_you_mean(name: str, known: Any) -> str:
    """" (did you mean 'x'?)" for the known name nearest ``name`` ("" when none is near), or
    " (did you mean 'x' or 'y'?)" when a second is as near within ``_TIE_RATIO``: the hint every
    "unknown key" error of the predictor ends with."""
    close = difflib.get_close_matches(str(name), list(known), n=2)
    if not close:
        return ""
    if len(close) == 2:
        ratios = [difflib.SequenceMatcher(None, str(name), c).ratio() for c in close]
        if ratios[0] - ratios[1] <= _TIE_RATIO:
            return f" (did you mean {close[0]!r} or {close[1]!r}?)"
    return f" (did you mean {close[0]!r}?)"


class PerfcastError(Exception):
    """Base class of every error meant for a user (exit code 2 in the CLIs)."""


class JobError(PerfcastError, ValueError):
    """A training job that cannot be predicted: unknown key, wrong type, impossible layout.

    ``key`` is the dotted job key at fault (``layout.tp``), or ``""`` when the whole job is.
    """

    def __init__(self, key: str, message: str, source: str = ""):
        self.key = key
        self.source = source
        self.reason = message
        where = f"{source}: " if source else ""
        text = f"{where}{key}: {message}" if key else f"{where}{message}"
        super().__init__(text)


class BundleError(PerfcastError):
    """A compute bundle or platform that is missing, corrupt, tampered with, or incomplete."""


class PlatformNotFound(BundleError):
    """No platform of that name or path."""


class UsageError(PerfcastError):
    """Bad command-line input: one line to the user, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad option as a :class:`UsageError` (one line, exit 2), not usage + error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


class RunRecordError(PerfcastError):
    """A measured-run record (a platform's ``[[validation]]`` or a runs file) that cannot be used."""


def wants_json(argv: Optional[Sequence[str]]) -> bool:
    """Whether a command line asks for ``--json`` (before ``--``): read without argparse, so that
    an error argparse itself raises is still answered in JSON."""
    for arg in argv or ():
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def error_document(exc: BaseException, exit_code: int) -> dict[str, Any]:
    """What a ``--json`` command prints on stdout when it fails: ``{"error": {...}}`` with the
    same message as its one line on stderr, the error's type (``job_error``, ``usage_error``,
    ``platform_not_found``, ...) and, for a job error, the job key and file at fault; a script
    reading stdout then gets one JSON object whether the command worked or not."""
    kind = re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()
    err: dict[str, Any] = {"type": kind, "message": str(exc), "exit_code": exit_code}
    if isinstance(exc, JobError):
        err["key"] = exc.key
        err["source"] = exc.source
    return {"error": err}
