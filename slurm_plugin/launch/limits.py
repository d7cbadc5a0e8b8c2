"""Bounds on everything the launch parser does, and the one exception that stops it.

A batch script is untrusted input that reaches a daemon sitting next to slurmctld: every loop,
recursion, file and string has a ceiling here, so that garbage, bombs and loops end quickly with
a one-line reason instead of a hang or a traceback.
"""
from __future__ import annotations

import time

MAX_FILE_BYTES = 4 << 20          # any file we read (scripts, sourced files)
MAX_CONFIG_BYTES = 1 << 20        # YAML / JSON configs: real ones are < 50 KiB; parsing is the slow part
MAX_SOURCED_FILES = 64            # `source` / `.` / bash FILE, counted over the whole run
MAX_CALL_DEPTH = 24               # nested source / function / bash -c / eval / $( )
MAX_PARSE_DEPTH = 64              # nested $( ( { ${ while parsing
MAX_COMMANDS = 4_000              # simple commands executed (real launch scripts: a few hundred)
MAX_LOOP_ITERATIONS = 5_000       # over all loops of a run
MAX_VALUE_CHARS = 256 << 10       # one variable / word
MAX_VFS_BYTES = 1 << 20           # one file written by the script (heredoc, echo >>)
MAX_VFS_FILES = 256
MAX_ARRAY_ITEMS = 10_000
MAX_COMMAND_WORDS = 10_000        # words of one simple command (real launch lines: a few hundred)
MAX_CONFIG_NODES = 50_000         # YAML/JSON nodes visited (alias bombs hit this)
MAX_CONFIG_DEPTH = 64
MAX_ARITH_DEPTH = 32              # a variable whose value is an expression naming a variable ...
MAX_RAMPUP_LEVELS = 1_000_000
DEFAULT_DEADLINE_S = 0.06         # last-resort wall clock (typical scripts take 1–3 ms, p99 4 ms);
                                  # the slowest loop between two clock checks can add ~40 ms


class CannotPredict(Exception):
    """Stops the parse: ``str(exc)`` is the reason and ``where`` the ``file:line`` it concerns."""

    def __init__(self, reason: str, where: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.where = where

    def line(self) -> str:
        return f"cannot predict: {self.reason}" + (f" ({self.where})" if self.where else "")


class Budget:
    """Shared counters and a deadline for one parse_script call."""

    __slots__ = ("deadline", "commands", "loops", "sourced", "_tick")

    def __init__(self, seconds: float = DEFAULT_DEADLINE_S):
        self.deadline = time.monotonic() + seconds
        self.commands = 0
        self.loops = 0
        self.sourced = 0
        self._tick = 0

    def check_time(self, where: str = "") -> None:
        if time.monotonic() > self.deadline:
            raise CannotPredict("the script took too long to evaluate", where)

    def command(self, where: str) -> None:
        self.commands += 1
        if self.commands > MAX_COMMANDS:
            raise CannotPredict(f"more than {MAX_COMMANDS} shell commands to evaluate", where)
        if self.commands & 63 == 0:
            self.check_time(where)

    def loop(self, where: str) -> bool:
        """Count one loop iteration; False once the run's loop budget is spent."""
        self.loops += 1
        if self.loops & 63 == 0:
            self.check_time(where)
        return self.loops <= MAX_LOOP_ITERATIONS

    def tick(self, where: str = "") -> None:
        """Cheap periodic deadline check for tight loops (parser, config walk)."""
        self._tick += 1
        if self._tick & 255 == 0:
            self.check_time(where)

    def tick_n(self, count: int, where: str = "") -> None:
        """``count`` ticks at once (the clock read if they pass a multiple of 256)."""
        before = self._tick
        self._tick += count
        if before >> 8 != self._tick >> 8:
            self.check_time(where)

    def tick_at(self, label: str, line: int) -> None:
        """tick() at ``label:line``, the place formatted only when the clock is read."""
        self._tick += 1
        if self._tick & 255 == 0:
            self.check_time(f"{label}:{line}")

# Unknown config keys that get a "did you mean" look-up (difflib over the known names) per file
MAX_KEY_SUGGESTIONS = 64
# OmegaConf ${...} interpolations followed for one NeMo value (a chain longer than this is a loop)
MAX_INTERPOLATION_DEPTH = 16
