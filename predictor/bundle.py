"""Bundles: fitted regressors on disk, as data.

A bundle is a directory::

    manifest.toml        what it is (compute | collectives), GPU, provenance, per-model sample
                         counts, validation errors, feature ranges, and the sha256 of every file
    models/*.gz          one model per operator, direction and precision (XGBoost JSON or
                         LightGBM text, gzip-compressed)
    LICENSE              the data's licence, where the samples came from a third party

Loading one never executes code: files are checked against their sha256 before they are parsed,
and only the libraries' own model parsers read them.  The manifest itself is covered by a sha256
that the platform pins (``compute_bundle_sha256`` / ``collective_bundle_sha256`` in
platform.toml, see :mod:`predictor.platform`): an edited manifest is refused like an edited model.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from .errors import BundleError
from .network import Links, collective_seconds, fit_links
from .operators import BYTES_PER_ELEMENT, COLLECTIVE_FEATURES, OPERATORS, GpuSpec, regressor_features
from .regress import CANDIDATES, fit_ratio_model
from .trees import Forest, TreeTable
from .samples import SampleSet, dump_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

log = logging.getLogger(__name__)

BUNDLE_FORMAT = 1
MANIFEST = "manifest.toml"
MAX_MODEL_BYTES = 64 << 20        # a model file beyond this is not one we wrote


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
    table: str = ""               # the same trees as a tree table: what predictions read


@dataclass
class FitReport:
    bundle_dir: Path
    models: dict[str, ModelInfo]
    skipped: list[str]
    links: Optional[Links] = None

    def table(self) -> str:
        lines = [f"{'model':<34} {'library':<14} {'samples':>7} {'val MAPE':>9} {'p90':>7}"]
        for k, m in sorted(self.models.items()):
            lines.append(f"{k:<34} {m.library:<14} {m.samples:>7} {100 * m.validation_mape:>8.2f}% "
                         f"{100 * m.validation_p90:>6.1f}%")
        return "\n".join(lines)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def operator_training_rows(samples: SampleSet, op_name: str, direction: str, precision: str,
                           gpu: GpuSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X = log2 features, y = log(measured / roofline), raw features) of one model's samples."""
    table = samples.operators[(op_name, precision)]
    op = OPERATORS[op_name]
    shape = {f: table.column(f) for f in op.features}
    measured_s = table.column(f"{direction}_us") * 1e-6
    keep = measured_s > 0
    roof = op.roofline_seconds(shape, direction, precision, gpu)
    X = regressor_features(op, shape)
    raw = np.column_stack([shape[f] for f in op.features])
    return X[keep], np.log(measured_s[keep] / roof[keep]), raw[keep]


def collective_training_rows(table: np.ndarray, kind: str, links: Links, precision: str
                             ) -> tuple[np.ndarray, np.ndarray]:
    entries, nodes, gpn, us = (table[:, i] for i in range(4))
    analytic = collective_seconds(links, kind, entries, nodes, gpn, BYTES_PER_ELEMENT[precision])
    X = collective_features(entries, nodes, gpn)
    return X, np.log(us * 1e-6 / analytic)


def collective_features(entries, nodes, gpn) -> np.ndarray:
    e = np.asarray(entries, dtype=float)
    return np.column_stack([np.log2(np.maximum(e, 1.0)),
                            np.broadcast_to(np.asarray(nodes, dtype=float), e.shape),
                            np.broadcast_to(np.asarray(gpn, dtype=float), e.shape)])


def fit_bundle(samples: SampleSet, out_dir: "str | Path", *, name: str, gpu: GpuSpec,
               kind: str = "compute", nics_per_node: int = 1, seed: int = 0,
               candidates: tuple[str, ...] = CANDIDATES, license_file: "str | Path | None" = None,
               extra_meta: Optional[Mapping[str, Any]] = None, overwrite: bool = False) -> FitReport:
    """Fit every operator (kind="compute") or collective (kind="collectives") in ``samples``.

    Writes ``out_dir`` atomically (a temporary sibling renamed into place) so a failed fit never
    leaves half a bundle where a platform might load it.
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise BundleError(f"{out}: already exists")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "models").mkdir(parents=True)
    models: dict[str, ModelInfo] = {}
    skipped: list[str] = []
    links: Optional[Links] = None
    try:
        if kind == "compute":
            for (op_name, precision), table in sorted(samples.operators.items()):
                for direction in OPERATORS[op_name].directions:
                    key = f"{op_name}.{direction}.{precision}"
                    X, y, raw = operator_training_rows(samples, op_name, direction, precision, gpu)
                    if len(table) and not len(y):
                        skipped.append(f"{key}: every sample marks it as not measured or dropped (0 µs)")
                        continue
                    info = _fit_one(tmp, key, X, y, raw, seed, candidates, skipped)
                    if info:
                        models[key] = info
        elif kind == "collectives":
            by_prec: dict[str, dict[str, np.ndarray]] = {}
            for (kind_name, precision), table in samples.collectives.items():
                by_prec.setdefault(precision, {})[kind_name] = table.rows
            if not by_prec:
                raise BundleError("no collective samples to fit")
            # Links are fitted on the half-precision rows when present: that is what training sends.
            prec0 = "fp16" if "fp16" in by_prec else sorted(by_prec)[0]
            links = fit_links(by_prec[prec0], nics_per_node, BYTES_PER_ELEMENT[prec0])
            for precision, kinds in sorted(by_prec.items()):
                for kind_name, rows in sorted(kinds.items()):
                    key = f"{kind_name}.{precision}"
                    X, y = collective_training_rows(rows, kind_name, links, precision)
                    info = _fit_one(tmp, key, X, y, rows[:, :3], seed, candidates, skipped)
                    if info:
                        topo = sorted({(int(a), int(b)) for a, b in rows[:, 1:3]})
                        info.topologies = [list(t) for t in topo]
                        models[key] = info
        else:
            raise ValueError(f"unknown bundle kind {kind!r}")
        if not models:
            raise BundleError("no model could be fitted from these samples")
        manifest: dict[str, Any] = {
            "format": BUNDLE_FORMAT,
            "kind": kind,
            "name": name,
            "gpu": gpu.name,
            "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "source": dict(_flat(samples.meta)),
            "gpu_spec": {"name": gpu.name, "memory_gib": gpu.memory_gib,
                         "memory_gbps": gpu.memory_gbps, "tflops": dict(gpu.tflops)},
        }
        if extra_meta:
            manifest["meta"] = dict(extra_meta)
        if links is not None:
            manifest["links"] = links.to_dict()
        manifest["models"] = {k: _info_dict(m) for k, m in models.items()}
        if skipped:
            manifest["not_fitted"] = list(skipped)    # "key: why" (the predictor quotes it)
        if license_file and Path(license_file).is_file():
            shutil.copyfile(license_file, tmp / "LICENSE")
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                files[p.relative_to(tmp).as_posix()] = _sha256(p.read_bytes())
        manifest["sha256"] = files
        (tmp / MANIFEST).write_text(dump_toml(manifest), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FitReport(out, models, skipped, links)


def _flat(meta: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for k, v in meta.items():
        if isinstance(v, (str, int, float, bool)) or (isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v)):
            yield k, v


def _fit_one(tmp: Path, key: str, X: np.ndarray, y: np.ndarray, raw: np.ndarray, seed: int,
             candidates: tuple[str, ...], skipped: list[str]) -> Optional[ModelInfo]:
    finite = np.isfinite(y) & np.all(np.isfinite(X), axis=1)
    X, y, raw = X[finite], y[finite], raw[finite]
    try:
        res = fit_ratio_model(X, y, seed=seed, candidates=candidates)
    except ValueError as exc:
        skipped.append(f"{key}: {exc}")
        log.warning("not fitted %s: %s", key, exc)
        return None
    ext = ".txt.gz" if res.library == "lightgbm" else ".json.gz"
    rel = f"models/{key}{ext}"
    (tmp / rel).write_bytes(res.model_bytes)
    table_rel = f"models/{key}.trees.npz"
    (tmp / table_rel).write_bytes(res.table_bytes)
    log.info("fitted %s with %s: %d samples, validation MAPE %.2f%%", key, res.library, res.samples,
             100 * res.validation_mape)
    return ModelInfo(key, rel, res.library, res.samples, res.validation_mape, res.validation_p90,
                     [float(v) for v in raw.min(axis=0)], [float(v) for v in raw.max(axis=0)],
                     res.candidate_mape, table=table_rel)


def _info_dict(m: ModelInfo) -> dict[str, Any]:
    d = {"file": m.file, "table": m.table, "library": m.library, "samples": m.samples,
         "validation_mape": m.validation_mape, "validation_p90": m.validation_p90,
         "feature_min": m.feature_min, "feature_max": m.feature_max,
         "candidate_mape": dict(m.candidate_mape)}
    if m.topologies:
        d["topologies"] = m.topologies
    return d


# ------------------------------------------------------------------------------------- loading
@dataclass
class LoadedModel:
    info: ModelInfo
    table: TreeTable
    index: int                    # position in the bundle's Forest

    def in_range(self, raw: np.ndarray) -> np.ndarray:
        """Rows whose every feature lies inside the sampled range (with 1 % slack)."""
        lo = np.asarray(self.info.feature_min) * 0.99
        hi = np.asarray(self.info.feature_max) * 1.01
        return np.all((raw >= lo) & (raw <= hi), axis=1)


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


def load_bundle(path: "str | Path", expected_manifest_sha256: str = "",
                pinned_by: str = "") -> Bundle:
    """Load and verify a bundle directory; every problem names the file at fault.

    Every file the manifest lists is checked against its sha256 (a tampered library file is
    refused too, though predictions read only the tree tables); the manifest is checked against
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
    if manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{mpath}: bundle format {manifest.get('format')!r} is not supported "
                          f"(this perfcast reads format {BUNDLE_FORMAT})")
    try:
        sums: Mapping[str, str] = manifest["sha256"]
        spec = manifest["gpu_spec"]
        gpu = GpuSpec(spec["name"], float(spec["memory_gib"]), dict(spec["tflops"]), float(spec["memory_gbps"]))
        entries = manifest["models"]
        kind, name = manifest["kind"], manifest["name"]
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{mpath}: incomplete manifest (missing or bad {exc})") from None
    root = d.resolve()
    contents: dict[str, bytes] = {}
    for rel, digest in sums.items():
        fpath = (d / rel).resolve()
        if root not in fpath.parents:
            raise BundleError(f"{mpath}: file {rel} points outside the bundle")
        try:
            if fpath.stat().st_size > MAX_MODEL_BYTES:
                raise BundleError(f"{fpath}: file is implausibly large")
            data = fpath.read_bytes()
        except FileNotFoundError:
            raise BundleError(f"{fpath}: file listed in the manifest is missing") from None
        except OSError as exc:
            raise BundleError(f"{fpath}: cannot read: {exc}") from None
        if _sha256(data) != digest:
            raise BundleError(f"{fpath}: checksum mismatch (file corrupted or tampered with)")
        contents[rel] = data
    models: dict[str, LoadedModel] = {}
    tables: list[TreeTable] = []
    for key, e in entries.items():
        try:
            info = ModelInfo(key, e["file"], e["library"], int(e["samples"]), float(e["validation_mape"]),
                             float(e["validation_p90"]), list(e["feature_min"]), list(e["feature_max"]),
                             dict(e.get("candidate_mape", {})), list(e.get("topologies", [])), e["table"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"{mpath}: model {key}: incomplete entry ({exc})") from None
        for rel in (info.file, info.table):
            if rel not in contents:
                raise BundleError(f"{mpath}: model {key}: file {rel} has no sha256")
        try:
            table = TreeTable.from_bytes(contents[info.table])
        except Exception as exc:  # numpy raises several types on a malformed archive
            raise BundleError(f"{d / info.table}: not a valid tree table: {exc}") from None
        models[key] = LoadedModel(info, table, len(tables))
        tables.append(table)
    links = Links.from_dict(manifest["links"]) if "links" in manifest else None
    return Bundle(d, kind, name, gpu, manifest, models, links, Forest(tables), _sha256(mbytes))
