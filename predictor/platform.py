"""Platforms: a GPU compute bundle + a network + overheads, named and loaded from ``platform.toml``.

The same GPU on another network is the same compute bundle with another network: ``dgx-a100``
reuses the A100 bundle measured on Perlmutter.  A platform directory::

    platform.toml     name, description, calibrated, gpus_per_node, compute_bundle (a path
                      relative to this file), collective_bundle (optional), the sha256 of each
                      bundle's manifest (compute_bundle_sha256, collective_bundle_sha256: an
                      edited manifest is refused; absent = not checked, for older platforms),
                      [links], [overheads],
                      and an optional [gpu] that moves the compute ratios onto another GPU's roofline
                      (spec-only platforms), an optional [host] (measured host issue costs,
                      :mod:`predictor.host`), and ``[[validation]]``: measured end-to-end runs
                      with what this platform predicted for them (see :mod:`predictor.validation`),
                      and an optional ``[fitted]``: end-to-end scales fitted on those runs
                      (``perf-calibrate validate --fit``, :class:`FittedTerms`), and an
                      optional ``[fabric]``: collectives between nodes timed beside each other
                      (``perf-calibrate fabric``, :class:`predictor.network.FabricSharing`)

Lookup order for a name: a path to such a directory; ``$PERFCAST_PLATFORMS`` (colon-separated
roots); ``/var/lib/perfcast/platforms`` (what ``perf-calibrate schedule`` installs, as
``<root>/<name>/current``); the platforms shipped inside this package.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .bundle import MANIFEST, Bundle, check_manifest_pin, load_bundle, manifest_sha256
from .errors import BundleError, PlatformNotFound, RunRecordError, did_you_mean
from .host import HostCosts
from .kinds import JobKind
from .network import FabricSharing, Links
from .operators import GpuSpec
from .samples import atomic_write, dump_toml
from .validation import MeasuredRun, parse_runs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLATFORM_FILE = "platform.toml"
SHIPPED_DIR = Path(__file__).parent / "platforms"
SITE_ROOT = Path("/var/lib/perfcast/platforms")


@dataclass(frozen=True)
class Overheads:
    """Costs outside the training iterations, in seconds unless the name says otherwise.

    The defaults have no measurement or published figure behind them (docs/modelling.md §7): they
    are placeholders a site replaces in platform.toml's ``[overheads]`` with its own."""

    startup_seconds: float = 120.0         # launch, NCCL init, data loader warm-up, model build
    step_seconds: float = 0.0              # per-iteration framework overhead not in any operator
    checkpoint_gbps_per_node: float = 2.0  # write bandwidth of the checkpoint file system per node
    checkpoint_fixed_seconds: float = 10.0  # per checkpoint: metadata, barriers, file creation


# --- [fitted]: end-to-end terms fitted on measured runs (perf-calibrate validate --fit) ---
# Bounds of a fitted scale: a factor of 2 either way covers every measured/predicted ratio of the
# shipped platforms' runs (tests/predictor/test_constants.py checks it); beyond it the models are
# wrong, not mis-scaled, and a scale would only hide that.
FITTED_SCALE_RANGE = (0.5, 2.0)
# The attention scale's upper bound: fused attention kernels on one GPU are up to 4x slower than
# the fastest (benchmarks/data/h100-lent/stacks/attention.json, 2k-32k tokens: SDPA's
# memory-efficient kernel 1.5-3.5x cuDNN's forward time, 3.0-4.2x its backward's), and a launch may
# not say which runs (SDPA falls back to the memory-efficient kernel under an arbitrary mask, e.g.
# ALiBi's).  No kernel measured beat the timed one by more than the other factors' x0.5 (cuDNN
# against FlashAttention-2: 0.52x), so the lower bound stays theirs.
ATTENTION_SCALE_RANGE = (0.5, 4.0)


def scale_range(name: str) -> tuple[float, float]:
    """The bounds of the fitted scale ``name`` (``FittedTerms``' field)."""
    return ATTENTION_SCALE_RANGE if name == "attention_scale" else FITTED_SCALE_RANGE


# The scales of [fitted]: compute_scale on device time; attention_scale on fused attention's
# device time besides (a stack's attention kernel against the one the platform timed: its share of
# a step grows with the sequence, so no compute scale can stand for it); host_scale (the one host
# scale of files written before the host terms were split; new fits write 1) on the whole host
# issue time; the three host terms of predictor/host.py, each on its own measured cost; and
# network_scale on the time of communication between nodes.
FITTED_SCALES = ("compute_scale", "attention_scale", "host_scale", "host_layer_scale", "host_micro_batch_scale",
                 "host_launch_scale", "network_scale")


# The mechanisms a job has or lacks (each "more than one": data-, tensor-, pipeline-, context-
# parallel ranks, nodes).  A scale fitted on runs that all had one can have absorbed its error.
FIT_TRAITS = ("dp", "tp", "pp", "cp", "nodes")


def job_traits(job: Any, gpus_per_node: int) -> dict[str, bool]:
    """Which of :data:`FIT_TRAITS` a job has (``job``: a TrainingJob)."""
    lay = job.layout
    return {"dp": lay.dp > 1, "tp": lay.tp > 1, "pp": lay.pp > 1, "cp": lay.cp > 1,
            "nodes": job.nodes(job.cluster.gpus_per_node or gpus_per_node) > 1}


@dataclass(frozen=True)
class FitDomain:
    """The jobs ``[fitted]`` was learnt on: the range of hidden sizes, and per trait of
    :data:`FIT_TRAITS` the values the runs had.  A fitted scale can absorb the error of a mechanism
    every run had (a compute scale fitted on data-parallel runs, the time their ranks lose to each
    other), so a job outside the domain is predicted without the scales and told so (the
    measurement behind it: docs/harvest.md).  The hidden range bounds only the scales of
    shape-dependent costs (:meth:`FittedTerms.outside`)."""

    hidden_min: int
    hidden_max: int
    traits: tuple[tuple[str, tuple[bool, ...]], ...]     # (trait, values seen), FIT_TRAITS order

    @classmethod
    def of_jobs(cls, jobs: "list[Any]", gpus_per_node: int) -> "FitDomain":
        if not jobs:
            raise ValueError("a fit domain needs at least one job")
        seen: dict[str, set[bool]] = {t: set() for t in FIT_TRAITS}
        for job in jobs:
            for t, v in job_traits(job, gpus_per_node).items():
                seen[t].add(v)
        hidden = [int(j.model.hidden) for j in jobs]
        return cls(min(hidden), max(hidden), tuple((t, tuple(sorted(seen[t]))) for t in FIT_TRAITS))

    def outside(self, job: Any, gpus_per_node: int, *, sizes: bool = True) -> str:
        """Why ``job`` lies outside the domain ("" when inside).  ``sizes``: the hidden range counts
        too (for scales of costs that depend on the shapes: device compute, host issue)."""
        h = int(job.model.hidden)
        if sizes and not self.hidden_min <= h <= self.hidden_max:
            return f"hidden {h} (fitted on {self.hidden_min}–{self.hidden_max})"
        seen = dict(self.traits)
        for t, v in job_traits(job, gpus_per_node).items():
            if v not in seen.get(t, (v,)):
                what = "more than one node" if t == "nodes" else f"{t} > 1"
                return f"{'' if v else 'no '}{what} (every fitted run had {'none' if v else 'it'})"
        return ""

    def describe(self) -> str:
        """One line, e.g. "hidden 512–4096; dp > 1, no tp, no pp, no cp, one node" (the traits every
        run had or none had; a trait with both values is not named)."""
        fixed = []
        for t, v in self.traits:
            if v == (True,):
                fixed.append("more than one node" if t == "nodes" else f"{t} > 1")
            elif v == (False,):
                fixed.append("one node" if t == "nodes" else f"no {t}")
        parts = [f"hidden {self.hidden_min}–{self.hidden_max}"]
        return "; ".join(parts + [", ".join(fixed)] if fixed else parts)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "FitDomain":
        if not isinstance(d, dict):
            raise BundleError(f"{where}: [fitted.domain] must be a table")
        unknown = sorted(set(d) - {"hidden", *FIT_TRAITS})
        if unknown:
            raise BundleError(f"{where}: fitted.domain.{unknown[0]}: unknown key")
        h = d.get("hidden")
        if (not isinstance(h, list) or len(h) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                               and x >= 1 for x in h) or h[0] > h[1]):
            raise BundleError(f"{where}: fitted.domain.hidden must be [min, max] hidden sizes, got {h!r}")
        traits = []
        for t in FIT_TRAITS:
            v = d.get(t, [False, True])
            if not isinstance(v, list) or not v or not all(isinstance(x, bool) for x in v):
                raise BundleError(f"{where}: fitted.domain.{t} must be a non-empty list of true/false, "
                                  f"got {v!r}")
            traits.append((t, tuple(sorted(set(v)))))
        return cls(h[0], h[1], tuple(traits))

    def to_dict(self) -> dict[str, Any]:
        return {"hidden": [self.hidden_min, self.hidden_max], **{t: list(v) for t, v in self.traits}}


def _check_scales(d: dict, scales: tuple[str, ...], prefix: str) -> None:
    """Each of ``scales`` in its :func:`scale_range` and the leave-one-out MAPEs >= 0 (default 1 / 0);
    ``prefix`` names the table in the error ("platform.toml: fitted.")."""
    for key in scales:
        lo, hi = scale_range(key)
        v = d.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise BundleError(f"{prefix}{key} must be a number in [{lo}, {hi}], got {v!r}")
    for key in ("loo_mape_before", "loo_mape_after"):
        v = d.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e6:
            raise BundleError(f"{prefix}{key} must be a number >= 0, got {v!r}")


@dataclass(frozen=True)
class FittedTerms:
    """``[fitted]``: ``compute_scale`` multiplies every operator's device time (never below its
    roofline), ``attention_scale`` fused attention's once more; the host's issue time
    (:mod:`predictor.host`) is ``host_scale`` × (``host_layer_scale`` × the per-layer cost +
    ``host_micro_batch_scale`` × the per-micro-batch cost + ``host_launch_scale`` × the launch cost); ``network_scale`` multiplies the time of every
    collective and pipeline send whose ranks span nodes (the fabric under a whole job, against the
    collectives calibration timed alone); the rest says how they were fitted (the runs,
    leave-one-out MAPE before and after, when).  Every scale defaults to 1, so a file written
    before a scale existed means what it meant."""

    compute_scale: float = 1.0
    host_scale: float = 1.0
    runs: tuple[str, ...] = ()
    attention_scale: float = 1.0
    loo_mape_before: float = 0.0
    loo_mape_after: float = 0.0
    fitted_at: str = ""
    source: str = ""
    host_layer_scale: float = 1.0
    host_micro_batch_scale: float = 1.0
    host_launch_scale: float = 1.0
    network_scale: float = 1.0
    domain: Optional[FitDomain] = None     # None: every job (files written before the domain)
    # Per kind (predictor.kinds): factors pooled toward these (``[[fitted_kind]]``), and the log
    # half-width of the interval of a kind with no runs (the spread measured across kinds; 0: no
    # per-kind fit).  A kind's own terms (KindTerms.terms) carry its key and leave-one-out scores.
    kinds: tuple["KindTerms", ...] = ()
    unseen_kind_bound: float = 0.0
    pooling: float = 0.0                   # the shrinkage strength leave-one-out chose (sigma^2/tau^2)
    kind: str = ""
    kind_scores: tuple[float, ...] = ()

    def without_scales(self) -> "Optional[FittedTerms]":
        """What a job outside the fit's domain is predicted with: no scales (None), but a per-kind
        fit's interval data kept (an unseen kind's bound stays what the runs measured)."""
        if not (self.kinds or self.kind or self.unseen_kind_bound):
            return None
        return FittedTerms(kinds=(), kind=self.kind, kind_scores=self.kind_scores,
                           unseen_kind_bound=self.unseen_kind_bound)

    def for_kind(self, key: str) -> "Optional[KindTerms]":
        """The fitted terms of kind ``key`` (None: no runs of it were fitted)."""
        return next((k for k in self.kinds if k.kind == key), None)

    @classmethod
    def from_dict(cls, d: Any, where: str, kinds: Any = None) -> "FittedTerms":
        if not isinstance(d, dict):
            raise BundleError(f"{where}: [fitted] must be a table")
        unknown = sorted(set(d) - ({f for f in cls.__dataclass_fields__} - {"kinds", "kind", "kind_scores"}))
        if unknown:
            raise BundleError(f"{where}: fitted.{unknown[0]}: unknown key")
        _check_scales(d, FITTED_SCALES, f"{where}: fitted.")
        runs = d.get("runs", [])
        if not isinstance(runs, list) or not all(isinstance(r, str) for r in runs):
            raise BundleError(f"{where}: fitted.runs must be a list of run names")
        for key in ("fitted_at", "source"):
            if not isinstance(d.get(key, ""), str):
                raise BundleError(f"{where}: fitted.{key} must be a string")
        domain = FitDomain.from_dict(d["domain"], where) if "domain" in d else None
        for key in ("unseen_kind_bound", "pooling"):
            v = d.get(key, 0.0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9:
                raise BundleError(f"{where}: fitted.{key} must be a number >= 0, got {v!r}")
        if kinds is None:
            kinds = []
        if not isinstance(kinds, list):
            raise BundleError(f"{where}: fitted_kind must be an array of tables ([[fitted_kind]])")
        parsed = tuple(KindTerms.from_dict(k, f"{where}: fitted_kind[{i}]") for i, k in enumerate(kinds))
        if len({k.kind for k in parsed}) != len(parsed):
            raise BundleError(f"{where}: fitted_kind: a kind appears twice")
        return cls(runs=tuple(runs), loo_mape_before=float(d.get("loo_mape_before", 0.0)),
                   loo_mape_after=float(d.get("loo_mape_after", 0.0)),
                   fitted_at=d.get("fitted_at", ""), source=d.get("source", ""), domain=domain,
                   kinds=parsed, unseen_kind_bound=float(d.get("unseen_kind_bound", 0.0)),
                   pooling=float(d.get("pooling", 0.0)),
                   **{key: float(d.get(key, 1.0)) for key in FITTED_SCALES})

    def outside(self, job: Any, gpus_per_node: int) -> str:
        """Why ``job`` lies outside the jobs these scales were fitted on ("" when inside, or when no
        domain was recorded).  The hidden range counts only where a scale of a shape-dependent cost
        (device compute, host issue) differs from 1: the network scale's fabric does not care."""
        if self.domain is None:
            return ""
        sized = any(getattr(self, k) != 1.0 for k in FITTED_SCALES if k != "network_scale")
        return self.domain.outside(job, gpus_per_node, sizes=sized)

    def to_dict(self) -> dict[str, Any]:
        out = {**{key: getattr(self, key) for key in FITTED_SCALES}, "runs": list(self.runs),
               "loo_mape_before": self.loo_mape_before, "loo_mape_after": self.loo_mape_after,
               "fitted_at": self.fitted_at, "source": self.source}
        if self.kinds or self.unseen_kind_bound:
            out["unseen_kind_bound"] = self.unseen_kind_bound
            out["pooling"] = self.pooling
        if self.domain is not None:
            out["domain"] = self.domain.to_dict()
        return out

    def kinds_to_toml(self) -> list[dict[str, Any]]:
        """``[[fitted_kind]]``: one table per kind (platform.toml's top level)."""
        return [k.to_dict() for k in self.kinds]


# The factors a kind carries (FITTED_SCALES without the legacy host_scale).
KIND_SCALES = tuple(k for k in FITTED_SCALES if k != "host_scale")


@dataclass(frozen=True)
class KindTerms:
    """``[[fitted_kind]]``: one kind's factors (each pooled toward the partition's ``[fitted]``
    ones, and those toward 1, by empirical-Bayes shrinkage), the standard error of each factor's
    log, and the leave-one-out scores ``log(measured / predicted)`` of its runs, which give its
    interval (:meth:`predictor.interval.IntervalRule.for_platform`)."""

    kind: str                                   # predictor.kinds.JobKind.key
    runs: int
    scales: tuple[tuple[str, float], ...]       # (factor, value), KIND_SCALES order
    std_errors: tuple[tuple[str, float], ...] = ()
    scores: tuple[float, ...] = ()
    loo_mape_before: float = 0.0
    loo_mape_after: float = 0.0
    domain: Optional[FitDomain] = None

    def scale(self, name: str) -> float:
        return dict(self.scales).get(name, 1.0)

    def terms(self, parent: FittedTerms) -> FittedTerms:
        """The ``[fitted]`` a prediction of this kind uses."""
        return dataclasses.replace(parent, kinds=(), kind=self.kind, kind_scores=self.scores,
                                   domain=self.domain if self.domain is not None else parent.domain,
                                   host_scale=1.0, **{k: self.scale(k) for k in KIND_SCALES})

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "KindTerms":
        if not isinstance(d, dict):
            raise BundleError(f"{where}: must be a table")
        known = {"kind", "runs", "std_errors", "scores", "loo_mape_before", "loo_mape_after", "domain",
                 *KIND_SCALES}
        unknown = sorted(set(d) - known)
        if unknown:
            raise BundleError(f"{where}.{unknown[0]}: unknown key")
        JobKind.from_key(d.get("kind"), f"{where}.kind")
        runs = d.get("runs")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 0:
            raise BundleError(f"{where}.runs must be a number of runs >= 0, got {runs!r}")
        _check_scales(d, KIND_SCALES, f"{where}.")
        se = d.get("std_errors", {})
        if not isinstance(se, dict) or any(k not in KIND_SCALES or isinstance(v, bool) or
                                           not isinstance(v, (int, float)) or not 0 <= v < 1e3
                                           for k, v in se.items()):
            raise BundleError(f"{where}.std_errors must map factors to numbers >= 0")
        scores = d.get("scores", [])
        if (not isinstance(scores, list) or len(scores) > 1000 or
                any(isinstance(x, bool) or not isinstance(x, (int, float)) or not abs(x) < 50 for x in scores)):
            raise BundleError(f"{where}.scores must be a list of finite log ratios")
        domain = FitDomain.from_dict(d["domain"], where) if "domain" in d else None
        return cls(d["kind"], runs, tuple((k, float(d.get(k, 1.0))) for k in KIND_SCALES),
                   tuple((k, float(v)) for k, v in se.items()), tuple(float(x) for x in scores),
                   float(d.get("loo_mape_before", 0.0)), float(d.get("loo_mape_after", 0.0)), domain)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "runs": self.runs, **dict(self.scales),
                               "scores": [round(x, 6) for x in self.scores],
                               "loo_mape_before": self.loo_mape_before, "loo_mape_after": self.loo_mape_after}
        if self.std_errors:
            out["std_errors"] = dict(self.std_errors)
        if self.domain is not None:
            out["domain"] = self.domain.to_dict()
        return out
# --- end [fitted] ---


@dataclass
class Platform:
    name: str
    description: str
    calibrated: bool
    gpus_per_node: int
    gpu: GpuSpec                        # the roofline the compute ratios are applied to
    compute: Bundle
    links: Links
    collectives: Optional[Bundle] = None
    overheads: Overheads = field(default_factory=Overheads)
    path: Path = Path(".")
    notes: list[str] = field(default_factory=list)
    validation: list[MeasuredRun] = field(default_factory=list)
    host: Optional[HostCosts] = None     # None: no host term (device time alone)
    fitted: Optional[FittedTerms] = None   # [fitted] scales (None: none fitted)
    fabric: Optional[FabricSharing] = None  # [fabric]: collectives between nodes beside each other

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu.memory_gib

    @property
    def bundle_id(self) -> str:
        ids = [self.compute.bundle_id]
        if self.collectives is not None:
            ids.append(self.collectives.bundle_id)
        return "+".join(ids)

    @property
    def transferred(self) -> bool:
        """Compute ratios measured on one GPU applied to another GPU's published peaks."""
        return self.gpu.name != self.compute.gpu.name

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "calibrated": self.calibrated,
                "gpus_per_node": self.gpus_per_node, "gpu": self.gpu.name,
                "gpu_memory_gib": self.gpu.memory_gib, "bundle": self.bundle_id,
                "path": str(self.path)}


# platform.toml key naming a bundle -> the key pinning that bundle's manifest
BUNDLE_PINS = {"compute_bundle": "compute_bundle_sha256",
               "collective_bundle": "collective_bundle_sha256"}


def bundle_pins(directory: "str | os.PathLike[str]", data: dict[str, Any]) -> dict[str, str]:
    """The manifest pins of the bundles ``data`` names, computed from the bundles on disk
    (a bundle that is not there yet gets no pin)."""
    pins: dict[str, str] = {}
    for key, pin in BUNDLE_PINS.items():
        rel = data.get(key)
        if isinstance(rel, str) and rel and (Path(directory) / rel / MANIFEST).is_file():
            pins[pin] = manifest_sha256(Path(directory) / rel)
    return pins


def write_platform(directory: "str | os.PathLike[str]", data: dict[str, Any]) -> Path:
    """Write ``platform.toml`` (keys as in this module's docstring) into ``directory``.

    The bundles' manifest pins are (re)computed from the bundles on disk: whoever writes a
    platform file (fit, validate, the build script) vouches for the bundles it names.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pins = bundle_pins(d, data)
    if pins:
        data = _with_pins(data, pins)
    path = d / PLATFORM_FILE
    atomic_write(path, dump_toml(data))
    return path


def _with_pins(data: dict[str, Any], pins: dict[str, str]) -> dict[str, Any]:
    """``data`` with each pin right after the bundle key it belongs to (readable files)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if k in pins:
            continue
        out[k] = v
        pin = BUNDLE_PINS.get(k)
        if pin in pins:
            out[pin] = pins[pin]
    for k, v in pins.items():
        out.setdefault(k, v)
    return out


def pin_platform_bundles(directory: "str | os.PathLike[str]", only_missing: bool = False) -> dict[str, str]:
    """Add (or update) the manifest pins in an existing ``platform.toml``, touching nothing else.

    The file is edited as text -- one ``..._sha256 = "..."`` line after the bundle's line --
    so comments, key order, the number formats and every table ([host], [[validation]], ...)
    stay exactly as they are; the result is checked to read back as the old file plus the pins.
    ``only_missing``: keep pins already there (perf-calibrate install on an older platform).
    Returns the pins written (empty if there was nothing to do).
    """
    d = Path(directory)
    path = d / PLATFORM_FILE
    text = path.read_text(encoding="utf-8")
    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BundleError(f"{path}: unreadable platform file: {exc}") from None
    pins = bundle_pins(d, before)
    if only_missing:
        pins = {k: v for k, v in pins.items() if k not in before}
    pins = {k: v for k, v in pins.items() if before.get(k) != v}
    if not pins:
        return {}
    lines = text.splitlines(keepends=True)
    top = next((i for i, line in enumerate(lines) if re.match(r"\s*\[", line)), len(lines))
    head, rest = lines[:top], lines[top:]
    head = [line for line in head
            if not any(re.match(rf"\s*{pin}\s*=", line) for pin in pins)]
    for key, pin in BUNDLE_PINS.items():
        if pin not in pins:
            continue
        at = next((i for i, line in enumerate(head) if re.match(rf"\s*{key}\s*=", line)), None)
        new = f'{pin} = "{pins[pin]}"\n'
        if at is None:
            head.append(new)
        else:
            if not head[at].endswith("\n"):
                head[at] += "\n"
            head.insert(at + 1, new)
    new_text = "".join(head + rest)
    after = tomllib.loads(new_text)
    if {k: v for k, v in after.items() if k not in pins} != \
            {k: v for k, v in before.items() if k not in pins} or any(after.get(k) != v for k, v in pins.items()):
        raise BundleError(f"{path}: cannot add the bundle pins without changing other keys")
    atomic_write(path, new_text)
    return pins


def search_roots(platforms_env: Optional[str], cwd: Optional[str] = None) -> list[Path]:
    """The roots a lookup by name searches in a process whose ``$PERFCAST_PLATFORMS`` is
    ``platforms_env`` (None: unset) and whose working directory is ``cwd`` (None: this one's)."""
    roots = [Path(cwd) / p if cwd else Path(p) for p in (platforms_env or "").split(":") if p]
    return roots + [SITE_ROOT, SHIPPED_DIR]


def _search_roots() -> list[Path]:
    return search_roots(os.environ.get("PERFCAST_PLATFORMS"))


def find_platform(name: str, roots: Sequence[Path], pending: Optional[Path] = None) -> Optional[Path]:
    """Where a lookup by name over ``roots`` finds platform ``name`` (``<root>/<name>/current``,
    then ``<root>/<name>``), or None.  ``pending``: a directory to count as holding one although
    nothing is there yet (what a dry run would install)."""
    for root in roots:
        for cand in (root / name / "current", root / name):
            if (cand / PLATFORM_FILE).is_file() or (pending is not None and cand.resolve() == pending.resolve()):
                return cand
    return None


def resolve_platform(name_or_path: "str | os.PathLike[str]", *, pending: Optional[Path] = None) -> Path:
    """The directory holding ``platform.toml`` for a name or a path.  ``pending``: a directory to
    count as holding one although nothing is there yet (what a dry run would install), so that the
    lookup says what it will find once it is."""
    p = Path(name_or_path)
    if (p / PLATFORM_FILE).is_file():
        return p
    if p.name == PLATFORM_FILE and p.is_file():
        return p.parent
    name = str(name_or_path)
    if "/" not in name and name not in ("", ".", ".."):
        found = find_platform(name, _search_roots(), pending)
        if found is not None:
            return found
    names = sorted(i["name"] for i in list_platforms())
    raise PlatformNotFound(f"no platform {name!r}{did_you_mean(name, names)} (known: {', '.join(names) or 'none'})")


# Loaded files, keyed by (directory, file mtime): a platform or bundle is read once per version
# and shared (dgx-a100 and perlmutter-a100 share a compute bundle), never mutated after loading,
# and only the latest version of each directory is kept.
_cache: dict[tuple, Platform] = {}
_bundles: dict[tuple, Bundle] = {}
_lock = threading.Lock()


def _bundle(path: Path, reload: bool, pin: str = "", pinned_by: str = "") -> Bundle:
    """Platforms that share a compute bundle (dgx-a100 and perlmutter-a100) share it in memory.

    ``pin``: the manifest's sha256 as platform.toml records it (checked on cached bundles too).
    """
    d = path.resolve()
    stamp = (str(d), (d / "manifest.toml").stat().st_mtime_ns) if (d / "manifest.toml").exists() else (str(d), 0)
    with _lock:
        cached = None if reload else _bundles.get(stamp)
    if cached is not None:
        check_manifest_pin(cached, pin, pinned_by)
        return cached
    b = load_bundle(d, pin, pinned_by)
    with _lock:
        _keep_latest(_bundles, stamp, b)
    return b


def _keep_latest(cache: dict, stamp: tuple, value: object) -> None:
    """Cache ``value`` under (directory, mtime), dropping that directory's older versions: a
    daemon that reloads after every refit must not keep each superseded platform in memory."""
    for old in [k for k in cache if k[0] == stamp[0] and k != stamp]:
        del cache[old]
    cache[stamp] = value


def forget_loaded() -> None:
    """Drop every cached platform and bundle, so the next loads read and verify their files
    again (and share what they read among themselves): the daemon's reload, which must catch a
    file changed on disk under an unchanged platform.toml and manifest.  What callers hold stays
    valid; only the cache forgets it."""
    with _lock:
        _cache.clear()
        _bundles.clear()


def load_platform(name_or_path: "str | os.PathLike[str]", *, reload: bool = False) -> Platform:
    """Load (and cache) a platform; ``reload=True`` re-reads it from disk (the daemon's SIGHUP)."""
    d = resolve_platform(name_or_path).resolve()
    stamp = (str(d), (d / PLATFORM_FILE).stat().st_mtime_ns)
    with _lock:
        if not reload and stamp in _cache:
            return _cache[stamp]
    plat = _load(d, reload)
    with _lock:
        _keep_latest(_cache, stamp, plat)
    return plat


# --- site overlays: a site's runs and fitted terms on top of a shipped platform ---
# A site overlay's platform.toml names the shipped platform it sits on (``overlay_of``) and pins
# that platform's platform.toml (``overlay_of_sha256``); it holds only what a site learnt:
OVERLAY_KEYS = frozenset({"name", "overlay_of", "overlay_of_sha256", "description", "notes", "fitted",
                          "fitted_kind", "validation"})


def shipped_platform_sha256(name: str) -> str:
    """The sha256 of a shipped platform's platform.toml (what an overlay of it pins)."""
    return hashlib.sha256((SHIPPED_DIR / name / PLATFORM_FILE).read_bytes()).hexdigest()


def is_shipped(directory: "str | os.PathLike[str]") -> bool:
    """Whether ``directory`` is one of the platforms shipped inside this package."""
    d = Path(directory).resolve()
    return d.parent == SHIPPED_DIR.resolve() and (d / PLATFORM_FILE).is_file()


def _load_overlay(d: Path, raw: dict[str, Any], reload: bool) -> Platform:
    fpath = d / PLATFORM_FILE
    unknown = sorted(set(raw) - OVERLAY_KEYS)
    if unknown:
        raise BundleError(f"{fpath}: {unknown[0]}: not allowed in a site overlay (it holds name, "
                          "overlay_of, overlay_of_sha256, description, notes, [fitted], [[fitted_kind]], "
                          f"[[validation]]){did_you_mean(unknown[0], OVERLAY_KEYS)}")
    name = raw.get("overlay_of")
    if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or \
            not (SHIPPED_DIR / name / PLATFORM_FILE).is_file():
        raise BundleError(f"{fpath}: overlay_of: {name!r} is not a platform shipped with perfcast")
    base = load_platform(SHIPPED_DIR / name, reload=reload)
    pin = raw.get("overlay_of_sha256", "")
    if pin != shipped_platform_sha256(name):
        # Its runs' residuals and factors were measured against other models: the shipped
        # platform as it is now, and say so (a site keeps predicting; a refit makes a new overlay).
        why = (f"site overlay {d} is not applied: it was fitted on another version of the shipped platform "
               f"{name} (overlay_of_sha256 differs); refit it (perf-calibrate harvest --refit)")
        logging.getLogger(__name__).warning("%s", why)
        return dataclasses.replace(base, notes=list(base.notes) + [why])
    fitted = FittedTerms.from_dict(raw["fitted"], str(fpath), raw.get("fitted_kind")) if "fitted" in raw else None
    if "fitted_kind" in raw and fitted is None:
        raise BundleError(f"{fpath}: [[fitted_kind]] without [fitted]")
    try:
        runs = parse_runs(raw.get("validation"), f"{fpath}: validation", need_prediction=True)
    except RunRecordError as exc:
        raise BundleError(str(exc)) from None
    notes = raw.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(x, str) for x in notes):
        raise BundleError(f"{fpath}: notes must be a list of strings")
    return dataclasses.replace(base, path=d, validation=runs, fitted=fitted,
                               description=str(raw.get("description", base.description)),
                               notes=list(base.notes) + list(notes))


# --- the keys of platform.toml (module docstring, docs/platforms.md) ---
# Every key a platform file may hold at its top level: what the shipped platforms hold and what
# perfcast writes (perf-calibrate fit, validate [--fit], the build script, install's pins).  Any
# other key is a typo and refused, with the nearest known key (a misspelt [overheads] must not
# bring back the default start-up).  A site overlay has its own keys (OVERLAY_KEYS).
PLATFORM_KEYS = frozenset({"name", "description", "calibrated", "gpus_per_node", "compute_bundle",
                           "compute_bundle_sha256", "collective_bundle", "collective_bundle_sha256",
                           "notes", "gpu", "links", "overheads", "host", "fabric", "validation", "fitted",
                           "fitted_kind"})
LINK_KEYS = ("intra_gbps", "intra_latency_us", "nic_gbps", "nics_per_node", "inter_latency_us")
GPU_KEYS = ("name", "memory_gib", "memory_gbps", "tflops")
OVERHEAD_KEYS = tuple(f.name for f in dataclasses.fields(Overheads))
# [host], [fabric], [fitted], [[fitted_kind]] and [[validation]] check their own keys
# (HostCosts, FabricSharing, FittedTerms, KindTerms, predictor.validation.parse_runs).


def _check_keys(d: dict, known: "Any", fpath: Path, table: str = "") -> None:
    """Refuse the first key of ``d`` (a table of platform.toml, ``table`` its dotted name, "" the
    top level) that is not in ``known``."""
    unknown = sorted(k for k in d if k not in known)
    if not unknown:
        return
    k = unknown[0]
    hint = did_you_mean(k, known)
    if not table and isinstance(d[k], dict):
        raise BundleError(f"{fpath}: [{k}]: unknown table{hint}")
    if not table and isinstance(d[k], list) and d[k] and all(isinstance(x, dict) for x in d[k]):
        raise BundleError(f"{fpath}: [[{k}]]: unknown array of tables{hint}")
    raise BundleError(f"{fpath}: {table + '.' if table else ''}{k}: unknown key{hint}")


def _table(raw: dict, key: str, fpath: Path) -> dict:
    v = raw[key]
    if not isinstance(v, dict):
        raise BundleError(f"{fpath}: {key} must be a table ([{key}]), got {v!r}")
    return v


def _number(v: Any, fpath: Path, key: str, *, positive: bool = False) -> None:
    """A finite number >= 0 (> 0 with ``positive``: a bandwidth, a size); refused naming ``key``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
            (positive and v == 0):
        raise BundleError(f"{fpath}: {key} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")


def _string(v: Any, fpath: Path, key: str, *, empty: bool = True) -> None:
    if not isinstance(v, str) or (not empty and not v):
        raise BundleError(f"{fpath}: {key} must be a {'' if empty else 'non-empty '}string, got {v!r}")


def _count(v: Any, fpath: Path, key: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise BundleError(f"{fpath}: {key} must be a whole number >= 1, got {v!r}")


def check_platform_keys(raw: dict[str, Any], fpath: Path) -> None:
    """Every key of a (non-overlay) platform.toml known, the required ones there, and the values of
    the top level, [gpu], [links] and [overheads] of the right type and range (one line naming the
    file and key).  The other tables are checked where they are parsed."""
    _check_keys(raw, PLATFORM_KEYS, fpath)
    for key in ("name", "gpus_per_node", "compute_bundle"):
        if key not in raw:
            raise BundleError(f"{fpath}: {key}: missing (a platform file needs name, gpus_per_node, "
                              "compute_bundle)")
    _string(raw["name"], fpath, "name", empty=False)
    _string(raw["compute_bundle"], fpath, "compute_bundle", empty=False)
    _count(raw["gpus_per_node"], fpath, "gpus_per_node")
    for key in ("description", "collective_bundle"):
        if key in raw:
            _string(raw[key], fpath, key)
    if "calibrated" in raw and not isinstance(raw["calibrated"], bool):
        raise BundleError(f"{fpath}: calibrated must be true or false, got {raw['calibrated']!r}")
    notes = raw.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(x, str) for x in notes):
        raise BundleError(f"{fpath}: notes must be a list of strings")
    if "gpu" in raw:
        g = _table(raw, "gpu", fpath)
        _check_keys(g, GPU_KEYS, fpath, "gpu")
        for key in GPU_KEYS:
            if key not in g:
                raise BundleError(f"{fpath}: gpu.{key}: missing ([gpu] needs {', '.join(GPU_KEYS)})")
        _string(g["name"], fpath, "gpu.name", empty=False)
        _number(g["memory_gib"], fpath, "gpu.memory_gib", positive=True)
        _number(g["memory_gbps"], fpath, "gpu.memory_gbps", positive=True)
        if not isinstance(g["tflops"], dict) or not g["tflops"]:
            raise BundleError(f"{fpath}: gpu.tflops must be a table of peak TFLOP/s per precision ([gpu.tflops])")
        for prec, v in g["tflops"].items():
            _number(v, fpath, f"gpu.tflops.{prec}", positive=True)
    if "links" in raw:
        links = _table(raw, "links", fpath)
        _check_keys(links, (*LINK_KEYS, "source"), fpath, "links")
        for key in LINK_KEYS:
            if key not in links:
                raise BundleError(f"{fpath}: links.{key}: missing ([links] needs {', '.join(LINK_KEYS)})")
        for key in ("intra_gbps", "nic_gbps"):
            _number(links[key], fpath, f"links.{key}", positive=True)
        for key in ("intra_latency_us", "inter_latency_us"):
            _number(links[key], fpath, f"links.{key}")
        _count(links["nics_per_node"], fpath, "links.nics_per_node")
        if "source" in links:
            _string(links["source"], fpath, "links.source")
    if "overheads" in raw:
        over = _table(raw, "overheads", fpath)
        _check_keys(over, OVERHEAD_KEYS, fpath, "overheads")
        for key, v in over.items():
            _number(v, fpath, f"overheads.{key}", positive=key == "checkpoint_gbps_per_node")
# --- end of the keys ---


def _load(d: Path, reload: bool = False) -> Platform:
    fpath = d / PLATFORM_FILE
    try:
        raw = tomllib.loads(fpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BundleError(f"{fpath}: unreadable platform file: {exc}") from None
    if "overlay_of" in raw:
        return _load_overlay(d, raw, reload)
    check_platform_keys(raw, fpath)
    try:
        pins = {k: raw.get(p, "") for k, p in BUNDLE_PINS.items()}
        for key, pin in pins.items():
            if not isinstance(pin, str) or (pin and len(pin) != 64):
                raise BundleError(f"{fpath}: {BUNDLE_PINS[key]} must be a sha256 (64 hex digits)")
        compute = _bundle(d / raw["compute_bundle"], reload, pins["compute_bundle"],
                          f"{fpath} compute_bundle_sha256")
        collectives = _bundle(d / raw["collective_bundle"], reload, pins["collective_bundle"],
                              f"{fpath} collective_bundle_sha256") if raw.get("collective_bundle") else None
        if "links" in raw:
            links = Links.from_dict(raw["links"])
        elif collectives is not None and collectives.links is not None:
            links = collectives.links
        else:
            raise BundleError(f"{fpath}: no [links] and no fitted collective bundle")
        gpu = compute.gpu
        if "gpu" in raw:
            g = raw["gpu"]
            gpu = GpuSpec(g["name"], float(g["memory_gib"]), dict(g["tflops"]), float(g["memory_gbps"]))
        over = Overheads(**raw.get("overheads", {}))
        host = HostCosts.from_dict(raw["host"], str(fpath)) if "host" in raw else None
        if "fitted_kind" in raw and "fitted" not in raw:
            raise BundleError(f"{fpath}: [[fitted_kind]] without [fitted]")
        fitted = FittedTerms.from_dict(raw["fitted"], str(fpath), raw.get("fitted_kind")) if "fitted" in raw else None
        fabric = FabricSharing.from_dict(raw["fabric"], str(fpath)) if "fabric" in raw else None
        try:
            runs = parse_runs(raw.get("validation"), f"{fpath}: validation", need_prediction=True)
        except RunRecordError as exc:
            raise BundleError(str(exc)) from None
        return Platform(name=raw["name"], description=raw.get("description", ""),
                        calibrated=bool(raw.get("calibrated", False)),
                        gpus_per_node=int(raw["gpus_per_node"]), gpu=gpu, compute=compute,
                        links=links, collectives=collectives, overheads=over, path=d,
                        notes=list(raw.get("notes", [])), validation=runs, host=host, fitted=fitted,
                        fabric=fabric)
    except BundleError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"{fpath}: incomplete platform file (missing or bad {exc})") from None


def list_platforms() -> list[dict[str, Any]]:
    """Every platform that can be loaded by name, first root wins (without loading the models)."""
    seen: dict[str, dict[str, Any]] = {}
    for root in _search_roots():
        if not root.is_dir():
            continue
        try:
            entries = sorted(root.iterdir())
        except OSError:
            continue
        for entry in entries:
            for cand in (entry / "current", entry):
                f = cand / PLATFORM_FILE
                if entry.name in seen or not f.is_file():
                    continue
                try:
                    raw = tomllib.loads(f.read_text(encoding="utf-8"))
                except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                    continue
                seen[entry.name] = {"name": entry.name, "description": raw.get("description", ""),
                                    "calibrated": bool(raw.get("calibrated", False)),
                                    "gpus_per_node": raw.get("gpus_per_node"), "path": str(cand)}
    return list(seen.values())
