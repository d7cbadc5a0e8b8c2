"""Bundles: fitted regressors on disk, as data -- loaded, verified and evaluated here.

A bundle is a directory (format 2)::

    manifest.toml        what it is (compute | collectives), GPU, provenance, per-model sample
                         counts, validation errors, feature ranges, and the sha256 of every file
    forest.bin           every model's trees in one flat file (:mod:`predictor.trees`): what
                         predictions read, viewed in place after one read
    models/*.gz          one model per operator, direction and precision in the library's own
                         portable format (XGBoost JSON or LightGBM text, gzip-compressed), for
                         other tools and for checking the forest against the libraries
    LICENSE              the data's licence, where the samples came from a third party

Format 1 kept one ``models/<key>.trees.npz`` per model instead of ``forest.bin``; it is still
read (more slowly: zlib and a re-layout), and ``calibrate.fitting.convert_bundle`` rewrites it.

Loading one never executes code (nothing is unpickled): every file the manifest lists is checked
against its sha256, and the forest is parsed from the very bytes that were hashed.  The manifest
itself is covered by a sha256 that the platform pins (``compute_bundle_sha256`` /
``collective_bundle_sha256`` in platform.toml, see :mod:`predictor.platform`): an edited
manifest is refused like an edited model.  Fitting bundles is :mod:`calibrate.fitting`'s job.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .errors import BundleError
from .network import Links
from .operators import OPERATORS, GpuSpec, log2_features
from .trees import Forest, ForestError, RowModels, TreeTable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger(__name__)

BUNDLE_FORMAT = 2                 # what calibrate.fitting writes
READABLE_FORMATS = (1, 2)
MANIFEST = "manifest.toml"
FOREST_FILE = "forest.bin"
MAX_MODEL_BYTES = 64 << 20        # a library model file beyond this is not one we wrote
MAX_FOREST_BYTES = 2 << 30        # 16 bytes a node: some 130 million nodes
_CHUNK = 1 << 20                  # hashing files that are checked but not kept
_HASH_THREADS = 2


@dataclass
class ModelInfo:
    key: str                      # "<op>.<direction>.<precision>" or "<kind>.<precision>"
    file: str                     # the library's own model file (portable, for other tools)
    library: str
    samples: int
    validation_mape: float
    validation_p90: float
    feature_min: list[float]
    feature_max: list[float]
    candidate_mape: dict[str, float] = field(default_factory=dict)
    topologies: list[list[int]] = field(default_factory=list)   # collectives: measured (nodes, gpn)
    table: str = ""               # format 1 only: the model's own tree table file


def info_dict(m: ModelInfo) -> dict[str, Any]:
    """A model's manifest entry (format 2: the trees are in the bundle's forest file)."""
    d: dict[str, Any] = {"file": m.file, "library": m.library, "samples": m.samples,
                         "validation_mape": m.validation_mape, "validation_p90": m.validation_p90,
                         "feature_min": m.feature_min, "feature_max": m.feature_max,
                         "candidate_mape": dict(m.candidate_mape)}
    if m.topologies:
        d["topologies"] = m.topologies
    return d


def _sha256(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def collective_features(entries: "np.ndarray | float", nodes: "np.ndarray | float",
                        gpn: "np.ndarray | float") -> np.ndarray:
    """The collective regressors' input: log2 of the entries, nodes, GPUs per node (rows × 3)."""
    e = np.asarray(entries, dtype=float).reshape(-1)
    # Filled column by column: called for every collective of every prediction, and
    # np.column_stack of broadcast views costs more than the arithmetic.
    out = np.empty((len(e), 3))
    out[:, 0] = log2_features(e)
    out[:, 1] = nodes
    out[:, 2] = gpn
    return out


def collective_row_features(rows: "Sequence[tuple[float, float, float]]") -> np.ndarray:
    """:func:`collective_features` of (entries, nodes, GPUs per node) rows."""
    out = np.array(rows, dtype=float).reshape(-1, 3)
    out[:, 0] = log2_features(out[:, 0])
    return out


# ------------------------------------------------------------------------------------- loading
@dataclass
class LoadedModel:
    info: ModelInfo
    index: int                    # position in the bundle's Forest
    _lo: np.ndarray = field(init=False, repr=False)
    _hi: np.ndarray = field(init=False, repr=False)
    _lo_row: list = field(init=False, repr=False)
    _hi_row: list = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The sampled range with 1 % slack, computed once: every prediction asks.
        self._lo = np.asarray(self.info.feature_min, dtype=float) * 0.99
        self._hi = np.asarray(self.info.feature_max, dtype=float) * 1.01
        self._lo_row, self._hi_row = self._lo.tolist(), self._hi.tolist()

    def range_side(self, raw: np.ndarray) -> np.ndarray:
        """Per row: 0 inside the sampled range (with 1 % slack), −1 below it in some feature, else
        +1 (above it in some feature).  Below matters more: a shape smaller than every sample runs
        into launch and latency costs the edge's ratio does not know
        (``benchmarks/bench_extrapolation.py``)."""
        below = (raw < self._lo).any(axis=1)
        above = (raw > self._hi).any(axis=1)
        return np.where(below, -1, np.where(above, 1, 0))

    def row_range_side(self, row: "Sequence[float]") -> int:
        """:meth:`range_side` for one row of plain numbers."""
        side = 0
        for v, lo, hi in zip(row, self._lo_row, self._hi_row):     # a loop: ~3x all(genexpr)
            if v < lo:
                return -1
            if v > hi:
                side = 1
        return side


@dataclass
class Bundle:
    path: Path
    kind: str
    name: str
    gpu: GpuSpec
    manifest: dict[str, Any]
    models: dict[str, LoadedModel]
    links: Optional[Links] = None
    forest: Optional[Forest] = None
    manifest_sha256: str = ""

    @property
    def format(self) -> int:
        return int(self.manifest.get("format", 0))

    @property
    def bundle_id(self) -> str:
        """Name plus a short digest of the manifest: changes whenever any model changes."""
        return f"{self.name}@{self.manifest_sha256[:12]}"

    def get(self, key: str) -> Optional[LoadedModel]:
        return self.models.get(key)

    def not_fitted_reason(self, key: str) -> str:
        """Why the manifest has no model ``key`` (as recorded when it was fitted)."""
        for entry in self.manifest.get("not_fitted", []):
            if isinstance(entry, str) and entry.startswith(f"{key}: "):
                return entry[len(key) + 2:]
        return "not fitted"

    def ratios(self, requests: "list[tuple[str, np.ndarray]]") -> list[np.ndarray]:
        """measured/roofline ratios for each (model key, rows of regressor features), in one pass."""
        outs = self.forest.predict([(self.models[k].index, X) for k, X in requests])
        return [np.exp(o) for o in outs]

    @functools.cached_property
    def kernel_floor_seconds(self) -> float:
        """The least any operator of this bundle was measured to take: its models at the corner of
        their sampled ranges (the smallest shapes, whose kernels are launch-bound), the least of
        them.  No kernel costs less than a launch, so a shape below every sample is not costed
        below this (the roofline ratio held at the range's edge would go to zero with the shape).
        0 for a bundle without operator models."""
        keys, rows, roofs = [], [], []
        for key, lm in self.models.items():
            op_name, _, rest = key.partition(".")
            direction, _, precision = rest.partition(".")
            op = OPERATORS.get(op_name)
            if op is None or len(lm.info.feature_min) != len(op.features):
                continue
            corner = [float(v) for v in lm.info.feature_min]
            keys.append(key)
            rows.append(corner)
            roofs.append(op.roofline_seconds(dict(zip(op.features, corner)), direction, precision, self.gpu))
        if not keys:
            return 0.0
        width = max(map(len, rows))        # one matrix; a model never reads past its own features
        X = log2_features([r + [1.0] * (width - len(r)) for r in rows])
        ratios = self.ratios_rows(keys, X)
        return float(np.min(ratios * np.asarray(roofs)))

    def model_rows(self, keys: "Sequence[str]") -> "ModelRows":
        """``keys`` with this bundle's forest arrays for them, for a caller that asks the same list
        again (:meth:`ratios_rows` takes it as its keys)."""
        out = ModelRows(keys)
        out.forest = self.forest
        out.forest_rows = self.forest.row_models([self.models[k].index for k in out])
        return out

    def ratios_rows(self, keys: "Sequence[str]", X: np.ndarray) -> np.ndarray:
        """:meth:`ratios` of many rows at once: row i by model ``keys[i]`` on ``X[i]`` (rows ×
        up to 7 columns; each model reads its own features' columns, the rest are ignored).
        ``keys`` may be :meth:`model_rows`' answer, kept from an earlier call."""
        if isinstance(keys, ModelRows) and keys.forest is self.forest:
            rows: "RowModels | list[int]" = keys.forest_rows
        else:
            rows = [self.models[k].index for k in keys]
        return np.exp(self.forest.predict_rows(rows, X))


class ModelRows(tuple):
    """Model keys, one per row, with a bundle's forest arrays for them (:meth:`Bundle.model_rows`)."""

    forest: Optional[Forest]
    forest_rows: RowModels


def file_sha256(path: "str | Path") -> str:
    """A file's sha256, read in 1 MiB chunks (bundle members can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_sha256(path: "str | Path") -> str:
    """The sha256 of a bundle directory's manifest (what a platform pins)."""
    mpath = Path(path) / MANIFEST
    try:
        return _sha256(mpath.read_bytes())
    except OSError as exc:
        raise BundleError(f"{mpath}: cannot read: {exc.strerror or exc}") from None


def check_manifest_pin(bundle: "Bundle", expected: str, pinned_by: str = "") -> None:
    """Refuse ``bundle`` unless its manifest's sha256 is ``expected`` (empty: nothing pinned)."""
    _check_pin(bundle.path / MANIFEST, bundle.manifest_sha256, expected, pinned_by)


def _check_pin(mpath: Path, actual: str, expected: str, pinned_by: str) -> None:
    if expected and actual != expected.lower():
        where = f" (pinned by {pinned_by})" if pinned_by else ""
        raise BundleError(f"{mpath}: manifest checksum mismatch{where}: expected {expected[:16]}..., "
                          f"the file has {actual[:16]}... (edited or replaced)")


def _bundle_file(root: Path, rel: str, mpath: Path, parents: dict[str, Path]) -> Path:
    """The path of manifest entry ``rel``, refused if it leads outside the bundle (``..``, an
    absolute path, a symlink out).  Directories are resolved once each, not once per file."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise BundleError(f"{mpath}: file {rel} points outside the bundle")
    sub = "/".join(parts[:-1])
    parent = parents.get(sub)
    if parent is None:
        parent = (root / sub).resolve() if sub else root
        if parent != root and root not in parent.parents:
            raise BundleError(f"{mpath}: file {rel} points outside the bundle")
        parents[sub] = parent
    fpath = parent / parts[-1]
    if fpath.is_symlink():
        fpath = fpath.resolve()
        if root not in fpath.parents:
            raise BundleError(f"{mpath}: file {rel} points outside the bundle")
    return fpath


def _read_verified(fpath: Path, digest: str, limit: int, keep: bool) -> Optional[np.ndarray]:
    """Read ``fpath`` once and check its sha256; ``keep``: return the bytes (a uint8 array that
    numpy allocated, so aligned for the records viewed from it), else hash in chunks and keep
    nothing."""
    try:
        with open(fpath, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            if size > limit:
                raise BundleError(f"{fpath}: file is implausibly large ({size} bytes)")
            h = hashlib.sha256()
            if keep:
                buf = np.empty(size, dtype=np.uint8)
                got = fh.readinto(memoryview(buf)) if size else 0
                if got != size or fh.read(1):
                    raise BundleError(f"{fpath}: file changed while it was read")
                h.update(buf)
            else:
                buf = None
                chunk = bytearray(min(_CHUNK, max(size, 1)))
                view = memoryview(chunk)
                while True:
                    n = fh.readinto(chunk)
                    if not n:
                        break
                    h.update(view[:n])
    except FileNotFoundError:
        raise BundleError(f"{fpath}: file listed in the manifest is missing") from None
    except IsADirectoryError:
        raise BundleError(f"{fpath}: file listed in the manifest is a directory") from None
    except OSError as exc:
        raise BundleError(f"{fpath}: cannot read: {exc}") from None
    if h.hexdigest() != digest:
        raise BundleError(f"{fpath}: checksum mismatch (file corrupted or tampered with)")
    return buf


def _read_all(jobs: list[tuple[str, Path, str, int, bool]]) -> dict[str, np.ndarray]:
    """Read and verify every file; the kept ones by name.

    Hashing is most of a load (some 40 MB for the A100 bundle) and hashlib and file reads release
    the GIL, so two threads halve it where two cores are free; the largest file goes first.
    """
    jobs = sorted(jobs, key=lambda j: not j[4])     # the kept (forest) file first: it is the largest
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    workers = min(_HASH_THREADS, cores, len(jobs))

    def run(j: tuple[str, Path, str, int, bool]) -> Optional[np.ndarray]:
        return _read_verified(j[1], j[2], j[3], j[4])

    if workers > 1:
        with ThreadPoolExecutor(workers, thread_name_prefix="bundle-sha256") as ex:
            bufs = list(ex.map(run, jobs))
    else:
        bufs = [run(j) for j in jobs]
    return {j[0]: b for j, b in zip(jobs, bufs) if b is not None}


def load_bundle(path: "str | Path", expected_manifest_sha256: str = "",
                pinned_by: str = "") -> Bundle:
    """Load and verify a bundle directory; every problem names the file at fault.

    Every file the manifest lists is checked against its sha256 (a tampered library file is
    refused too, though predictions read only the forest); the manifest is checked against
    ``expected_manifest_sha256`` when given (before anything in it is trusted).
    """
    d = Path(path)
    mpath = d / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{d}: not a bundle (no {MANIFEST})")
    try:
        mbytes = mpath.read_bytes()
    except OSError as exc:
        raise BundleError(f"{mpath}: unreadable manifest: {exc}") from None
    _check_pin(mpath, _sha256(mbytes), expected_manifest_sha256, pinned_by)
    try:
        manifest = tomllib.loads(mbytes.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BundleError(f"{mpath}: unreadable manifest: {exc}") from None
    fmt = manifest.get("format")
    if fmt not in READABLE_FORMATS:
        raise BundleError(f"{mpath}: bundle format {fmt!r} is not supported "
                          f"(this perfcast reads formats {', '.join(map(str, READABLE_FORMATS))})")
    try:
        sums: Mapping[str, str] = manifest["sha256"]
        spec = manifest["gpu_spec"]
        gpu = GpuSpec(spec["name"], float(spec["memory_gib"]), dict(spec["tflops"]), float(spec["memory_gbps"]))
        entries = manifest["models"]
        kind, name = manifest["kind"], manifest["name"]
        forest_rel = manifest["forest"] if fmt >= 2 else ""
        if not isinstance(sums, Mapping) or not isinstance(entries, Mapping) or not isinstance(forest_rel, str):
            raise TypeError("sha256, models or forest")
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{mpath}: incomplete manifest (missing or bad {exc})") from None
    infos: dict[str, ModelInfo] = {}
    for key, e in entries.items():
        try:
            info = ModelInfo(key, e["file"], e["library"], int(e["samples"]), float(e["validation_mape"]),
                             float(e["validation_p90"]), [float(v) for v in e["feature_min"]],
                             [float(v) for v in e["feature_max"]], dict(e.get("candidate_mape", {})),
                             list(e.get("topologies", [])), e["table"] if fmt == 1 else "")
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"{mpath}: model {key}: incomplete entry ({exc})") from None
        for rel in (info.file, info.table) if fmt == 1 else (info.file,):
            if rel not in sums:
                raise BundleError(f"{mpath}: model {key}: file {rel} has no sha256")
        infos[key] = info
    if fmt >= 2 and forest_rel not in sums:
        raise BundleError(f"{mpath}: the forest file {forest_rel} has no sha256")

    # The files the predictor reads are kept (and parsed from the bytes that were hashed); the
    # others are hashed in chunks and dropped.
    keep = {forest_rel} if fmt >= 2 else {i.table for i in infos.values()}
    root = d.resolve()
    parents: dict[str, Path] = {}
    jobs = []
    for rel, digest in sums.items():
        fpath = _bundle_file(root, rel, mpath, parents)
        if not isinstance(digest, str):
            raise BundleError(f"{mpath}: sha256 of {rel} is not a string")
        limit = MAX_FOREST_BYTES if rel == forest_rel else MAX_MODEL_BYTES
        jobs.append((rel, fpath, digest.lower(), limit, rel in keep))
    kept = _read_all(jobs)

    if fmt >= 2:
        try:
            forest = Forest.from_buffer(kept[forest_rel])
        except ForestError as exc:
            raise BundleError(f"{d / forest_rel}: not a valid forest file: {exc}") from None
        missing = sorted(set(infos) - set(forest.keys))
        extra = sorted(set(forest.keys) - set(infos))
        if missing or extra:
            raise BundleError(f"{d / forest_rel}: does not match {mpath}: "
                              f"models missing from the forest: {', '.join(missing) or 'none'}; "
                              f"models not in the manifest: {', '.join(extra) or 'none'}")
    else:
        forest = _legacy_forest(d, infos, kept)
    models = {key: LoadedModel(info, forest.index(key)) for key, info in infos.items()}
    try:
        links = Links.from_dict(manifest["links"]) if "links" in manifest else None
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{mpath}: bad [links] ({exc})") from None
    return Bundle(d, kind, name, gpu, manifest, models, links, forest, _sha256(mbytes))


def _legacy_forest(d: Path, infos: Mapping[str, ModelInfo], kept: Mapping[str, np.ndarray]) -> Forest:
    """Format 1: one ``.npz`` tree table per model, re-laid out into a forest."""
    log.info("%s: bundle format 1 (per-model .npz tables): loads slowly; "
             "calibrate.fitting.convert_bundle rewrites it", d)
    tables: list[TreeTable] = []
    for key, info in infos.items():
        try:
            tables.append(TreeTable.from_bytes(kept[info.table].tobytes()))
        except Exception as exc:  # numpy raises several types on a malformed archive
            raise BundleError(f"{d / info.table}: not a valid tree table: {exc}") from None
    try:
        return Forest.from_tables(tables, list(infos))
    except ForestError as exc:
        where = d / infos[exc.key].table if exc.key in infos else d
        raise BundleError(f"{where}: not a valid tree table: {exc}") from None
