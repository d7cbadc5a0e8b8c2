"""The two line-continuation slips that make a batch script's launch lose its flags without a word
from bash: a ``\\`` followed by a space (it escapes the space, so the line ends there) and a
commented-out flag inside a continued command (the comment ends the command at its newline).  Both
leave the flags after them as commands of their own; the job then runs with defaults, or the reader
misses a flag the user can see in the script.  Found by two regex searches of the whole text,
reported as warnings and named in a parse error's message."""
from __future__ import annotations

import re

MAX_SLIPS = 3
# Places that look like a slip but are not one (inside a comment, an escaped '\\') looked at before
# the scan gives up: a script of a million of them costs milliseconds, not seconds.
MAX_LOOKS = 1000

# A '\' then spaces or tabs to the line's end, and a next line that starts with a flag: bash ends
# the command there (a slip unless the line is a comment or the '\' is escaped).
_SPACE_SLIP = re.compile(r"\\[ \t]+\n(?=[^\S\n]*-{1,2}[A-Za-z])")
# A '\' ending a line, then a comment line that ends in '\' too: the comment ends the command (a
# slip unless the first line is a comment or either '\' is escaped).
_COMMENT_SLIP = re.compile(r"\\\n[^\S\n]*#[^\n]*\\$", re.M)


def continuation_slips(text: str, label: str) -> list[str]:
    """One line per slip (at most :data:`MAX_SLIPS`, the first in the text): where, and what bash
    does with it.  Only where a flag follows, so a heredoc's backslashes or a comment between
    commands say nothing.  Each search starts at a '\\' (a fast scan in C) and only its matches are
    looked at in Python: a 3 MiB script of 400,000 continued lines took 120-190 ms when every line
    was, past the parse's deadline."""
    if "\\" not in text:
        return []
    found: list[tuple[int, str]] = []
    for m in _slips(_SPACE_SLIP, text):
        line = text.count("\n", 0, m.start()) + 1
        found.append((line, f"{label}:{line}: a space after the '\\' ends the command there; the lines after it "
                            "run as commands of their own (delete the space)"))
    for m in _slips(_COMMENT_SLIP, text):
        line = text.count("\n", 0, m.end()) + 1          # the comment line, where the match ends
        found.append((line, f"{label}:{line}: a commented-out line inside a command continued with '\\' ends "
                            "the command; the lines after it run as commands of their own"))
    return [msg for _line, msg in sorted(found)[:MAX_SLIPS]]


def _slips(pattern: re.Pattern, text: str) -> list[re.Match]:
    """The first :data:`MAX_SLIPS` matches of ``pattern`` that are slips (the first slips overall
    are among each kind's first), looking at no more than :data:`MAX_LOOKS` matches."""
    out = []
    for looked, m in enumerate(pattern.finditer(text)):
        if looked >= MAX_LOOKS:
            break
        start, end = m.start(), m.end()
        first_line = text[text.rfind("\n", 0, start) + 1:start]
        if first_line.endswith("\\") or first_line.lstrip().startswith("#"):
            continue      # an escaped '\', or the continued line is itself a comment
        if pattern is _COMMENT_SLIP and text[end - 2] == "\\":
            continue      # the comment line ends in an escaped '\'
        out.append(m)
        if len(out) >= MAX_SLIPS:
            break
    return out
