"""Installing calibrated platforms per partition: versioned directories, an atomic symlink switch.

Layout under the platforms root (``--root``, else ``$PERFCAST_PLATFORMS`` (first entry), else
``/var/lib/perfcast/platforms``; the predictor resolves ``<root>/<name>/current``)::

    <root>/<partition>/versions/<UTC stamp>-<tag>/   one fitted platform directory each
    <root>/<partition>/current  -> versions/…        what the predictor and the daemon load
    <root>/<partition>/previous -> versions/…        what ``rollback`` switches back to
    <root>/<partition>/history.log                   one line per install / refusal / rollback

Rules: a platform that does not load, comes from an incomplete calibration, is for another GPU
type than the active one, or validates worse than the active one (beyond a tolerance) is refused
and nothing installed is touched.  The switch is ``rename(2)`` of a new symlink over ``current``,
so a reader sees the old platform or the new one, never a mix.  After a switch the daemon is sent
SIGHUP (pid file from ``--pid-file``, ``$PERFCAST_DAEMON_PIDFILE`` or the packaged default).
No torch here.
"""
from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.errors import BundleError
from predictor.platform import PLATFORM_FILE, load_platform

from .errors import CalibrationError, InstallRefused
from .fitting import read_calibration

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/var/lib/perfcast/platforms")
DEFAULT_PIDFILE = Path("/run/perfcast/perf-predictd.pid")
KEEP_VERSIONS = 5
# A new calibration may be this much worse (relative, plus an absolute 0.5 point for noise on
# small stores) before it is refused.
DEFAULT_TOLERANCE = 0.10
_ABS_SLACK = 0.005
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def platforms_root(root: "str | Path | None" = None) -> Path:
    """--root, else the first entry of $PERFCAST_PLATFORMS, else /var/lib/perfcast/platforms."""
    if root:
        return Path(root)
    env = [p for p in os.environ.get("PERFCAST_PLATFORMS", "").split(":") if p]
    return Path(env[0]) if env else DEFAULT_ROOT


def check_partition_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise CalibrationError(f"bad partition name {name!r} (letters, digits, '.', '_', '-')")
    return name


@dataclass
class InstalledVersion:
    partition: str
    version: str
    path: Path
    created: str
    samples: int
    compute_mape: float
    collective_mape: float | None
    gpu: str
    complete: bool


@dataclass
class InstallResult:
    partition: str
    version: str
    path: Path
    previous: str | None
    signalled: int | None          # daemon pid that got SIGHUP
    message: str


def _read_version(partition: str, path: Path) -> InstalledVersion:
    cal = read_calibration(path)
    mape = cal.get("compute_mape", math.nan)
    coll = cal.get("collective_mape")
    return InstalledVersion(partition, path.name, path, str(cal.get("created", "")),
                            int(cal.get("samples", 0)), float(mape),
                            float(coll) if coll is not None else None, str(cal.get("gpu", "")),
                            bool(cal.get("complete", False)))


def _link_target(link: Path) -> Path | None:
    if not link.is_symlink():
        return None
    return (link.parent / os.readlink(link)).resolve()


def current_version(root: Path, partition: str) -> InstalledVersion | None:
    target = _link_target(root / partition / "current")
    if target is None or not (target / PLATFORM_FILE).is_file():
        return None
    return _read_version(partition, target)


def previous_version(root: Path, partition: str) -> InstalledVersion | None:
    target = _link_target(root / partition / "previous")
    if target is None or not (target / PLATFORM_FILE).is_file():
        return None
    return _read_version(partition, target)


def _switch(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` atomically (relative symlink, renamed over the old one)."""
    rel = os.path.relpath(target, link.parent)
    tmp = link.with_name(f".{link.name}.tmp{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(rel, tmp)
    os.replace(tmp, link)
    _fsync_dir(link.parent)


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _history(root: Path, partition: str, line: str) -> None:
    try:
        d = root / partition
        d.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
        with open(d / "history.log", "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {line}\n")
    except OSError as exc:  # the history is a courtesy; never fail an install over it
        log.warning("cannot write history.log: %s", exc)


def validate_candidate(platform_dir: Path, *, allow_incomplete: bool = False) -> InstalledVersion:
    """Check that a fitted platform is installable on its own: it loads and its calibration finished."""
    if not (platform_dir / PLATFORM_FILE).is_file():
        raise InstallRefused(f"{platform_dir}: not a platform directory (no {PLATFORM_FILE})")
    try:
        load_platform(platform_dir, reload=True)
    except BundleError as exc:
        raise InstallRefused(f"{platform_dir}: does not load: {exc}") from None
    cal = read_calibration(platform_dir)
    if not cal:
        raise InstallRefused(f"{platform_dir}: no calibration.toml (not fitted by perf-calibrate fit)")
    info = _read_version("", platform_dir)
    if not info.complete and not allow_incomplete:
        raise InstallRefused(f"{platform_dir}: fitted from an incomplete calibration (killed or failed "
                             "run); not installed")
    if not math.isfinite(info.compute_mape):
        raise InstallRefused(f"{platform_dir}: no validation error recorded")
    return info


def install_platform(platform_dir: "str | Path", partition: str, *, root: "str | Path | None" = None,
                     tolerance: float = DEFAULT_TOLERANCE, force: bool = False, tag: str = "",
                     keep: int = KEEP_VERSIONS, pid_file: "str | Path | None" = None) -> InstallResult:
    """Install a fitted platform as the partition's active one (see the module docstring).

    ``force`` skips the comparisons with the active platform (GPU type, validation error) but
    never the checks that the new platform loads.
    """
    src = Path(platform_dir)
    check_partition_name(partition)
    base = platforms_root(root)
    new = validate_candidate(src, allow_incomplete=force)
    cur = current_version(base, partition)
    if cur is not None and not force:
        if cur.gpu and new.gpu and cur.gpu != new.gpu:
            msg = (f"{src}: calibrated on {new.gpu!r}, partition {partition} runs {cur.gpu!r}; "
                   "not installed (use --force if the partition's hardware changed)")
            _history(base, partition, f"refused {src}: other GPU type")
            raise InstallRefused(msg)
        if math.isfinite(cur.compute_mape) and \
                new.compute_mape > cur.compute_mape * (1.0 + tolerance) + _ABS_SLACK:
            _history(base, partition, f"refused {src}: validation {new.compute_mape:.4f} worse than "
                                      f"active {cur.version} {cur.compute_mape:.4f}")
            raise InstallRefused(
                f"{src}: validates worse than the active platform of {partition} "
                f"({100 * new.compute_mape:.2f} % vs {100 * cur.compute_mape:.2f} %, tolerance "
                f"{100 * tolerance:.0f} %); the active one stays (use --force to install anyway)")
    pdir = base / partition
    versions = pdir / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_tag = re.sub(r"[^A-Za-z0-9._-]", "_", tag or os.environ.get("SLURM_JOB_ID", "") or str(os.getpid()))
    version = f"{stamp}-{safe_tag}"
    dest = versions / version
    n = 1
    while dest.exists():
        n += 1
        dest = versions / f"{version}.{n}"
    tmp = versions / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, symlinks=False)
        os.replace(tmp, dest)
        _fsync_dir(versions)
        load_platform(dest, reload=True)      # the copy loads too, before anything points at it
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
        if isinstance(exc, (OSError, BundleError)):
            raise InstallRefused(f"cannot install {src} into {versions}: {exc}") from None
        raise
    if cur is not None:
        _switch(pdir / "previous", cur.path)
    _switch(pdir / "current", dest)
    _history(base, partition, f"installed {dest.name} (compute MAPE {new.compute_mape:.4f}, "
                              f"{new.samples} samples) from {src}")
    _prune(pdir, keep)
    pid = signal_daemon(pid_file)
    msg = f"installed {dest.name} as the platform of partition {partition}"
    if cur is not None:
        msg += f" (previous: {cur.version}, kept for rollback)"
    return InstallResult(partition, dest.name, dest, cur.version if cur else None, pid, msg)


def rollback(partition: str, *, root: "str | Path | None" = None,
             pid_file: "str | Path | None" = None) -> InstallResult:
    """Make ``previous`` current again (and the rolled-back version previous, so it can be undone)."""
    check_partition_name(partition)
    base = platforms_root(root)
    pdir = base / partition
    cur = current_version(base, partition)
    prev = previous_version(base, partition)
    if cur is None:
        raise CalibrationError(f"partition {partition} has no installed platform under {base}")
    if prev is None:
        raise CalibrationError(f"partition {partition} has no previous platform to roll back to")
    try:
        load_platform(prev.path, reload=True)
    except BundleError as exc:
        raise CalibrationError(f"previous platform {prev.version} does not load any more: {exc}") from None
    _switch(pdir / "current", prev.path)
    _switch(pdir / "previous", cur.path)
    _history(base, partition, f"rolled back from {cur.version} to {prev.version}")
    pid = signal_daemon(pid_file)
    return InstallResult(partition, prev.version, prev.path, cur.version, pid,
                         f"partition {partition}: rolled back to {prev.version} (from {cur.version})")


def _prune(pdir: Path, keep: int) -> None:
    """Remove the oldest versions beyond ``keep``; never current or previous."""
    versions = pdir / "versions"
    protected = {t for t in (_link_target(pdir / "current"), _link_target(pdir / "previous")) if t}
    entries = sorted(p for p in versions.iterdir() if p.is_dir() and not p.name.startswith("."))
    excess = len(entries) - max(keep, 2)
    for p in entries:
        if excess <= 0:
            break
        if p.resolve() in protected:
            continue
        shutil.rmtree(p, ignore_errors=True)
        excess -= 1


def signal_daemon(pid_file: "str | Path | None" = None) -> int | None:
    """SIGHUP the prediction daemon named by the pid file, if there is one; returns its pid.

    The pid is checked to belong to perf-predictd (pids are reused: a stale pid file must not
    make us signal an unrelated process).
    """
    path = Path(pid_file) if pid_file else (
        Path(os.environ["PERFCAST_DAEMON_PIDFILE"]) if os.environ.get("PERFCAST_DAEMON_PIDFILE") else DEFAULT_PIDFILE)
    try:
        pid = int(path.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        if pid_file:
            log.warning("daemon pid file %s unreadable: no SIGHUP sent", path)
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        log.warning("pid %d from %s is not running: no SIGHUP sent", pid, path)
        return None
    if "perf-predictd" not in cmdline and "slurm_plugin.daemon" not in cmdline and "perfcast" not in cmdline:
        log.warning("pid %d from %s is not perf-predictd (%s): no SIGHUP sent", pid, path, cmdline[:80])
        return None
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        log.warning("cannot signal perf-predictd (pid %d): %s", pid, exc)
        return None
    log.info("sent SIGHUP to perf-predictd (pid %d)", pid)
    return pid


@dataclass
class PartitionStatus:
    partition: str
    version: str | None
    age_days: float | None
    samples: int
    compute_mape: float | None
    collective_mape: float | None
    gpu: str
    previous: str | None
    versions: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def status(root: "str | Path | None" = None) -> list[PartitionStatus]:
    """Every partition under the root: active version, age, samples and validation errors."""
    base = platforms_root(root)
    out: list[PartitionStatus] = []
    if not base.is_dir():
        return out
    now = time.time()
    for pdir in sorted(p for p in base.iterdir() if p.is_dir() and (p / "versions").is_dir()):
        cur = current_version(base, pdir.name)
        prev = previous_version(base, pdir.name)
        nvers = sum(1 for p in (pdir / "versions").iterdir() if p.is_dir() and not p.name.startswith("."))
        age = None
        if cur is not None:
            try:
                created = _dt.datetime.fromisoformat(cur.created).timestamp() if cur.created else \
                    (cur.path / PLATFORM_FILE).stat().st_mtime
            except ValueError:
                created = (cur.path / PLATFORM_FILE).stat().st_mtime
            age = max(0.0, (now - created) / 86400.0)
        out.append(PartitionStatus(
            pdir.name, cur.version if cur else None, age, cur.samples if cur else 0,
            cur.compute_mape if cur and math.isfinite(cur.compute_mape) else None,
            cur.collective_mape if cur else None, cur.gpu if cur else "",
            prev.version if prev else None, nvers))
    return out
