"""A small, safe evaluator for the bash that launch scripts are written in.

It runs the *shell* part of a batch script symbolically: variables, exports, arrays, ``${…}``
operators, arithmetic, if/case over known values, loops over known lists, functions, ``source``,
heredocs written to files, ``bash -c`` strings. It never runs a program: every external command is
either recognised as the training launch (recorded with the environment it would see) or treated
as opaque, and whatever its output feeds becomes an *unknown* value (see values.py) that carries
the reason — never a silent guess.
"""
from __future__ import annotations

import logging
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import launchers
from .arith import ArithError, ArithUnknown, Evaluator
from .configs import key_origin
from .files import ReadFile, decode_text, join_path, os_reason, valid_unicode
from .limits import (MAX_ARRAY_ITEMS, MAX_CALL_DEPTH, MAX_SOURCED_FILES, MAX_VALUE_CHARS, MAX_VFS_BYTES,
                     MAX_VFS_FILES, Budget, CannotPredict)
from .shell_ast import (AndOr, Arith, ArithCmd, ArithFor, Assign, Case, CmdSub, Cond, For, FuncDef, Group,
                        If, Lit, Param, Pipeline, ProcSub, Simple, While)
from .shell_parse import Parser
from .values import MARK_OPEN, Tok, Unknowns, sanitize_text

log = logging.getLogger(__name__)

_WS = re.compile(r"[ \t\n]+")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")

# Commands that change nothing we model; they succeed.
_NOOPS = {
    ":", "true", "mkdir", "rm", "touch", "module", "ml", "conda", "ulimit", "trap", "wait", "sleep",
    "umask", "set", "shopt", "alias", "unalias", "hash", "type", "chmod", "chown", "ln", "mv",
    "history", "disown", "nvidia-smi", "sync", "clear", "logger", "micromamba", "mamba", "spack",
    "echo_err", "setopt", "rocm-smi", "lfs", "env_parallel", "srun_noop",
}

# Variables the job has without the script or the submitting environment setting them, so an
# expansion of one we do not know is never "not set": Slurm's own (SLURM_*, and the GPU lists
# slurmstepd exports), the MPI/PMI launchers', and those bash sets itself.
_SET_BY_RUNTIME = ("SLURM_", "SLURMD_", "SLURMSTEPD_", "PMI_", "PMIX_", "OMPI_", "BASH", "COMP_")
_SET_BY_BASH = frozenset((
    "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "HOME", "USER", "LOGNAME", "PATH",
    "SHELL", "HOSTNAME", "HOSTTYPE", "OSTYPE",
    "MACHTYPE", "RANDOM", "SRANDOM", "SECONDS", "LINENO", "PPID", "UID", "EUID", "GROUPS", "IFS", "PWD",
    "OLDPWD", "SHLVL", "EPOCHSECONDS", "EPOCHREALTIME", "OPTIND", "OPTARG", "OPTERR", "PS4", "SHELLOPTS",
    "DIRSTACK", "PIPESTATUS", "FUNCNAME", "HISTCMD", "REPLY"))
# Names a script assigns, read from its text (also in branches never taken and by builtins we do not
# model): `NAME=`, `NAME[i]=`, `NAME+=`, and the names after read/mapfile/getopts/printf -v/for/declare…
_ASSIGN_RE = re.compile(r"(?<![\w${!#.:/-])([A-Za-z_]\w*)(?:\[[^\]\n]*\])?\+?=")
_ASSIGN_CMD_RE = re.compile(r"\b(?:read|readarray|mapfile|getopts|printf|for|select|declare|typeset|local|export|"
                            r"readonly)\b([^\n;|&]*)")
_ASSIGN_CMD_NAME = re.compile(r"(?<![\w${!#.:/-])[A-Za-z_]\w*")
_MAX_UNSET = 64


@dataclass
class VFile:
    """A file the script writes (heredoc, echo >>): text, the origin of each line, or why unknown."""

    text: str = ""
    line_origins: list = field(default_factory=list)
    unknown: Optional[str] = None
    where: str = ""


class _Var:
    __slots__ = ("value", "array", "exported", "assoc")

    def __init__(self, value=None, array=None, exported=False, assoc=False):
        self.value = value          # list of segments, or None when the variable is an array
        self.array = array          # dict[str, list of segments] (keys: indexes as str)
        self.exported = exported
        self.assoc = assoc


class _Exit(Exception):
    pass


class _Return(Exception):
    pass


class _Break(Exception):
    def __init__(self, n: int, cont: bool):
        super().__init__()
        self.n, self.cont = n, cont


@dataclass
class Launch:
    """An external command that starts training, as the shell would run it."""

    toks: list
    where: str
    wrappers: list
    env: dict
    cwd: Optional[str]
    classified: object


class Shell:
    """One evaluation of a batch script (and what it sources)."""

    def __init__(self, *, budget: Budget, unknowns: Unknowns, read_file: ReadFile,
                 env: dict, cwd: Optional[str], warnings: list, home: Optional[str] = None,
                 env_whole: Optional[bool] = None):
        self.budget = budget
        self.u = unknowns
        self.read_file = read_file
        self.cwd = cwd
        self.warnings = warnings
        self.vars: dict[str, _Var] = {k: _Var([(v if v.isascii() else valid_unicode(v), origin)], None, True)
                                      for k, (v, origin) in env.items()}
        self.funcs: dict[str, tuple] = {}     # name -> (body, the file it was defined in)
        self.positional: list = []
        self.script_name = ""
        self.label = ""
        self.depth = 0
        self.status: Optional[int] = 0
        self.capture: list = []          # stack of output buffers for $( )
        self.capture_unknown: list = []  # reasons an enclosing $( ) is unknown
        self.vfs: dict[str, VFile] = {}
        self.launches: list[Launch] = []
        self.inner_batches: list[tuple[str, str, int]] = []   # (script, where sbatch is, its first line)
        self.wrapper_stack: list = []
        self.env_incomplete: Optional[str] = None
        self.local_frames: list = []
        self.probe_cache: dict[str, object] = {}
        self.unexported_child: Optional[set] = None
        self._warned: set = set()
        self._where_cache: dict = {}
        # Variables expanded while unset (see _unset_use). "Unset" needs the whole environment the
        # job starts with: perf-predict gives os.environ (it has PATH); the daemon gives only HOME,
        # USER, ... from passwd (cli_filter.lua sends no environment), where a name the script does
        # not set may well be exported by the user: there it is a warning, never an error.
        if env_whole is None:
            env_whole = "PATH" in env or not any(o == "environment" for _, o in env.values())
        self.env_whole = env_whole
        self.nounset = False                      # set -u / set -o nounset in force
        self._subshell = 0                        # in $( ), ( ), a pipeline stage, a child shell
        self._guess = 0                           # in a branch taken on a condition we cannot decide
        self.unset_uses: dict[str, str] = {}      # name -> where it was first expanded while unset
        # what an error after the script says of them (parse_script): an empty word that shifted a
        # launch's arguments is then the likely cause
        self.unset_warning = self.unset_clause = ""
        self._unset_stops: list = []              # [(name, where)] where set -u stops the script
        self._texts: set = set()                  # every text run (for the names the script assigns)
        self._assigned: Optional[tuple[int, set]] = None   # (texts scanned, the names they assign)

    # ================================================================== entry points
    def run(self, text: str, label: str, positional: Optional[list] = None) -> None:
        self.label = label
        self.script_name = label
        if positional is not None:
            self.positional = positional
        shebang = re.match(r"#![ \t]*\S*\b(?:ba)?sh[ \t]+(.*)", text)
        if shebang and any(re.fullmatch(r"-[a-zA-Z]*u[a-zA-Z]*", w) for w in shebang.group(1).split()):
            self.nounset = True                  # `#!/bin/bash -eu`: sbatch runs the script with it
        try:
            self._run_text(valid_unicode(text), label)
        except _Exit:
            pass
        except (_Return, _Break):
            pass
        except CannotPredict:
            self._raise_nounset()               # bash stopped before what we could not read
            raise
        self._raise_nounset()
        note = self.unset_note()
        if note is not None:
            self.warnings.append(note[0])
            self.unset_warning, self.unset_clause = note

    # ----------------------------------------------------------------- unset variables
    def _unset_use(self, name: str, line) -> None:
        """``$name`` was expanded while unset: remember where first, and whether set -u stops there."""
        if name in _SET_BY_BASH or name.startswith(_SET_BY_RUNTIME) or name in self.vars:
            return
        if name not in self.unset_uses and len(self.unset_uses) < _MAX_UNSET:
            self.unset_uses[name] = self.where(line)
        # bash -u stops the script here, unless the expansion is in a subshell (only that stops), on
        # a branch we guessed, or after the launch (the training has run by then)
        if self.nounset and not self._subshell and not self._guess and not self.launches \
                and len(self._unset_stops) < _MAX_UNSET:
            self._unset_stops.append((name, self.where(line)))

    def _assigned_names(self) -> set:
        # (asked by _raise_nounset and unset_vars after one run: the texts' scan is done once)
        if self._assigned is None or self._assigned[0] != len(self._texts):
            names: set = set()
            for text in self._texts:
                names.update(_ASSIGN_RE.findall(text))
                for args in _ASSIGN_CMD_RE.findall(text):
                    names.update(_ASSIGN_CMD_NAME.findall(args))
            self._assigned = (len(self._texts), names)
        return self._assigned[1] | set(self.vars)

    def unset_vars(self) -> list:
        """[(name, where first expanded)] of the variables read as empty because nothing sets them:
        not the script (anywhere in it), not the environment we were given."""
        if not self.unset_uses:
            return []
        assigned = self._assigned_names()
        return [(k, w) for k, w in self.unset_uses.items() if k not in assigned]

    def _raise_nounset(self) -> None:
        if not self._unset_stops or not self.env_whole:
            return
        assigned = self._assigned_names()
        for name, where in self._unset_stops:
            if name not in assigned:
                raise CannotPredict(f"${name} is not set ({where}) and the script runs with set -u: bash stops "
                                    f"there ('{name}: unbound variable'); set it in the script or export it "
                                    f"before sbatch (sbatch passes your environment)")

    def unset_note(self) -> Optional[tuple[str, str]]:
        """(the warning on the variables read as empty, the clause an error that follows the script
        says of them instead: parse_script); None when there are none."""
        got = self.unset_vars()
        if not got:
            return None
        named = [f"${k} ({w})" for k, w in got[:3]]
        listed = ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else named[0]
        if len(got) > 3:
            listed = ", ".join(named) + f" and {len(got) - 3} more"
        plural = len(got) > 1
        text = (f"{listed} {'are' if plural else 'is'} not set here and {'were' if plural else 'was'} read as "
                f"empty; sbatch passes your environment, so the job may see another value")
        stops = {k for k, _ in self._unset_stops}
        if any(k in stops for k, _ in got):
            text += "; the script runs with set -u: bash stops at the first one unless your environment sets it"
        clause = (f"(the script expands {listed}, which {'are' if plural else 'is'} not set here: read as empty)")
        return text, clause

    def _run_text(self, text: str, label: str, line_offset=0, origin_of_pos=None) -> None:
        self._texts.add(text)
        saved = self.label
        self.label = label
        parser = Parser(text, label, self.budget, line_offset=line_offset, depth=self.depth,
                        origin_of_pos=origin_of_pos)
        try:
            while True:
                node = parser.parse_next()
                if node is None:
                    break
                self.exec_node(node)
        finally:
            self.label = saved

    def warn(self, msg: str) -> None:
        if msg not in self._warned and len(self.warnings) < 200:
            self._warned.add(msg)
            self.warnings.append(msg)

    def where(self, line) -> str:
        if isinstance(line, str):
            return line
        key = (self.label, line)
        w = self._where_cache.get(key)
        if w is None:
            w = self._where_cache[key] = f"{self.label}:{line}"
        return w

    # ================================================================== variables
    def get_var(self, name: str) -> Optional[list]:
        v = self.vars.get(name)
        if v is None:
            if self.env_incomplete:
                return [(self.u.new(f"{name} is not set in the script; {self.env_incomplete}"), "")]
            return None
        if self.unexported_child is not None and name in self.unexported_child:
            self.warn(f"{name} is used inside a child shell but not exported; the real shell would see it "
                      f"empty (we use its value)")
        if v.value is not None:
            return v.value
        if v.array:
            return v.array.get("0", [])
        return []

    def set_var(self, name: str, value: list, where: str = "") -> None:
        if sum(len(s[0]) for s in value) > MAX_VALUE_CHARS:
            raise CannotPredict(f"the value of {name} grows beyond {MAX_VALUE_CHARS >> 10} KiB", where)
        v = self.vars.get(name)
        if v is None:
            self.vars[name] = _Var(value)
        else:
            if v.array is not None and v.value is None:
                v.array["0"] = value
            else:
                v.value = value

    def set_array(self, name: str, items: dict, assoc: bool = False) -> None:
        if len(items) > MAX_ARRAY_ITEMS:
            raise CannotPredict(f"array {name} has more than {MAX_ARRAY_ITEMS} items", self.label)
        v = self.vars.get(name)
        exported = v.exported if v else False
        self.vars[name] = _Var(None, items, exported, assoc)

    def text_of(self, name: str) -> Optional[str]:
        v = self.get_var(name)
        return None if v is None else "".join([s[0] for s in v])

    def snapshot_env(self) -> dict:
        out = {}
        for k, v in self.vars.items():
            val = v.value
            if val is None:
                val = (v.array.get("0") if v.array else None) or ()
            out[k] = val[0][0] if len(val) == 1 else "".join([s[0] for s in val])
        return out

    # ================================================================== execution
    def exec_body(self, body: list) -> Optional[int]:
        st: Optional[int] = 0
        for node in body:
            st = self.exec_node(node)
        return st

    def exec_node(self, node) -> Optional[int]:
        t = type(node)
        if t is AndOr:
            return self._and_or(node)
        if t is Pipeline:
            return self._pipeline(node)
        if t is Simple:
            return self._simple(node)
        if t is If:
            return self._if(node)
        if t is For:
            return self._for(node)
        if t is While:
            return self._while(node)
        if t is ArithFor:
            return self._arith_for(node)
        if t is Case:
            return self._case(node)
        if t is Group:
            if node.subshell:
                saved = (dict(self.vars), self.cwd, self.nounset)
                self._subshell += 1
                try:
                    return self.exec_body(node.body)
                except _Exit:
                    return 0
                finally:
                    self.vars, self.cwd, self.nounset = saved
                    self._subshell -= 1
            return self.exec_body(node.body)
        if t is FuncDef:
            self.funcs[node.name] = (node.body, self.label)   # its lines are that file's
            return 0
        if t is ArithCmd:
            v = self._arith_value(node.expr, node.line)
            if v is None:
                return None
            return 0 if v != 0 else 1
        if t is Cond:
            return self._status_of(self._eval_cond_words(node.words, node.line, double=True))
        raise CannotPredict(f"unsupported shell construct {t.__name__}", self.where(getattr(node, "line", 0)))

    def _and_or(self, node: AndOr) -> Optional[int]:
        st = self._pipeline(node.items[0][1])
        for op, pipe in node.items[1:]:
            if st is None:
                # An external command or an unknown test: assume success (the usual case of
                # `cmd || exit 1` and `[ … ] && X=…`); a test is worth a warning.
                if self._last_was_test:
                    self.warn(f"condition at {self.where(pipe.line)} depends on unknown values; "
                              f"assuming it holds")
                    if op == "&&":
                        st = self._guessed(self._pipeline, pipe)
                        continue
                st = 0
            if (op == "&&" and st == 0) or (op == "||" and st != 0):
                st = self._pipeline(pipe)
        return st

    _last_was_test = False

    def _pipeline(self, node: Pipeline) -> Optional[int]:
        st: Optional[int] = 0
        if len(node.cmds) == 1:
            st = self.exec_node(node.cmds[0])
        else:
            # Stages run in subshells; the first one is where a launch lives (`srun … | tee log`).
            for i, cmd in enumerate(node.cmds):
                saved = dict(self.vars), self.nounset
                self._subshell += 1
                try:
                    st = self.exec_node(cmd)
                except _Exit:
                    st = None
                finally:
                    self.vars, self.nounset = saved
                    self._subshell -= 1
        if node.negate:
            return None if st is None else (1 if st == 0 else 0)
        return st

    def _guessed(self, run: Callable[[Any], Any], node: Any) -> Any:
        """``run(node)`` on a branch taken on a condition we cannot decide (or a loop run once for
        an unknown count): set -u does not stop the script for what it expands there."""
        self._guess += 1
        try:
            return run(node)
        finally:
            self._guess -= 1

    def _if(self, node: If) -> Optional[int]:
        for cond, body in node.clauses:
            st = self.exec_body(cond)
            if st is None:
                self.warn(f"cannot decide the condition at {self.where(node.line)}; "
                          f"taking its branch as written first")
                return self._guessed(self.exec_body, body)
            if st == 0:
                return self.exec_body(body)
        if node.else_body is not None:
            return self.exec_body(node.else_body)
        return 0

    def _loop_body(self, body: list) -> Optional[bool]:
        """Run one iteration; True = break out, False = go on."""
        try:
            self.exec_body(body)
        except _Break as b:
            if b.n > 1:
                b.n -= 1
                raise
            return not b.cont
        return False

    def _symbolic_once(self, body: list, line: int, why: str) -> None:
        """A loop whose trip count is unknown: run the body once, then mark what it changed unknown."""
        before = {k: (v.value, v.array) for k, v in self.vars.items()}
        try:
            self._guessed(self._loop_body, body)
        except _Break:
            pass
        reason = f"set in a loop whose number of iterations is unknown ({why}, {self.where(line)})"
        for k, v in list(self.vars.items()):
            old = before.get(k)
            if old is None or old[0] is not v.value or old[1] is not v.array:
                mark = self.u.new(reason)
                self.vars[k] = _Var([(mark, self.where(line))], exported=v.exported)

    def _for(self, node: For) -> Optional[int]:
        if node.items is None:
            items = list(self.positional)
        else:
            items = []
            for w in node.items:
                items.extend(self.expand(w))
        if any(MARK_OPEN in "".join(s[0] for s in it) for it in items):
            reason = next(self.u.reason("".join(s[0] for s in it)) for it in items
                          if MARK_OPEN in "".join(s[0] for s in it))
            self.set_var(node.var, [(self.u.new(reason), self.where(node.line))])
            self._symbolic_once(node.body, node.line, f"the list holds an unknown value: {reason}")
            return 0
        for it in items:
            if not self.budget.loop(self.where(node.line)):
                raise CannotPredict("loops run too many iterations", self.where(node.line))
            self.set_var(node.var, it)
            if self._loop_body(node.body):
                break
        return 0

    def _while(self, node: While) -> Optional[int]:
        while True:
            if not self.budget.loop(self.where(node.line)):
                raise CannotPredict("loops run too many iterations", self.where(node.line))
            st = self.exec_body(node.cond)
            if st is None:
                self._symbolic_once(node.body, node.line, "its condition is unknown")
                return 0
            go = (st != 0) if node.until else (st == 0)
            if not go:
                return 0
            if self._loop_body(node.body):
                return 0

    def _arith_for(self, node: ArithFor) -> Optional[int]:
        if self._arith_value(node.init, node.line) is None:
            self._symbolic_once(node.body, node.line, "its bounds are unknown")
            return 0
        while True:
            if not self.budget.loop(self.where(node.line)):
                raise CannotPredict("loops run too many iterations", self.where(node.line))
            c = self._arith_value(node.cond, node.line) if node.cond and any(
                not (isinstance(p, Lit) and not p.text.strip()) for p in node.cond) else 1
            if c is None:
                self._symbolic_once(node.body, node.line, "its condition is unknown")
                return 0
            if c == 0:
                return 0
            if self._loop_body(node.body):
                return 0
            self._arith_value(node.step, node.line)

    def _case(self, node: Case) -> Optional[int]:
        subject = self.expand_str(node.word)
        text = _flat(subject)
        unknown = MARK_OPEN in text
        for pats, body in node.items:
            for p in pats:
                if unknown:
                    self.warn(f"cannot decide the case at {self.where(node.line)} "
                              f"({self.u.reason(text)}); taking its first branch")
                    return self._guessed(self.exec_body, body)
                rx = self._pattern_whole(p)
                if rx is not None and re.fullmatch(rx, text, re.S):
                    return self.exec_body(body)
        return 0

    # ================================================================== simple commands
    def _simple(self, node: Simple) -> Optional[int]:
        where = self.where(node.line)
        self.budget.command(where)
        self._last_was_test = False
        if not node.words:
            for a in node.assigns:
                self._assign(a, where)
            self._redirect_only(node, where)
            return 0
        argv: list = []
        decl_assigns: list = []
        label, where_of = self.label, self._where_cache
        for w in node.words:
            if isinstance(w, Assign):
                decl_assigns.append(w)
                argv.append([(w.name, where)])
            elif len(w) == 1 and type(w[0]) is Lit and not w[0].text.startswith("~"):
                lit = w[0]     # expand()'s common case
                argv.append([(lit.text, where_of.get((label, lit.line)) or self.where(lit.line))])
            else:
                argv.extend(self.expand(w))
        if len(argv) > 256:
            # a command of many words costs as many: the clock is read between such commands,
            # not only every 64th (20 × `echo $X` of 130,000 words each took 6 s)
            self.budget.tick_n(len(argv), where)
        if not argv:
            for a in node.assigns:
                self._assign(a, where)
            return 0
        # FOO=1 cmd: FOO for that command only
        saved = {}
        for a in node.assigns:
            saved[a.name] = self.vars.get(a.name)
            self._assign(a, where)
            self.vars[a.name].exported = True
        try:
            return self._command(argv, node, decl_assigns, where)
        finally:
            for k, old in saved.items():
                if old is None:
                    self.vars.pop(k, None)
                else:
                    self.vars[k] = old

    def _assign(self, a: Assign, where: str) -> None:
        where = self.where(a.line)
        if a.array is not None:
            items: dict = {}
            if a.append:
                v = self.vars.get(a.name)
                if v is not None:
                    items = dict(v.array) if v.array is not None else ({"0": v.value} if v.value is not None else {})
            nxt = max((n for k in items if (n := _to_int(k)) is not None), default=-1) + 1
            assoc = bool(self.vars.get(a.name) and self.vars[a.name].assoc)
            for w in a.array:
                if w and isinstance(w[0], Lit) and not w[0].quoted and w[0].text.startswith("["):
                    m = re.match(r"\[([^\]]*)\]=", w[0].text)
                    if m:
                        key = m.group(1)
                        rest = [Lit(w[0].text[m.end():], w[0].line, False)] + list(w[1:])
                        val = self.expand_str(rest)
                        if not assoc:
                            k = self._arith_value([Lit(key, w[0].line, False)], w[0].line)
                            key = str(k) if k is not None else key
                        items[key] = val
                        n = _to_int(key)
                        if n is not None:
                            nxt = n + 1
                        continue
                for f in self.expand(w):
                    items[str(nxt)] = f
                    nxt += 1
            self.set_array(a.name, items, assoc)
            return
        value = self.expand_str(a.value or [])
        if a.index is not None:
            v = self.vars.get(a.name)
            if v is None or v.array is None:
                base = {"0": v.value} if v is not None and v.value is not None else {}
                self.set_array(a.name, base, False)
                v = self.vars[a.name]
            key = a.index
            if not v.assoc:
                k = self._arith_value(self._parse_fragment(key, a.line), a.line)
                key = str(k) if k is not None else key
            if a.append and key in v.array:
                value = v.array[key] + value
            v.array[key] = value
            return
        if a.append:
            v = self.vars.get(a.name)
            if v is not None and v.value is None and v.array is not None:
                nxt = max((n for k in v.array if (n := _to_int(k)) is not None), default=-1) + 1
                v.array[str(nxt)] = value
                return
            old = self.get_var(a.name) or []
            value = list(old) + value
        self.set_var(a.name, value, where)

    def _parse_fragment(self, text: str, line: int) -> list:
        return Parser(text, self.label, self.budget, line_offset=line - 1 if isinstance(line, int) else line,
                      depth=self.depth)._parts("heredoc")

    def _file_segments(self, path: Optional[str], text: str) -> list:
        """A file's text with each line's origin: the script's own lines for a file it wrote."""
        f = self.vfs.get(path) if path else None
        return _lines_with_origin(text, path, f.line_origins if f is not None else None)

    def _redirect_only(self, node: Simple, where: str) -> None:
        """`> file` alone truncates a file; keep the vfs honest. `$(< FILE)` is bash's `$(cat FILE)`."""
        if self.capture and len(node.redirs) == 1 and node.redirs[0].op == "<" and node.redirs[0].target:
            f = _flat(self.expand_str(node.redirs[0].target))
            path = self._path(f)
            text = self._read_any(path, where, what="file")   # read as the submitting user, never run
            if text is None:
                if not self.capture_unknown[-1]:
                    self.capture_unknown[-1] = f"contents of {f} ({where})"
                return
            self.emit(self._file_segments(path, text), None, where, append_nl=False)
            return
        for r in node.redirs:
            if r.op in (">", ">|") and r.target is not None:
                path = self._path(_flat(self.expand_str(r.target)))
                if path:
                    self._write_vfs(path, [], False, where)

    def _command(self, argv: list, node: Simple, decl_assigns: list, where: str) -> Optional[int]:
        name = _flat(argv[0])
        if self.capture and not self.capture_unknown[-1] and name not in _PURE and name not in self.funcs:
            if MARK_OPEN in name or name not in _BUILTINS:
                self.capture_unknown[-1] = f"output of `{_short(argv)}` ({where})"
                return None
        if name in self.funcs:
            return self._call_function(name, argv, where)
        handler = _BUILTINS.get(name)
        if handler is not None:
            return handler(self, argv, node, decl_assigns, where)
        if name in _NOOPS:
            self._redirect_outputs_unknown(node, argv, where, noop=True)
            return 0
        return self._external(argv, node, where)

    # ----------------------------------------------------------------- external commands
    def _external(self, argv: list, node: Simple, where: str) -> Optional[int]:
        toks = [Tok(a[0][0], a) if len(a) == 1 else Tok.of(a) for a in argv]
        heredoc = self._stdin_heredoc(node)
        c = launchers.classify(toks, where)
        if c.kind in ("bash-c", "bash-file", "bash-stdin"):
            return self._child_shell(c, heredoc, where)
        if c.kind == "sbatch":
            if heredoc is not None:
                # (with the line its body starts on: the job's lines are named as this script's)
                self.inner_batches.append((_flat(heredoc), where, _line_of(heredoc[0][1]) if heredoc else 1))
            return 0
        if c.kind == "launch":
            self.launches.append(Launch(toks, where, list(self.wrapper_stack) + c.wrappers,
                                        self.snapshot_env(), self.cwd, c))
            return 0
        if c.kind == "eval-args":
            return self._eval_text([list(t.segs) for t in c.args], where)
        self._redirect_outputs_unknown(node, argv, where)
        return None

    def _stdin_heredoc(self, node: Simple) -> Optional[list]:
        for r in node.redirs:
            if r.op in ("<<", "<<-") and r.heredoc is not None:
                return self.expand_str(r.heredoc) if not all(isinstance(p, Lit) for p in r.heredoc) \
                    else [(p.text, self.where(p.line)) for p in r.heredoc]
            if r.op == "<<<" and r.target is not None:
                return self.expand_str(r.target) + [("\n", "")]
        return None

    def _redirect_outputs_unknown(self, node: Simple, argv: list, where: str, noop: bool = False) -> None:
        for r in node.redirs:
            if r.op in (">", ">>", ">|", "&>", "&>>") and r.target is not None and (r.fd in (None, 1)):
                path = self._path(_flat(self.expand_str(r.target)))
                if path and not noop:
                    self._vfs_unknown(path, f"written at run time by `{_short(argv)}` ({where})", where)

    def _child_shell(self, c, heredoc: Optional[list], where: str) -> Optional[int]:
        """`bash -c STR`, `bash FILE`, `bash <<EOF`: run in a child with the same (exported) env."""
        if self.depth >= MAX_CALL_DEPTH:
            raise CannotPredict("shells nested too deeply", where)
        if c.kind == "bash-c":
            # (its lines are named through the string's origins, below, not an offset)
            text, label, offset = c.script.text, self.label, 0
            if c.dollar0 is not None and "$" not in text and any(t.text.startswith("-") for t in c.args):
                # `bash -c "cmd ${A[@]}"`: the quoted "@" expansion made one word per element
                self.warn(f"bash -c runs only its first argument (`…{Unknowns.strip(text)[-50:]}`); the "
                          f"{1 + len(c.args)} words after it become $0, $1, … and are not part of the command "
                          f"— an array expanded with [@] inside the quoted string splits it (use [*]) ({where})")
        elif c.kind == "bash-stdin":
            if heredoc is None:
                return None
            # the body's first line is the line after `<<EOF`: a warning names the script's own line
            text, label, offset = _flat(heredoc), self.label, max(_line_of(heredoc[0][1]) - 1, 0) if heredoc else 0
        else:
            path = self._path(c.script.text)
            got = self._read_any(path, where, what="script run with bash")
            if got is None:
                # unreadable helper (`./launch.sh $CMD`): its arguments may still hold the launch
                self._scan_args_for_launch(c, where)
                return None
            text, label, offset = got, path, 0
        saved_vars = self.vars
        saved_pos, saved_name = self.positional, self.script_name
        saved_unexp = self.unexported_child
        self.vars = {k: v for k, v in saved_vars.items()}
        self.unexported_child = {k for k, v in saved_vars.items() if not v.exported}
        self.positional = [list(t.segs) for t in c.args]
        self.wrapper_stack.append(c.wrappers)
        self.depth += 1
        saved_nounset, self.nounset = self.nounset, False    # a new bash starts without set -u
        self._subshell += 1
        try:
            if c.kind == "bash-c":
                # the string was built by this shell: keep each piece's origin
                self._run_text(text, label, 0, _origin_map(c.script.segs))
            else:
                self._run_text(text if c.kind != "bash-file" else sanitize_text(text), label, offset,
                               self._written_origins(label, text) if c.kind == "bash-file" else None)
        except _Exit:
            pass
        except (_Return, _Break):
            pass
        finally:
            self.depth -= 1
            self._subshell -= 1
            self.nounset = saved_nounset
            self.wrapper_stack.pop()
            self.vars = saved_vars
            self.positional, self.script_name = saved_pos, saved_name
            self.unexported_child = saved_unexp
        return None

    def _scan_args_for_launch(self, c, where: str) -> None:
        c2 = launchers.classify(c.args, where)
        if c2.kind == "launch":
            self.launches.append(Launch(c.args, where, list(self.wrapper_stack) + c.wrappers + c2.wrappers,
                                        self.snapshot_env(), self.cwd, c2))

    def _eval_text(self, words: list, where: str) -> Optional[int]:
        """`eval WORD…`: the words joined by spaces run as script text, each piece named where it
        was written (`CMD='…'` over several lines, then `eval "srun $CMD"`: the line in CMD)."""
        if self.depth >= MAX_CALL_DEPTH:
            raise CannotPredict("eval nested too deeply", where)
        segs: list = []
        for i, word in enumerate(words):
            if i:
                segs.append((" ", where))
            segs.extend(word)
        self.depth += 1
        try:
            self._run_text(_flat(segs), self.label, 0, _origin_map(segs))
        finally:
            self.depth -= 1
        return self.status

    def _call_function(self, name: str, argv: list, where: str) -> Optional[int]:
        if self.depth >= MAX_CALL_DEPTH:
            raise CannotPredict(f"function {name} recurses too deeply", where)
        saved = self.positional
        self.positional = argv[1:]
        self.depth += 1
        self.local_frames.append({})
        body, saved_label = self.funcs[name], self.label
        self.label = body[1]      # a function from a sourced file is named in that file
        try:
            return self.exec_node(body[0])
        except _Return:
            return self.status
        finally:
            self.label = saved_label
            frame = self.local_frames.pop()
            for k, old in frame.items():
                if old is None:
                    self.vars.pop(k, None)
                else:
                    self.vars[k] = old
            self.depth -= 1
            self.positional = saved

    # ----------------------------------------------------------------- files
    def _path(self, text: str) -> Optional[str]:
        # Paths may hold unknown parts (`ds_config.$SLURM_JOBID.json`): the same unknown value
        # gives the same text, so a file written and read under that name still matches in the vfs.
        if not text or (MARK_OPEN in text and text.startswith(MARK_OPEN) and "/" not in text):
            return None
        return join_path(self.cwd, text)

    def _write_vfs(self, path: str, value: list, append: bool, where: str) -> None:
        if path in ("/dev/null", "/dev/stdout", "/dev/stderr"):
            return
        f = self.vfs.get(path)
        if f is None:
            if len(self.vfs) >= MAX_VFS_FILES:
                raise CannotPredict("the script writes too many files", where)
            f = self.vfs[path] = VFile(where=where)
        if not append:
            f.text, f.line_origins, f.unknown = "", [], None
        f.where = where
        value = [(valid_unicode(t), origin) for t, origin in value]
        text = _flat(value)
        if len(f.text) + len(text) > MAX_VFS_BYTES:
            raise CannotPredict(f"file {path} written by the script grows beyond {MAX_VFS_BYTES >> 10} KiB", where)
        _add_line_origins(f.line_origins, value, open_line=not (f.text == "" or f.text.endswith("\n")))
        f.text += text

    def _vfs_unknown(self, path: str, reason: str, where: str) -> None:
        if len(self.vfs) >= MAX_VFS_FILES and path not in self.vfs:
            raise CannotPredict("the script writes too many files", where)
        self.vfs[path] = VFile(unknown=reason, where=where)

    def _written_origins(self, path: str, text: str):
        """For a file the script wrote (``cat > run.sh <<EOF``) and then runs or sources, a map from
        a position in ``text`` to the script line that wrote it: the file does not exist when the
        job is submitted, so that line is the one a user can fix.  None for a file on disk."""
        f = self.vfs.get(path)
        if f is None or f.text != text or not f.line_origins:
            return None
        return _origin_map(_lines_with_origin(text, path, f.line_origins))

    def _read_any(self, path: Optional[str], where: str, what: str) -> Optional[str]:
        """A file from the vfs or the disk (bounded); None with a warning when unreadable."""
        if path is None:
            self.warn(f"{what}: path unknown ({where})")
            return None
        f = self.vfs.get(path)
        if f is not None:
            if f.unknown:
                self.warn(f"{what} {path} is {f.unknown}")
                return None
            return f.text
        if MARK_OPEN in path:
            self.warn(f"{what}: path {Unknowns.strip(path)} is unknown ({self.u.reason(path)}) ({where})")
            return None
        self.budget.sourced += 1
        if self.budget.sourced > MAX_SOURCED_FILES:
            raise CannotPredict(f"more than {MAX_SOURCED_FILES} files sourced or read", where)
        try:
            data = self.read_file(path)
        except (OSError, ValueError) as exc:
            self.warn(f"cannot read {what} {path}: {os_reason(exc)} ({where})")
            return None
        return decode_text(data, path)

    # ================================================================== expansion
    def expand(self, word: list) -> list:
        """A word -> fields (each a list of segments), with field splitting of unquoted expansions."""
        if len(word) == 1 and type(word[0]) is Lit and not word[0].text.startswith("~"):
            return [[(word[0].text, self.where(word[0].line))]]   # most words: one literal, as below
        fields: list = []
        cur: Optional[list] = None
        for p in word:
            tp = type(p)
            if tp is Lit:
                if p.text.startswith("~") and not p.quoted and cur is None and (len(p.text) == 1 or p.text[1] == "/"):
                    home = self.text_of("HOME") or "~"
                    cur = [(home + p.text[1:], self.where(p.line))]
                    continue
                if cur is None:
                    cur = []
                cur.append((p.text, self.where(p.line)))
                continue
            elems = self._part(p)
            if p.quoted:
                if elems is _ARRAY_EMPTY:
                    continue
                if isinstance(elems, _Multi) and _is_star(p):
                    # "${A[*]}" / "$*": one word, the elements joined by IFS's first character
                    elems = _join_star(elems)
                if isinstance(elems, _Multi):
                    for i, e in enumerate(elems.items):
                        if i:
                            fields.append(cur)
                            cur = []
                        if cur is None:
                            cur = []
                        cur.extend(e)
                    continue
                if cur is None:
                    cur = []
                cur.extend(elems)
                continue
            items = elems.items if isinstance(elems, _Multi) else ([] if elems is _ARRAY_EMPTY else [elems])
            for k, e in enumerate(items):
                if k:
                    if cur:
                        fields.append(cur)
                    cur = None
                for text, origin in e:
                    pos = 0
                    for m in _WS.finditer(text):
                        if m.start() > pos:
                            if cur is None:
                                cur = []
                            cur.append((text[pos:m.start()], origin))
                        if cur is not None:
                            fields.append(cur)
                        cur = None
                        pos = m.end()
                    if pos < len(text):
                        if cur is None:
                            cur = []
                        cur.append((text[pos:], origin))
        if cur is not None:
            fields.append(cur)
        return fields

    def expand_str(self, word: list) -> list:
        """A word -> one value, no splitting (assignments, heredocs, case subjects)."""
        out: list = []
        for p in word:
            if type(p) is Lit:
                if p.text.startswith("~") and not p.quoted and not out and (len(p.text) == 1 or p.text[1] == "/"):
                    out.append(((self.text_of("HOME") or "~") + p.text[1:], self.where(p.line)))
                else:
                    out.append((p.text, self.where(p.line)))
                continue
            v = self._part(p)
            if isinstance(v, _Multi):
                for i, e in enumerate(v.items):
                    if i:
                        out.append((" ", ""))
                    out.extend(e)
            elif v is not _ARRAY_EMPTY:
                out.extend(v)
        if sum(len(s[0]) for s in out) > MAX_VALUE_CHARS:
            raise CannotPredict(f"a value grows beyond {MAX_VALUE_CHARS >> 10} KiB",
                                self.where(getattr(word[0], "line", 0)) if word else self.label)
        return out

    def _part(self, p):
        tp = type(p)
        if tp is Param:
            return self._param(p)
        if tp is CmdSub:
            return self._cmdsub(p)
        if tp is Arith:
            v = self._arith_value(p.expr, p.line)
            if v is None:
                return [(self._last_arith_unknown, self.where(p.line))]
            return [(str(v), self.where(p.line))]
        if tp is ProcSub:
            return [(self.u.new(f"process substitution ({self.where(p.line)})"), self.where(p.line))]
        return []

    # ----------------------------------------------------------------- $( )
    def _cmdsub(self, p: CmdSub) -> list:
        where = self.where(p.line)
        if self.depth >= MAX_CALL_DEPTH:
            raise CannotPredict("command substitutions nested too deeply", where)
        saved_vars, saved_cwd, saved_nounset = dict(self.vars), self.cwd, self.nounset
        self.capture.append([])
        self.capture_unknown.append(None)
        self.depth += 1
        self._subshell += 1
        try:
            self.exec_body(p.body)
        except (_Exit, _Return, _Break):
            pass
        finally:
            self.depth -= 1
            self._subshell -= 1
            out = self.capture.pop()
            unknown = self.capture_unknown.pop()
            self.vars, self.cwd, self.nounset = saved_vars, saved_cwd, saved_nounset
        if unknown:
            return [(self.u.new(unknown), where)]
        segs = [s for chunk in out for s in chunk]
        # strip trailing newlines of the whole output
        while segs and segs[-1][0].endswith("\n"):
            t, o = segs[-1]
            t = t.rstrip("\n")
            if t:
                segs[-1] = (t, o)
                break
            segs.pop()
        return segs

    def emit(self, value: list, node: Optional[Simple], where: str, append_nl: bool = True) -> None:
        """Output of echo/printf/cat: to the enclosing $( ), to a redirected file, or nowhere."""
        out = list(value) + ([("\n", where)] if append_nl else [])
        if node is not None:
            for r in node.redirs:
                if r.op in (">", ">>", ">|", "&>", "&>>") and r.target is not None and r.fd in (None, 1):
                    path = self._path(_flat(self.expand_str(r.target)))
                    if path is None:
                        self.warn(f"output file name unknown ({where})")
                        return
                    self._write_vfs(path, out, r.op in (">>", "&>>"), where)
                    return
        if self.capture:
            self.capture[-1].append(out)

    # ----------------------------------------------------------------- arithmetic
    _last_arith_unknown = ""

    def _arith_value(self, expr: list, line: int) -> Optional[int]:
        text = _flat(self.expand_str(expr))
        where = self.where(line)
        if MARK_OPEN in text and not re.search(r"[A-Za-z_]", re.sub("\ue000\\d+\ue001", "", text)):
            self._last_arith_unknown = self.u.new(self.u.reason(text) or "unknown")
            return None

        def get(name: str) -> Optional[str]:
            # each reference counts: a value naming other variables is evaluated again at each use,
            # so a few short assignments can fan out to millions of them
            self.budget.tick(where)
            if "[" in name:
                base, idx = name[:-1].split("[", 1)
                v = self.vars.get(base)
                if v is None or v.array is None:
                    return self.text_of(base) if idx == "0" else None
                seg = v.array.get(idx)
                return None if seg is None else _flat(seg)
            got = self.text_of(name)
            if got is None:
                self._unset_use(name, line)
            return got

        def put(name: str, value: int) -> None:
            self.set_var(name, [(str(value), where)], where)

        ev = Evaluator(get, put)
        try:
            v = ev.evaluate(text)
        except ArithUnknown as exc:
            self._last_arith_unknown = self.u.new(self.u.reason(exc.text) or "unknown")
            return None
        except (ArithError, RecursionError) as exc:
            reason = f"arithmetic error in $(( {Unknowns.strip(text)[:60]} )): {exc} ({where})"
            self.warn(reason)
            self._last_arith_unknown = self.u.new(reason)
            return None
        if ev.used_underscore:
            self.warn(f"bash rejects numbers with '_' in arithmetic ({where}); we read them as Python does")
        return v

    # ----------------------------------------------------------------- ${ }
    def _param_values(self, p: Param) -> Optional[list]:
        """Elements of the parameter: None when unset; [value] for scalars; n items for [@]."""
        name = p.name
        if name in ("@", "*"):
            return list(self.positional)
        if name == "#":
            return [[(str(len(self.positional)), self.where(p.line))]]
        if name == "?":
            return [[(str(self.status) if self.status is not None else self.u.new("exit status of an external "
                                                                                    "command"), "")]]
        if name in ("$", "!"):
            return [[(self.u.new("a process id", nonempty=True), "")]]
        if name == "-":
            return [[("hB", "")]]
        if name == "0":
            return [[(self.script_name, "")]]
        if name.isdigit():
            i = _to_int(name)
            return [self.positional[i - 1]] if i is not None and 0 < i <= len(self.positional) else None
        v = self.vars.get(name)
        if p.index is not None:
            idx = _flat(self.expand_str(p.index))
            if v is None:
                got = self.get_var(name)   # env-incomplete unknown or None
                return None if got is None else [got]
            if v.array is None:
                if idx in ("@", "*"):
                    return [v.value] if v.value is not None else []
                return [v.value] if idx in ("0", "") and v.value is not None else None
            if idx in ("@", "*"):
                return [v.array[k] for k in _ordered_keys(v.array, v.assoc)]
            if not v.assoc:
                n = self._arith_value(self._parse_fragment(idx, p.line), p.line)
                if n is None:
                    return [[(self._last_arith_unknown, self.where(p.line))]]
                if n < 0:
                    keys = _ordered_keys(v.array, False)
                    n = (_to_int(keys[n]) or 0) if -n <= len(keys) else n
                idx = str(n)
            got = v.array.get(idx)
            return None if got is None else [got]
        got = self.get_var(name)
        return None if got is None else [got]

    def _param(self, p: Param):
        where = self.where(p.line)
        vals = self._param_values(p)
        multi = p.name in ("@", "*") or (p.index is not None and len(p.index) == 1 and isinstance(p.index[0], Lit)
                                         and p.index[0].text in ("@", "*"))
        op = p.op
        if vals is None and not multi and op not in _UNSET_OK_OPS and _NAME_RE.match(p.name):
            self._unset_use(p.name, p.line)
        if op == "len":
            if multi:
                return [(str(len(vals or [])), where)]
            t = _flat(vals[0]) if vals else ""
            if MARK_OPEN in t:
                return [(self.u.new(self.u.reason(t) or "unknown"), where)]
            return [(str(len(t)), where)]
        if op == "keys":
            v = self.vars.get(p.name)
            keys = _ordered_keys(v.array, v.assoc) if v is not None and v.array is not None else \
                (["0"] if v is not None else [])
            return _Multi([[(k, where)] for k in keys]) if keys else _ARRAY_EMPTY
        if op == "indirect":
            target = _flat(vals[0]) if vals else ""
            if not _NAME_RE.match(target or "-"):
                return [(self.u.new(f"indirect expansion ${{!{p.name}}} ({where})"), where)] if MARK_OPEN in target \
                    else []
            got = self.get_var(target)
            return got or []
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            colon = op.startswith(":")
            base = op[-1]
            if vals is None:
                state: Optional[bool] = False   # unset
            elif not colon:
                state = True
            else:
                joined = "".join(_flat(v) for v in vals)
                state = self.u.known_nonempty(joined)
            if state is None:
                return [(self.u.new(f"${{{p.name}{op}…}} on a value of unknown emptiness "
                                    f"({self.u.reason(''.join(_flat(v) for v in vals))})"), where)]
            if base == "-":
                return self._join_vals(vals, multi) if state else self.expand_str(p.arg or [])
            if base == "=":
                if state:
                    return self._join_vals(vals, multi)
                val = self.expand_str(p.arg or [])
                self.set_var(p.name, val, where)
                return val
            if base == "+":
                return self.expand_str(p.arg or []) if state else []
            if base == "?":
                if state:
                    return self._join_vals(vals, multi)
                return [(self.u.new(f"{p.name} is not set (${{{p.name}:?}} stops the script) ({where})"), where)]
        if vals is None:
            return [] if not multi else _ARRAY_EMPTY
        if op is None:
            if multi:
                return _Multi(vals) if vals else _ARRAY_EMPTY
            return vals[0]
        # string operators apply to every element
        out = [self._string_op(p, v, where) for v in vals]
        if multi:
            return _Multi(out) if out else _ARRAY_EMPTY
        return out[0]

    def _join_vals(self, vals: list, multi: bool):
        if multi:
            return _Multi(vals) if vals else _ARRAY_EMPTY
        return vals[0]

    def _string_op(self, p: Param, val: list, where: str) -> list:
        text = _flat(val)
        origin = next((s[1] for s in val if s[0]), where)
        op = p.op
        if op in ("#", "##", "%", "%%", "/", "//", "/#", "/%"):
            tokens = self._pattern_tokens(p.arg or [])
            if tokens is None:
                return [(self.u.new(f"pattern from an unknown value ({where})"), where)]
            rx = "".join(".*" if t is None else t for t in tokens)
            if MARK_OPEN in text and op not in ("//", "/"):
                return [(self.u.new(self.u.reason(text) or "unknown"), where)]
            if op in ("#", "##"):
                res = _strip_prefix(text, tokens, longest=(op == "##"))
            elif op in ("%", "%%"):
                res = _strip_suffix(text, tokens, longest=(op == "%%"))
            else:
                rep = _flat(self.expand_str(p.arg2 or []))
                if not rx:
                    res = text
                elif op == "//":
                    res = re.sub(rx, lambda m: rep, text)
                elif op == "/":
                    res = re.sub(rx, lambda m: rep, text, count=1)
                elif op == "/#":
                    res = re.sub("^(?:" + rx + ")", lambda m: rep, text, count=1)
                else:
                    res = re.sub("(?:" + rx + ")$", lambda m: rep, text, count=1)
            return [(res, origin)]
        if op in ("^^", ",,", "^", ","):
            if op == "^^":
                res = text.upper()
            elif op == ",,":
                res = text.lower()
            elif op == "^":
                res = text[:1].upper() + text[1:]
            else:
                res = text[:1].lower() + text[1:]
            return [(res, origin)]
        if op == "substr":
            off = self._arith_value(p.arg or [], p.line)
            ln = self._arith_value(p.arg2, p.line) if p.arg2 is not None else None
            if off is None or (p.arg2 is not None and ln is None) or MARK_OPEN in text:
                return [(self.u.new(f"substring of an unknown value ({where})"), where)]
            if off < 0:
                off = max(0, len(text) + off)
            res = text[off:] if ln is None else (text[off:off + ln] if ln >= 0 else text[off:len(text) + ln])
            return [(res, origin)]
        return val

    def _pattern_tokens(self, word: list) -> Optional[list]:
        """The shell pattern ``word`` as :func:`_glob_tokens` (its quoted parts literal); None
        where a part is unknown."""
        out: list = []
        for part in word:
            if isinstance(part, Lit):
                t, quoted = part.text, part.quoted
            else:
                t, quoted = _flat(self.expand_str([part])), part.quoted
                if MARK_OPEN in t:
                    return None
            if quoted:
                out += [re.escape(c) for c in t]
            else:
                for tok in _glob_tokens(t):
                    if tok is not None or not out or out[-1] is not None:
                        out.append(tok)
        return out

    def _pattern_whole(self, word: list) -> Optional[str]:
        """The shell pattern ``word`` as a regex for a whole text (:func:`_whole`); None where a
        part is unknown."""
        tokens = self._pattern_tokens(word)
        return None if tokens is None else _whole(tokens)

    # ================================================================== tests
    def _status_of(self, truth: Optional[bool]) -> Optional[int]:
        self._last_was_test = True
        if truth is None:
            return None
        return 0 if truth else 1

    def _eval_cond_words(self, words: list, line: int, double: bool) -> Optional[bool]:
        args = [_flat(self.expand_str(w)) for w in words] if double else words
        patterns: dict = {}
        if double:
            # the right of == and != is a pattern whose quoted parts match as themselves
            for k in range(1, len(words)):
                if args[k - 1] in ("=", "==", "!=") and any(getattr(part, "quoted", False) for part in words[k]):
                    patterns[k] = self._pattern_tokens(words[k])
        try:
            return _TestEval(self, args, double, self.where(line), patterns).run()
        except _TestSyntax:
            self.warn(f"cannot read the test at {self.where(line)}")
            return None

    def probe(self, path: str) -> Optional[str]:
        """'file' | 'dir' | 'missing' | None (unknown) for a path, via the vfs or read_file."""
        if path in self.vfs:
            return "file" if not self.vfs[path].unknown else "file"
        if path in self.probe_cache:
            return self.probe_cache[path]
        if len(self.probe_cache) > 64:
            return None
        try:
            self.read_file(path)
            res: Optional[str] = "file"
        except IsADirectoryError:
            res = "dir"
        except FileNotFoundError:
            res = "missing"
        except (OSError, ValueError):
            res = None
        self.probe_cache[path] = res
        return res


class _Multi:
    """Several fields from one expansion (${A[@]}, $@)."""

    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items


_ARRAY_EMPTY = _Multi([])


class _TestSyntax(Exception):
    pass


class _TestEval:
    """`[ … ]`, `test …` and `[[ … ]]` in three-valued logic (None = unknown)."""

    def __init__(self, sh: Shell, args: list, double: bool, where: str, patterns: Optional[dict] = None):
        self.sh, self.args, self.double, self.where = sh, args, double, where
        self.patterns = patterns or {}      # arg index -> pattern tokens (quoted parts literal)
        self.i = 0

    def run(self) -> Optional[bool]:
        if not self.args:
            return False
        v = self._or()
        if self.i != len(self.args):
            raise _TestSyntax()
        return v

    def _peek(self) -> Optional[str]:
        return self.args[self.i] if self.i < len(self.args) else None

    def _or(self) -> Optional[bool]:
        v = self._and()
        while self._peek() in ("-o", "||"):
            self.i += 1
            w = self._and()
            v = True if (v is True or w is True) else (None if (v is None or w is None) else False)
        return v

    def _and(self) -> Optional[bool]:
        v = self._not()
        while self._peek() in ("-a", "&&") and not (self._peek() == "-a" and self.double):
            self.i += 1
            w = self._not()
            v = False if (v is False or w is False) else (None if (v is None or w is None) else True)
        return v

    def _not(self) -> Optional[bool]:
        if self._peek() == "!" and self.i + 1 < len(self.args):
            self.i += 1
            v = self._not()
            return None if v is None else not v
        return self._primary()

    def _primary(self) -> Optional[bool]:
        a = self._peek()
        if a is None:
            raise _TestSyntax()
        if a == "(":
            self.i += 1
            v = self._or()
            if self._peek() != ")":
                raise _TestSyntax()
            self.i += 1
            return v
        nxt = self.args[self.i + 1] if self.i + 1 < len(self.args) else None
        if nxt in _BINARY_TESTS and self.i + 2 < len(self.args):
            b, tokens = self.args[self.i + 2], self.patterns.get(self.i + 2)
            self.i += 3
            return self._binary(a, nxt, b, tokens)
        if a in _UNARY_TESTS and nxt is not None:
            self.i += 2
            return self._unary(a, nxt)
        self.i += 1
        return self.sh.u.known_nonempty(a)

    def _unary(self, op: str, arg: str) -> Optional[bool]:
        u = self.sh.u
        if op == "-z":
            ne = u.known_nonempty(arg)
            return None if ne is None else not ne
        if op == "-n":
            return u.known_nonempty(arg)
        if op == "-v":
            return arg in self.sh.vars
        if MARK_OPEN in arg:
            return None
        path = self.sh._path(arg)
        if path is None:
            return None
        kind = self.sh.probe(path)
        if kind is None:
            return None
        if op in ("-e", "-a", "-r", "-s", "-w"):
            return kind != "missing"
        if op == "-f":
            return kind == "file"
        if op == "-d":
            return kind == "dir"
        return None

    def _binary(self, a: str, op: str, b: str, tokens: Optional[list] = None) -> Optional[bool]:
        if MARK_OPEN in a or (MARK_OPEN in b and op != "=~"):
            return None
        if op in ("=", "==", "!=") and self.double:
            rx = _whole(tokens if tokens is not None else _glob_tokens(b))
            return (re.fullmatch(rx, a, re.S) is not None) == (op != "!=")
        if op in ("=", "=="):
            return a == b
        if op == "!=":
            return a != b
        if op == "=~":
            if MARK_OPEN in b:
                return None
            try:
                return re.search(b, a[:10_000]) is not None
            except re.error:
                return None
        if op in ("<", ">"):
            return (a < b) if op == "<" else (a > b)
        ai, bi = _to_int(a), _to_int(b)
        if ai is None or bi is None:
            return None
        return {"-eq": ai == bi, "-ne": ai != bi, "-lt": ai < bi, "-le": ai <= bi,
                "-gt": ai > bi, "-ge": ai >= bi}.get(op)


_UNARY_TESTS = {"-z", "-n", "-e", "-f", "-d", "-r", "-s", "-w", "-x", "-L", "-h", "-a", "-v", "-p", "-S",
                "-b", "-c", "-g", "-u", "-k", "-O", "-G", "-N", "-t"}
_BINARY_TESTS = {"=", "==", "!=", "=~", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge"}


_INT_RE = re.compile(r"-?[0-9]+")
_INT64 = 1 << 63


# ${X:-d} ${X-d} ${X:=d} ${X=d} ${X:+a} ${X+a} ${X:?} ${X?}: written for an unset X (bash -u too);
# ${!X*} names; ${!X} says itself why its target is unknown
_UNSET_OK_OPS = frozenset((":-", "-", ":=", "=", ":+", "+", ":?", "?", "keys", "indirect"))


def _to_int(s: str) -> Optional[int]:
    """``s`` as bash reads a decimal integer (ASCII digits, 64 bits), or None.

    Past 64 bits the value saturates: Python refuses to convert more than 4,300 digits, and a
    positional, index or key that large names nothing anyway."""
    s = s.strip()
    if not _INT_RE.fullmatch(s):
        return None
    if len(s.lstrip("-").lstrip("0")) > 19:
        return -_INT64 if s.startswith("-") else _INT64 - 1
    return int(s)


# ====================================================================== builtins
def _b_test(sh: Shell, argv, node, decl, where):
    args = [_flat(a) for a in argv[1:]]
    if _flat(argv[0]) == "[":
        if not args or args[-1] != "]":
            sh.warn(f"'[' without ']' ({where})")
            return sh._status_of(None)
        args = args[:-1]
    try:
        return sh._status_of(_TestEval(sh, args, False, where).run())
    except _TestSyntax:
        sh.warn(f"cannot read the test at {where}")
        return sh._status_of(None)


def _b_assign_words(sh: Shell, argv, decl, where, export: bool, local: bool = False) -> None:
    flags = ""
    assoc = False
    di = 0
    for a in argv[1:]:
        t = _flat(a)
        if decl and di < len(decl) and t == decl[di].name and not t.startswith("-"):
            asg = decl[di]
            di += 1
            if local and sh.local_frames:
                sh.local_frames[-1].setdefault(asg.name, sh.vars.get(asg.name))
            if "A" in flags and asg.array is not None:
                sh.set_array(asg.name, {}, True)
                sh.vars[asg.name].assoc = True
            sh._assign(asg, where)
            if export or "x" in flags:
                sh.vars[asg.name].exported = True
            continue
        if t.startswith("-") or t.startswith("+"):
            flags += t[1:]
            assoc = assoc or "A" in t
            continue
        name, eq, val = t.partition("=")
        if not _NAME_RE.match(name):
            continue
        if local and sh.local_frames:
            sh.local_frames[-1].setdefault(name, sh.vars.get(name))
        if eq:
            # a dynamically built NAME=value word: the value keeps its origin
            tok = Tok.of(a)
            sh.set_var(name, [(val, tok.origin_at(len(name) + 1))], where)
        elif name not in sh.vars:
            if "a" in flags or "A" in flags:
                sh.set_array(name, {}, "A" in flags)
            elif local:
                sh.vars[name] = _Var([])
            elif export:
                continue
            else:
                sh.vars[name] = _Var([])
        if (export or "x" in flags) and name in sh.vars:
            sh.vars[name].exported = True
        if "A" in flags and name in sh.vars and sh.vars[name].array is None:
            sh.set_array(name, {}, True)


def _b_export(sh, argv, node, decl, where):
    _b_assign_words(sh, argv, decl, where, export=True)
    return 0


def _b_declare(sh, argv, node, decl, where):
    _b_assign_words(sh, argv, decl, where, export=False)
    return 0


def _b_local(sh, argv, node, decl, where):
    _b_assign_words(sh, argv, decl, where, export=False, local=True)
    return 0


def _b_unset(sh, argv, node, decl, where):
    for a in argv[1:]:
        t = _flat(a)
        if t in ("-v", "-f"):
            continue
        sh.vars.pop(t, None)
        sh.funcs.pop(t, None)
    return 0


def _b_source(sh: Shell, argv, node, decl, where):
    if len(argv) < 2:
        return 1
    raw = _flat(argv[1])
    if MARK_OPEN in raw:
        reason = f"sourced file name unknown ({sh.u.reason(raw)}) ({where})"
        sh.warn(reason)
        sh.env_incomplete = sh.env_incomplete or f"it may come from a file sourced at {where} whose name is unknown"
        return None
    path = sh._path(raw)
    if sh.depth >= MAX_CALL_DEPTH:
        raise CannotPredict(f"`source` nested more than {MAX_CALL_DEPTH} deep ({path} sources itself?)", where)
    text = sh._read_any(path, where, what="sourced file")
    if text is None:
        sh.env_incomplete = sh.env_incomplete or f"it may come from {path}, which could not be read ({where})"
        return None
    saved_pos = sh.positional
    if len(argv) > 2:
        sh.positional = argv[2:]
    sh.depth += 1
    try:
        sh._run_text(sanitize_text(text), path, 0, sh._written_origins(path, text))
    except _Return:
        pass
    finally:
        sh.depth -= 1
        if len(argv) > 2:
            sh.positional = saved_pos
    return 0


def _b_cd(sh: Shell, argv, node, decl, where):
    target = _flat(argv[1]) if len(argv) > 1 else (sh.text_of("HOME") or "")
    if target == "-":
        return 0
    if MARK_OPEN in target or not target:
        sh.warn(f"cd to an unknown directory ({where}); relative paths after it are read from "
                f"{sh.cwd or 'the submit directory'}")
        return 0
    sh.cwd = join_path(sh.cwd, target)
    sh.set_var("PWD", [(sh.cwd, where)], where)
    return 0


def _b_shift(sh, argv, node, decl, where):
    n = _to_int(_flat(argv[1])) if len(argv) > 1 else 1
    sh.positional = sh.positional[(n or 1):]
    return 0


def _b_set(sh, argv, node, decl, where):
    expect_name = None        # `-o NAME` / `-euo NAME`: "-" or "+" of the option that takes it
    for i, a in enumerate(argv[1:], 1):
        t = _flat(a)
        if expect_name is not None:
            if t == "nounset":
                sh.nounset = expect_name == "-"
            expect_name = None
            continue
        if t == "--":
            sh.positional = argv[i + 1:]
            break
        if len(t) > 1 and t[0] in "-+" and t[1:].isalpha():
            if "u" in t:
                sh.nounset = t[0] == "-"
            if "o" in t:
                expect_name = t[0]
            continue
        break
    return 0


def _b_eval(sh, argv, node, decl, where):
    return sh._eval_text(argv[1:], where)


def _b_exit(sh, argv, node, decl, where):
    raise _Exit()


def _b_return(sh, argv, node, decl, where):
    raise _Return()


def _b_break(sh, argv, node, decl, where):
    n = _to_int(_flat(argv[1])) if len(argv) > 1 else 1
    raise _Break(n or 1, _flat(argv[0]) == "continue")


def _b_false(sh, argv, node, decl, where):
    return 1


def _b_let(sh, argv, node, decl, where):
    v = 0
    for a in argv[1:]:
        r = sh._arith_value([Lit(_flat(a), _line_of(where), True)], _line_of(where))
        if r is None:
            return None
        v = r
    return 0 if v else 1


def _b_read(sh, argv, node, decl, where):
    """`read` from a here-document / here-string is known (`read -r -d '' CMD <<EOF`); else unknown."""
    raw, delim, names, i = False, "\n", [], 1
    while i < len(argv):
        t = _flat(argv[i])
        if not names and t in ("-d", "-p", "-t", "-n", "-N", "-u", "-a", "-i") and i + 1 < len(argv):
            if t == "-d":
                delim = _flat(argv[i + 1])[:1]        # '' = read up to a NUL, i.e. everything
            elif t == "-a":
                names.append(None)                    # array read: not modelled, unknown below
                names.append(_flat(argv[i + 1]))
            i += 2
            continue
        if not names and t.startswith("-") and len(t) > 1:
            raw = raw or "r" in t
            i += 1
            continue
        names.append(t)
        i += 1
    heredoc = sh._stdin_heredoc(node)
    valid = [n for n in names if n is not None and _NAME_RE.match(n)]
    if heredoc is None or None in names or MARK_OPEN in delim or len(valid) != 1:
        for t in valid or ([] if names else ["REPLY"]):
            sh.set_var(t, [(sh.u.new(f"read at run time ({where})"), where)])
        return None
    # one name: the text up to the delimiter, outer whitespace trimmed (default IFS)
    segs: list = []
    found = False
    for text, origin in heredoc:
        if delim and delim in text:
            segs.append((text[:text.index(delim)], origin))
            found = True
            break
        segs.append((text, origin))
    if not raw:
        # without -r a backslash-newline joins lines and other backslashes quote the next character
        segs = [(re.sub(r"\\(.)", r"\1", t.replace("\\\n", "")), o) for t, o in segs]
    while segs and not segs[0][0].strip():
        segs.pop(0)
    if segs:
        segs[0] = (segs[0][0].lstrip(" \t\n"), segs[0][1])
    while segs and not segs[-1][0].strip():
        segs.pop()
    if segs:
        segs[-1] = (segs[-1][0].rstrip(" \t\n"), segs[-1][1])
    sh.set_var(valid[0], segs or [("", where)], where)
    return 0 if found else 1       # no delimiter before the end (always so with -d ''): status 1


def _b_echo(sh, argv, node, decl, where):
    args = argv[1:]
    newline, escapes = True, False
    while args and re.fullmatch(r"-[neE]+", _flat(args[0])):
        f = _flat(args[0])
        newline = newline and "n" not in f
        escapes = ("e" in f) or (escapes and "E" not in f)
        args = args[1:]
    out: list = []
    for i, a in enumerate(args):
        if i:
            out.append((" ", where))
        out.extend([(_unescape(t) if escapes else t, o) for t, o in a])
    sh.emit(out, node, where, append_nl=newline)
    return 0


def _b_printf(sh, argv, node, decl, where):
    args = [a for a in argv[1:]]
    if args and _flat(args[0]) == "-v" and len(args) > 2:
        name = _flat(args[1])
        text = _printf(_flat(args[2]), [_flat(a) for a in args[3:]])
        sh.set_var(name, [(text, Tok.of(args[3]).origin_at(0) if len(args) > 3 else where)], where)
        return 0
    if not args:
        return 1
    text = _printf(_flat(args[0]), [_flat(a) for a in args[1:]])
    origin = Tok.of(args[1]).origin_at(0) if len(args) > 1 else where
    sh.emit([(text, origin)], node, where, append_nl=False)
    return 0


def _b_cat(sh: Shell, argv, node, decl, where):
    heredoc = sh._stdin_heredoc(node)
    files = [_flat(a) for a in argv[1:] if not _flat(a).startswith("-") or _flat(a) == "-"]
    if heredoc is not None and (not files or files == ["-"]):
        sh.emit(heredoc, node, where, append_nl=False)
        return 0
    out: list = []
    for f in files:
        text = sh._read_any(sh._path(f), where, what="file") if f != "-" else None
        if text is None:
            if sh.capture:
                sh.capture_unknown[-1] = f"contents of {f} ({where})"
            sh._redirect_outputs_unknown(node, argv, where)
            return None
        out.extend(sh._file_segments(sh._path(f), text))
    sh.emit(out, node, where, append_nl=False)
    return 0


def _b_tee(sh: Shell, argv, node, decl, where):
    heredoc = sh._stdin_heredoc(node)
    files = [_flat(a) for a in argv[1:] if not _flat(a).startswith("-")]
    append = any(_flat(a) in ("-a", "--append") for a in argv[1:])
    for f in files:
        path = sh._path(f)
        if path is None:
            continue
        if heredoc is not None:
            sh._write_vfs(path, heredoc, append, where)
        else:
            sh._vfs_unknown(path, f"written at run time by `{_short(argv)}` ({where})", where)
    return 0


def _b_sed(sh: Shell, argv, node, decl, where):
    """`sed [-i] -e 's/A/B/g' [file]`: the template filling of pattern 21."""
    scripts, files, inplace = [], [], False
    args = [_flat(a) for a in argv[1:]]
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-e", "--expression") and i + 1 < len(args):
            scripts.append(args[i + 1])
            i += 2
            continue
        if a.startswith("-i") or a == "--in-place":
            inplace = True
        elif a in ("-E", "-r", "-n", "-s", "-u", "-z"):
            if a == "-n":
                scripts.append("\x00noprint")
        elif not scripts:
            scripts.append(a)
        else:
            files.append(a)
        i += 1
    subs = []
    for s in scripts:
        for piece in s.split(";"):
            m = re.fullmatch(r"\s*s(.)(.*?)\1(.*?)\1([gI0-9]*)\s*", piece, re.S)
            if not m or MARK_OPEN in m.group(2):
                sh._redirect_outputs_unknown(node, argv, where)
                if sh.capture:
                    sh.capture_unknown[-1] = f"output of `{_short(argv)}` ({where})"
                return None
            subs.append(m.groups()[1:])
    texts = []
    stdin_origins: Optional[list] = None
    for f in files or ["-"]:
        if f == "-":
            hd = sh._stdin_heredoc(node)
            t = _flat(hd) if hd is not None else None
            if hd is not None:
                stdin_origins = _line_origins(hd)
        else:
            t = sh._read_any(sh._path(f), where, what="sed input")
        if t is None:
            sh._redirect_outputs_unknown(node, argv, where)
            if sh.capture:
                sh.capture_unknown[-1] = f"output of `{_short(argv)}` ({where})"
            return None
        texts.append((f, t))
    compiled = []
    for pat, rep, flags in subs:
        try:
            rx = re.compile(_bre_to_re(pat), re.I if "I" in flags else 0)
        except re.error:
            rx = re.compile(re.escape(pat))
        rep_py = rep.replace("\\&", "\x00AMP").replace("&", "\\g<0>").replace("\x00AMP", "&")
        compiled.append((rx, rep_py, 0 if "g" in flags else 1))
    for f, t in texts:
        # line by line (sed's model): unchanged lines keep their origin, changed ones point here
        segs = []
        src = sh._path(f) if f != "-" else where
        # a file the script wrote or copied (a template): each line's own origin, not src:line
        vf = sh.vfs.get(src) if f != "-" else None
        origins = stdin_origins if f == "-" else (vf.line_origins if vf is not None and vf.line_origins else None)
        for i, line in enumerate(t.split("\n")[: 100_000], 1):
            new = line
            for rx, rep_py, count in compiled:
                try:
                    new = rx.sub(rep_py, new, count=count)
                except (re.error, IndexError):
                    pass
            if origins is not None:
                before = origins[i - 1] if i <= len(origins) else where
            else:
                before = f"{src}:{i}" if f != "-" else where
            if new == line:
                origin = before
            else:
                # the line sed changed is named at the sed command; its key too, unless sed left
                # the line's first word alone (`"micro": MB` filled in: the key is the template's)
                origin = where
                word = _FIRST_WORD.search(new)
                same = next((k for k, (a, b) in enumerate(zip(line, new)) if a != b), min(len(line), len(new)))
                if word is not None and word.end() <= same:
                    origin = LineOrigin(where, key_origin(before))
            segs.append((new + "\n", origin))
        if segs and not t.endswith("\n"):
            segs[-1] = (segs[-1][0][:-1], segs[-1][1])
        elif segs and segs[-1][0] == "\n":
            segs.pop()
        if inplace and f != "-":
            sh._write_vfs(sh._path(f), segs, False, where)
        else:
            sh.emit(segs, node, where, append_nl=False)
    return 0


def _b_cp(sh: Shell, argv, node, decl, where):
    """`cp [-fpv…] SRC DST`: DST is SRC's text, each line still named where SRC has it (a template
    copied and then filled in by `sed -i`).  Other forms (several sources, -r, unknown names) copy
    nothing we could know: DST, where known, is a file of unknown text."""
    args = [_flat(a) for a in argv[1:]]
    opts = [a for a in args if a.startswith("-") and a != "-"]
    paths = [a for a in args if not (a.startswith("-") and a != "-")]
    simple = len(paths) == 2 and all(re.fullmatch(r"-[fpvn]+|--force|--preserve|--verbose", o) for o in opts)
    if not simple or any(MARK_OPEN in p for p in paths):
        if paths and MARK_OPEN not in paths[-1] and not paths[-1].endswith("/"):
            sh._vfs_unknown(sh._path(paths[-1]), f"written at run time by `{_short(argv)}` ({where})", where)
        return 0
    src_path, dst = sh._path(paths[0]), paths[1]
    dst_path = sh._path(dst)
    if dst.endswith("/") or dst in (".", ".."):      # (a directory by any other name is not known here)
        dst_path = join_path(dst_path, posixpath.basename(src_path))
    text = sh._read_any(src_path, where, what="file copied")
    if text is None:
        sh._vfs_unknown(dst_path, f"a copy of {src_path}, which could not be read ({where})", where)
        return 0
    f = sh.vfs.get(src_path)
    sh._write_vfs(dst_path, _lines_with_origin(text, src_path, f.line_origins if f is not None else None),
                  False, where)
    return 0


def _b_pwd(sh, argv, node, decl, where):
    if sh.cwd is None:
        if sh.capture:
            sh.capture_unknown[-1] = f"the working directory ({where})"
        return None
    sh.emit([(sh.cwd, where)], node, where)
    return 0


def _b_dirname(sh, argv, node, decl, where):
    if len(argv) < 2:
        return 1
    t = _flat(argv[1])
    if MARK_OPEN in t:
        if sh.capture:
            sh.capture_unknown[-1] = sh.u.reason(t) or "unknown"
        return None
    d = posixpath.dirname(t.rstrip("/")) or "."
    sh.emit([(d, Tok.of(argv[1]).origin_at(0))], node, where)
    return 0


def _b_basename(sh, argv, node, decl, where):
    if len(argv) < 2:
        return 1
    t = _flat(argv[1])
    if MARK_OPEN in t:
        if sh.capture:
            sh.capture_unknown[-1] = sh.u.reason(t) or "unknown"
        return None
    b = posixpath.basename(t.rstrip("/"))
    if len(argv) > 2 and b.endswith(_flat(argv[2])):
        b = b[: -len(_flat(argv[2]))]
    sh.emit([(b, Tok.of(argv[1]).origin_at(0))], node, where)
    return 0


def _b_realpath(sh, argv, node, decl, where):
    args = [a for a in argv[1:] if not _flat(a).startswith("-")]
    if not args:
        return 1
    t = _flat(args[0])
    p = sh._path(t)
    if p is None:
        if sh.capture:
            sh.capture_unknown[-1] = f"path of an unknown value ({where})"
        return None
    sh.emit([(p, Tok.of(args[0]).origin_at(0))], node, where)
    return 0


def _b_seq(sh, argv, node, decl, where):
    nums = [_to_int(_flat(a)) for a in argv[1:] if not _flat(a).startswith("-") or _to_int(_flat(a)) is not None]
    if not nums or any(n is None for n in nums) or len(nums) > 3:
        if sh.capture:
            sh.capture_unknown[-1] = f"output of `{_short(argv)}` ({where})"
        return None
    first, step, last = (1, 1, nums[0]) if len(nums) == 1 else \
        ((nums[0], 1, nums[1]) if len(nums) == 2 else (nums[0], nums[1], nums[2]))
    if step == 0 or abs((last - first) // step) > 10_000:
        if sh.capture:
            sh.capture_unknown[-1] = f"output of `{_short(argv)}` ({where})"
        return None
    sh.emit([("\n".join(str(x) for x in range(first, last + (1 if step > 0 else -1), step)), where)],
            node, where)
    return 0


def _b_expr(sh, argv, node, decl, where):
    text = " ".join(_flat(a) for a in argv[1:])
    v = sh._arith_value([Lit(text, _line_of(where), True)], _line_of(where)) \
        if re.fullmatch(r"[\d\s+\-*/%()]+", text) else None
    if v is None:
        if sh.capture:
            sh.capture_unknown[-1] = f"output of `{_short(argv)}` ({where})"
        return None
    sh.emit([(str(v), where)], node, where)
    return 0 if v else 1


def _b_command(sh, argv, node, decl, where):
    rest = [a for a in argv[1:]]
    if rest and _flat(rest[0]) in ("-v", "-V"):
        return None
    if not rest:
        return 0
    return sh._command(rest, node, decl, where)


def _b_exec(sh, argv, node, decl, where):
    if len(argv) == 1:
        return 0   # `exec > log 2>&1`
    sh._command(argv[1:], node, decl, where)   # its status is the shell's last: exec does not return
    raise _Exit()


def _b_noop_cap(sh, argv, node, decl, where):
    return 0


_BUILTINS: dict[str, Callable] = {
    "[": _b_test, "test": _b_test, "export": _b_export, "declare": _b_declare, "typeset": _b_declare,
    "readonly": _b_declare, "local": _b_local, "unset": _b_unset, "source": _b_source, ".": _b_source,
    "cd": _b_cd, "pushd": _b_cd, "popd": _b_noop_cap, "shift": _b_shift, "set": _b_set, "eval": _b_eval,
    "exit": _b_exit, "return": _b_return, "break": _b_break, "continue": _b_break, "false": _b_false,
    "let": _b_let, "read": _b_read, "echo": _b_echo, "printf": _b_printf, "cat": _b_cat, "tee": _b_tee,
    "sed": _b_sed, "pwd": _b_pwd, "dirname": _b_dirname, "basename": _b_basename, "realpath": _b_realpath,
    "readlink": _b_realpath, "seq": _b_seq, "expr": _b_expr, "command": _b_command, "builtin": _b_command,
    "exec": _b_exec, "true": _b_noop_cap, ":": _b_noop_cap, "cp": _b_cp,
}
# Builtins whose output inside $( ) we can know.
_PURE = {"echo", "printf", "pwd", "dirname", "basename", "realpath", "readlink", "seq", "expr", "cat", "sed",
         "true", ":", "[", "test", "export", "declare", "local", "set", "shift", "let", "false", "unset",
         "typeset", "readonly", "cd", "eval", "exit", "return", "break", "continue", "command", "builtin"}


# ====================================================================== helpers
_FIRST_WORD = re.compile(r"[A-Za-z0-9_][\w.\-]*")


class LineOrigin(str):
    """A written line's origin (its value's: :func:`_add_line_origins`) that also knows where the
    line's first word was written, its key's (``written``): `"micro_batchs": $MB` names a
    misspelt key at the heredoc's line, its value at the line that set MB.  ``written`` empty: the
    line has no word yet (only blanks or punctuation, so far)."""

    written: str

    def __new__(cls, origin: str, written: str) -> "LineOrigin":
        self = super().__new__(cls, origin)
        self.written = written
        return self

    def __reduce__(self):
        return LineOrigin, (str(self), self.written)


def _add_line_origins(origins: list, segs: list, open_line: bool) -> None:
    """Append to ``origins`` the origin of each line ``segs`` (text, origin) write, one per line
    (line N is origins[N - 1], empty lines too): the last piece on it with a letter or digit, so
    that `"stage": $ZERO_STAGE` points at the line that set ZERO_STAGE, not at the heredoc; an
    empty line, the piece that ends it.  Where the line's first piece with a letter or digit came
    from elsewhere, the origin is a :class:`LineOrigin` that keeps it (the key's line).
    ``open_line``: the last line so far is unfinished and has its origin already."""
    first = None
    if open_line and origins:       # an unfinished line: its first word's origin, if it has one
        first = getattr(origins[-1], "written", origins[-1]) or None
    for seg_text, origin in segs:
        for i, piece in enumerate(seg_text.split("\n")):
            if i:
                if not open_line:
                    origins.append(origin)
                open_line, first = False, None
            if piece:
                has_word = _ALNUM.search(piece) is not None
                if not open_line:
                    # (a line begun without a word says so, for a later write that continues it)
                    origins.append(origin if has_word else LineOrigin(origin, ""))
                    open_line = True
                    first = origin if has_word else None
                elif has_word:
                    if first is None:
                        first = origin
                    origins[-1] = origin if first == origin else LineOrigin(origin, first)


def _line_origins(segs: list) -> list:
    """The origin of each line of the text ``segs`` make (:func:`_add_line_origins`)."""
    origins: list = []
    _add_line_origins(origins, segs, open_line=False)
    return origins


def _lines_with_origin(text: str, path: Optional[str], origins: Optional[list] = None) -> list:
    """A file's text as one segment per line, each naming ``path:line`` or ``origins[line]`` (linear)."""
    out: list = []
    pos, line = 0, 1
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end + 1
        origin = origins[line - 1] if origins is not None and line <= len(origins) else f"{path}:{line}"
        out.append((text[pos:end], origin))
        pos, line = end, line + 1
    return out


def _is_star(p) -> bool:
    """``$*`` or ``${A[*]}`` (any operator): joined into one word when quoted, unlike ``@``."""
    if type(p) is not Param:
        return False
    if p.name == "*":
        return True
    return p.index is not None and len(p.index) == 1 and isinstance(p.index[0], Lit) and p.index[0].text == "*"


def _join_star(elems: "_Multi") -> list:
    out: list = []
    for i, e in enumerate(elems.items):
        if i:
            out.append((" ", e[0][1] if e else ""))
        out.extend(e)
    return out


def _flat(val: list) -> str:
    return "".join([s[0] for s in val])


def _short(argv: list) -> str:
    s = " ".join(Unknowns.strip(_flat(a)) for a in argv[:4])
    return s[:80] + ("…" if len(argv) > 4 or len(s) > 80 else "")


def _line_of(origin: str) -> int:
    tail = origin.rsplit(":", 1)[-1] if origin else ""
    return int(tail) if tail.isdigit() else 0


def _origin_map(segs: list):
    import bisect
    starts, origins = [], []
    pos = 0
    for text, origin in segs:
        if text:
            starts.append(pos)
            origins.append(origin)
            pos += len(text)
    if not starts:
        return lambda _p: ""

    def at(p: int) -> str:
        i = bisect.bisect_right(starts, p) - 1
        return origins[max(i, 0)]
    return at


def _ordered_keys(arr: dict, assoc: bool) -> list:
    if assoc:
        return list(arr.keys())
    return sorted(arr.keys(), key=lambda k: _to_int(k) or 0)


def _glob_tokens(pat: str) -> list:
    """A shell pattern as regex pieces, one per character it matches, and None for each `*`."""
    out: list = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if c == "*":
            if not out or out[-1] is not None:      # `**` is `*`
                out.append(None)
        elif c == "?":
            out.append(".")
        elif c == "[":
            end, cls = _bracket(pat, i)
            if cls is None:
                out.append(re.escape(c))
            else:
                out.append(cls)
                i = end
        elif c == "\\" and i + 1 < len(pat):
            out.append(re.escape(pat[i + 1]))
            i += 1
        else:
            out.append(re.escape(c))
        i += 1
    return out


# POSIX character classes in a bracket expression, as Python class members
_POSIX_CLASSES = {"alpha": "a-zA-Z", "digit": "0-9", "alnum": "a-zA-Z0-9", "upper": "A-Z", "lower": "a-z",
                  "space": " \\t\\n\\r\\f\\v", "blank": " \\t", "xdigit": "0-9A-Fa-f", "word": "\\w",
                  "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"), "cntrl": "\\x00-\\x1f\\x7f",
                  "print": "\\x20-\\x7e", "graph": "\\x21-\\x7e"}


def _bracket(pat: str, i: int) -> tuple[int, Optional[str]]:
    """The bracket expression at ``pat[i] == "["`` as bash reads it: ``!`` or ``^`` negates, a
    ``]`` first is a member, ``[:class:]`` a POSIX class, a backslash escapes; (index of its
    closing ``]``, a Python character class), or (i, None) when it does not close (a plain ``[``)."""
    j = i + 1
    negate = j < len(pat) and pat[j] in "!^"
    j += negate
    members: list = []
    first = True
    while j < len(pat):
        c = pat[j]
        if c == "]" and not first:
            cls = "[" + ("^" if negate else "") + "".join(members) + "]"
            try:
                re.compile(cls)
            except re.error:         # a reversed range ([z-a]): bash matches nothing with it
                cls = "(?!)"
            return j, cls
        if c == "[" and pat.startswith("[:", j):
            k = pat.find(":]", j + 2)
            name = pat[j + 2:k] if k > 0 else ""
            if name in _POSIX_CLASSES:
                members.append(_POSIX_CLASSES[name])
                j, first = k + 2, False
                continue
        if c == "\\" and j + 1 < len(pat):
            j += 1
            c = pat[j]
        if c == "-" and members and not first and j + 1 < len(pat) and pat[j + 1] != "]":
            members.append("-")          # a range between its neighbours
        else:
            members.append(re.escape(c))
        j, first = j + 1, False
    return i, None


def _whole(tokens: list) -> str:
    """A regex that matches a whole text as the pattern ``tokens`` does, in time linear in each
    star's span: as fnmatch translates, every star but the last takes the earliest place its
    fixed-length piece after it matches, in an atomic group that never retries it (a greedy `.*`
    per star backtracks through every split: `*a*a*a*a*b` against 200 `a`s took 4.6 s)."""
    pieces = _star_pieces(tokens)
    if len(pieces) == 1:
        return pieces[0]
    out = [pieces[0]]
    out += [_atomic(".*?" + p, k) for k, p in enumerate(pieces[1:-1])]
    out.append(".*" + pieces[-1])
    return "".join(out)


def _star_pieces(tokens: list) -> list:
    """The regexes of the fixed-length pieces between a pattern's stars (one more than stars)."""
    pieces: list = [[]]
    for t in tokens:
        if t is None:
            pieces.append([])
        else:
            pieces[-1].append(t)
    return ["".join(p) for p in pieces]


def _atomic(body: str, k: int) -> str:
    """``(?>body)`` (an atomic group, Python 3.11+) as a lookahead and a reference to what it
    took, which no later failure retries, on every Python: fnmatch's own construction."""
    return f"(?=(?P<g{k}>{body}))(?P=g{k})"


def _prefix_end(tokens: list, text: str, longest: bool) -> Optional[int]:
    """Where the shortest (or longest) prefix of ``text`` that the pattern ``tokens`` matches
    ends, or None: in one regex match, linear in the text.  Each piece between stars is of fixed
    length, so the earliest place of every piece after the first (atomic, never retried) gives
    the shortest prefix; the longest takes those earliest places for all but the last piece and
    the latest place for that one (or the whole text after a last star)."""
    if longest:
        rx = _whole(tokens)     # matched from the start only, it ends where the longest prefix does
    else:
        pieces = _star_pieces(tokens)
        rx = pieces[0] + "".join(_atomic(".*?" + p, k) for k, p in enumerate(pieces[1:]))
    m = re.match(rx, text, re.S)
    return None if m is None else m.end()


def _strip_prefix(text: str, tokens: list, longest: bool) -> str:
    end = _prefix_end(tokens, text, longest)
    return text if end is None else text[end:]


def _strip_suffix(text: str, tokens: list, longest: bool) -> str:
    # a suffix of the text is a prefix of it reversed, matched by the pattern reversed
    end = _prefix_end(tokens[::-1], text[::-1], longest)
    return text if end is None else text[:len(text) - end]


def _unescape(t: str) -> str:
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], t)


def _printf(fmt: str, args: list) -> str:
    fmt = _unescape(fmt)
    specs = re.findall(r"%[-+ #0]*\d*(?:\.\d+)?[sdifgxXeEcbu%]", fmt)
    n = sum(1 for s in specs if s != "%%")
    out = []
    args = list(args)
    for _ in range(100):
        it = iter(args[:n] if n else [])
        args = args[n:] if n else []

        def rep(m):
            s = m.group(0)
            if s == "%%":
                return "%"
            a = next(it, "")
            conv = s[-1]
            if len(s) > 8:
                s = _clamped_spec(s)
            try:
                if conv in "diu":
                    return ("%" + s[1:-1] + "d") % int(a or 0)
                if conv in "fgeE":
                    return s % float(a or 0)
                if conv in "xX":
                    return s % int(a or 0)
            except (ValueError, TypeError):
                return a
            return ("%" + s[1:-1] + "s") % a if conv in "sbc" else a
        out.append(re.sub(r"%[-+ #0]*\d*(?:\.\d+)?[sdifgxXeEcbu%]", rep, fmt))
        if not args or not n:
            break
    return "".join(out)


def _clamped_spec(spec: str) -> str:
    """A printf spec whose width or precision passes the value limit made just past it: the text is
    refused all the same (the value grows beyond MAX_VALUE_CHARS), without formatting a gigabyte
    first (`%0999999999d`)."""
    m = re.fullmatch(r"%([-+ #0]*)(\d*)(?:\.(\d+))?(.)", spec)
    if m is None:
        return spec
    flags, width, prec, conv = m.groups()
    cap = MAX_VALUE_CHARS + 1
    width = str(min(int(width), cap)) if width else ""
    prec = "." + str(min(int(prec), cap)) if prec else ""
    return f"%{flags}{width}{prec}{conv}"


def _bre_to_re(pat: str) -> str:
    """sed basic regex -> Python: \\( \\) \\{ \\} \\+ \\? are operators, bare ones literal."""
    out = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if c == "\\" and i + 1 < len(pat):
            n = pat[i + 1]
            out.append(n if n in "(){}+?|" else "\\" + n)
            i += 2
            continue
        out.append("\\" + c if c in "(){}+?|" else c)
        i += 1
    return "".join(out)
