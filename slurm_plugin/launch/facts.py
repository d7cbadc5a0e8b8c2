"""Framework-neutral facts about a job, each with its origin, gathered before derivation.

Framework readers (neox.py, deepspeed.py, megatron.py) and the launcher reader fill one
:class:`Facts`; derive.py turns it into the job dict. Keys are short names (``layers``, ``tp``,
``global_batch``…), documented in derive.py.
"""
from __future__ import annotations

from typing import Any, Optional

from .configs import to_int, to_number
from .values import MARK_OPEN, Fact, Tok, Unknowns


class Facts:
    def __init__(self, unknowns: Unknowns):
        self.u = unknowns
        self.d: dict[str, Fact] = {}
        self.warnings: list[str] = []
        # reason why keys we did not find may still be set somewhere we cannot see
        self.hidden_args: Optional[str] = None

    def set(self, key: str, value: Any, origin: str, unknown: Optional[str] = None) -> None:
        self.d[key] = Fact(value, origin, unknown)

    def set_unknown(self, key: str, reason: str, origin: str) -> None:
        self.d[key] = Fact(None, origin, reason)

    def get(self, key: str) -> Optional[Fact]:
        return self.d.get(key)

    def known(self, key: str) -> bool:
        f = self.d.get(key)
        return f is not None and f.unknown is None and f.value is not None

    def val(self, key: str, default: Any = None) -> Any:
        f = self.d.get(key)
        return default if f is None or f.unknown is not None or f.value is None else f.value

    def origin(self, key: str, default: str = "") -> str:
        f = self.d.get(key)
        return f.origin if f is not None else default

    # ---- conversions from command-line tokens
    def set_int(self, key: str, tok: Tok, offset: int = 0, what: str = "") -> None:
        text = tok.text[offset:]
        if len(text) <= 15 and text.isdigit() and text.isascii():
            # set_int_value's common case: a plain decimal word (most often of one piece)
            segs = tok.segs
            self.d[key] = Fact(int(text), segs[0][1] if len(segs) == 1 else tok.origin_at(offset))
            return
        self.set_int_value(key, text, tok.origin_at(offset), what)

    def set_int_value(self, key: str, value: Any, origin: str, what: str = "") -> None:
        """A command-line word or a config value as an integer fact; an unknown or malformed
        one is recorded as unknown, with the reason (and a warning for a malformed one)."""
        if isinstance(value, str) and MARK_OPEN in value:
            self.set_unknown(key, self.u.reason(value) or "unknown", origin)
            return
        n = to_int(value)
        if n is None:
            shown = str(value)[:40]
            num = to_number(value)
            what_it_is = "not an integer" if num is None or (isinstance(num, float) and not num.is_integer()) \
                else "too large for any job"
            self.warnings.append(f"{what or key}: {shown!r} is {what_it_is} ({origin})")
            self.set_unknown(key, f"{what or key} is {shown!r}, {what_it_is}", origin)
            return
        if type(value) is str:
            try:
                int(value)
            except ValueError:
                # "2e5", "4.0": argparse's int() (the launchers' flags) refuses them, and a config
                # check that wants an int stops on the string; the number meant is still read.
                self.warnings.append(f"{what or key} {value!r}: Python's int() refuses it (argparse and "
                                     f"the frameworks' config checks stop at start); read as {n} ({origin})")
        self.set(key, n, origin)

    def set_str(self, key: str, tok: Tok, offset: int = 0) -> None:
        text = tok.text[offset:]
        origin = tok.origin_at(offset)
        if MARK_OPEN in text:
            self.set_unknown(key, self.u.reason(text) or "unknown", origin)
            return
        self.set(key, text, origin)
