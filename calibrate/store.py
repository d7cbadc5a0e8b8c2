"""The resumable sample store: the predictor's sample layout plus what resuming needs.

``predictor.samples`` reads the layout (every fitting path goes through it); the writers are here,
:func:`append_rows` and :func:`write_meta` (the importers write the same layout).  On top of them:

* an identity check on resume — a store written for another device, GPU type or measurement-method
  version is refused rather than silently mixed (mixed samples bias the regressors);
* repair of the one defect a killed writer can leave, a torn last line (dropped, never rewritten);
* the set of points already measured, so that a resumed run measures only what is missing;
* ``skipped.csv`` for points that cannot be measured here (out of memory, unsupported precision),
  so a resume does not retry them forever;
* a ``[progress]`` table with ``complete = true`` once every point of the plan is done: installing
  refuses a store that never reached it (a killed or failed calibration).
"""
from __future__ import annotations

import csv
import dataclasses
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, NoReturn, Sequence

from predictor.errors import BundleError, did_you_mean
from predictor.samples import (FORMAT_VERSION, META_FILE, SampleSet, atomic_write, collective_columns,
                               dump_toml, load_samples, operator_columns)
from predictor.operators import BYTES_PER_ELEMENT, OPERATORS

from .env import METHOD_VERSION, DeviceSpec, Environment
from .errors import CalibrationError, IncompatibleStore
from .plans import CollectivePoint, OperatorPoint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger(__name__)

SKIPPED_FILE = "skipped.csv"
STORE_KIND = "perfcast-calibration"
# samples.toml's [timing] host: "included" (perf-calibrate run --timing call) | "excluded" (device).
HOST_TIMINGS = ("included", "excluded")
# The [progress] table, as mark_complete writes it.
PROGRESS_KEYS = ("complete", "complete_plans", "operator_rows", "collective_rows", "skipped")

# Everything perfcast writes into samples.toml, and so everything it accepts there: a key of a
# table is a table (its own dict of keys), None a value.  The writers: this module (write_meta,
# SampleStore.open, mark_complete), calibrate.runner.run_calibration (the run's meta dict;
# [environment] is calibrate.env.Environment, [gpu] calibrate.env.DeviceSpec, both taken from
# their fields here), calibrate.importers (imported samples).  Nobody is meant to write the file
# by hand except a [gpu] table where fit asks for one, so a key outside this is a typo (or a store
# of a newer perfcast) and is refused: a misspelt [timing] host or [progress] complete would
# otherwise change the fit without a word.  tests/calibrate/test_store_checks.py writes stores
# through the real writers and checks them here, so the two cannot drift apart.
_VALUE = None
META_SCHEMA: dict[str, Any] = {
    # this module
    "format": _VALUE, "kind": _VALUE, "method_version": _VALUE, "device": _VALUE, "gpu_name": _VALUE,
    "plans": _VALUE, "precisions": _VALUE,
    "progress": dict.fromkeys(PROGRESS_KEYS),
    # calibrate.runner
    "environment": dict.fromkeys(f.name for f in dataclasses.fields(Environment) if f.name != "extra"),
    "gpu": {**dict.fromkeys(f.name for f in dataclasses.fields(DeviceSpec)),
            "tflops": dict.fromkeys(BYTES_PER_ELEMENT)},
    "allocation": dict.fromkeys(("nodes", "gpus_per_node")),
    "timing": dict.fromkeys(("warmup", "repeats", "statistic", "clock", "host")),
    "estimated": dict.fromkeys(("wall_minutes", "gpu_minutes")),
    "flash_atten_impl": _VALUE, "flash_atten_causal": _VALUE, "attention_impls_measured": _VALUE,
    "attention_impls_missing": _VALUE, "notes": _VALUE,
    # calibrate.importers (gpu: the GPU's name there, a value rather than the table)
    "source": _VALUE, "source_path": _VALUE, "license": _VALUE, "citation": _VALUE,
    "skipped_files": _VALUE, "dropped_rows": _VALUE,
    # read by fit as the allocation's when [allocation] is absent (older or hand-made stores)
    "gpus_per_node": _VALUE,
}
# Keys that may be either a table or a value ([gpu] measured, or gpu = "name" of imported samples).
_TABLE_OR_VALUE = {("gpu",)}


def check_meta(meta: Mapping[str, Any], path: Path) -> None:
    """Refuse a samples.toml holding a table or key perfcast does not write (with the nearest known
    one), or a value the fit reads that is not one it could have written; one line naming the file,
    the line where it can be found, and the key."""
    text: str | None = None

    def fail(trail: tuple[str, ...], message: str) -> NoReturn:
        nonlocal text
        if text is None:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = ""
        line = _line_of(text, trail)
        raise CalibrationError(f"{path}{f':{line}' if line else ''}: {message}")

    def walk(table: Mapping[str, Any], schema: Mapping[str, Any], trail: tuple[str, ...]) -> None:
        where = f" in [{'.'.join(trail)}]" if trail else ""
        for key, value in table.items():
            here = trail + (key,)
            if key not in schema:
                what = f"table [{'.'.join(here)}]" if isinstance(value, Mapping) else f"key {key!r}{where}"
                fail(here, f"unknown {what}{did_you_mean(key, schema)}; samples.toml holds only what "
                           "perf-calibrate writes (a typo, or a store of a newer perfcast?)")
            sub = schema[key]
            if isinstance(value, Mapping):
                if sub is None:
                    fail(here, f"{'.'.join(here)} is a value, not a table")
                walk(value, sub, here)
            elif sub is not None and here not in _TABLE_OR_VALUE:
                fail(here, f"[{'.'.join(here)}] must be a table, not {value!r}")

    walk(meta, META_SCHEMA, ())
    timing = meta.get("timing")
    if isinstance(timing, Mapping) and "host" in timing and timing["host"] not in HOST_TIMINGS:
        fail(("timing", "host"), f"[timing] host: {timing['host']!r} is not one of "
                                 f"{', '.join(map(repr, HOST_TIMINGS))}{did_you_mean(timing['host'], HOST_TIMINGS)}")
    progress = meta.get("progress")
    if isinstance(progress, Mapping) and "complete" in progress and not isinstance(progress["complete"], bool):
        fail(("progress", "complete"), f"[progress] complete: {progress['complete']!r} is not true or false")


def _line_of(text: str, trail: tuple[str, ...]) -> int | None:
    """The line of samples.toml where the key at ``trail`` is (best effort: the tables and bare
    keys perfcast writes; None when not found)."""
    table: tuple[str, ...] = ()
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        m = re.fullmatch(r"\[\[?([^\[\]]+)\]\]?\s*(#.*)?", line)
        if m:
            table = tuple(_unquote(k) for k in m.group(1).split("."))
            if table[:len(trail)] == trail:
                return n        # [key], or the first [key.sub]: a table named at fault
            continue
        m = re.match(r"""("[^"]*"|'[^']*'|[A-Za-z0-9_.-]+)\s*=""", line)
        if m:
            key = m.group(1)
            parts = (_unquote(key),) if key[0] in "\"'" else tuple(key.split("."))
            if (table + parts)[:len(trail)] == trail:
                return n
    return None


def _unquote(key: str) -> str:
    key = key.strip()
    return key[1:-1] if len(key) >= 2 and key[0] == key[-1] and key[0] in "\"'" else key


def write_meta(directory: Path, meta: Mapping[str, Any]) -> None:
    """Write samples.toml (only flat string/number/bool values and one level of tables)."""
    directory.mkdir(parents=True, exist_ok=True)
    full = {"format": FORMAT_VERSION, **meta}
    atomic_write(directory / META_FILE, dump_toml(full))


def append_rows(path: Path, columns: Sequence[str], rows: Iterable[Sequence[float]]) -> int:
    """Append rows to a sample CSV, writing the header if the file is new; returns rows written.

    Each row is flushed and fsynced with the file so that a job killed mid-run loses at most the
    row being measured.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    n = 0
    with open(path, "a", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(columns)
        for row in rows:
            if len(row) != len(columns):
                raise ValueError(f"{path}: row has {len(row)} values, header has {len(columns)}")
            w.writerow([_fmt(v) for v in row])
            n += 1
        fh.flush()
        os.fsync(fh.fileno())
    return n


def _fmt(v: float) -> str:
    # Integers as integers (shapes read back exactly and diff cleanly), other values round-trip.
    f = float(v)
    return str(int(f)) if f.is_integer() and abs(f) < 2**53 else repr(f)


@dataclass(frozen=True)
class StoreIdentity:
    """What must match between a store and the run that appends to it."""

    device: str
    gpu_name: str
    method_version: int = METHOD_VERSION
    host_timing: str = "included"      # samples.toml [timing] host: "included" (--timing call) | "excluded" (device)

    def check(self, meta: Mapping[str, Any], where: Path) -> None:
        """Raise :class:`IncompatibleStore` when ``meta`` (samples.toml) is not ours to extend."""
        if meta.get("format") != FORMAT_VERSION:
            raise IncompatibleStore(f"{where}: sample format {meta.get('format')!r}, this perfcast "
                                    f"writes format {FORMAT_VERSION}; use a new --out directory")
        if meta.get("kind") != STORE_KIND:
            raise IncompatibleStore(f"{where}: not a calibration store (kind {meta.get('kind')!r}; "
                                    "imported samples cannot be extended by a run); use a new --out")
        if meta.get("method_version") != self.method_version:
            raise IncompatibleStore(f"{where}: measured with method version {meta.get('method_version')!r}, "
                                    f"this perfcast measures with version {self.method_version}; "
                                    "use a new --out directory")
        if meta.get("device") != self.device:
            raise IncompatibleStore(f"{where}: samples of device {meta.get('device')!r}, this run is "
                                    f"on {self.device!r}; use a new --out directory")
        # Stores written before the key existed timed isolated calls, the host included.
        host = meta.get("timing", {}).get("host", "included")
        if host != self.host_timing:
            raise IncompatibleStore(f"{where}: samples timed with the host's issue time {host}, this run "
                                    f"times with it {self.host_timing} (--timing); use a new --out directory")
        if meta.get("gpu_name") != self.gpu_name:
            raise IncompatibleStore(f"{where}: samples of {meta.get('gpu_name')!r}, this run is on "
                                    f"{self.gpu_name!r} (another GPU type); use a new --out directory")


def read_meta(directory: Path) -> dict[str, Any]:
    """samples.toml of a store, or {} when there is none; corrupt ones raise CalibrationError."""
    path = directory / META_FILE
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CalibrationError(f"{path}: corrupt sample store metadata: {exc}") from None


def repair_torn_tail(path: Path) -> bool:
    """Drop a last line without its newline (what a writer killed mid-row leaves); True if cut."""
    size = path.stat().st_size
    if size == 0:
        return False
    with open(path, "rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return False
        # Find the last newline; keep everything up to and including it.
        block = min(size, 1 << 16)
        fh.seek(size - block)
        tail = fh.read(block)
        cut = tail.rfind(b"\n")
        keep = 0 if cut < 0 else size - block + cut + 1
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    log.warning("%s: dropped a torn last line (a previous run was killed while writing)", path)
    return True


class SampleStore:
    """A sample directory being filled by a calibration run (create or resume with :meth:`open`)."""

    def __init__(self, directory: Path, meta: dict[str, Any], samples: SampleSet | None):
        self.directory = directory
        self.meta = meta
        self._ops: set[OperatorPoint] = set()
        self._colls: set[CollectivePoint] = set()
        self._skipped: set[tuple[str, ...]] = set()
        self.operator_rows = 0
        self.collective_rows = 0
        if samples is not None:
            for (op, prec), table in samples.operators.items():
                nf = len(OPERATORS[op].features)
                for row in table.rows:
                    self._ops.add(OperatorPoint(op, prec, tuple(int(v) for v in row[:nf])))
                self.operator_rows += len(table)
            for (kind, prec), table in samples.collectives.items():
                for row in table.rows:
                    self._colls.add(CollectivePoint(kind, prec, int(row[0]), int(row[1]), int(row[2])))
                self.collective_rows += len(table)
        skipped = directory / SKIPPED_FILE
        if skipped.exists():
            repair_torn_tail(skipped)
            with open(skipped, newline="", encoding="utf-8") as fh:
                for row in csv.reader(fh):
                    if row and row[0] != "what":
                        self._skipped.add(tuple(row[:3]))

    # --------------------------------------------------------------------------- opening
    @classmethod
    def open(cls, directory: "str | Path", identity: StoreIdentity, meta: Mapping[str, Any]) -> "SampleStore":
        """Create the store, or resume it after checking that it is compatible and readable.

        ``meta`` (environment, GPU spec, plan …) is merged into samples.toml; the list of plans
        that contributed grows.  Nothing is written before every check has passed.
        """
        d = Path(directory)
        existing = read_meta(d)
        if d.exists() and not d.is_dir():
            raise CalibrationError(f"{d}: exists and is not a directory")
        if existing:
            identity.check(existing, d / META_FILE)
            check_meta(existing, d / META_FILE)
            for sub in ("operators", "collectives"):
                for path in sorted((d / sub).glob("*.csv")):
                    repair_torn_tail(path)
            try:
                samples = load_samples(d)
            except BundleError as exc:
                raise CalibrationError(f"corrupt sample store, refusing to extend it: {exc}") from None
        else:
            if d.exists() and any(d.iterdir()):
                raise CalibrationError(f"{d}: not empty and not a sample store (no {META_FILE}); "
                                       "refusing to write into it")
            samples = None
        merged = dict(existing)
        merged.update({k: v for k, v in meta.items() if k not in ("plans", "precisions")})
        if isinstance(existing.get("gpu"), dict) and isinstance(meta.get("gpu"), dict):
            # A run of other precisions (fp8 after fp16, say) adds its peaks to the earlier runs':
            # a probed spec holds only the precisions it was asked for, and fit needs them all.
            peaks = {**existing["gpu"].get("tflops", {}), **meta["gpu"].get("tflops", {})}
            merged["gpu"] = {**meta["gpu"], "tflops": peaks}
        merged["kind"] = STORE_KIND
        merged["method_version"] = identity.method_version
        merged["device"] = identity.device
        merged["gpu_name"] = identity.gpu_name
        for key in ("plans", "precisions"):
            merged[key] = sorted(set(existing.get(key, [])) | set(meta.get(key, [])))
        merged.pop("format", None)
        prog = _progress(merged)
        # Which of the plans this store was started with have every point in it: a store is
        # complete only when all of them are (a store resumed with another plan is not complete
        # because that one finished).  A store from before this list: complete meant all of them.
        done = prog.get("complete_plans")
        if not isinstance(done, list):
            done = list(existing.get("plans", [])) if prog.get("complete") is True else []
        merged["progress"] = {**prog, "complete": False, "complete_plans": sorted(set(done))}
        store = cls(d, merged, samples)
        store._write_meta()
        return store

    # --------------------------------------------------------------------------- state
    def has_operator(self, pt: OperatorPoint) -> bool:
        return pt in self._ops or ("operator", pt.op, _key(pt)) in self._skipped_keys()

    def has_collective(self, pt: CollectivePoint) -> bool:
        return pt in self._colls or ("collective", pt.kind, _key(pt)) in self._skipped_keys()

    def _skipped_keys(self) -> set[tuple[str, ...]]:
        return self._skipped

    @property
    def skipped(self) -> int:
        return len(self._skipped)

    # --------------------------------------------------------------------------- writing
    def record_operator(self, pt: OperatorPoint, us: Mapping[str, float]) -> None:
        """Append one measured operator row (fsync'd) — durations per direction in µs."""
        op = OPERATORS[pt.op]
        row = list(pt.shape) + [float(us[d]) for d in op.directions]
        append_rows(self.directory / "operators" / f"{pt.op}_{pt.precision}.csv",
                    operator_columns(pt.op), [row])
        self._ops.add(pt)
        self.operator_rows += 1

    def record_collective(self, pt: CollectivePoint, us: float) -> None:
        append_rows(self.directory / "collectives" / f"{pt.kind}_{pt.precision}.csv",
                    collective_columns(), [[pt.entries, pt.nodes, pt.gpus_per_node, float(us)]])
        self._colls.add(pt)
        self.collective_rows += 1

    def record_skip(self, what: str, pt: "OperatorPoint | CollectivePoint", reason: str) -> None:
        """Remember a point that cannot be measured here, so that resumes do not retry it."""
        name = pt.op if isinstance(pt, OperatorPoint) else pt.kind
        path = self.directory / SKIPPED_FILE
        new = not path.exists()
        with open(path, "a", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            if new:
                w.writerow(["what", "name", "key", "reason"])
            w.writerow([what, name, _key(pt), reason.replace("\n", " ")[:300]])
            fh.flush()
            os.fsync(fh.fileno())
        self._skipped.add((what, name, _key(pt)))
        log.warning("skipped %s %s %s: %s", what, name, _key(pt), reason)

    def update_meta(self, **values: Any) -> None:
        """Merge top-level keys or tables into samples.toml (atomically rewritten; rows never are)."""
        for k, v in values.items():
            if isinstance(v, Mapping) and isinstance(self.meta.get(k), Mapping):
                self.meta[k] = {**self.meta[k], **v}
            else:
                self.meta[k] = v
        self._write_meta()

    def mark_complete(self, complete: bool = True, plan: str | None = None,
                      covers: Iterable[str] = ()) -> bool:
        """Record whether ``plan`` (the label this run added to ``plans``) has every point in the
        store; the store is complete when every plan it was started with is.  Returns that.

        ``covers``: other labels of ``plans`` whose points are all among ``plan``'s (a run of
        some operators of the same plan, ``"tiny (linear1 only)"``), marked complete with it."""
        prog = _progress(self.meta)
        plans = set(self.meta.get("plans", []))
        done = set(prog.get("complete_plans", [])) & plans
        if plan is None:
            done = plans if complete else set()
        elif complete:
            done.add(plan)
            done |= set(covers) & plans
        else:
            done.discard(plan)
        whole = complete and done >= plans
        self.update_meta(progress={"complete": whole, "complete_plans": sorted(done),
                                   "operator_rows": self.operator_rows,
                                   "collective_rows": self.collective_rows, "skipped": self.skipped})
        return whole

    def incomplete_plans(self) -> list[str]:
        return sorted(set(self.meta.get("plans", [])) - set(_progress(self.meta).get("complete_plans", [])))

    def _write_meta(self) -> None:
        meta = {k: v for k, v in self.meta.items() if k != "format"}
        write_meta(self.directory, meta)


def _key(pt: "OperatorPoint | CollectivePoint") -> str:
    if isinstance(pt, OperatorPoint):
        return f"{pt.precision}:" + "x".join(str(v) for v in pt.shape)
    return f"{pt.precision}:{pt.entries}@{pt.nodes}x{pt.gpus_per_node}"


def _progress(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """samples.toml's [progress] table ({} when absent or not a table)."""
    prog = meta.get("progress")
    return prog if isinstance(prog, Mapping) else {}
