"""Values that flow from the shell into framework parsers: known text, unknowns, and their origin.

Unknowable shell values (``$(scontrol …)``, an unreadable sourced file) are carried inside ordinary
strings as a private-use marker ``\\ue000N\\ue001``: concatenation, splitting and substitution then
need no special cases, and whoever finally reads a job key can ask why it is unknown.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

MARK_OPEN = "\ue000"
MARK_CLOSE = "\ue001"
_MARK_RE = re.compile("\ue000(\\d+)\ue001")
_MAX_UNKNOWNS = 10_000


def sanitize_text(text: str) -> str:
    """Input text must not forge markers."""
    if MARK_OPEN in text or MARK_CLOSE in text:
        text = text.replace(MARK_OPEN, "\ufffd").replace(MARK_CLOSE, "\ufffd")
    return text


class Unknowns:
    """Registry of unknown values: marker index -> (reason, may_be_empty)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.nonempty: list[bool] = []

    def new(self, reason: str, nonempty: bool = False) -> str:
        if len(self.reasons) >= _MAX_UNKNOWNS:
            idx = len(self.reasons) - 1  # reuse: the budget of distinct reasons is spent
        else:
            self.reasons.append(reason)
            self.nonempty.append(nonempty)
            idx = len(self.reasons) - 1
        return f"{MARK_OPEN}{idx}{MARK_CLOSE}"

    @staticmethod
    def has(text: str) -> bool:
        return MARK_OPEN in text

    def reason(self, text: str) -> Optional[str]:
        m = _MARK_RE.search(text)
        if not m:
            return None
        return self.reasons[int(m.group(1))]

    def known_nonempty(self, text: str) -> Optional[bool]:
        """True/False when emptiness is known, None when not."""
        if not text:
            return False
        rest = _MARK_RE.sub("", text)
        if rest:
            return True
        return True if all(self.nonempty[int(i)] for i in _MARK_RE.findall(text)) else None

    @staticmethod
    def strip(text: str) -> str:
        return _MARK_RE.sub("?", text)


@dataclass
class Fact:
    """One value for a job key as found in a script or config, with where it came from.

    ``unknown`` holds the reason when the value could not be known statically.
    """

    value: Any
    origin: str
    unknown: Optional[str] = None


Seg = tuple  # (text, origin "file:line")


class Tok:
    """One argument of an evaluated command line, with the origin of each of its pieces."""

    __slots__ = ("text", "segs")

    def __init__(self, text: str, segs: list):
        self.text = text
        self.segs = segs

    @classmethod
    def of(cls, segs: list) -> "Tok":
        if len(segs) == 1:
            return cls(segs[0][0], segs)
        return cls("".join([s[0] for s in segs]), segs)

    def origin_at(self, offset: int = 0) -> str:
        """Origin of the character at ``offset`` (the first non-empty piece at or after it)."""
        if len(self.segs) == 1:
            return self.segs[0][1]
        pos = 0
        last = ""
        for text, origin in self.segs:
            last = origin
            if text and pos + len(text) > offset:
                return origin
            pos += len(text)
        return last

    def __repr__(self) -> str:
        return f"Tok({self.text!r})"
