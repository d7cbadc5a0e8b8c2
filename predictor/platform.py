"""Platforms: a GPU compute bundle + a network + overheads, named and loaded from ``platform.toml``.

The same GPU on another network is the same compute bundle with another network: ``dgx-a100``
reuses the A100 bundle measured on Perlmutter.  A platform directory::

    platform.toml     name, description, calibrated, gpus_per_node, compute_bundle (a path
                      relative to this file), collective_bundle (optional), [links], [overheads],
                      and an optional [gpu] that moves the compute ratios onto another GPU's roofline
                      (spec-only platforms), an optional [host] (measured host issue costs,
                      :mod:`predictor.host`), and ``[[validation]]``: measured end-to-end runs
                      with what this platform predicted for them (see :mod:`predictor.validation`)

Lookup order for a name: a path to such a directory; ``$PERFCAST_PLATFORMS`` (colon-separated
roots); ``/var/lib/perfcast/platforms`` (what ``perf-calibrate schedule`` installs, as
``<root>/<name>/current``); the platforms shipped inside this package.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .bundle import Bundle, load_bundle
from .errors import BundleError, PlatformNotFound, RunRecordError
from .host import HostCosts
from .network import Links
from .operators import GpuSpec
from .validation import MeasuredRun, parse_runs, ratio_range

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLATFORM_FILE = "platform.toml"
SHIPPED_DIR = Path(__file__).parent / "platforms"
SITE_ROOT = Path("/var/lib/perfcast/platforms")


@dataclass(frozen=True)
class Overheads:
    """Costs outside the training iterations, in seconds unless the name says otherwise."""

    startup_seconds: float = 120.0         # launch, NCCL init, data loader warm-up, model build
    step_seconds: float = 0.0              # per-iteration framework overhead not in any operator
    checkpoint_gbps_per_node: float = 2.0  # write bandwidth of the checkpoint file system per node
    checkpoint_fixed_seconds: float = 10.0


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

    @property
    def timeline_ratio(self) -> tuple[float, float]:
        """(low, high) factors for intervals: measured / predicted over this platform's runs."""
        return ratio_range(self.validation)

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


def write_platform(directory: "str | os.PathLike[str]", data: dict[str, Any]) -> Path:
    """Write ``platform.toml`` (keys as in this module's docstring) into ``directory``."""
    from .samples import atomic_write, dump_toml
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / PLATFORM_FILE
    atomic_write(path, dump_toml(data))
    return path


def _search_roots() -> list[Path]:
    roots = [Path(p) for p in os.environ.get("PERFCAST_PLATFORMS", "").split(":") if p]
    return roots + [SITE_ROOT, SHIPPED_DIR]


def resolve_platform(name_or_path: "str | os.PathLike[str]") -> Path:
    """The directory holding ``platform.toml`` for a name or a path."""
    p = Path(name_or_path)
    if (p / PLATFORM_FILE).is_file():
        return p
    if p.name == PLATFORM_FILE and p.is_file():
        return p.parent
    name = str(name_or_path)
    if "/" not in name and name not in ("", ".", ".."):
        for root in _search_roots():
            for cand in (root / name / "current", root / name):
                if (cand / PLATFORM_FILE).is_file():
                    return cand
    known = ", ".join(sorted(i["name"] for i in list_platforms())) or "none"
    raise PlatformNotFound(f"no platform {name!r} (known: {known})")


_cache: dict[tuple, Platform] = {}
_bundles: dict[tuple, Bundle] = {}
_lock = threading.Lock()


def _bundle(path: Path, reload: bool) -> Bundle:
    """Platforms that share a compute bundle (dgx-a100 and perlmutter-a100) share it in memory."""
    d = path.resolve()
    stamp = (str(d), (d / "manifest.toml").stat().st_mtime_ns) if (d / "manifest.toml").exists() else (str(d), 0)
    with _lock:
        if not reload and stamp in _bundles:
            return _bundles[stamp]
    b = load_bundle(d)
    with _lock:
        _bundles[stamp] = b
    return b


def load_platform(name_or_path: "str | os.PathLike[str]", *, reload: bool = False) -> Platform:
    """Load (and cache) a platform; ``reload=True`` re-reads it from disk (the daemon's SIGHUP)."""
    d = resolve_platform(name_or_path).resolve()
    stamp = (str(d), (d / PLATFORM_FILE).stat().st_mtime_ns)
    with _lock:
        if not reload and stamp in _cache:
            return _cache[stamp]
    plat = _load(d, reload)
    with _lock:
        _cache[stamp] = plat
    return plat


def _load(d: Path, reload: bool = False) -> Platform:
    fpath = d / PLATFORM_FILE
    try:
        raw = tomllib.loads(fpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BundleError(f"{fpath}: unreadable platform file: {exc}") from None
    try:
        compute = _bundle(d / raw["compute_bundle"], reload)
        collectives = _bundle(d / raw["collective_bundle"], reload) if raw.get("collective_bundle") else None
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
        try:
            runs = parse_runs(raw.get("validation"), f"{fpath}: validation", need_prediction=True)
        except RunRecordError as exc:
            raise BundleError(str(exc)) from None
        return Platform(name=raw["name"], description=raw.get("description", ""),
                        calibrated=bool(raw.get("calibrated", False)),
                        gpus_per_node=int(raw["gpus_per_node"]), gpu=gpu, compute=compute,
                        links=links, collectives=collectives, overheads=over, path=d,
                        notes=list(raw.get("notes", [])), validation=runs, host=host)
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
