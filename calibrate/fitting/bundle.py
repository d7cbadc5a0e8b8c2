"""Samples → bundle: one :class:`~calibrate.fitting.ratio.RatioRegressor` per operator, direction and
precision (or per collective kind and precision), written as a bundle directory that
:func:`predictor.bundle.load_bundle` reads (layout in that module's docstring)::

    report = BundleFitter(name="h100-80gb-hbm3", gpu=H100).fit(samples, "out/compute")

Also :func:`convert_bundle`: a format-1 bundle (one ``.npz`` tree table per model) rewritten in the
current format with the very same trees, so its predictions do not change by a bit.
"""
from __future__ import annotations

import datetime as _dt
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from predictor.bundle import (BUNDLE_FORMAT, FOREST_FILE, MANIFEST, Bundle, ModelInfo, collective_features,
                              file_sha256, info_dict, load_bundle)
from predictor.errors import BundleError
from predictor.network import Links, collective_seconds, fit_links
from predictor.operators import BYTES_PER_ELEMENT, OPERATORS, GpuSpec, regressor_features
from predictor.samples import SampleSet, dump_toml
from predictor.trees import Forest, TreeTable

from .libraries import CANDIDATES, check_candidates
from .ratio import RatioRegressor

log = logging.getLogger(__name__)

KINDS = ("compute", "collectives")


@dataclass
class FitReport:
    """What :meth:`BundleFitter.fit` wrote: the bundle, its models, and what could not be fitted."""

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
    """(X, y = log(measured / ring model)) of one collective's rows (entries, nodes, gpn, µs)."""
    entries, nodes, gpn, us = (table[:, i] for i in range(4))
    analytic = collective_seconds(links, kind, entries, nodes, gpn, BYTES_PER_ELEMENT[precision])
    X = collective_features(entries, nodes, gpn)
    return X, np.log(us * 1e-6 / analytic)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


class BundleFitter:
    """Fits every operator (``kind="compute"``) or collective (``kind="collectives"``) of a sample
    set into a bundle directory.

    Parameters are checked here, before any sample is read: ``name`` (the bundle's name),
    ``gpu`` (the roofline the compute ratios are taken against), ``kind``, ``nics_per_node``
    (collectives: the adapters a ring can use between nodes), ``seed``, ``candidates`` (regressor
    libraries to choose from), ``license_file`` (copied in as ``LICENSE``; must exist when given),
    ``extra_meta`` (a ``[meta]`` table for the manifest).
    """

    def __init__(self, *, name: str, gpu: GpuSpec, kind: str = "compute", nics_per_node: int = 1,
                 seed: int = 0, candidates: Sequence[str] = CANDIDATES,
                 license_file: "str | os.PathLike[str] | None" = None,
                 extra_meta: Optional[Mapping[str, Any]] = None):
        if not isinstance(name, str) or not name.strip() or "/" in name or "\n" in name:
            raise ValueError(f"name must be a non-empty single-line name without '/', got {name!r}")
        if not isinstance(gpu, GpuSpec):
            raise ValueError(f"gpu must be a predictor.operators.GpuSpec, got {type(gpu).__name__}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if isinstance(nics_per_node, bool) or not isinstance(nics_per_node, int) or nics_per_node < 1:
            raise ValueError(f"nics_per_node must be an integer >= 1, got {nics_per_node!r}")
        if license_file is not None and not Path(license_file).is_file():
            raise ValueError(f"license_file {license_file}: no such file")
        if extra_meta is not None and not isinstance(extra_meta, Mapping):
            raise ValueError("extra_meta must be a mapping (the manifest's [meta] table)")
        # The regressor's own checks (seed, candidates), once here rather than per model.
        RatioRegressor(candidates, seed=seed)
        self.name = name
        self.gpu = gpu
        self.kind = kind
        self.nics_per_node = nics_per_node
        self.seed = int(seed)
        self.candidates = check_candidates(candidates)
        self.license_file = Path(license_file) if license_file is not None else None
        self.extra_meta = dict(extra_meta) if extra_meta else {}

    def fit(self, samples: SampleSet, out_dir: "str | os.PathLike[str]", *,
            overwrite: bool = False) -> FitReport:
        """Fit and write ``out_dir`` atomically (a temporary sibling renamed into place), so a
        failed fit never leaves half a bundle where a platform might load it."""
        out = Path(out_dir)
        if out.exists() and not overwrite:
            raise BundleError(f"{out}: already exists")
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "models").mkdir(parents=True)
        models: dict[str, ModelInfo] = {}
        tables: dict[str, TreeTable] = {}
        skipped: list[str] = []
        links: Optional[Links] = None
        try:
            if self.kind == "compute":
                for (op_name, precision), table in sorted(samples.operators.items()):
                    for direction in OPERATORS[op_name].directions:
                        key = f"{op_name}.{direction}.{precision}"
                        X, y, raw = operator_training_rows(samples, op_name, direction, precision, self.gpu)
                        if len(table) and not len(y):
                            skipped.append(f"{key}: every sample marks it as not measured or dropped (0 µs)")
                            continue
                        self._fit_one(tmp, key, X, y, raw, models, tables, skipped)
            else:
                by_prec: dict[str, dict[str, np.ndarray]] = {}
                for (kind_name, precision), table in samples.collectives.items():
                    by_prec.setdefault(precision, {})[kind_name] = table.rows
                if not by_prec:
                    raise BundleError("no collective samples to fit")
                # Links are fitted on the half-precision rows when present: that is what training sends.
                prec0 = "fp16" if "fp16" in by_prec else sorted(by_prec)[0]
                links = fit_links(by_prec[prec0], self.nics_per_node, BYTES_PER_ELEMENT[prec0])
                for precision, kinds in sorted(by_prec.items()):
                    for kind_name, rows in sorted(kinds.items()):
                        key = f"{kind_name}.{precision}"
                        X, y = collective_training_rows(rows, kind_name, links, precision)
                        info = self._fit_one(tmp, key, X, y, rows[:, :3], models, tables, skipped)
                        if info:
                            topo = sorted({(int(a), int(b)) for a, b in rows[:, 1:3]})
                            info.topologies = [list(t) for t in topo]
            if not models:
                raise BundleError("no model could be fitted from these samples")
            manifest: dict[str, Any] = {
                "format": BUNDLE_FORMAT,
                "kind": self.kind,
                "name": self.name,
                "gpu": self.gpu.name,
                "created": _now(),
                "forest": FOREST_FILE,
                "source": dict(_flat(samples.meta)),
                "gpu_spec": {"name": self.gpu.name, "memory_gib": self.gpu.memory_gib,
                             "memory_gbps": self.gpu.memory_gbps, "tflops": dict(self.gpu.tflops)},
            }
            if self.extra_meta:
                manifest["meta"] = dict(self.extra_meta)
            if links is not None:
                manifest["links"] = links.to_dict()
            manifest["models"] = {k: info_dict(m) for k, m in models.items()}
            if skipped:
                manifest["not_fitted"] = list(skipped)    # "key: why" (the predictor quotes it)
            if self.license_file is not None:
                shutil.copyfile(self.license_file, tmp / "LICENSE")
            forest = Forest.from_tables([tables[k] for k in models], list(models))
            write_bundle_files(tmp, manifest, forest)
            _replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return FitReport(out, models, skipped, links)

    def _fit_one(self, tmp: Path, key: str, X: np.ndarray, y: np.ndarray, raw: np.ndarray,
                 models: dict[str, ModelInfo], tables: dict[str, TreeTable],
                 skipped: list[str]) -> Optional[ModelInfo]:
        finite = np.isfinite(y) & np.all(np.isfinite(X), axis=1)
        X, y, raw = X[finite], y[finite], raw[finite]
        try:
            est = RatioRegressor(self.candidates, seed=self.seed).fit(X, y)
        except ValueError as exc:
            skipped.append(f"{key}: {exc}")
            log.warning("not fitted %s: %s", key, exc)
            return None
        ext = ".txt.gz" if est.library_ == "lightgbm" else ".json.gz"
        rel = f"models/{key}{ext}"
        (tmp / rel).write_bytes(est.model_bytes_)
        log.info("fitted %s with %s: %d samples, validation MAPE %.2f%%", key, est.library_,
                 est.n_samples_, 100 * est.validation_mape_)
        info = ModelInfo(key, rel, est.library_, est.n_samples_, est.validation_mape_, est.validation_p90_,
                         [float(v) for v in raw.min(axis=0)], [float(v) for v in raw.max(axis=0)],
                         dict(est.candidate_mape_))
        models[key] = info
        tables[key] = est.table_
        return info


def write_bundle_files(directory: Path, manifest: dict[str, Any], forest: Forest) -> None:
    """Write ``forest.bin`` and ``manifest.toml`` (with the sha256 of every file already in
    ``directory``) into a bundle directory being built, then load it back: what is renamed into
    place is known to load."""
    (directory / FOREST_FILE).write_bytes(forest.to_bytes())
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(directory).as_posix()] = file_sha256(p)
    manifest["sha256"] = files
    (directory / MANIFEST).write_text(dump_toml(manifest), encoding="utf-8")
    load_bundle(directory)


def _replace_dir(tmp: Path, out: Path) -> None:
    """Put the finished ``tmp`` at ``out``; an existing ``out`` is moved aside first and removed
    last, so that a crash in between leaves one whole bundle, never a mix."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _flat(meta: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    for k, v in meta.items():
        if isinstance(v, (str, int, float, bool)) or (isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v)):
            yield k, v


def convert_bundle(src: "str | os.PathLike[str]", out: "str | os.PathLike[str] | None" = None, *,
                   overwrite: bool = False) -> Path:
    """Rewrite a format-1 bundle in the current format, in place (``out`` None) or into ``out``.

    The trees are the ones the old bundle's tables hold, re-laid out (predictions are the same
    bits); the library model files, the LICENSE and every manifest entry are kept, the ``created``
    date too.  The manifest changes (its format, the forest file, the checksums), so a platform
    that pins it needs its pin rewritten (``predictor.platform.pin_platform_bundles``).
    Returns the bundle directory; a bundle already in the current format is left as it is.
    """
    src = Path(src)
    dst = Path(out) if out is not None else src
    bundle: Bundle = load_bundle(src)        # verified: every file against the manifest
    if bundle.format == BUNDLE_FORMAT:
        if dst.resolve() != src.resolve():
            raise BundleError(f"{src}: already bundle format {BUNDLE_FORMAT}; copy it instead")
        return src
    if dst.exists() and dst.resolve() != src.resolve() and not overwrite:
        raise BundleError(f"{dst}: already exists")
    manifest = {k: v for k, v in bundle.manifest.items() if k != "sha256"}
    tables = {m.info.table for m in bundle.models.values()}
    manifest["format"] = BUNDLE_FORMAT
    manifest["forest"] = FOREST_FILE
    manifest["converted_from_format"] = bundle.format
    manifest["models"] = {k: {f: v for f, v in e.items() if f != "table"}
                          for k, e in bundle.manifest["models"].items()}
    tmp = dst.with_name(f".{dst.name}.conv{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        for rel, digest in bundle.manifest["sha256"].items():
            if rel in tables or rel == MANIFEST:
                continue
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, tmp / rel)
            # The copy is what the new manifest vouches for: it must be what the old one did.
            if file_sha256(tmp / rel) != str(digest).lower():
                raise BundleError(f"{src / rel}: changed while the bundle was converted")
        write_bundle_files(tmp, manifest, bundle.forest)
        _replace_dir(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("%s: converted bundle format %d -> %d into %s", src, bundle.format, BUNDLE_FORMAT, dst)
    return dst


__all__ = ["BundleFitter", "FitReport", "KINDS", "convert_bundle", "operator_training_rows",
           "collective_training_rows", "write_bundle_files"]
