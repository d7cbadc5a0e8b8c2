"""The sample store: measured operator and collective timings, as plain CSV files.

Layout of a sample directory (format 1)::

    samples.toml                          what was measured where: GPU, environment, plan, format
    operators/<op>_<precision>.csv        <features of the op>, fwd_us, bwd_us   (optimizer: step_us;
                                          0 = that direction was not measured, or was dropped)
    collectives/<kind>_<precision>.csv    entries, nodes, gpus_per_node, us

Calibration appends rows as it measures (a killed job resumes where it stopped: rows already
present are skipped by the caller); the importer of third-party data writes the same layout, so
one fitting path serves both.  Rows are never rewritten; a last line without its newline (a
writer killed mid-row) is read as not there, with a warning, as a resumed run drops it.  The
writers are :mod:`calibrate.store`'s; this module reads (the predictor itself never needs samples,
but every fitting path reads them through here) and keeps the small TOML writer the platform
files use.
"""
from __future__ import annotations

import csv
import io
import logging
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

log = logging.getLogger(__name__)

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


# The range of one measured time, in µs.  A sample is one call of one operator or collective at a
# training shape (calibrate.timing: the mean of 4-10 repetitions after 1-3 warm-ups in the built-in
# plans).  The slowest sample shipped, a CPU optimizer step, is 0.3 s: an hour is four orders of
# magnitude beyond it, and at an hour a call one point would keep the calibration busy for 5 to 13
# hours, more than a partition's MaxTime gives a whole calibration of hundreds of points (4 h
# when it has none).  Under a nanosecond is a few clock cycles: less than any kernel launch or
# the clock that brackets it (CUDA events resolve ~0.5 µs; the fastest sample shipped is ~2 µs).
# A value outside is a unit slip or a corrupt file, never a measurement, and the fit would learn
# from it (log-ratio targets: one such row drags a tree's leaf by orders of magnitude).
MAX_SAMPLE_US = 3600e6
MIN_SAMPLE_US = 1e-3


def _is_time(column: str) -> bool:
    """A measured-time column (``fwd_us``, ``step_us``, a collective's ``us``); the others are features."""
    return column == "us" or column.endswith("_us")


def _row_problem(header: Sequence[str], times: Sequence[int], row: Sequence[str],
                 vals: Sequence[float]) -> str | None:
    """Why one parsed row cannot be a sample ("column X: ..."), or None.

    Features are shapes, counts or sizes: finite and > 0 (0 would be an operator of nothing, and
    the regressors' log-features of it are not finite: the fit would drop the row without a word).
    Times are finite and within [MIN_SAMPLE_US, MAX_SAMPLE_US]; an operator's direction may be 0,
    which means "not measured, or dropped" (the importer drops impossible backward times so), but
    not every direction of a row, and a collective's time never (it has one).  ``times``: the
    indices of the header's time columns (:func:`_is_time`), found once per file.
    """
    for i, (col, raw, v) in enumerate(zip(header, row, vals)):
        if not np.isfinite(v):
            return f"column {col}: {raw.strip()!r} is not a finite number"
        if i not in times:
            if v <= 0:
                return f"column {col}: {v:g} is not a size (must be > 0)"
            continue
        if v < 0:
            return f"column {col}: {v:g} µs is negative (a time is > 0, or 0 for a direction not measured)"
        if v == 0:
            if col == "us":
                return f"column {col}: 0 µs is not a measured time (must be > 0)"
            continue
        if v > MAX_SAMPLE_US:
            return (f"column {col}: {v:g} µs is more than an hour for one call, not a measurement "
                    "(a unit slip or a corrupt file?)")
        if v < MIN_SAMPLE_US:
            return f"column {col}: {v:g} µs is under a nanosecond, not a measurement (a unit slip?)"
    if times and all(vals[i] == 0 for i in times):
        cols = ", ".join(header[i] for i in times)
        return f"every time ({cols}) is 0: nothing measured, not a sample"
    return None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_table(path: Path, name: str, precision: str, expected: Sequence[str]) -> SampleTable:
    """Read one sample CSV, checking its header and every value; errors name file, line and column
    (a bad row refuses the whole file: a measurement store's admin wants to know, not a fit that
    quietly learnt without it or from it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: cannot read sample file: {exc}") from None
    if text and not text.endswith("\n"):
        # A last line without its newline is what a writer killed mid-row leaves (every row is
        # written whole with its newline, calibrate.store.append_rows): its values may be cut
        # short yet parse ("113.6359,3" of "113.6359,35.2").  Dropped with a warning, as
        # calibrate.store.repair_torn_tail drops it before a run resumes; the file is not changed.
        cut = text.rfind("\n") + 1
        log.warning("%s:%d: dropped a torn last line (no newline at its end: a writer was killed "
                    "while writing it)", path, text.count("\n", 0, cut) + 1)
        text = text[:cut]
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise BundleError(f"{path}: empty sample file")
    header = [h.strip() for h in header]
    if tuple(header) != tuple(expected):
        raise BundleError(f"{path}: columns {header} do not match the expected {list(expected)} "
                          "(a sample store of another perfcast version?)")
    values = []
    times = [i for i, c in enumerate(header) if _is_time(c)]    # the measured-time columns
    for row in reader:
        lineno = reader.line_num
        if not row:
            continue
        if len(row) != len(header):
            # A torn last line is what a killed writer leaves; anything else is corruption.
            raise BundleError(f"{path}:{lineno}: expected {len(header)} values, found {len(row)}")
        try:
            vals = [float(v) for v in row]
        except ValueError:
            col, raw = next((c, v) for c, v in zip(header, row) if not _is_float(v))
            raise BundleError(f"{path}:{lineno}: column {col}: {raw.strip()!r} is not a number") from None
        problem = _row_problem(header, times, row, vals)
        if problem:
            raise BundleError(f"{path}:{lineno}: {problem}")
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
