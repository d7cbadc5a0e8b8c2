"""Installing calibrated platforms per partition: versioned directories, an atomic symlink switch.

Layout under the platforms root (``--root``, else ``$PERFCAST_PLATFORMS`` (first entry), else
``/var/lib/perfcast/platforms``; the predictor resolves ``<root>/<name>/current``)::

    <root>/<partition>/versions/<UTC stamp>-<tag>/   one fitted platform directory each
    <root>/<partition>/current  -> versions/…        what the predictor and the daemon load
    <root>/<partition>/previous -> versions/…        what ``rollback`` switches back to (no link:
                                                     the shipped platform of that name, if any)
    <root>/<partition>/history.log                   one line per install / refusal / rollback

Rules: a platform that does not load, comes from an incomplete calibration, is for another GPU
type than the active one, or validates worse than the active one (beyond a tolerance) is refused
and nothing installed is touched.  The switch is ``rename(2)`` of a new symlink over ``current``,
so a reader sees the old platform or the new one, never a mix.  Installs and rollbacks of one
partition take a lock (``<partition>/.lock``); what a killed install left behind (``.<version>.tmp``
folders, half-made links) is removed by the next one.  ``previous`` is always what was active just
before the last install or rollback, so ``rollback`` undoes exactly that one: after an install made
while no version was active (the shipped platform of that name answered, e.g. after a rollback to
it) there is no ``previous`` link, and ``rollback`` goes back to the shipped platform (a link left
from before would skip it).  An installed platform always pins its
bundles' manifests (``compute_bundle_sha256`` ...): one fitted before pins existed gets them here.

``perf-calibrate harvest --refit`` (:func:`refit_partition`) makes a new version the same way: a
copy of the active version whose ``[fitted]`` end-to-end terms are fitted on the partition's
harvested runs (``perf-calibrate validate --fit``), installed only when leave-one-out improves.
Its directory carries ``refit.toml`` (what it was refitted from, on how many runs, leave-one-out
MAPE before and after, the factors that moved), which ``status`` shows; ``rollback`` undoes it
like any install, and a later refit respects that: while the newest refit is rolled back, runs
its fit already saw are no reason to refit (:func:`_rolled_back_refit`).  Partitions whose refit
writes the same directory (``gpu`` and ``gpu-long`` both on ``dgx-h100``) are refitted together
(:func:`refit_shared`): one fit on all their runs, one version, ``refit.toml`` keeping each one's.

After a switch the daemon reloads (:func:`reload_daemon`): SIGHUP to the pid in the pid file
(``--pid-file``, ``$PERFCAST_DAEMON_PIDFILE`` or ``/run/perfcast/perf-predictd.pid``, which the
packaged systemd unit has the daemon write) once ``/proc/PID/cmdline`` shows that process really
is perf-predictd, else ``systemctl reload perf-predictd`` when systemd runs it.  A reload that
fails is an error (:class:`ReloadFailed`: the command exits non-zero, the new platform stays
installed); no daemon running at all is only a warning (it loads the platform when it starts).
No torch here.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import difflib
import fcntl
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from predictor.bundle import file_sha256
from predictor.errors import BundleError, PerfcastError, did_you_mean
from predictor.platform import (PLATFORM_FILE, SHIPPED_DIR, load_platform, pin_platform_bundles,
                                shipped_platform_sha256)
from predictor.validation import MAX_RUNS, MeasuredRun
from slurm_plugin.policy import plural

from .errors import CalibrationError, InstallRefused
from .fitting import CALIBRATION_FILE, read_calibration
from .runs_files import write_atomically

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - older Pythons only
    import tomli as tomllib

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/var/lib/perfcast/platforms")
DEFAULT_PIDFILE = Path("/run/perfcast/perf-predictd.pid")
SYSTEMD_UNIT = "perf-predictd.service"
DAEMON_MODULE = "slurm_plugin.daemon"
DAEMON_COMMAND = "perf-predictd"
KEEP_VERSIONS = 5
# A new calibration may be this much worse (relative, plus an absolute 0.5 point for noise on
# small stores) before it is refused.
DEFAULT_TOLERANCE = 0.10
_ABS_SLACK = 0.005
# In a version directory made by `harvest --refit`: where it came from (read by status()).
REFIT_FILE = "refit.toml"
# Harvested runs a refit needs at least.  Leave-one-out needs 3 to fit at all (validate's
# MIN_FIT_RUNS); with 5 each fit inside it still sees 4 jobs, so one odd job cannot carry a scale.
DEFAULT_REFIT_MIN_RUNS = 5
# The names perf-calibrate harvest gives its runs ("slurm job <id>"): the runs file is their
# authority, so a refit drops such runs from the platform's [[validation]] before adding the file's.
HARVESTED_RUN_PREFIX = "slurm job "
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
    samples: int | None            # None: its calibration.toml has no sound count (status shows "?")
    compute_mape: float
    collective_mape: float | None
    gpu: str
    complete: bool
    problem: str = ""              # what is wrong with its calibration.toml ("" when sound)


class ReloadFailed(CalibrationError):
    """The platform was switched but the running daemon could not be told to reload."""


@dataclass
class ReloadResult:
    status: str                    # signalled | systemd | not-running | failed | unchanged (none needed)
    pid: int | None                # the daemon's pid, when known
    message: str

    @property
    def ok(self) -> bool:
        return self.status != "failed"


@dataclass
class InstallResult:
    partition: str
    version: str
    path: Path
    previous: str | None
    signalled: int | None          # daemon pid that got SIGHUP
    message: str
    reload: ReloadResult | None = None


# calibration.toml's keys: what perf-calibrate fit writes (calibrate.fitting.fit_platform), the
# required ones first.  Any other key is a typo (``gpu_name`` would skip the GPU-type check).
CALIBRATION_REQUIRED = ("gpu", "samples", "compute_mape")
CALIBRATION_KEYS = frozenset({*CALIBRATION_REQUIRED, "format", "name", "created", "samples_dir", "complete",
                              "device", "collective_mape", "plans", "environment"})


def calibration_problem(cal: dict[str, Any], where: "str | Path") -> str:
    """Why calibration.toml ``cal`` (read from ``where``) cannot be trusted: one line naming the file
    and the key, "" when it is sound."""
    unknown = sorted(k for k in cal if k not in CALIBRATION_KEYS)
    if unknown:
        # gpu_name: both of its words are keys; else the nearest key (sampels: samples)
        close = [k for k in unknown[0].split("_") if k in CALIBRATION_KEYS] or \
            difflib.get_close_matches(unknown[0], sorted(CALIBRATION_KEYS), n=1)
        return f"{where}: {unknown[0]}: unknown key" + \
            (f" (did you mean {' or '.join(repr(k) for k in close)}?)" if close else "")
    for key in CALIBRATION_REQUIRED:
        if key not in cal:
            return f"{where}: {key}: missing (calibration.toml needs {', '.join(CALIBRATION_REQUIRED)})"
    for key in ("gpu", "name", "created", "samples_dir", "device"):
        if key in cal and (not isinstance(cal[key], str) or (key == "gpu" and not cal[key].strip())):
            return f"{where}: {key} must be a {'non-empty ' if key == 'gpu' else ''}string, got {cal[key]!r}"
    for key in ("samples", "format"):
        v = cal.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return f"{where}: {key} must be a whole number >= 0, got {v!r}"
    for key in ("compute_mape", "collective_mape"):
        v = cal.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return f"{where}: {key} must be a finite number >= 0 (a fraction: 0.05 is 5 %), got {v!r}"
    if "complete" in cal and not isinstance(cal["complete"], bool):
        return f"{where}: complete must be true or false, got {cal['complete']!r}"
    plans = cal.get("plans", [])
    if not isinstance(plans, list) or not all(isinstance(x, str) for x in plans):
        return f"{where}: plans must be a list of plan names"
    if not isinstance(cal.get("environment", {}), dict):
        return f"{where}: environment must be a table"
    return ""


def _read_version(partition: str, path: Path, *, strict: bool = False) -> InstalledVersion:
    """The version in ``path`` as its calibration.toml describes it.  ``strict`` (a candidate):
    a bad calibration.toml is refused (:class:`InstallRefused`).  Otherwise (an installed version:
    status, rollback) it is read as far as it can be and the problem kept in ``problem``."""
    cal = read_calibration(path)
    cfile = path / CALIBRATION_FILE
    # {} from read_calibration: no file (a site overlay has none), or one that does not parse.
    problem = calibration_problem(cal, cfile) if cal else _calibration_read_problem(cfile)
    if problem and strict:
        raise InstallRefused(problem)
    if problem:
        log.warning("%s", problem)

    def num(key: str, default: Any) -> Any:
        v = cal.get(key, default)
        return v if not isinstance(v, bool) and isinstance(v, (int, float)) else default

    samples = num("samples", None)
    mape = num("compute_mape", math.nan)
    coll = num("collective_mape", None)
    # A count the file lacks or garbles is unknown (None), not 0; no calibration.toml at all (a
    # site overlay: no samples of its own) is 0.
    return InstalledVersion(partition, path.name, path, str(cal.get("created", "")),
                            int(samples) if isinstance(samples, int) and samples >= 0 else
                            None if cal or problem else 0,
                            float(mape) if math.isfinite(mape) and mape >= 0 else math.nan,
                            float(coll) if coll is not None and math.isfinite(coll) and coll >= 0 else None,
                            cal["gpu"] if isinstance(cal.get("gpu"), str) else "",
                            cal.get("complete") is True, problem)


def _calibration_read_problem(cfile: Path) -> str:
    """Why calibration.toml ``cfile`` cannot be read ("" when it is absent or reads)."""
    if not cfile.exists() and not cfile.is_symlink():
        return ""
    try:
        tomllib.loads(cfile.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"{cfile}: cannot read: {exc.strerror or exc}"
    except UnicodeDecodeError:
        return f"{cfile}: not UTF-8 text"
    except tomllib.TOMLDecodeError as exc:
        return f"{cfile}: not valid TOML: {exc}"
    return ""


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
    platform_dir = Path(platform_dir)
    if not (platform_dir / PLATFORM_FILE).is_file():
        raise InstallRefused(_not_a_platform_dir(platform_dir))
    try:
        load_platform(platform_dir, reload=True)
    except BundleError as exc:
        raise InstallRefused(f"{platform_dir}: does not load: {exc}") from None
    if overlay_of(platform_dir):
        # A site overlay of a shipped platform: the shipped models, the site's runs and factors.
        return _read_version("", platform_dir)
    cal = read_calibration(platform_dir)
    if not cal:
        raise InstallRefused(_calibration_read_problem(platform_dir / CALIBRATION_FILE) or
                             f"{platform_dir}: no calibration.toml (not fitted by perf-calibrate fit)")
    info = _read_version("", platform_dir, strict=True)
    if not info.complete and not allow_incomplete:
        raise InstallRefused(f"{platform_dir}: fitted from an incomplete calibration (killed or failed "
                             "run); not installed")
    if not math.isfinite(info.compute_mape):
        raise InstallRefused(f"{platform_dir}: no validation error recorded")
    return info


def _not_a_platform_dir(path: Path) -> str:
    """Why ``path`` is not a platform directory, in one line that says what to give instead."""
    if path.is_file() or (path.exists() and not path.is_dir()):
        # platform.toml itself (validate accepts it): the directory that holds it is the platform.
        hint = (f"give the directory that holds it: {path.parent}" if path.name in (PLATFORM_FILE, CALIBRATION_FILE)
                and (path.parent / PLATFORM_FILE).is_file() else
                f"give a platform directory, one with {PLATFORM_FILE} as perf-calibrate fit writes")
        return f"{path}: a file, not a platform directory ({hint})"
    if not path.exists():
        return f"{path}: no such platform directory"
    return f"{path}: not a platform directory (no {PLATFORM_FILE})"


@contextlib.contextmanager
def _partition_lock(pdir: Path) -> Iterator[None]:
    """One install or rollback of a partition at a time (so leftovers found are a dead one's)."""
    pdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(pdir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CalibrationError(f"{pdir}: another install or rollback of this partition is "
                                   "running") from None
        yield
    finally:
        os.close(fd)


def _prune_leftovers(pdir: Path) -> list[str]:
    """Remove what killed installs left: ``versions/.<version>.tmp`` and ``.<link>.tmp<pid>``."""
    removed = []
    versions = pdir / "versions"
    if versions.is_dir():
        for p in versions.iterdir():
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p.name)
    for p in pdir.glob(".*.tmp*"):
        if p.is_symlink():
            p.unlink(missing_ok=True)
            removed.append(p.name)
    if removed:
        log.info("removed leftovers of interrupted installs in %s: %s", pdir, ", ".join(sorted(removed)))
    return removed


def install_platform(platform_dir: "str | Path", partition: str, *, root: "str | Path | None" = None,
                     tolerance: float = DEFAULT_TOLERANCE, force: bool = False, tag: str = "",
                     keep: int = KEEP_VERSIONS, pid_file: "str | Path | None" = None) -> InstallResult:
    """Install a fitted platform as the partition's active one (see the module docstring).

    ``force`` skips the comparisons with the active platform (GPU type, validation error) but
    never the checks that the new platform loads.  Raises :class:`ReloadFailed` (after the
    switch) when the daemon could not be reloaded.

    A platform whose files are those of the active version, file for file, is not installed again
    (``perf-calibrate install`` of the same folder twice): nothing changes, and the result says
    ``already installed as version X``.  A ``tag`` asks for a version of that name all the same
    (``<stamp>-<tag>``: a caller that marks versions; the CLI never passes one).
    """
    src = Path(platform_dir)
    check_partition_name(partition)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) \
            or tolerance < 0:
        raise CalibrationError(f"tolerance must be a relative worsening of 0 or more (0.10: 10 % worse), "
                               f"not {tolerance!r}")
    base = platforms_root(root)
    new = validate_candidate(src, allow_incomplete=force)
    with _partition_lock(base / partition):
        res = _install_locked(src, partition, base, new, tolerance=tolerance, force=force, tag=tag,
                              keep=keep, pid_file=pid_file, skip_unchanged=not tag)
    return _reloaded(res, pid_file)


def _install_locked(src: Path, partition: str, base: Path, new: InstalledVersion, *,
                    tolerance: float, force: bool, tag: str, keep: int,
                    origin: str = "", prune_leftovers: bool = True,
                    pid_file: "str | Path | None" = None, skip_unchanged: bool = True) -> InstallResult:
    """Install ``src`` as a new version of ``partition`` under the partition's lock.  With
    ``skip_unchanged``, files identical to the active version's install nothing (:func:`_unchanged`)."""
    if prune_leftovers:       # a refit pruned them already, and src is its own staging folder
        _recover(base, partition, pid_file)
        _prune_leftovers(base / partition)
    # history.log names the source as it is on disk, not as the admin's working directory saw it.
    shown = _absolute(src)
    cur = current_version(base, partition)
    if cur is not None and not force:
        if cur.problem:
            # Its GPU type and error cannot be compared with: fix the file, or --force.
            _history(base, partition, f"refused {shown}: the active version's calibration.toml is bad")
            raise InstallRefused(f"{cur.problem}; the active version of {partition} cannot be compared "
                                 "with: not installed (fix that file, or use --force)")
        if cur.gpu and new.gpu and cur.gpu != new.gpu:
            msg = (f"{src}: calibrated on {new.gpu!r}, partition {partition} runs {cur.gpu!r}; "
                   "not installed (use --force if the partition's hardware changed)")
            _history(base, partition, f"refused {shown}: other GPU type")
            raise InstallRefused(msg)
        if math.isfinite(cur.compute_mape) and \
                new.compute_mape > cur.compute_mape * (1.0 + tolerance) + _ABS_SLACK:
            _history(base, partition, f"refused {shown}: validation {new.compute_mape:.4f} worse than "
                                      f"active {cur.version} {cur.compute_mape:.4f}")
            raise InstallRefused(
                f"{src}: validates worse than the active platform of {partition} "
                f"({100 * new.compute_mape:.2f} % vs {100 * cur.compute_mape:.2f} %, tolerance "
                f"{100 * tolerance:.0f} %); the active one stays (use --force to install anyway)")
    pdir = base / partition
    versions = pdir / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    version = _new_version_name(tag)
    dest = versions / version
    n = 1
    while dest.exists():
        n += 1
        dest = versions / f"{version}.{n}"
    tmp = versions / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(src, tmp, symlinks=False)
        # A platform fitted before manifests were pinned gets its pins now (it loaded above).
        pin_platform_bundles(tmp, only_missing=True)
        if skip_unchanged and cur is not None and _same_files(tmp, cur.path):
            # The active version already is this platform, file for file (pins included): a copy
            # would only push the version before it out of `previous` and out of the ones kept.
            shutil.rmtree(tmp, ignore_errors=True)
            return _unchanged(base, partition, cur, src, shown, origin)
        os.replace(tmp, dest)
        _fsync_dir(versions)
        load_platform(dest, reload=True)      # the copy loads too, before anything points at it
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
        if isinstance(exc, (OSError, BundleError)):
            raise InstallRefused(f"cannot install {src} into {versions}: {exc}") from None
        raise
    what = (f"compute MAPE {new.compute_mape:.4f}, {new.samples} samples" if math.isfinite(new.compute_mape)
            else f"site overlay of the shipped {overlay_of(dest)}" if overlay_of(dest) else "no validation error")
    # previous records what was active just before: the active version, or, when none was (the
    # shipped platform answered, or nothing), no link at all, which is how rollback knows to go
    # back to the shipped platform.  A link left from before a rollback must not survive: it
    # would make rollback skip the state this install replaced.
    reload = _commit_switch(base, partition, current=dest.name, previous=cur.path.name if cur is not None else "",
                            history=f"installed {dest.name} ({what}) {origin or f'from {shown}'}",
                            pid_file=pid_file)
    _prune(pdir, keep)
    msg = f"installed {dest.name} as the platform of partition {partition}"
    shipped = partition if cur is None and (SHIPPED_DIR / partition / PLATFORM_FILE).is_file() else ""
    if cur is not None:
        msg += f" (previous: {cur.version}, kept for rollback)"
    elif shipped:
        msg += f" (previous: the shipped platform {shipped}; `rollback` returns to it)"
    res = InstallResult(partition, dest.name, dest,
                        cur.version if cur else f"shipped {shipped}" if shipped else None, None, msg)
    res.reload = reload
    return res


def _new_version_name(tag: str) -> str:
    """``<UTC stamp>-<tag>``: the name a version installed now gets (``.2`` ... added on a clash)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_tag = re.sub(r"[^A-Za-z0-9._-]", "_", tag or os.environ.get("SLURM_JOB_ID", "") or str(os.getpid()))
    return f"{stamp}-{safe_tag}"


def _absolute(path: Path) -> Path:
    """``path`` absolute, links resolved (as it is if it cannot be resolved)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def _file_list(d: Path) -> list[tuple[str, int]]:
    """Every file and folder under ``d``: (path relative to ``d``, size; -1 for a folder), sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(d, followlinks=True):
        rel = os.path.relpath(dirpath, d)
        out.extend((os.path.normpath(os.path.join(rel, n)), -1) for n in dirnames)
        for n in filenames:
            out.append((os.path.normpath(os.path.join(rel, n)), os.stat(os.path.join(dirpath, n)).st_size))
    return sorted(out)


def _same_files(a: Path, b: Path) -> bool:
    """Whether folders ``a`` and ``b`` hold the same files with the same contents (sha256 of each;
    platform.toml pins the bundles' manifests, which pin their files)."""
    try:
        files = _file_list(a)
        if files != _file_list(b):
            return False
        return all(size < 0 or file_sha256(a / rel) == file_sha256(b / rel) for rel, size in files)
    except OSError:
        return False                       # unreadable: not known to be the same; install a copy


def _unchanged(base: Path, partition: str, cur: InstalledVersion, src: Path, shown: Path,
               origin: str) -> InstallResult:
    """The result of installing what the active version ``cur`` already is: nothing switched, no
    version added, perf-predictd not reloaded (it already predicts with these files)."""
    what = origin or f"install of {shown}"
    _history(base, partition, f"{what}: the same files as the active {cur.version}; nothing changed")
    prev = previous_version(base, partition)
    # (With an origin, src is a staging folder of validate or a refit: named by what made it.)
    msg = (f"already installed as version {cur.version} of partition {partition} (the same files: "
           f"{origin} changes nothing); nothing changed" if origin else
           f"{src} is already installed as version {cur.version} of partition {partition} (the same "
           "files); nothing changed")
    res = InstallResult(partition, cur.version, cur.path, prev.version if prev is not None else None, None, msg)
    res.reload = ReloadResult("unchanged", None, "nothing changed: perf-predictd not reloaded")
    return res


def _reloaded(res: InstallResult, pid_file: "str | Path | None") -> InstallResult:
    """Report the daemon's reload after a switch (done with the switch, :func:`_commit_switch`);
    a failure raises (the switch itself stays)."""
    reload = res.reload if res.reload is not None else reload_daemon(pid_file)
    res.reload = reload
    if not reload.ok:
        raise ReloadFailed(f"{res.message}, but perf-predictd was not reloaded: {reload.message}; "
                           f"it keeps predicting with the old platform until "
                           f"`systemctl reload perf-predictd` (or SIGHUP to it)")
    if reload.status == "not-running":
        log.warning("%s", reload.message)
    res.signalled = reload.pid if reload.status in ("signalled", "systemd") else None
    return res


def rollback(partition: str, *, root: "str | Path | None" = None,
             pid_file: "str | Path | None" = None) -> InstallResult:
    """Make ``previous`` current again (and the rolled-back version previous, so it can be undone)."""
    check_partition_name(partition)
    base = platforms_root(root)
    if not (base / partition).is_dir():
        raise CalibrationError(_nothing_installed(partition, base)
                               + did_you_mean(partition, _installed_partitions(base)))
    with _partition_lock(base / partition):
        res = _rollback_locked(partition, base, pid_file)
    return _reloaded(res, pid_file)


def _nothing_installed(name: str, base: Path) -> str:
    """Why ``rollback NAME`` finds nothing: NAME is a shipped platform's name (a refit's overlay
    is kept under it) that never had a version installed, or a partition with none."""
    if (SHIPPED_DIR / name / PLATFORM_FILE).is_file():
        return f"platform {name} has no installed version under {base} (it runs as shipped)"
    return f"partition {name} has no installed platform under {base}"


def _installed_partitions(base: Path) -> list[str]:
    """The partitions with a directory under ``base`` (for a misspelt name's did-you-mean)."""
    try:
        return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _rollback_locked(partition: str, base: Path, pid_file: "str | Path | None" = None) -> InstallResult:
    pdir = base / partition
    _recover(base, partition, pid_file)
    _prune_leftovers(pdir)
    cur = current_version(base, partition)
    prev = previous_version(base, partition)
    shipped = SHIPPED_DIR / partition if (SHIPPED_DIR / partition / PLATFORM_FILE).is_file() else None
    if cur is None and prev is None:
        raise CalibrationError(_nothing_installed(partition, base))
    if cur is not None and prev is not None and cur.path.resolve() == prev.path.resolve():
        raise CalibrationError(f"{partition}: nothing to roll back to: previous and current are both "
                               f"{cur.version}")
    if cur is not None and prev is None:
        if shipped is None:
            raise CalibrationError(f"{partition}: no previous platform to roll back to")
        # Installed while the shipped platform of this name answered (a site overlay of it, or a
        # calibration installed under its name): no previous link, back to the shipped platform.
        reload = _commit_switch(base, partition, current="", previous=cur.path.name,
                                history=f"rolled back from {cur.version} to the shipped platform {partition}",
                                pid_file=pid_file)
        res = InstallResult(partition, f"shipped {partition}", shipped, cur.version, None,
                            f"{partition}: rolled back to the shipped platform (from {cur.version}; "
                            "`rollback` again restores it)")
        res.reload = reload
        return res
    assert prev is not None
    try:
        load_platform(prev.path, reload=True)
    except BundleError as exc:
        raise CalibrationError(f"previous platform {prev.version} does not load any more: {exc}") from None
    was = cur.version if cur is not None else f"the shipped platform {partition}"
    reload = _commit_switch(base, partition, current=prev.path.name,
                            previous=cur.path.name if cur is not None else "",
                            history=f"rolled back from {was} to {prev.version}", pid_file=pid_file)
    res = InstallResult(partition, prev.version, prev.path, cur.version if cur else None, None,
                        f"{partition}: rolled back to {prev.version} (from {was})")
    res.reload = reload
    return res


# ---------------------------------------------------------------- the switch journal
# A switch changes up to two links (previous, then current), appends history and reloads the
# daemon.  It is written down first (JOURNAL, renamed into place), so that a kill at any point is
# finished by the next install, rollback or refit of the partition (:func:`_recover`): no
# previous = current, no switch without its history line and reload.
JOURNAL = "switch.journal"


def _write_journal(pdir: Path, data: dict[str, Any]) -> None:
    import json
    write_atomically(pdir / JOURNAL, json.dumps(data))


def _commit_switch(base: Path, partition: str, *, current: "str | None", previous: "str | None", history: str,
                   pid_file: "str | Path | None") -> ReloadResult:
    """Point ``current`` and ``previous`` at those versions (a name under versions/; "" removes the
    link, None leaves it), then history, then the daemon's reload, journalled."""
    pdir = base / partition
    data = {"current": current, "previous": previous, "history": history, "stage": "switch"}
    _write_journal(pdir, data)
    return _apply_journal(base, partition, data, pid_file)


def _apply_journal(base: Path, partition: str, data: dict[str, Any], pid_file: "str | Path | None") -> ReloadResult:
    pdir = base / partition
    if data.get("stage") == "switch":
        for link in ("previous", "current"):
            target = data.get(link)
            if target is None:
                continue
            if target == "":
                (pdir / link).unlink(missing_ok=True)
                _fsync_dir(pdir)
            else:
                _switch(pdir / link, pdir / "versions" / target)
        line = str(data.get("history", "switched"))
        # Replayed after a kill between the history line and the journal's update: once only.
        if not (data.get("replayed") and _last_history(pdir).startswith(line.removesuffix(_REPLAYED))):
            _history(base, partition, line)
        data = dict(data, stage="reload")
        _write_journal(pdir, data)
    res = reload_daemon(pid_file)
    (pdir / JOURNAL).unlink(missing_ok=True)
    _fsync_dir(pdir)
    return res


_REPLAYED = " (completed after an interrupted switch)"


def _last_history(pdir: Path) -> str:
    """The last line of history.log without its time stamp ("" when none)."""
    try:
        lines = (pdir / "history.log").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    return lines[-1].split(" ", 1)[1] if lines and " " in lines[-1] else ""


def _recover(base: Path, partition: str, pid_file: "str | Path | None") -> ReloadResult | None:
    """Finish a switch a killed install, rollback or refit left in the journal (None: none)."""
    import json
    pdir = base / partition
    path = pdir / JOURNAL
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable (%s); removed", path, exc)
        path.unlink(missing_ok=True)
        return None
    ok = isinstance(data, dict) and data.get("stage") in ("switch", "reload") and all(
        data.get(k) is None or (isinstance(data.get(k), str) and (data[k] == "" or (
            "/" not in data[k] and (pdir / "versions" / data[k] / PLATFORM_FILE).is_file())))
        for k in ("current", "previous"))
    if not ok:
        log.warning("%s: names no installed version; removed", path)
        path.unlink(missing_ok=True)
        return None
    data["history"] = f"{data.get('history', 'switched')}{_REPLAYED}"
    data["replayed"] = True
    log.warning("partition %s: completing a switch that was interrupted: %s", partition, data["history"])
    return _apply_journal(base, partition, data, pid_file)


def overlay_of(platform_dir: Path) -> str:
    """The shipped platform a site overlay sits on ("" for a platform of its own)."""
    return _platform_key(platform_dir, "overlay_of")


def _platform_key(platform_dir: Path, key: str) -> str:
    """A string key of ``platform_dir``'s platform.toml ("" when absent or unreadable)."""
    try:
        raw = tomllib.loads((platform_dir / PLATFORM_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return ""
    v = raw.get(key, "")
    return v if isinstance(v, str) else ""


def make_overlay(stage: Path, shipped: str, note: str) -> None:
    """A site overlay of shipped platform ``shipped`` with nothing learnt yet, in ``stage``."""
    from predictor.platform import write_platform
    base = load_platform(SHIPPED_DIR / shipped, reload=True)
    stage.mkdir(parents=True, exist_ok=True)
    write_platform(stage, {"name": shipped, "overlay_of": shipped,
                           "overlay_of_sha256": shipped_platform_sha256(shipped),
                           "description": f"{base.description} (site overlay)", "notes": [note]})


def version_order(version_dir: Path) -> tuple[str, int]:
    """Sort key of installed versions, oldest first: the UTC stamp their name starts with
    (``<stamp>-<tag>[.n]``, to the second), then, within one second, when the directory took its
    name (its ctime: the install's rename) -- the names alone would order those by tag, and ``.10``
    before ``.2``."""
    return version_dir.name.split("-", 1)[0], version_dir.stat().st_ctime_ns


def _prune(pdir: Path, keep: int) -> None:
    """Remove the oldest versions beyond ``keep``; never current or previous."""
    versions = pdir / "versions"
    protected = {t for t in (_link_target(pdir / "current"), _link_target(pdir / "previous")) if t}
    entries = sorted((p for p in versions.iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=version_order)
    excess = len(entries) - max(keep, 2)
    for p in entries:
        if excess <= 0:
            break
        if p.resolve() in protected:
            continue
        shutil.rmtree(p, ignore_errors=True)
        excess -= 1


def daemon_argv(pid: int) -> list[str] | None:
    """``/proc/PID/cmdline`` as a list (None: no such process)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else []


_PYTHON = re.compile(r"^python[0-9.]*$")
_PY_OPTS_WITH_ARG = {"-W", "-X", "-Q"}


def is_predictd(argv: list[str]) -> bool:
    """Whether a command line runs perf-predictd: its console script (``perf-predictd ...``, or
    ``python .../perf-predictd ...``) or ``python -m slurm_plugin.daemon``.  The program and the
    module are read from argv's positions, never searched for as substrings: a stale pid file
    must not make us signal some process that merely mentions perfcast."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == DAEMON_COMMAND:
        return True
    if not _PYTHON.match(os.path.basename(argv[0])):
        return False
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            return i + 1 < len(argv) and argv[i + 1] == DAEMON_MODULE
        if a.startswith("-m"):
            return a[2:] == DAEMON_MODULE
        if a in ("-c", "-", "--"):
            return a == "--" and i + 1 < len(argv) and os.path.basename(argv[i + 1]) == DAEMON_COMMAND
        if a.startswith("-"):
            i += 2 if a in _PY_OPTS_WITH_ARG else 1
            continue
        return os.path.basename(a) == DAEMON_COMMAND       # the script python runs
    return False


def _systemd_active() -> bool:
    if not os.path.isdir("/run/systemd/system") or not shutil.which("systemctl"):
        return False
    try:
        return subprocess.run(["systemctl", "is-active", "--quiet", SYSTEMD_UNIT],
                              timeout=10, capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _systemd_reload() -> ReloadResult:
    try:
        out = subprocess.run(["systemctl", "reload", SYSTEMD_UNIT], timeout=60, capture_output=True,
                             text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ReloadResult("failed", None, f"systemctl reload {SYSTEMD_UNIT}: {exc}")
    if out.returncode != 0:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        return ReloadResult("failed", None, f"systemctl reload {SYSTEMD_UNIT}: {why}")
    pid = None
    try:
        shown = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", SYSTEMD_UNIT],
                               timeout=10, capture_output=True, text=True).stdout.strip()
        pid = int(shown) or None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    log.info("perf-predictd reloads (systemctl reload %s)", SYSTEMD_UNIT)
    return ReloadResult("systemd", pid, f"systemctl reload {SYSTEMD_UNIT}")


def reload_daemon(pid_file: "str | Path | None" = None) -> ReloadResult:
    """Make the running perf-predictd reload its platforms (see the module docstring)."""
    named = Path(pid_file) if pid_file else (
        Path(os.environ["PERFCAST_DAEMON_PIDFILE"]) if os.environ.get("PERFCAST_DAEMON_PIDFILE") else None)
    path = named or DEFAULT_PIDFILE
    problem = ""
    try:
        pid: int | None = int(path.read_text(encoding="utf-8").split()[0])
    except FileNotFoundError:
        pid = None
        if named:
            problem = f"pid file {path} does not exist"
    except (OSError, ValueError, IndexError) as exc:
        pid = None
        problem = f"pid file {path} unreadable ({getattr(exc, 'strerror', None) or exc})"
    if pid is not None:
        argv = daemon_argv(pid)
        if argv is None:
            problem = f"pid {pid} from {path} is not running (stale pid file)"
        elif not is_predictd(argv):
            shown = " ".join(argv)[:80] or "?"
            problem = f"pid {pid} from {path} is not perf-predictd ({shown}); no signal sent"
        else:
            try:
                os.kill(pid, signal.SIGHUP)
            except OSError as exc:
                return ReloadResult("failed", pid, f"cannot signal perf-predictd (pid {pid}): "
                                                   f"{exc.strerror or exc}")
            log.info("sent SIGHUP to perf-predictd (pid %d)", pid)
            return ReloadResult("signalled", pid, f"SIGHUP sent to perf-predictd (pid {pid})")
    if _systemd_active():
        res = _systemd_reload()
        if res.ok and problem:
            log.warning("%s; reloaded through systemd instead", problem)
        return res
    if problem:
        return ReloadResult("failed", pid, problem)
    return ReloadResult("not-running", None,
                        f"perf-predictd is not running (no {path}): it loads the new platform when "
                        "it starts")


def signal_daemon(pid_file: "str | Path | None" = None) -> int | None:
    """SIGHUP perf-predictd through its pid file; its pid, or None when nothing was signalled
    (see :func:`reload_daemon`, which also says why)."""
    res = reload_daemon(pid_file)
    if not res.ok:
        log.warning("%s", res.message)
    return res.pid if res.status == "signalled" else None


@dataclass
class PartitionStatus:
    partition: str
    version: str | None
    age_days: float | None
    # "?" when the active calibration.toml has no sound count (a typo, a bad value): not a 0 that
    # looks measured; to_dict() gives None for it.
    samples: "int | str"
    compute_mape: float | None
    collective_mape: float | None
    gpu: str
    previous: str | None
    versions: int
    origin: str = "calibration"          # calibration | refit (perf-calibrate harvest --refit)
    refit: dict[str, Any] | None = None  # refit.toml of the active version: base, runs, LOO MAPE
    base: str = ""                       # a site overlay's shipped platform ("shipped NAME"; "" none)
    problem: str = ""                    # why the active version does not load ("" when it does)
    # The platform's name (its platform.toml's; an overlay's is the shipped platform's): ``partition``
    # is the directory's name, which for a site overlay is a platform's, not a partition's.
    platform: str = ""
    # What is wrong with the active version's calibration.toml ("" when sound): it still loads, but
    # its figures are not to be trusted and an install over it needs --force.
    calibration_problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["samples"] = self.samples if isinstance(self.samples, int) else None
        return d


def status_problems(rows: Sequence[PartitionStatus]) -> list[str]:
    """``partition: problem`` for each partition whose active version does not load (jobs get no
    prediction from it): what makes ``perf-calibrate status`` exit non-zero, for monitoring."""
    return [f"{r.partition}: {r.problem}" for r in rows if r.problem]


def read_refit(version_dir: Path) -> dict[str, Any] | None:
    """``refit.toml`` of a version directory (None: not made by a refit, or unreadable)."""
    try:
        data = tomllib.loads((version_dir / REFIT_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        log.warning("%s: unreadable (%s); shown as a calibration", version_dir / REFIT_FILE, exc)
        return None
    if not isinstance(data, dict):
        return None
    # Every harvested run's name is kept for the next refit's "nothing new" check, not for status.
    data.pop("harvested_runs", None)
    data.pop("harvested_runs_by_partition", None)
    return data


def status(root: "str | Path | None" = None) -> list[PartitionStatus]:
    """Every partition under the root: active version, age, samples and validation errors."""
    base = platforms_root(root)
    out: list[PartitionStatus] = []
    if base.exists() and not base.is_dir():
        # Not "no such directory yet": a file (a runs file given as --root, say) is no root at all.
        raise CalibrationError(f"{base}: not a directory (the platforms root{_root_origin(root)} is the "
                               "directory that holds one folder per partition)")
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
        refit = read_refit(cur.path) if cur is not None else None
        shipped = overlay_of(cur.path) if cur is not None else (
            pdir.name if (SHIPPED_DIR / pdir.name / PLATFORM_FILE).is_file() else "")
        # What `rollback` returns to: the previous link, else (a version installed while the
        # shipped platform of that name answered: no link) the shipped platform itself.
        previous = prev.version if prev else (
            f"shipped {pdir.name}" if cur is not None and (SHIPPED_DIR / pdir.name / PLATFORM_FILE).is_file()
            else None)
        out.append(PartitionStatus(
            pdir.name, cur.version if cur else None, age,
            (cur.samples if cur.samples is not None else "?") if cur else 0,
            cur.compute_mape if cur and math.isfinite(cur.compute_mape) else None,
            cur.collective_mape if cur else None, cur.gpu if cur else "",
            previous, nvers,
            "refit" if refit is not None else "shipped" if cur is None and shipped else "calibration",
            refit, f"shipped {shipped}" if shipped else "", _load_problem(cur.path) if cur else "",
            (_platform_key(cur.path, "name") if cur is not None else "") or shipped,
            cur.problem if cur is not None else ""))
    return out


def _root_origin(root: "str | Path | None") -> str:
    """Where the platforms root came from, for a message: `` (--root)``, `` ($PERFCAST_PLATFORMS)``."""
    if root:
        return " (--root)"
    return " ($PERFCAST_PLATFORMS)" if any(os.environ.get("PERFCAST_PLATFORMS", "").split(":")) else ""


def _load_problem(version_dir: Path) -> str:
    """Why the predictor (and perf-predictd) would refuse this version -- a bundle file changed on
    disk (checksum), a bad platform.toml -- or "" when it loads: status shows what jobs would get,
    not only what the files say."""
    from predictor.errors import PerfcastError
    from predictor.platform import load_platform
    try:
        load_platform(version_dir, reload=True)
    except PerfcastError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"{version_dir}: {exc}"
    return ""



def validate_as_new_version(name: str, runs: Sequence[MeasuredRun], *, root: "str | Path | None" = None,
                            fit: bool = False, replace: bool = False, pid_file: "str | Path | None" = None,
                            keep: int = KEEP_VERSIONS, dry_run: bool = False) -> tuple[Any, InstallResult | None]:
    """``perf-calibrate validate`` of a shipped platform or of an installed one (``<root>/<name>``):
    the runs (and, with ``fit``, the fitted terms) go into a copy of the active version (a new site
    overlay of a shipped platform with none installed), installed as a new version like any
    install -- never into the package's files, nor into an installed version in place, which no
    ``rollback`` could undo.  With ``fit``, nothing is installed unless the fit is written
    (leave-one-out improves).  (validate's summary, the install or None).

    ``dry_run``: nothing is written, locked or created; the summary's ``outcome`` says what the real
    run would do (install a new ``<stamp>-validate`` version, or nothing when the fit is declined)."""
    import dataclasses         # (its replace: the parameter ``replace`` hides the module's import)

    from .validate import validate_platform
    check_partition_name(name)
    base = platforms_root(root)
    if not (SHIPPED_DIR / name / PLATFORM_FILE).is_file() and current_version(base, name) is None:
        raise CalibrationError(f"{name} is neither a platform shipped with perfcast nor installed under {base}")
    if dry_run:
        return _validate_dry_run(name, runs, base, fit=fit, replace=replace), None
    pdir = base / name
    with _partition_lock(pdir):
        _recover(base, name, pid_file)
        _prune_leftovers(pdir)
        versions = pdir / "versions"
        versions.mkdir(parents=True, exist_ok=True)
        stage = versions / f".validate-{os.getpid()}.tmp"
        shutil.rmtree(stage, ignore_errors=True)
        cur = current_version(base, name)
        try:
            if cur is not None:
                shutil.copytree(cur.path, stage, symlinks=False)
            else:
                make_overlay(stage, name, "site overlay made by perf-calibrate validate")
            summary = validate_platform(stage, runs, replace=replace, fit=fit,
                                        fit_source=f"perf-calibrate validate --fit on {plural(len(runs), 'run')}")
            if fit and not (summary.fit is not None and summary.fit.written):
                # (recorded in the staging copy, which goes: nothing of it stays)
                return dataclasses.replace(summary, outcome="nothing installed (the fit was not written)"), None
            new = validate_candidate(stage, allow_incomplete=True)
            inst = _install_locked(stage, name, base, new, tolerance=DEFAULT_TOLERANCE, force=True,
                                   tag="validate", keep=keep, prune_leftovers=False, pid_file=pid_file,
                                   origin=f"perf-calibrate validate{' --fit' if fit else ''} of "
                                          f"{plural(len(runs), 'run')}")
        except OSError as exc:
            raise CalibrationError(f"cannot write a new version of {name} under {pdir}: {exc}") from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    summary = dataclasses.replace(summary, platform_file=inst.path / PLATFORM_FILE, outcome=inst.message)
    return summary, _reloaded(inst, pid_file)


def _validate_dry_run(name: str, runs: Sequence[MeasuredRun], base: Path, *, fit: bool, replace: bool) -> Any:
    """:func:`validate_as_new_version` with ``dry_run``: validated on the active version (a site
    overlay made in a temporary folder for a shipped platform with none installed), nothing written."""
    import dataclasses
    import tempfile

    from .validate import validate_platform
    cur = current_version(base, name)
    tmp = None
    try:
        if cur is not None:
            where = cur.path
        else:
            tmp = tempfile.TemporaryDirectory(prefix="perfcast-overlay-")
            where = Path(tmp.name)
            make_overlay(where, name, "dry run")
        summary = validate_platform(where, runs, replace=replace, fit=fit, dry_run=True,
                                    fit_source=f"perf-calibrate validate --fit on {plural(len(runs), 'run')}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    what = f"the site overlay of the shipped platform {name}" if cur is None or overlay_of(cur.path) else \
        f"installed platform {name}"
    if fit and (summary.fit is None or not summary.fit.improves):
        why = summary.fit.reason if summary.fit is not None and summary.fit.reason else "the fit would not be written"
        outcome = f"{what}: would install nothing ({why}) (dry run: nothing written)"
    else:
        prev = cur.version if cur is not None else f"the shipped platform {name}"
        outcome = (f"{what}: would install a new version ({_new_version_name('validate')}) under {base / name} "
                   f"holding {plural(len(summary.runs), 'run')}{' and the fitted factors' if fit else ''} "
                   f"(previous: {prev}, kept for rollback) (dry run: nothing written)")
    platform_file = (cur.path if cur is not None else SHIPPED_DIR / name) / PLATFORM_FILE
    return dataclasses.replace(summary, platform_file=platform_file, outcome=outcome)


# ------------------------------------------------------------------------------------- refit
@dataclass
class RefitResult:
    """What ``harvest --refit`` did for one partition."""

    partition: str
    status: str                    # installed | declined | skipped | failed | dry-run
    message: str                   # one line, for the admin
    runs: int = 0                  # harvested runs offered
    fit_runs: int = 0              # runs the fit used (the harvested + the platform's own)
    base_version: str | None = None
    version: str | None = None     # the version installed
    loo_mape_before: float | None = None
    loo_mape_after: float | None = None
    compute_scale: float | None = None
    host_scale: float | None = None
    network_scale: float | None = None
    reload: ReloadResult | None = None
    target: str = ""               # the directory under the platforms root written (platform name)
    kinds: list[dict[str, Any]] | None = None    # per kind: runs, MAPE before/after, factors ...
    report: str = ""               # the per-kind table
    # The factors the fit writes that are not 1 (fitted_factors): {"partition": {...}, "kinds": [...]}
    factors: dict[str, Any] | None = None
    config_error: bool = False     # failed because perfcast.toml is wrong (exit code 2, not 1)
    # The other partitions refitted with it: their platform is the same directory (refit_shared)
    shared_with: list[str] = field(default_factory=list)
    # The upper end (x the point) of a kind with no runs' interval, [before, after] (unseen_kind_upper)
    unseen_kind_upper: list[float] | None = None

    @property
    def ok(self) -> bool:
        """False when something is broken (a failed refit, a daemon that did not reload)."""
        return self.status != "failed" and (self.reload is None or self.reload.ok)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "reload"}
        d["reload"] = None if self.reload is None else {"status": self.reload.status, "pid": self.reload.pid,
                                                        "message": self.reload.message}
        return d


def _fit_runs(platform_validation: Sequence[MeasuredRun], harvested: Sequence[MeasuredRun]) -> list[MeasuredRun]:
    """The runs a refit fits on: the platform's own recorded runs (an admin's, ``validate``'s) that
    are not harvested ones, then the harvested runs (newest last), at most MAX_RUNS in all (the
    oldest harvested give way: [[validation]] holds no more)."""
    names = {r.name for r in harvested}
    kept = [r for r in platform_validation
            if not r.name.startswith(HARVESTED_RUN_PREFIX) and r.name not in names][:MAX_RUNS]
    room = MAX_RUNS - len(kept)
    return kept + (list(harvested)[-room:] if room > 0 else [])


def fitted_factors(fit: Any) -> dict[str, Any]:
    """The factors ``fit`` writes (``[fitted]``, each ``[[fitted_kind]]``) that are not 1 at three
    decimals: ``{"partition": {factor: value}, "kinds": [{"kind", "runs", "factors"}]}``.  The
    summary scales (compute, the host summary, network) leave out what moved a kind's predictions:
    its host per-layer, per-micro-batch and launch costs, its attention kernel."""
    from predictor.platform import FITTED_SCALES
    terms = fit.terms()

    def moved(pairs: Any) -> dict[str, float]:
        return {f: r for f, v in pairs if (r := round(float(v), 3)) != 1.0}
    return {"partition": moved((f, getattr(terms, f)) for f in FITTED_SCALES),
            "kinds": [{"kind": k.kind, "runs": k.runs, "factors": moved(k.scales)} for k in terms.kinds]}


def unseen_kind_upper(plat: Any) -> float:
    """The upper end, as a multiple of the point, of the interval a job of a kind with no runs gets
    on ``plat`` (before any operator spread): the platform's rule, widened to a per-kind fit's
    ``unseen_kind_bound`` (:meth:`predictor.interval.IntervalRule.for_platform`)."""
    from predictor.interval import IntervalRule
    return IntervalRule.for_platform(plat).factors[1]


def describe_unseen_kind_upper(pair: Any) -> str:
    """``unseen kinds' interval upper end ×1.52 -> ×2.90`` for a refit's [before, after] when they
    differ at two decimals ("" otherwise, or for a refit.toml without them)."""
    if not (isinstance(pair, list) and len(pair) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)):
        return ""
    before, after = (f"{v:.2f}" for v in pair)
    return f"unseen kinds' interval upper end ×{before} -> ×{after}" if before != after else ""


def count_of(n: Any, word: str) -> str:
    """``1 run``, ``1,204 runs`` (:func:`slurm_plugin.policy.plural`); a count a file lacks or
    garbles as it is (``? runs``)."""
    if isinstance(n, int) and not isinstance(n, bool):
        return plural(n, word)
    return f"{'?' if n is None else n} {word}s"


def describe_factors(factors: "dict[str, float] | Any") -> str:
    """``compute ×0.977, host per layer ×1.454`` ("every factor 1" when none moved)."""
    from .fitting.kinds import LABEL
    if not isinstance(factors, dict) or not factors:
        return "every factor 1"
    return ", ".join(f"{LABEL.get(f, f.removesuffix('_scale').replace('_', ' '))} ×{v:.3f}"
                     for f, v in factors.items() if isinstance(v, (int, float)))


def describe_fitted_factors(factors: Any, mapes: "dict[str, tuple[float, float]] | None" = None) -> str:
    """One line of :func:`fitted_factors` (as refit.toml keeps it too): the partition's, then each
    kind's, with the kind's MAPE before -> after (leave-one-out) when ``mapes`` has it."""
    if not isinstance(factors, dict):
        return ""
    parts = [f"partition {describe_factors(factors.get('partition'))}"]
    for k in factors.get("kinds") or []:
        if not isinstance(k, dict):
            continue
        m = (mapes or {}).get(str(k.get("kind")))
        mape = f", MAPE {100 * m[0]:.1f} % -> {100 * m[1]:.1f} %" if m else ""
        parts.append(f"kind {k.get('kind', '?')} ({count_of(k.get('runs'), 'run')}{mape}): "
                     f"{describe_factors(k.get('factors'))}")
    return "fitted factors: " + "; ".join(parts)


def _seen_runs(version_dir: Path, partition: str) -> frozenset[str] | None:
    """The harvested runs a refit of ``partition`` was given when it made ``version_dir``
    (``refit.toml``'s ``harvested_runs``, per partition in ``harvested_runs_by_partition`` for
    partitions refitted together; before that key, the platform's ``[fitted] runs``, which a run
    cap or another partition's refit may leave short); None when the version is no refit of
    ``partition``."""
    try:
        refit = tomllib.loads((version_dir / REFIT_FILE).read_text(encoding="utf-8"))
        shared = refit.get("partitions")
        if isinstance(shared, list):
            by_part = refit.get("harvested_runs_by_partition")
            runs = by_part.get(partition) if partition in shared and isinstance(by_part, dict) else None
            return frozenset(r for r in runs if isinstance(r, str)) if isinstance(runs, list) else None
        if refit.get("partition", partition) != partition:
            return None
        runs = refit.get("harvested_runs")
        if not isinstance(runs, list):
            fitted = tomllib.loads((version_dir / PLATFORM_FILE).read_text(encoding="utf-8")).get("fitted")
            runs = fitted.get("runs") if isinstance(fitted, dict) else None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    return frozenset(r for r in runs if isinstance(r, str)) if isinstance(runs, list) else None


def _rolled_back_refit(base: Path, target: str, partitions: Sequence[str], cur: "InstalledVersion | None"
                       ) -> tuple[str, dict[str, frozenset[str]], str] | None:
    """The newest refit of ``partitions`` (one, or those refitted together) installed for
    ``target`` when a rollback took it out of service: (its version, the harvested runs it was
    given per partition, the day of the rollback, "" when history.log does not say).  None when
    that refit is active, when a version newer than it is (installed since: a new base that a
    refit may build on), or when it was no refit of one of ``partitions``.  An
    install always makes its version current, so the newest refit being neither current nor
    older than current means an admin rolled it back; a refit of the same runs would quietly
    undo that at the next timer run."""
    try:
        refits = sorted((p for p in (base / target / "versions").iterdir()
                         if not p.name.startswith(".") and (p / REFIT_FILE).is_file()), key=version_order)
        if not refits:
            return None
        newest = refits[-1].name
        if cur is not None and version_order(cur.path) >= version_order(refits[-1]):
            return None
    except OSError:
        return None
    runs = {p: _seen_runs(base / target / "versions" / newest, p) for p in partitions}
    if any(r is None for r in runs.values()):
        return None
    day = ""
    try:
        for line in (base / target / "history.log").read_text(encoding="utf-8").splitlines():
            if f" rolled back from {newest} " in line:
                day = line.split(" ", 1)[0][:10]
    except OSError:
        pass
    return newest, {p: r for p, r in runs.items() if r is not None}, day


def refit_target(partition: str, base: Path, platform: "str | None" = None) -> tuple[str, str]:
    """(the directory under the platforms root a refit of ``partition`` writes, the shipped platform
    it overlays or "").  The partition's own installed platform first; else the platform
    perfcast.toml names for it (``platform``), installed or shipped -- given as a path, the installed
    platform under the root it leads to (:func:`platform_under_root`), and nothing for a path
    elsewhere; else a shipped platform of the partition's name.  ("", ""): nothing to refit."""
    if (base / partition / "current").is_symlink():
        return partition, ""
    if platform and "/" in platform:
        # A path (what `status` shows an admin): the platform under the root it leads to, if any.
        name = platform_under_root(platform, base)
        return (name, "") if name and (base / name / "current").is_symlink() else ("", "")
    for name in ([platform] if platform else []) + [partition]:
        if not name or not _NAME.match(name):
            continue
        if (base / name / "current").is_symlink():
            return name, ""
        if (SHIPPED_DIR / name / PLATFORM_FILE).is_file():
            return name, name
    return "", ""


def platform_under_root(path: str, base: Path) -> str:
    """The installed platform (``<base>/<name>``) that ``path`` names -- ``<base>/<name>/current``,
    ``<base>/<name>`` or one of its versions (``<base>/<name>/versions/<v>``), symbolic links
    followed -- else ""."""
    try:
        rel = Path(path).resolve().relative_to(base.resolve()).parts
    except (ValueError, OSError):
        return ""
    if rel and _NAME.match(rel[0]) and (rel[1:] in ((), ("current",)) or
                                        (len(rel) == 3 and rel[1] == "versions")):
        return rel[0]
    return ""


def _no_target(base: Path, platforms: Mapping[str, "str | None"], group: Sequence[str]) -> str:
    """Why partitions ``group`` have nothing to refit under ``base`` (:func:`refit_target` found none)."""
    paths = [(p, platforms[p]) for p in group if platforms.get(p) and "/" in str(platforms[p])]
    if paths:
        p, path = paths[0]
        under = platform_under_root(str(path), base)
        why = (f"{base / under} has no installed version (no `current`)" if under else
               f"which is not under the platforms root {base}: a refit installs new versions of a platform "
               "kept there (rollback, history), never rewrites a directory in place")
        return (f"perfcast.toml predicts partition {p} with the path {path}, {why}; not refitted (install it "
                f"with perf-calibrate install --partition {p}, or name an installed platform)")
    return (f"no platform installed for it under {base} and no shipped platform named for it "
            "(a refit makes a new version of the partition's platform; see perf-calibrate install)")


def refit_partition(partition: str, runs: Sequence[MeasuredRun], *, root: "str | Path | None" = None,
                    min_runs: int = DEFAULT_REFIT_MIN_RUNS, pid_file: "str | Path | None" = None,
                    dry_run: bool = False, keep: int = KEEP_VERSIONS, runs_file: str = "",
                    platform: "str | None" = None) -> RefitResult:
    """Fit the end-to-end terms of the platform ``partition`` is predicted with on its harvested
    ``runs`` and, when leave-one-out improves, install the result as a new version (see the module
    docstring).  ``platform``: the platform perfcast.toml names for the partition; a shipped one
    gets a site overlay (:func:`refit_target`).

    Never raises for a partition it cannot refit: the result says why (``skipped``: nothing to do;
    ``failed``: something is broken); only bad arguments raise :class:`CalibrationError`.  A
    declined or dry-run fit changes nothing on disk.
    """
    return refit_shared({partition: runs}, root=root, min_runs=min_runs, pid_file=pid_file, dry_run=dry_run,
                        keep=keep, runs_files={partition: runs_file}, platforms={partition: platform})[0]


def refit_shared(runs: Mapping[str, Sequence[MeasuredRun]], *, root: "str | Path | None" = None,
                 min_runs: int = DEFAULT_REFIT_MIN_RUNS, pid_file: "str | Path | None" = None,
                 dry_run: bool = False, keep: int = KEEP_VERSIONS,
                 runs_files: "Mapping[str, str] | None" = None,
                 platforms: "Mapping[str, str | None] | None" = None) -> list[RefitResult]:
    """:func:`refit_partition` of partitions whose refits write the same platform directory
    (:func:`refit_target`: ``gpu`` and ``gpu-long`` both on ``dgx-h100``, or ``gpu-long`` on
    partition ``gpu``'s installed platform): ``runs`` maps each to its harvested runs, the one to
    report under first.  One fit on all their runs (:func:`_pooled_runs`), one new version whose
    ``refit.toml`` keeps each partition's runs; "nothing new" and a rollback are judged on all of
    them (a new run of any one refits).  Refitted one by one, each partition's fit would replace
    the other's at every harvest.  One result per partition, in ``runs``' order: the first says
    it all, the others point to it.  With one partition, exactly :func:`refit_partition`."""
    from .validate import MIN_FIT_RUNS
    group = {check_partition_name(p): list(r) for p, r in runs.items()}
    if not group:
        raise CalibrationError("no partition to refit")
    if min_runs < MIN_FIT_RUNS:
        raise CalibrationError(f"a refit needs at least {MIN_FIT_RUNS} runs (leave-one-out fits on "
                               f"all but one), not {min_runs}")
    base = platforms_root(root)
    platforms = platforms or {}
    partition, *others = group
    pooled = _pooled_runs(group)
    res = RefitResult(partition, "skipped", "", runs=len(pooled), shared_with=others)
    if len(pooled) < min_runs:
        split = f" ({_per_partition(group)})" if len(group) > 1 else ""
        res.message = (f"{plural(len(pooled), 'harvested run')}{split}, a refit needs at "
                       f"least {min_runs}: not refitted")
        return _shared_results(res)
    targets = {refit_target(p, base, platforms.get(p)) for p in group}
    if len(targets) > 1:
        raise CalibrationError(f"partitions {', '.join(group)} are refitted into different platforms "
                               f"({', '.join(sorted(t for t, _ in targets))}): not one refit")
    target, shipped = targets.pop()
    if not target:
        # Before the lock, which would create the directory.
        res.message = _no_target(base, platforms, list(group))
        return _shared_results(res)
    res.target = target
    pdir = base / target
    files: Mapping[str, str] = runs_files or {}
    try:
        if dry_run:
            cur = None if shipped else current_version(base, target)
            if cur is None and not shipped:
                res.status, res.message = "failed", f"{pdir / 'current'} is not a platform directory"
                return _shared_results(res)
            return _shared_results(_refit(res, cur, group, pooled, base, dry_run=True, keep=keep,
                                          runs_files=files, shipped=shipped))
        with _partition_lock(pdir):
            _recover(base, target, pid_file)
            _prune_leftovers(pdir)
            cur = None if shipped else current_version(base, target)
            if cur is None and not shipped:
                res.status, res.message = "failed", f"{pdir / 'current'} is not a platform directory"
                return _shared_results(res)
            res = _refit(res, cur, group, pooled, base, dry_run=False, keep=keep, runs_files=files,
                         shipped=shipped, pid_file=pid_file)
    except CalibrationError as exc:            # another install running, a refused copy
        res.status, res.message = "failed", str(exc)
        return _shared_results(res)
    if res.status == "installed" and res.reload is not None:
        # Said as install and rollback say it: whether the daemon now predicts with the new version.
        if not res.reload.ok:
            res.message += (f", but perf-predictd was not reloaded: {res.reload.message}; it keeps "
                            "predicting with the old platform until `systemctl reload perf-predictd`")
        elif res.reload.status == "signalled":
            res.message += f"; perf-predictd (pid {res.reload.pid}) reloads"
        elif res.reload.status == "systemd":
            res.message += f"; perf-predictd reloads ({res.reload.message})"
        else:
            res.message += f"; {res.reload.message}"
            log.warning("%s", res.reload.message)
    return _shared_results(res)


def _per_partition(group: Mapping[str, Sequence[MeasuredRun]]) -> str:
    """``gpu 7, gpu-long 5``: each partition's harvested runs, for partitions refitted together
    ("" for one)."""
    return ", ".join(f"{p} {len(r)}" for p, r in group.items()) if len(group) > 1 else ""


def _pooled_runs(group: Mapping[str, Sequence[MeasuredRun]]) -> list[MeasuredRun]:
    """The runs of the partitions refitted together, each once, oldest first (job ids grow: the
    fit's cap drops the oldest).  Harvested names are ``slurm job <id>``, unique in a cluster, but a
    name in two partitions' runs files (ids counting again after slurmctld lost its state) is two
    jobs unless the runs are the same (one job moved to the other partition): each then gets its
    partition appended, so that neither replaces the other in the fit.  One partition: its runs."""
    if len(group) == 1:
        return list(next(iter(group.values())))
    from .validate import run_key
    owners: dict[str, list[tuple[str, MeasuredRun]]] = {}
    for p, runs in group.items():
        for r in runs:
            owners.setdefault(r.name, []).append((p, r))
    pooled = []
    for name, held in owners.items():
        first = held[0][1]
        if len({p for p, _ in held}) == 1 or all(
                run_key(r) == run_key(first) and math.isclose(r.measured_iteration_seconds,
                                                              first.measured_iteration_seconds, rel_tol=1e-9)
                for _, r in held):
            pooled.append(held[-1][1])
            continue
        for p, r in held:
            suffix = f" ({p})"
            pooled.append(replace(r, name=name[:200 - len(suffix)] + suffix))

    def job_id(r: MeasuredRun) -> int:
        m = re.match(rf"{HARVESTED_RUN_PREFIX}(\d+)", r.name)
        return int(m.group(1)) if m else -1
    return sorted(pooled, key=job_id)


def _shared_results(res: RefitResult) -> list[RefitResult]:
    """One result per partition refitted together: the first says it all, the others point to it."""
    if not res.shared_with:
        return [res]
    where = f"platform {res.target}" if res.target else "one platform"
    both = "both" if len(res.shared_with) == 1 else "all of them"
    lead = res.partition
    outcome = {"installed": f"installed {res.version}", "dry-run": "would install a refit (dry run: nothing "
               "written)", "declined": "nothing changed", "skipped": "not refitted"}.get(res.status, "failed")
    out = [res]
    for p in res.shared_with:
        others = [lead] + [o for o in res.shared_with if o != p]
        out.append(replace(res, partition=p, shared_with=others, message=(
            f"{where}, shared with {', '.join(others)} (one refit on the runs of {both}, reported under "
            f"{lead}): {outcome}")))
    res.message = f"{where}, shared with {', '.join(res.shared_with)} (one refit on the runs of {both}): " \
                  f"{res.message}"
    return out


def _refit(res: RefitResult, cur: "InstalledVersion | None", group: Mapping[str, Sequence[MeasuredRun]],
           runs: Sequence[MeasuredRun], base: Path, *, dry_run: bool, keep: int, runs_files: Mapping[str, str],
           shipped: str = "", pid_file: "str | Path | None" = None) -> RefitResult:
    """Refit for ``group`` (partition -> its harvested runs; one, or those sharing the platform)
    on ``runs`` (:func:`_pooled_runs` of them), under the target's lock unless ``dry_run``."""
    from predictor.samples import dump_toml

    from .validate import validate_platform
    partition = res.partition
    target = res.target or partition
    label = cur.version if cur is not None else f"the shipped platform {shipped}"
    res.base_version = cur.version if cur is not None else f"shipped {shipped}"
    try:
        plat = load_platform(cur.path if cur is not None else SHIPPED_DIR / shipped, reload=True)
    except BundleError as exc:
        res.status, res.message = "failed", f"the installed platform {label} does not load: {exc}"
        return res
    # Judged per partition on the names its runs file gives them: a new run of any one means refit
    # (a partition with no runs brings nothing new).
    names = {p: {r.name for r in rs} for p, rs in group.items() if rs}
    rolled = _rolled_back_refit(base, target, list(names), cur)
    if rolled is not None and all(n <= rolled[1][p] for p, n in names.items()):
        # An admin's rollback stands until jobs harvested after the rolled-back fit exist.
        version, _, day = rolled
        prev = previous_version(base, target)
        # rollback goes back to `previous` alone: name it only when that is the rolled-back refit
        back = (f"`perf-calibrate rollback {target}` restores it" if prev is not None and prev.path.name == version
                else f"it is kept in {base / target / 'versions' / version}; `perf-calibrate rollback "
                     f"{target}` returns to {prev.version if prev is not None else 'the shipped platform'}, not to it")
        res.message = (f"{version} was rolled back{f' on {day}' if day else ''}; no runs harvested since "
                       f"{version} was fitted: not refitting ({back})")
        return res
    fitted = frozenset(plat.fitted.runs) if plat.fitted is not None else None
    nothing_new = True
    for p, n in names.items():
        seen = _seen_runs(cur.path, p) if cur is not None else None
        seen = fitted if seen is None else seen
        nothing_new = nothing_new and seen is not None and n <= seen
    if nothing_new:
        res.message = (f"no runs harvested since {label} was fitted on them: not refitted")
        return res
    fit_runs = _fit_runs(plat.validation, runs)
    res.fit_runs = len(fit_runs)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    files = [f for f in (runs_files.get(p, "") for p in group) if f]
    who = (f"partition {partition}" if len(group) == 1
           else f"partitions {', '.join(group)} (one platform)")
    source = (f"perf-calibrate harvest --refit of {who} on {plural(len(runs), 'harvested run')}"
              + (f" ({', '.join(files)})" if files else ""))
    versions = base / target / "versions"
    # The copy is fitted beside the versions (same depth: bundle paths relative to a version
    # directory resolve alike); a killed refit leaves a .tmp folder the next install removes.
    # A shipped platform gets a site overlay: its runs and fitted terms only.
    stage = versions / f".refit-{os.getpid()}.tmp"
    tmp_dry = None
    try:
        if not dry_run:
            shutil.rmtree(stage, ignore_errors=True)
            if cur is not None:
                shutil.copytree(cur.path, stage, symlinks=False)
            else:
                make_overlay(stage, shipped, f"site overlay made by perf-calibrate harvest --refit of {who}")
        elif cur is None:
            import tempfile
            tmp_dry = tempfile.TemporaryDirectory(prefix="perfcast-overlay-")
            make_overlay(Path(tmp_dry.name), shipped, "dry run")
        where = stage if not dry_run else (cur.path if cur is not None else Path(tmp_dry.name))
        summary = validate_platform(where, fit_runs, replace=True, fit=True,
                                    dry_run=dry_run, fit_source=source)
        fit = summary.fit
        if fit is None:                    # validate_platform(fit=True) always fits
            raise CalibrationError("validate --fit returned no fit")
        res.loo_mape_before, res.loo_mape_after = fit.mape_before, fit.loo_mape_after
        res.compute_scale, res.host_scale = fit.compute_scale, fit.host_scale
        res.network_scale = fit.network_scale
        res.factors = fitted_factors(fit)
        # Every factor the fit writes that is not 1, the partition's and each kind's: the summary
        # scales alone (a host scale of 1 where the host factors moved) would hide why predictions moved.
        scores = (f"leave-one-out MAPE {100 * fit.mape_before:.2f} % -> {100 * fit.loo_mape_after:.2f} % "
                  f"on {plural(len(fit_runs), 'run')} ({len(runs)} harvested{': ' if len(group) > 1 else ''}"
                  f"{_per_partition(group)}); "
                  + describe_fitted_factors(res.factors, {k.kind: (k.mape_before, k.loo_mape_after)
                                                          for k in getattr(fit, "kinds", [])}))
        res.kinds = [k.to_dict() for k in getattr(fit, "kinds", [])]
        res.report = fit.report() if hasattr(fit, "report") else ""
        if not fit.improves:
            res.status = "declined"
            res.message = f"{scores}: no better than {label} as it is; nothing changed"
            return res
        # Intervals move without any factor (a per-kind fit widens a kind with no runs to the spread
        # across kinds): what a job of such a kind gets, before -> after, when it changes.
        after = load_platform(where, reload=True)
        if dry_run:                        # (nothing written: what would be)
            after = replace(after, validation=list(summary.runs), fitted=fit.terms())
        res.unseen_kind_upper = [round(unseen_kind_upper(plat), 4), round(unseen_kind_upper(after), 4)]
        unseen = describe_unseen_kind_upper(res.unseen_kind_upper)
        scores += f"; {unseen}" if unseen else ""
        if dry_run:
            res.status = "dry-run"
            res.message = f"{scores}: would install a refit of {label} (dry run: nothing written)"
            return res
        # Partitions refitted together: all of them, and each one's runs (what _seen_runs reads).
        who_toml: dict[str, Any] = {"partition": partition} if len(group) == 1 else {
            "partitions": list(group), "partition_runs": {p: len(rs) for p, rs in group.items()}}
        (stage / REFIT_FILE).write_text(
            "# This platform version was made by perf-calibrate harvest --refit (perf-calibrate status "
            "shows it).\n" + dump_toml({
                **who_toml, "base_version": res.base_version, "runs": len(runs),
                "kinds": len(getattr(fit, "kinds", [])),
                "fit_runs": len(fit_runs), "loo_mape_before": round(fit.mape_before, 6),
                "loo_mape_after": round(fit.loo_mape_after, 6),
                "compute_scale": round(fit.compute_scale, 4), "host_scale": round(fit.host_scale, 4),
                "network_scale": round(fit.network_scale, 4), "refitted_at": stamp,
                "runs_file": ", ".join(files),
                # what status lists: every written factor that is not 1, the partition's and per kind
                "factors": res.factors["partition"], "kind_factors": res.factors["kinds"],
                "unseen_kind_upper": res.unseen_kind_upper,
                # every harvested run it was given (the fit may keep fewer: MAX_RUNS): a later refit
                # with none besides these has nothing new to learn
                "harvested_runs": sorted({r.name for rs in group.values() for r in rs}),
                **({} if len(group) == 1 else {"harvested_runs_by_partition": {
                    p: sorted(r.name for r in rs) for p, rs in group.items()}})}), encoding="utf-8")
        new = validate_candidate(stage, allow_incomplete=True)
        # The regressors and calibration.toml are the active version's: the comparisons with it
        # (GPU type, validation error) hold trivially; leave-one-out decided above.
        inst = _install_locked(stage, target, base, new, tolerance=DEFAULT_TOLERANCE, force=False,
                               tag="refit", keep=keep, origin=f"refit of {label}: {scores}",
                               prune_leftovers=False, pid_file=pid_file)
        res.reload = inst.reload
    except PerfcastError as exc:           # a run the platform cannot predict, a refused copy, ...
        res.status, res.message = "failed", f"refit of {label}: {exc}"
        return res
    except OSError as exc:
        res.status, res.message = "failed", f"refit of {label}: {exc.filename or stage}: {exc.strerror or exc}"
        return res
    finally:
        if not dry_run:
            shutil.rmtree(stage, ignore_errors=True)
        if tmp_dry is not None:
            tmp_dry.cleanup()
    res.status, res.version = "installed", inst.version
    where = f" under {base / target}" if target != partition else ""
    res.message = f"{scores}: installed {inst.version}{where} (previous: {label}, kept for rollback)"
    log.info("partition %s: %s", partition, res.message)
    return res
