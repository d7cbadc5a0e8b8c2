"""A partition's runs file, ``<out>/<partition>.toml``: the one writer every process goes through.

``perf-calibrate harvest`` (finished jobs) and ``perf-calibrate watch`` (running jobs, every 5
minutes from a timer) both merge runs into the same file: read it, replace runs by name, write it
whole.  Two such read-modify-writes at once would lose one's rows, so every write holds an
advisory lock (``fcntl.flock`` on the sibling ``.<partition>.toml.lock``) from the read to the
rename; a writer waits for it at most :data:`LOCK_WAIT_S` and then says which file is held and by
whom, writing nothing.  The file is replaced whole (a temporary file in the same directory, synced,
``os.replace``, the directory synced), so a reader (``validate --runs``, a refit) that takes no
lock sees the old file or the new one, never half of one, even after a power cut.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

from predictor.errors import PerfcastError, RunRecordError
from predictor.validation import MAX_RUNS, MeasuredRun

# A write merges at most MAX_RUNS runs (a second or two of TOML); a harvest holds the lock once per
# partition, the watch once per job whose rate moved.  Thirty seconds is many such writes queued;
# longer means a writer hung (a stalled file system), and the caller's next pass tries again.
LOCK_WAIT_S = 30.0
_POLL_S = 0.05
PARTITION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


#: What an unreadable runs file's error adds (the harvest's refit says the same).
BAD_RUNS_FILE_HINT = "the partition's runs file, which the harvest and the watch write: fix it or move it aside"


class RunsFileError(PerfcastError):
    """A runs file cannot be read, locked or written (one line naming the file)."""


def runs_file(out_dir: "str | os.PathLike[str]", partition: str) -> Path:
    """``<out_dir>/<partition>.toml`` (a partition name that is not one is refused)."""
    if not PARTITION_RE.match(partition or ""):
        raise RunsFileError(f"bad partition name {partition!r} for a runs file")
    return Path(out_dir) / f"{partition}.toml"


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextmanager
def runs_lock(path: Path, wait_seconds: Optional[float] = None) -> Iterator[None]:
    """Hold the write lock of runs file ``path`` (waiting at most ``wait_seconds``, default
    :data:`LOCK_WAIT_S`)."""
    wait_seconds = LOCK_WAIT_S if wait_seconds is None else wait_seconds
    lock = lock_path(path)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise RunsFileError(f"{lock}: cannot open the write lock of {path}: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + max(0.0, wait_seconds)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunsFileError(f"{lock}: cannot lock: {exc.strerror or exc}") from None
                if time.monotonic() >= deadline:
                    holder = _holder(fd)
                    raise RunsFileError(
                        f"{lock}: held{f' by pid {holder}' if holder else ''} for more than {wait_seconds:g} s "
                        f"(another perf-calibrate harvest or watch writing {path}); nothing written, the "
                        "next run writes it") from None
                time.sleep(_POLL_S)
        # Who holds it, for the message of a writer that gave up waiting.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)            # closing the last descriptor releases the lock


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: synced temporary file, rename, synced directory.  The file
    keeps its mode (a new one gets 0666 less the umask)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if mode is None else 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def merge_runs(out_dir: "str | os.PathLike[str]", partition: str, runs: Sequence[MeasuredRun], *,
               dry_run: bool = False, wait_seconds: Optional[float] = None
               ) -> tuple[Path, int, int, list[MeasuredRun]]:
    """Merge ``runs`` into the partition's runs file by name (one run per job id, the newer wins),
    keeping the newest :data:`MAX_RUNS`: (file, runs added, runs in the file, the runs it holds
    afterwards -- or would, in a dry run, which neither locks nor writes)."""
    path = runs_file(out_dir, partition)
    if dry_run:
        return _merged(path, partition, runs)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunsFileError(f"{path.parent}: cannot create: {exc.strerror or exc}") from None
    with runs_lock(path, wait_seconds):
        out = _merged(path, partition, runs)
        from predictor.samples import dump_toml
        text = (f"# Measured runs of partition {partition}: finished jobs (perf-calibrate harvest) and running "
                "ones (perf-calibrate watch).\n# Input to: perf-calibrate validate PLATFORM --runs "
                f"{path} [--fit]\n\n" + dump_toml({"run": [r.to_dict() for r in out[3]]}))
        try:
            write_atomically(path, text)
        except OSError as exc:
            raise RunsFileError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return out


def _merged(path: Path, partition: str, runs: Sequence[MeasuredRun]
            ) -> tuple[Path, int, int, list[MeasuredRun]]:
    from .validate import load_runs
    existing: list[MeasuredRun] = []
    if path.exists():
        try:
            existing = load_runs(path)
        except RunRecordError as exc:
            raise RunsFileError(f"{exc} ({BAD_RUNS_FILE_HINT})") from None
    names = {r.name for r in runs}
    had = {e.name for e in existing}
    merged = ([r for r in existing if r.name not in names] + list(runs))[-MAX_RUNS:]
    return path, sum(1 for r in runs if r.name not in had), len(merged), merged


__all__ = ["LOCK_WAIT_S", "PARTITION_RE", "RunsFileError", "lock_path", "merge_runs", "runs_file", "runs_lock",
           "write_atomically"]
