"""The two line-continuation slips that make a batch script's launch lose its flags without a word
from bash: a ``\\`` followed by a space (it escapes the space, so the line ends there) and a
commented-out flag inside a continued command (the comment ends the command at its newline).  Both
leave the flags after them as commands of their own; the job then runs with defaults, or the reader
misses a flag the user can see in the script.  Found by a linear scan of the text (string tests,
a regex only on the line after a slip), reported as warnings and named in a parse error's message."""
from __future__ import annotations

import re

_FLAG_LINE = re.compile(r"\s*-{1,2}[A-Za-z]")
MAX_SLIPS = 3


def continuation_slips(text: str, label: str) -> list[str]:
    """One line per slip (at most :data:`MAX_SLIPS`): where, and what bash does with it.  Only
    where a flag follows, so a heredoc's backslashes or a comment between commands say nothing.
    String tests only, no regex search per line: a 1 MiB script of comments stays cheap."""
    if "\\" not in text:
        return []
    lines = text.split("\n")
    out: list[str] = []
    for i, line in enumerate(lines):
        if "\\" not in line:
            continue
        if line.lstrip().startswith("#"):
            prev = lines[i - 1] if i else ""
            if _continues(line) and _continues(prev) and not prev.lstrip().startswith("#"):
                out.append(f"{label}:{i + 1}: a commented-out line inside a command continued with '\\' ends "
                           "the command; the lines after it run as commands of their own")
        else:
            bare = line.rstrip(" \t")
            if bare != line and _continues(bare) and i + 1 < len(lines) and _FLAG_LINE.match(lines[i + 1]):
                out.append(f"{label}:{i + 1}: a space after the '\\' ends the command there; the lines after it "
                           "run as commands of their own (delete the space)")
        if len(out) >= MAX_SLIPS:
            break
    return out


def _continues(line: str) -> bool:
    """Ends with one '\\' (not an escaped backslash): a line continuation."""
    return line.endswith("\\") and not line.endswith("\\\\")
