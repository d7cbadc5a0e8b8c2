"""The sample store: measured operator and collective timings, as plain CSV files.

Layout of a sample directory (format 1)::

    samples.toml                          what was measured where: GPU, environment, plan, format
    operators/<op>_<precision>.csv        <features of the op>, fwd_us, bwd_us   (optimizer: step_us;
                                          0 = that direction was not measured, or was dropped)
    collectives/<kind>_<precision>.csv    entries, nodes, gpus_per_node, us

Calibration appends rows as it measures (a killed job resumes where it stopped: rows already
present are skipped by the caller); the importer of third-party data writes the same layout, so
one fitting path serves both.  Rows are never rewritten.  The writers are
:mod:`calibrate.store`'s; this module reads (the predictor itself never needs samples, but every
fitting path reads them through here) and keeps the small TOML writer the platform files use.
"""
from __future__ import annotations

import csv
import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import BundleError
from .operators import COLLECTIVE_FEATURES, COLLECTIVES, OPERATORS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FORMAT_VERSION = 1
META_FILE = "samples.toml"


@dataclass
class SampleTable:
    """Rows of one operator or collective at one precision: features + measured microseconds."""

    name: str
    precision: str
    columns: tuple[str, ...]
    rows: np.ndarray                   # float64, rows × columns

    def column(self, name: str) -> np.ndarray:
        return self.rows[:, self.columns.index(name)]

    def __len__(self) -> int:
        return int(self.rows.shape[0])


@dataclass
class SampleSet:
    """Everything in a sample directory."""

    meta: dict[str, Any]
    operators: dict[tuple[str, str], SampleTable] = field(default_factory=dict)    # (op, precision)
    collectives: dict[tuple[str, str], SampleTable] = field(default_factory=dict)  # (kind, precision)


def operator_columns(op_name: str) -> tuple[str, ...]:
    op = OPERATORS[op_name]
    return op.features + tuple(f"{d}_us" for d in op.directions)


def collective_columns() -> tuple[str, ...]:
    return COLLECTIVE_FEATURES + ("us",)


def read_table(path: Path, name: str, precision: str, expected: Sequence[str]) -> SampleTable:
    """Read one sample CSV, checking its header and every value; errors name file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: cannot read sample file: {exc}") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise BundleError(f"{path}: empty sample file")
    header = [h.strip() for h in header]
    if tuple(header) != tuple(expected):
        raise BundleError(f"{path}: columns {header} do not match the expected {list(expected)} "
                          "(a sample store of another perfcast version?)")
    values = []
    for lineno, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != len(header):
            # A torn last line is what a killed writer leaves; anything else is corruption.
            raise BundleError(f"{path}:{lineno}: expected {len(header)} values, found {len(row)}")
        try:
            vals = [float(v) for v in row]
        except ValueError:
            raise BundleError(f"{path}:{lineno}: not a number in {row}") from None
        if not all(np.isfinite(vals)) or any(v < 0 for v in vals):
            raise BundleError(f"{path}:{lineno}: values must be finite and non-negative: {row}")
        values.append(vals)
    rows = np.asarray(values, dtype=float).reshape(-1, len(header))
    return SampleTable(name, precision, tuple(header), rows)


def load_samples(directory: "str | Path") -> SampleSet:
    """Read a whole sample directory; refuses other formats and unknown files with a clear message."""
    d = Path(directory)
    meta_path = d / META_FILE
    if not meta_path.is_file():
        raise BundleError(f"{d}: not a sample directory (no {META_FILE})")
    try:
        meta = tomllib.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BundleError(f"{meta_path}: unreadable: {exc}") from None
    if meta.get("format") != FORMAT_VERSION:
        raise BundleError(f"{meta_path}: sample format {meta.get('format')!r} is not supported "
                          f"(this perfcast reads format {FORMAT_VERSION})")
    out = SampleSet(meta=meta)
    for path in sorted((d / "operators").glob("*.csv")):
        op, precision = _split_name(path, OPERATORS)
        out.operators[(op, precision)] = read_table(path, op, precision, operator_columns(op))
    for path in sorted((d / "collectives").glob("*.csv")):
        kind, precision = _split_name(path, COLLECTIVES)
        out.collectives[(kind, precision)] = read_table(path, kind, precision, collective_columns())
    return out


def _split_name(path: Path, known: Iterable[str]) -> tuple[str, str]:
    stem = path.stem
    name, _, precision = stem.rpartition("_")
    # fp8: the layers' linear GEMMs measured in FP8 (calibrate.kernels, predictor.fp8).
    if name not in set(known) or precision not in ("fp16", "bf16", "fp32", "fp8"):
        raise BundleError(f"{path}: unknown sample file (expected <name>_<fp16|bf16|fp32|fp8>.csv "
                          f"with a name from the catalog)")
    return name, precision


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` in one rename, so that a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def dump_toml(data: Mapping[str, Any]) -> str:
    """A small TOML writer for our own manifests (flat values, arrays, nested tables and top-level
    arrays of tables)."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    arrays: list[tuple[str, list]] = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            tables.append((key, value))
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
            arrays.append((key, list(value)))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for name, table in tables:
        _dump_table(name, table, lines)
    for name, items in arrays:
        for item in items:
            _dump_table(_toml_key(name), item, lines, array=True)
    return "\n".join(lines) + "\n"


def _dump_table(prefix: str, table: Mapping[str, Any], lines: list[str], array: bool = False) -> None:
    sub = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    if array or len(sub) < len(table) or not table:
        # A table holding only sub-tables needs no header of its own (TOML implies it).
        lines.append("")
        lines.append(f"[[{prefix}]]" if array else f"[{prefix}]")
    for key, value in table.items():
        if not isinstance(value, Mapping):
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in sub:
        _dump_table(f"{prefix}.{_toml_key(key)}", value, lines)


def _toml_key(key: str) -> str:
    k = str(key)
    if k and all(c.isalnum() or c in "-_" for c in k):
        return k
    return _toml_value(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not np.isfinite(v):
            raise ValueError("TOML cannot hold NaN or infinity here")
        return repr(v)
    if isinstance(v, str):
        esc = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        esc = "".join(c if ord(c) >= 0x20 else f"\\u{ord(c):04x}" for c in esc)
        return f'"{esc}"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
