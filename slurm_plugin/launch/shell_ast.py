"""Syntax tree of the shell subset we read (see shell_parse.py for the grammar we accept)."""
from __future__ import annotations

from typing import Any, Optional


class Lit:
    __slots__ = ("text", "line", "quoted")

    def __init__(self, text: str, line: int, quoted: bool):
        self.text, self.line, self.quoted = text, line, quoted


class Param:
    """$X / ${X op arg} / ${A[i]} / ${#X} / $@ ..."""

    __slots__ = ("name", "op", "arg", "arg2", "index", "quoted", "line")

    def __init__(self, name: str, line: int, quoted: bool, op: Optional[str] = None,
                 arg: Optional[list] = None, arg2: Optional[list] = None, index: Optional[list] = None):
        self.name, self.line, self.quoted = name, line, quoted
        self.op, self.arg, self.arg2, self.index = op, arg, arg2, index


class CmdSub:
    __slots__ = ("body", "line", "quoted")

    def __init__(self, body: list, line: int, quoted: bool):
        self.body, self.line, self.quoted = body, line, quoted


class Arith:
    __slots__ = ("expr", "line", "quoted")

    def __init__(self, expr: list, line: int, quoted: bool):
        self.expr, self.line, self.quoted = expr, line, quoted


class ProcSub:
    __slots__ = ("line", "quoted")

    def __init__(self, line: int):
        self.line, self.quoted = line, False


Word = list  # of Lit | Param | CmdSub | Arith | ProcSub


class Node:
    __slots__ = ("line",)


class Assign(Node):
    __slots__ = ("name", "index", "append", "value", "array")

    def __init__(self, name: str, index: Optional[str], append: bool, value: Optional[Word],
                 array: Optional[list], line: int):
        self.name, self.index, self.append, self.value, self.array, self.line = \
            name, index, append, value, array, line


class Redir(Node):
    __slots__ = ("op", "fd", "target", "heredoc")

    def __init__(self, op: str, fd: Optional[int], target: Optional[Word], line: int):
        self.op, self.fd, self.target, self.line = op, fd, target, line
        self.heredoc: Optional[Word] = None


class Simple(Node):
    __slots__ = ("assigns", "words", "redirs")

    def __init__(self, assigns: list, words: list, redirs: list, line: int):
        self.assigns, self.words, self.redirs, self.line = assigns, words, redirs, line


class Pipeline(Node):
    __slots__ = ("cmds", "negate")

    def __init__(self, cmds: list, negate: bool, line: int):
        self.cmds, self.negate, self.line = cmds, negate, line


class AndOr(Node):
    __slots__ = ("items",)   # [(None|'&&'|'||', Pipeline)]

    def __init__(self, items: list, line: int):
        self.items, self.line = items, line


class If(Node):
    __slots__ = ("clauses", "else_body")

    def __init__(self, clauses: list, else_body: Optional[list], line: int):
        self.clauses, self.else_body, self.line = clauses, else_body, line


class For(Node):
    __slots__ = ("var", "items", "body")

    def __init__(self, var: str, items: Optional[list], body: list, line: int):
        self.var, self.items, self.body, self.line = var, items, body, line


class ArithFor(Node):
    __slots__ = ("init", "cond", "step", "body")

    def __init__(self, init: Word, cond: Word, step: Word, body: list, line: int):
        self.init, self.cond, self.step, self.body, self.line = init, cond, step, body, line


class While(Node):
    __slots__ = ("cond", "body", "until")

    def __init__(self, cond: list, body: list, until: bool, line: int):
        self.cond, self.body, self.until, self.line = cond, body, until, line


class Case(Node):
    __slots__ = ("word", "items")

    def __init__(self, word: Word, items: list, line: int):
        self.word, self.items, self.line = word, items, line


class FuncDef(Node):
    __slots__ = ("name", "body")

    def __init__(self, name: str, body: Any, line: int):
        self.name, self.body, self.line = name, body, line


class Group(Node):
    __slots__ = ("body", "subshell")

    def __init__(self, body: list, subshell: bool, line: int):
        self.body, self.subshell, self.line = body, subshell, line


class ArithCmd(Node):
    __slots__ = ("expr",)

    def __init__(self, expr: Word, line: int):
        self.expr, self.line = expr, line


class Cond(Node):
    """[[ ... ]]: the words between the brackets."""

    __slots__ = ("words",)

    def __init__(self, words: list, line: int):
        self.words, self.line = words, line
