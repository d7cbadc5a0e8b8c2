"""Fitting: samples → regressors → bundles → a platform.  Everything that fits lives here; the
predictor only loads, validates and predicts (and never imports the regressor libraries).

- :class:`RatioRegressor` (``ratio``): one operator's regressor, scikit-learn style
  (``RatioRegressor(candidates, seed=...).fit(X, y)``): the library with the lowest hold-out error.
- :class:`BundleFitter` (``bundle``): every model of a sample set, written as a bundle directory
  (``BundleFitter(name=..., gpu=...).fit(samples, out_dir) -> FitReport``); :func:`convert_bundle`
  rewrites an older bundle format with the same trees.
- ``libraries``: the libraries' estimators, model files and their conversion to tree tables.
- ``report``: the validation report of a fit.

``fit_platform(samples_dir, out_dir)`` is ``perf-calibrate fit``.  The platform directory::

    platform.toml          what predictor.platform.load_platform reads ([host] from the store's
                           host.toml, perf-calibrate host, on a GPU; [fabric] from its
                           fabric.toml, perf-calibrate fabric)
    compute/               the compute bundle (BundleFitter, kind "compute")
    collectives/           the collective bundle, when collectives were measured
    calibration.toml       provenance and the scores that install/status compare
    validation/report.txt  per operator and direction: library, samples, hold-out MAPE and p90
    validation/predicted_vs_measured.png

Everything is written into a temporary sibling, loaded back through the predictor, and only then
renamed into place: a failed fit leaves nothing that a daemon could pick up.  The directory must
not be the samples, inside them or hold them; ``overwrite`` (``--force``) replaces only an empty
directory or a previous fit (both its platform.toml and calibration.toml), never anything else
(:func:`_check_out`).  No torch here.
"""
from __future__ import annotations

import datetime as _dt
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from predictor.errors import BundleError
from predictor.estimate import model_candidates
from predictor.operators import OPERATORS, GpuSpec
from predictor.platform import load_platform, write_platform
from predictor.samples import META_FILE, SampleSet, dump_toml, load_samples

from ..env import DeviceSpec, published_spec
from ..errors import CalibrationError
from ..store import check_meta
from .bundle import (BundleFitter, FitReport, collective_training_rows, convert_bundle,
                     operator_training_rows)
from .fabric import FABRIC_FILE, platform_fabric_table
from .host import HOST_FILE, platform_host_table
from .libraries import CANDIDATES
from .ratio import RatioRegressor
from .report import ValidationReport, held_out_predictions, write_report

log = logging.getLogger(__name__)

CALIBRATION_FILE = "calibration.toml"
CALIBRATION_FORMAT = 1

# Links assumed when no collective was measured (a single-rank calibration): one host's memory
# for CPU "ranks", a conservative NVLink/IB pair for GPUs.  The platform says so in its notes.
_DEFAULT_LINKS = {
    "cpu": {"intra_gbps": 5.0, "intra_latency_us": 50.0, "nic_gbps": 1.0, "nics_per_node": 1,
            "inter_latency_us": 100.0, "source": "spec"},
    "cuda": {"intra_gbps": 100.0, "intra_latency_us": 10.0, "nic_gbps": 12.5, "nics_per_node": 1,
             "inter_latency_us": 20.0, "source": "spec"},
}


@dataclass
class FitResult:
    """What ``perf-calibrate fit`` produced."""

    platform_dir: Path
    name: str
    compute: FitReport
    collectives: FitReport | None
    report: ValidationReport
    samples: int
    complete: bool
    notes: list[str] = field(default_factory=list)

    @property
    def compute_mape(self) -> float:
        return self.report.compute_mape

    @property
    def collective_mape(self) -> float | None:
        return self.report.collective_mape


def gpu_spec_from_meta(meta: Mapping[str, Any], where: Path) -> tuple[GpuSpec, str]:
    """The roofline normaliser of a sample store: its measured [gpu] table, else published figures."""
    g = meta.get("gpu")
    if isinstance(g, Mapping) and "tflops" in g:
        try:
            spec = DeviceSpec.from_dict(g)
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: bad [gpu] table in samples.toml: {exc}") from None
        return spec.to_gpu_spec(), spec.device
    name = g if isinstance(g, str) else str(meta.get("gpu_name", ""))
    spec = published_spec(name) if name else None
    if spec is None:
        raise CalibrationError(f"{where}: samples of GPU {name or '(unnamed)'!r}, whose peak figures "
                               "perfcast does not know; add a [gpu] table (name, memory_gib, "
                               "memory_gbps, [gpu.tflops]) to samples.toml")
    return spec.to_gpu_spec(), str(meta.get("device", "cuda"))


def _count(samples: SampleSet) -> int:
    return sum(len(t) for t in samples.operators.values()) + sum(len(t) for t in samples.collectives.values())


def fit_platform(samples_dir: "str | Path", out_dir: "str | Path", *, name: str | None = None,
                 gpus_per_node: int | None = None, nics_per_node: int = 1, overwrite: bool = False,
                 plot: bool = True, seed: int = 0,
                 candidates: tuple[str, ...] | None = None) -> FitResult:
    """Fit a sample store into a platform directory (see the module docstring)."""
    src, out = Path(samples_dir), Path(out_dir)
    if not src.is_dir():
        raise CalibrationError(f"{src}: no such sample directory")
    try:
        samples = load_samples(src)
    except BundleError as exc:
        raise CalibrationError(f"refusing a corrupt or incompatible sample store: {exc}") from None
    # A key perfcast does not write (a typo'd [timing] host, [progress] complete …) would change
    # the fit without a word: refused, naming the file, line and key.
    check_meta(samples.meta, src / META_FILE)
    if not samples.operators:
        raise CalibrationError(f"{src}: no operator samples to fit")
    _check_out(src, out, overwrite)
    meta = samples.meta
    gpu, device = gpu_spec_from_meta(meta, src / "samples.toml")
    alloc = meta.get("allocation", {}) if isinstance(meta.get("allocation"), Mapping) else {}
    gpn = int(gpus_per_node or alloc.get("gpus_per_node") or meta.get("gpus_per_node") or 1)
    pname = name or out.name
    complete = bool(meta.get("progress", {}).get("complete", True)) if isinstance(meta.get("progress"), Mapping) \
        else True
    notes: list[str] = []
    if not complete:
        notes.append("fitted from an incomplete calibration (the run did not finish every point)")

    tmp = out.with_name(f".{out.name}.fit{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        license_file = src / "LICENSE" if (src / "LICENSE").is_file() else None
        extra = {k: v for k, v in (("samples", str(src.resolve())), ("device", device)) if v}
        libs = tuple(candidates) if candidates else CANDIDATES
        compute = BundleFitter(name=f"{pname}-compute", gpu=gpu, kind="compute", seed=seed,
                               candidates=libs, license_file=license_file,
                               extra_meta=extra).fit(samples, tmp / "compute")
        unpredictable = _unpredictable(samples, compute, src)
        if unpredictable:
            # A platform the predictor cannot cost a measured operator with is not a finished
            # calibration: install's incomplete-calibration gate must refuse it.
            complete = False
            for line in unpredictable:
                notes.append(line)
                log.warning("%s", line)
        collectives = None
        if samples.collectives:
            try:
                collectives = BundleFitter(name=f"{pname}-collectives", gpu=gpu, kind="collectives",
                                           nics_per_node=nics_per_node, seed=seed, candidates=libs,
                                           license_file=license_file,
                                           extra_meta=extra).fit(samples, tmp / "collectives")
            except BundleError as exc:
                notes.append(f"collectives not fitted ({exc}); analytic network model")
                log.warning("collectives not fitted: %s", exc)
        plat: dict[str, Any] = {
            "name": pname,
            "description": _describe(meta, gpu, gpn),
            "calibrated": True,
            "gpus_per_node": gpn,
            "compute_bundle": "compute",
        }
        if collectives is not None:
            plat["collective_bundle"] = "collectives"
        else:
            plat["links"] = dict(_DEFAULT_LINKS.get(device, _DEFAULT_LINKS["cuda"]))
            notes.append("no measured collectives: network from default link figures")
        if device == "cpu":
            # A CPU "cluster" starts in seconds, not minutes.
            plat["overheads"] = {"startup_seconds": 5.0}
        host = _host_table(src, meta, device, notes)
        if host is not None:
            plat["host"] = host
        if (src / FABRIC_FILE).is_file():
            fabric = platform_fabric_table(src / FABRIC_FILE)
            if fabric is not None:
                plat["fabric"] = fabric
            else:
                notes.append(f"{FABRIC_FILE} holds no groups between nodes: no [fabric]")
        if notes:
            plat["notes"] = notes
        write_platform(tmp, plat)

        report = held_out_predictions(samples, gpu, compute, collectives, seed=seed)
        write_report(report, tmp / "validation", plot=plot)
        cal = {
            "format": CALIBRATION_FORMAT,
            "name": pname,
            "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            "samples_dir": str(src.resolve()),
            "samples": _count(samples),
            "complete": complete,
            "device": device,
            "gpu": gpu.name,
            "compute_mape": report.compute_mape,
            "plans": list(meta.get("plans", [])) if isinstance(meta.get("plans"), list) else [],
        }
        if report.collective_mape is not None:
            cal["collective_mape"] = report.collective_mape
        env = meta.get("environment")
        if isinstance(env, Mapping):
            cal["environment"] = {k: v for k, v in env.items() if isinstance(v, (str, int, float, bool))}
        (tmp / CALIBRATION_FILE).write_text(dump_toml(cal), encoding="utf-8")
        # The proof that the platform is usable: the predictor itself loads it.
        load_platform(tmp, reload=True)
        # Checked again: the fit took a while, and --out is about to be removed.
        if _check_out(src, out, overwrite):
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FitResult(out, pname, compute, collectives, report, _count(samples), complete, notes)


# What a fit writes into its directory (the module docstring): a directory holding both files is
# a previous fit, the only kind of non-empty directory that --force replaces.
_FIT_MARKERS = ("platform.toml", CALIBRATION_FILE)


def _check_out(src: Path, out: Path, overwrite: bool) -> bool:
    """Refuse an ``--out`` that a fit must not write to; True when ``out`` exists and is to be
    replaced (``--force``, and it is empty or a previous fit).

    The samples are never at risk: ``--out`` may not be the sample directory, inside it, or hold
    it.  With ``--force``, only an empty directory or a previous fit (its platform.toml and
    calibration.toml) is replaced; anything else (a typo'd ``--out ~/``, a directory of notes) is
    refused even then, naming what is in it.
    """
    src_r, out_r = src.resolve(), out.resolve()
    if out_r == src_r:
        raise CalibrationError(f"--out {out}: is the sample directory being fitted; "
                               "write the platform to another directory")
    if src_r in out_r.parents:
        raise CalibrationError(f"--out {out}: is inside the sample directory {src}; "
                               "write the platform to a directory outside it")
    if out_r in src_r.parents:
        raise CalibrationError(f"--out {out}: holds the sample directory {src} (replacing it would "
                               "delete the samples); write the platform to another directory")
    if not out.exists() and not out.is_symlink():
        return False
    if not overwrite:
        raise CalibrationError(f"--out {out}: already exists (pass --force to replace it)")
    if out.is_symlink() or not out.is_dir():
        kind = "a symbolic link" if out.is_symlink() else "a file" if out.is_file() else "not a directory"
        raise CalibrationError(f"--out {out}: is {kind}, not a platform directory; "
                               "not replaced, even with --force")
    try:
        entries = sorted(out.iterdir())
    except OSError as exc:
        raise CalibrationError(f"--out {out}: cannot list it ({exc.strerror or exc}); "
                               "not replaced") from None
    if not entries or all((out / m).is_file() and not (out / m).is_symlink() for m in _FIT_MARKERS):
        return True
    shown = [e.name + ("/" if e.is_dir() and not e.is_symlink() else "") for e in entries[:5]]
    more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
    raise CalibrationError(f"--out {out}: not a previous fit (no {' and '.join(_FIT_MARKERS)}) and not "
                           f"empty: it holds {', '.join(shown)}{more}; not replaced, even with --force "
                           "(choose another --out, or empty it first)")


def _unpredictable(samples: SampleSet, compute: FitReport, src: Path) -> list[str]:
    """One line per operator of the store that the fitted bundle cannot cost: no model for it,
    for its forward pass (what a missing backward falls back to), nor for its substitute, as the
    predictor looks them up (predictor.estimate)."""
    out = []
    for (op, prec), _ in sorted(samples.operators.items()):
        if op not in OPERATORS:
            continue
        lost = []
        for direction in OPERATORS[op].directions:
            if not any(f"{o}.{d}.{p}" in compute.models for o, d, p in model_candidates(op, direction, prec)):
                lost.append(direction)
        if lost:
            why = next((s.split(": ", 1)[1] for s in compute.skipped
                        if s.startswith(f"{op}.{lost[0]}.{prec}: ")), "no usable samples")
            out.append(f"operator {op} ({', '.join(lost)}, {prec}) not fitted ({why}; "
                       f"{src / 'operators' / f'{op}_{prec}.csv'}) and has no substitute: "
                       "the calibration is not complete (install refuses it without --force)")
    return out


def _host_table(src: Path, meta: Mapping[str, Any], device: str, notes: list[str]) -> dict[str, Any] | None:
    """The store's host costs (``perf-calibrate host --out SAMPLES/host.toml``) as the platform's
    [host] table, or None.  On a CPU the host is the device and the operator samples already hold
    the dispatch, so there is no host term to add; a GPU store without host.toml gets none either,
    and its notes say how to add one."""
    path = src / HOST_FILE
    if not path.is_file():
        if device != "cpu":
            notes.append(f"no {HOST_FILE} in the samples: no host term (perf-calibrate host --device cuda "
                         f"--out {path} measures one; fit again)")
        return None
    if device == "cpu":
        notes.append(f"{HOST_FILE} not used: on a CPU the operator samples already hold the host's work")
        return None
    timing = meta.get("timing", {}) if isinstance(meta.get("timing"), Mapping) else {}
    # Device-timed samples (perf-calibrate run --timing device) hold no host time to take off.
    return platform_host_table(path, per_call=timing.get("host", "included") != "excluded")


def _describe(meta: Mapping[str, Any], gpu: GpuSpec, gpn: int) -> str:
    env = meta.get("environment") if isinstance(meta.get("environment"), Mapping) else {}
    host = env.get("host", "") if env else ""
    job = env.get("slurm_job_id", "") if env else ""
    where = f" on {host}" if host else ""
    where += f" (Slurm job {job})" if job else ""
    return f"calibrated by perf-calibrate: {gpu.name}, {gpn} per node{where}"


def read_calibration(platform_dir: Path) -> dict[str, Any]:
    """calibration.toml of a platform directory ({} when absent or unreadable)."""
    import sys
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads((platform_dir / CALIBRATION_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


__all__ = ["FitResult", "fit_platform", "gpu_spec_from_meta", "read_calibration", "CALIBRATION_FILE",
           "RatioRegressor", "BundleFitter", "FitReport", "convert_bundle", "CANDIDATES",
           "operator_training_rows", "collective_training_rows"]
