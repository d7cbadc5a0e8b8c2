"""Bash arithmetic ($(( )), (( )), let, array indexes): 64-bit integers, C operators, ternaries.

Variables are read through a callback; a variable whose value is itself an expression is
evaluated recursively (as bash does), to a bounded depth. Numbers may carry underscores
(``220_000_000``): bash rejects them, but launch scripts pass them on to Python, so we accept
them and let the caller warn.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

from .limits import MAX_ARITH_DEPTH
from .values import MARK_OPEN

_MASK = (1 << 64) - 1


def _wrap(v: int) -> int:
    v &= _MASK
    return v - (1 << 64) if v >> 63 else v


class ArithError(Exception):
    pass


class ArithUnknown(Exception):
    """The expression reads a value that is not known statically; ``text`` holds its marker."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


_TOKEN = re.compile(r"""\s*(?:
    (?P<num>0[xX][0-9a-fA-F_]+|\d+\#[0-9a-zA-Z@_]+|\d[\d_]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\*\*=|<<=|>>=|\+\+|--|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||\+=|-=|\*=|/=|%=|&=|\^=|\|=|[-+*/%<>&|^!~?:=(),\[\]])
  | (?P<mark>\ue000\d+\ue001)
)""", re.X)

_BINARY = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, ">": 7, "<=": 7, ">=": 7,
    "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10, "**": 11,
}
_ASSIGN_OPS = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "^=", "|=", "**="}


def tokenize(text: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ArithError(f"syntax error near {text[pos:pos + 10]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
        if len(out) > 10_000:
            raise ArithError("expression too long")
    return out


def parse_number(tok: str) -> int:
    t = tok.replace("_", "")
    try:
        if t[:2] in ("0x", "0X"):
            return int(t[2:], 16)
        if "#" in t:
            base, digits = t.split("#", 1)
            b = int(base)
            if not 2 <= b <= 36:
                raise ArithError(f"invalid base {b}")
            return int(digits, b)
        if len(t) > 1 and t[0] == "0":
            return int(t, 8)
        return int(t)
    except ValueError:
        raise ArithError(f"invalid number {tok!r}") from None


class Evaluator:
    """Evaluate one expression. ``get(name)`` -> str or None; ``put(name, value)`` stores."""

    def __init__(self, get: Callable[[str], Optional[str]], put: Callable[[str, int], None], depth: int = 0):
        self.get, self.put, self.depth = get, put, depth
        self.used_underscore = False

    def evaluate(self, text: str) -> int:
        if self.depth > MAX_ARITH_DEPTH:
            raise ArithError("expression recursion too deep")
        if not text.strip():
            return 0
        self.toks = tokenize(text)
        self.i = 0
        v = self._comma()
        if self.i != len(self.toks):
            raise ArithError(f"syntax error near {self.toks[self.i][1]!r}")
        return v

    # --------------------------------------------------------------- recursive descent
    def _peek(self) -> Optional[tuple[str, str]]:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _take(self, op: str) -> bool:
        t = self._peek()
        if t and t[0] == "op" and t[1] == op:
            self.i += 1
            return True
        return False

    def _comma(self) -> int:
        v = self._assign()
        while self._take(","):
            v = self._assign()
        return v

    def _assign(self) -> int:
        t = self._peek()
        if t and t[0] == "name" and self.i + 1 < len(self.toks):
            nxt = self.toks[self.i + 1]
            if nxt[0] == "op" and nxt[1] in _ASSIGN_OPS:
                name = t[1]
                self.i += 2
                rhs = self._assign()
                if nxt[1] == "=":
                    v = rhs
                else:
                    v = self._binop(nxt[1][:-1], self._var(name), rhs)
                v = _wrap(v)
                self.put(name, v)
                return v
        return self._ternary()

    def _ternary(self) -> int:
        c = self._binary(1)
        if self._take("?"):
            a = self._assign()
            if not self._take(":"):
                raise ArithError("expected ':' in ternary")
            b = self._assign()
            return a if c else b
        return c

    def _binary(self, prec: int) -> int:
        left = self._unary()
        while True:
            t = self._peek()
            if not t or t[0] != "op" or t[1] not in _BINARY or _BINARY[t[1]] < prec:
                return left
            op = t[1]
            p = _BINARY[op]
            self.i += 1
            # ** is right-associative; the others left
            right = self._binary(p if op == "**" else p + 1)
            left = _wrap(self._binop(op, left, right))

    @staticmethod
    def _binop(op: str, a: int, b: int) -> int:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op in ("/", "%"):
            if b == 0:
                raise ArithError("division by 0")
            q = abs(a) // abs(b)
            if (a < 0) != (b < 0):
                q = -q
            return q if op == "/" else a - q * b
        if op == "**":
            if b < 0:
                raise ArithError("exponent less than 0")
            return pow(a, b, 1 << 64)
        if op == "<<":
            return a << (b & 63)
        if op == ">>":
            return a >> (b & 63)
        if op == "&":
            return a & b
        if op == "|":
            return a | b
        if op == "^":
            return a ^ b
        if op == "&&":
            return int(bool(a) and bool(b))
        if op == "||":
            return int(bool(a) or bool(b))
        if op == "==":
            return int(a == b)
        if op == "!=":
            return int(a != b)
        if op == "<":
            return int(a < b)
        if op == ">":
            return int(a > b)
        if op == "<=":
            return int(a <= b)
        if op == ">=":
            return int(a >= b)
        raise ArithError(f"unknown operator {op}")

    def _unary(self) -> int:
        t = self._peek()
        if t is None:
            raise ArithError("unexpected end of expression")
        if t[0] == "op":
            op = t[1]
            if op in ("+", "-", "!", "~"):
                self.i += 1
                v = self._unary()
                return {"+": v, "-": _wrap(-v), "!": int(not v), "~": _wrap(~v)}[op]
            if op in ("++", "--"):
                self.i += 1
                n = self._peek()
                if not n or n[0] != "name":
                    raise ArithError(f"{op} needs a variable")
                self.i += 1
                v = _wrap(self._var(n[1]) + (1 if op == "++" else -1))
                self.put(n[1], v)
                return v
        return self._postfix()

    def _postfix(self) -> int:
        t = self._peek()
        self.i += 1
        kind, val = t
        if kind == "num":
            if "_" in val:
                self.used_underscore = True
            return _wrap(parse_number(val))
        if kind == "mark":
            raise ArithUnknown(val)
        if kind == "name":
            if self._take("["):
                # array element inside arithmetic: evaluate the index, read NAME[i]
                idx = self._comma()
                if not self._take("]"):
                    raise ArithError("expected ']'")
                return self._var(f"{val}[{idx}]")
            n = self._peek()
            if n and n[0] == "op" and n[1] in ("++", "--"):
                self.i += 1
                v = self._var(val)
                self.put(val, _wrap(v + (1 if n[1] == "++" else -1)))
                return v
            return self._var(val)
        if val == "(":
            v = self._comma()
            if not self._take(")"):
                raise ArithError("expected ')'")
            return v
        raise ArithError(f"syntax error near {val!r}")

    def _var(self, name: str) -> int:
        raw = self.get(name)
        if raw is None or raw.strip() == "":
            return 0
        if MARK_OPEN in raw:
            raise ArithUnknown(raw)
        s = raw.strip()
        if re.fullmatch(r"-?\d[\d_]*", s):
            if "_" in s:
                self.used_underscore = True
            neg = s.startswith("-")
            v = parse_number(s.lstrip("-"))
            return _wrap(-v if neg else v)
        sub = Evaluator(self.get, self.put, self.depth + 1)
        v = sub.evaluate(s)
        self.used_underscore |= sub.used_underscore
        return v
