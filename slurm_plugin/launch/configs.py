"""Loading YAML (NeoX) and JSON (DeepSpeed) configs safely, keeping the line of every key.

Only yaml's *composer* runs (C libyaml when present, else SafeLoader): we build plain values from
the node graph ourselves, with a node budget (alias bombs), a depth limit (1000-deep nests), and
never a constructor that could run code. JSON goes through the same path (YAML 1.1 reads JSON and
also the bare ``GBSIZE`` placeholders of sed templates, as strings); JSON with tabs falls back to
the json module.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from .files import decode_text
from .limits import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_NODES, CannotPredict
from .values import MARK_OPEN

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MARK = re.compile("\ue000\\d+\ue001")
_BARE_MARK = re.compile(r'(?<!["\w])(\ue000\d+\ue001)(?!["\w])')
_INTEGRAL = re.compile(r"[+-]?\d+(\.0*)?([eE]\+?\d+)?")
_SC = yaml.constructor.SafeConstructor()
_SEXAGESIMAL_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


@dataclass
class Config:
    """A loaded config: plain data, the line of each key path, and how to name a line."""

    data: Any
    label: str
    lines: dict = field(default_factory=dict)          # tuple(key path) -> line (1-based)
    line_origins: Optional[list] = None                # for files the script wrote: line -> "file:line"
    duplicates: list = field(default_factory=list)     # [(key path, line, first line)]: a key again
    bare: set = field(default_factory=set)             # key paths whose value is an unquoted word

    def origin(self, path: tuple) -> str:
        return self.line_origin(self.lines.get(path))

    def key_origin(self, path: tuple) -> str:
        """Where the key of ``path`` was written: :meth:`origin`, less a value's origin on its line
        (a file the script wrote with `"key": $VAR` names the variable's line for the value)."""
        return key_origin(self.origin(path))

    def line_origin(self, line: Optional[int]) -> str:
        if line is None:
            return self.label
        if self.line_origins is not None and 0 < line <= len(self.line_origins):
            return self.line_origins[line - 1]
        return f"{self.label}:{line}"


def key_origin(origin: str) -> str:
    """Where a line's key was written (its first word): ``origin`` itself unless the line is one
    a script wrote with a value from elsewhere (shell.LineOrigin, which keeps both)."""
    return getattr(origin, "written", None) or origin


def _too_deep_at(text: str) -> int:
    """Offset where flow nesting first exceeds MAX_CONFIG_DEPTH, or -1 (libyaml recurses in C)."""
    if text.count("[") + text.count("{") <= MAX_CONFIG_DEPTH:
        return -1
    # Brackets inside quoted strings count too: a false alarm needs > 64 of them nested, which
    # no real config has. numpy keeps a 1 MiB check at C speed.
    import numpy as np
    raw = np.frombuffer(text.encode("utf-8", "replace"), dtype=np.uint8)
    steps = (raw == ord("[")).astype(np.int32) + (raw == ord("{")) - (raw == ord("]")) - (raw == ord("}"))
    over = np.flatnonzero(np.cumsum(steps) > MAX_CONFIG_DEPTH)
    if not len(over):
        return -1
    return len(text.encode("utf-8", "replace")[: int(over[0])].decode("utf-8", "replace"))


def load_config(text: str, label: str, line_origins: Optional[list] = None, kind: str = "yaml") -> Config:
    if len(text) > MAX_CONFIG_BYTES:
        raise CannotPredict(f"config {label} is larger than {MAX_CONFIG_BYTES >> 10} KiB", f"{label}:1")
    deep = _too_deep_at(text)
    if deep >= 0:
        line = text.count("\n", 0, deep) + 1
        where = line_origins[line - 1] if line_origins and line <= len(line_origins) else f"{label}:{line}"
        raise CannotPredict(f"config {label} is nested more than {MAX_CONFIG_DEPTH} levels deep", where)
    src = _BARE_MARK.sub(r'"\1"', text) if MARK_OPEN in text else text
    try:
        node = yaml.compose(src, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if kind == "json" and "\t" in text:
            return _load_json(src, label, line_origins)
        problem = (exc.problem or exc.context or "syntax error").strip()
        line = mark.line + 1 if mark else 0
        where = line_origins[line - 1] if line_origins and 0 < line <= len(line_origins) else f"{label}:{line}"
        raise CannotPredict(f"{label} is not valid {'JSON' if kind == 'json' else 'YAML'}: {problem}", where) \
            from None
    except yaml.YAMLError as exc:
        raise CannotPredict(f"{label} is not valid {'JSON' if kind == 'json' else 'YAML'}: "
                            f"{str(exc).splitlines()[0][:100]}", label) from None
    except (RecursionError, MemoryError):
        raise CannotPredict(f"config {label} is nested too deeply", label) from None
    cfg = Config(None, label, {}, line_origins)
    if node is None:
        if kind == "json":
            # Megatron-DeepSpeed (and DeepSpeed before its hjson loader) json.load the file, which
            # fails on no value; DeepSpeed's hjson reads {} and then asserts a batch size is given.
            what = "empty" if not text.strip() else "without a JSON value (comments or blanks only)"
            first = line_origins[0] if line_origins else f"{label}:1"
            raise CannotPredict(f"{label} is {what}: DeepSpeed stops at start (json.load fails on it; "
                                f"DeepSpeed's hjson loader reads no keys, so no batch size)", first)
        cfg.data = {}
        return cfg
    budget = [0]
    cfg.data = _build(node, (), cfg.lines, budget, 0, label, cfg.duplicates, cfg.bare)
    if kind == "json":
        _check_json(cfg, src)
    return cfg


# What YAML accepts in a JSON file and json.load does not (DeepSpeed reads its config with
# json.load): looked for only where one of these characters appears at all.
_JSON_SUSPECT = re.compile(r",\s*[}\]]|#|'")
_BARE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEEPSPEED_LOADER = "DeepSpeed's json.load (\"Duplicate keys in DeepSpeed config\")"


def _check_json(cfg: Config, src: str) -> None:
    """DeepSpeed loads its JSON with ``json.load(..., object_pairs_hook=dict_raise_error_on_duplicate_keys)``
    (runtime/config.py, config_utils.py): a duplicate key or text json refuses stops it at start.
    A bare word where a value belongs is a sed template's placeholder (filled before the run): not
    judged."""
    check_duplicates(cfg, _DEEPSPEED_LOADER, True, [])
    if _JSON_SUSPECT.search(src) is None:
        return
    try:
        json.loads(src)
    except ValueError as exc:
        pos = getattr(exc, "pos", None)
        if pos is None or _BARE_WORD.match(src, pos) and not src.startswith(("true", "false", "null"), pos):
            return
        raise CannotPredict(f"{cfg.label} is not valid JSON: {exc.msg} (YAML reads it, but DeepSpeed's json.load "
                            f"refuses it and DeepSpeed stops at start)", cfg.line_origin(exc.lineno)) from None
    except RecursionError:
        return


def check_duplicates(cfg: Config, who: str, refuses: bool, warnings: list) -> None:
    """A key given twice in one mapping: ``who`` (OmegaConf) refuses to load such a file, or (PyYAML)
    keeps the last one silently."""
    for path, line, first in cfg.duplicates:
        again = f" (first at line {first})" if first is not None and first != line else ""
        name = ".".join(map(str, path))
        if refuses:
            raise CannotPredict(f"duplicate key {name!r} in {cfg.label}{again}: {who} refuses to load a config "
                                f"with a duplicate key and the job stops at start", cfg.line_origin(line))
        warnings.append(f"duplicate key {name!r} in {cfg.label}{again}: {who} keeps the last value, this one "
                        f"({cfg.line_origin(line)})")


def _build(node, path: tuple, lines: dict, budget: list, depth: int, label: str, dups: list,
           bare: set) -> Any:
    budget[0] += 1
    if budget[0] > MAX_CONFIG_NODES:
        raise CannotPredict(f"config {label} expands to more than {MAX_CONFIG_NODES} values "
                            f"(YAML aliases?)", f"{label}:{node.start_mark.line + 1}")
    if depth > MAX_CONFIG_DEPTH:
        raise CannotPredict(f"config {label} is nested more than {MAX_CONFIG_DEPTH} levels deep",
                            f"{label}:{node.start_mark.line + 1}")
    if isinstance(node, yaml.ScalarNode):
        if not node.style and node.tag == "tag:yaml.org,2002:str" and len(path) <= 4:
            bare.add(path)      # a plain word: in a JSON file, a template's placeholder (GBSIZE)
        if node.tag in _SEXAGESIMAL_TAGS and node.value.count(":") > 4:
            # YAML 1.1's base 60 (1:30 is 90): PyYAML multiplies ever larger numbers part by part,
            # quadratic in the parts; no setting has more than a few, so a longer one stays text
            return node.value
        try:
            return _SC.construct_object(node, deep=False) if node.tag != "tag:yaml.org,2002:timestamp" \
                else node.value
        except (yaml.YAMLError, ValueError, OverflowError):
            return node.value
    if isinstance(node, yaml.SequenceNode):
        return [_build(v, path + (i,), lines, budget, depth + 1, label, dups, bare) for i, v in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                budget[0] += 1
                continue
            key = str(k.value)
            if k.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *x` merge keys: not used by NeoX configs; ignored
            sub = path + (key,)
            if key in out:
                dups.append((sub, k.start_mark.line + 1, lines.get(sub)))
            if len(sub) <= 4:
                lines[sub] = k.start_mark.line + 1
            out[key] = _build(v, sub, lines, budget, depth + 1, label, dups, bare)
        return out
    return None


def _load_json(text: str, label: str, line_origins: Optional[list]) -> Config:
    dups: list = []

    def pairs(items: list) -> dict:
        out = dict(items)
        if len(out) != len(items):
            seen: set = set()
            dups.extend(((k,), 0, None) for k, _v in items if k in seen or seen.add(k))
        return out
    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except (ValueError, RecursionError) as exc:
        line = getattr(exc, "lineno", 0)
        raise CannotPredict(f"{label} is not valid JSON: {getattr(exc, 'msg', str(exc))[:80]}",
                            f"{label}:{line}") from None
    cfg = Config(data, label, {}, line_origins)
    # json has no line numbers: find each top-level/nested key's first line by a plain search
    for i, ln in enumerate(text.split("\n"), 1):
        for m in re.finditer(r'"([^"\\]{1,80})"\s*:', ln):
            cfg.lines.setdefault((m.group(1),), i)
    if dups:
        path = dups[0][0]
        cfg.duplicates = [(path, cfg.lines.get(path), None)]
        check_duplicates(cfg, _DEEPSPEED_LOADER, True, [])
    return cfg


def read_config(raw: bytes, label: str, kind: str) -> Config:
    text = decode_text(raw, label, MAX_CONFIG_BYTES)
    return load_config(text, label, None, kind)


def to_number(value: Any) -> Optional[float]:
    """YAML 1.1 leaves `5e8`, `1e-5` and '1_000' as strings; NeoX/DeepSpeed read them as numbers."""
    if isinstance(value, str):      # first: command-line words are the common case
        s = value.strip().replace("_", "")
        if MARK_OPEN in s:
            return None
        if len(s) <= 15 and s.isdigit() and s.isascii():
            return int(s)     # what float() then the integral pattern give, exact below 1e15
        try:
            f = float(s)
        except ValueError:
            return None
        if f != f or f in (float("inf"), float("-inf")):
            return None
        return int(f) if f.is_integer() and _INTEGRAL.fullmatch(s) else f
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value if value - value == 0.0 else None    # YAML's .nan, .inf: no setting's value
    if isinstance(value, int):
        return value
    return None


# Beyond this an integer setting (layers, sizes, batches, steps, intervals) is no real job's, and the
# arithmetic on it (2/3 of 4h, float products) would overflow: it is read as no integer at all.
MAX_INT_SETTING = 1 << 62


def to_int(value: Any) -> Optional[int]:
    n = to_number(value)
    if n is None:
        return None
    if isinstance(n, float):
        if not n.is_integer():
            return None
        n = int(n)
    return n if -MAX_INT_SETTING <= n <= MAX_INT_SETTING else None


def to_bool(value: Any) -> Optional[bool]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "yes", "on", "1"):
            return True
        if v in ("false", "no", "off", "0", "none", "null", ""):
            return False
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    return None
