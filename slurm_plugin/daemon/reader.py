"""Reading files named by a batch script, as the submitting user, with hard bounds.

A child process drops to the user's uid, gid and supplementary groups before it opens the file
(subprocess does setgroups/setregid/setreuid in C between fork and exec, so no Python runs in the
forked child), so the kernel decides exactly as it would for the user, ACLs and root-squashed NFS
included.  Paths are made absolute against the job's work_dir and the child runs in ``/``: a
relative open from a directory root had entered would skip the user's search permission on that
directory's ancestors.

Bounds: ``max_bytes`` per file, ``MAX_FILES_PER_REQUEST`` files per request, and a timeout per
read that never outlives the request's deadline.  A child that does not exit once killed (stuck
in uninterruptible I/O on a hung file system: SIGKILL is only acted on when the system call
returns) is abandoned after a short grace: counted, logged and reaped later, never waited for.

Nothing read here is ever put in an answer or a log line (see :func:`engine.redact`).
"""
from __future__ import annotations

import errno
import logging
import os
import pwd
import signal
import subprocess
import time
from typing import Any, Optional

from .logs import log_event

MAX_FILES_PER_REQUEST = 16   # a script naming more configs than this is not a training launch
HEAD = "/usr/bin/head" if os.path.exists("/usr/bin/head") else "head"
REAP_GRACE_S = 0.05          # how long a killed child may take to go before it is abandoned
MAX_ABANDONED = 32           # that many stuck children: the file system hangs; stop starting more

# Children that did not exit when killed (per process: each worker has its own list).
_abandoned: list[subprocess.Popen] = []
abandoned_total = 0


class FileTooLarge(OSError):
    pass


def reap_abandoned() -> int:
    """Collect abandoned children that have exited since; returns how many are still stuck."""
    _abandoned[:] = [p for p in _abandoned if p.poll() is None]
    return len(_abandoned)


class UserFileReader:
    """``read_file`` for the launch parser: reads with the submitting user's rights, bounded.

    ``contents`` keeps what was read during this request (in this process only) so that the
    engine can make sure none of it reaches an answer.
    """

    def __init__(self, uid: int, gid: int, work_dir: str, *, max_bytes: int, timeout_s: float,
                 deadline: Optional[float] = None):
        self.uid, self.gid, self.work_dir = uid, gid, work_dir
        self.max_bytes, self.timeout_s, self.deadline = max_bytes, timeout_s, deadline
        self.reads = 0
        self.contents: list[bytes] = []

    def _groups(self) -> list[int]:
        try:
            name = pwd.getpwuid(self.uid).pw_name
            return sorted(set(os.getgrouplist(name, self.gid)))
        except (KeyError, OSError):
            return [self.gid]

    def _command(self, full: str) -> list[str]:
        return [HEAD, "-c", str(self.max_bytes + 1), "--", full]

    def _kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL the child (a test replaces this to play a child stuck in the kernel)."""
        try:
            proc.send_signal(signal.SIGKILL)
        except OSError:
            pass

    def __call__(self, path: str) -> bytes:
        if not isinstance(path, str) or not path or "\0" in path:
            raise FileNotFoundError(errno.ENOENT, "bad path")
        self.reads += 1
        if self.reads > MAX_FILES_PER_REQUEST:
            raise OSError(errno.EMFILE, "too many files named by one script")
        full = path if os.path.isabs(path) else os.path.join(self.work_dir, path)
        timeout = self.timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            raise TimeoutError(errno.ETIMEDOUT, "no time left to read files")
        if reap_abandoned() >= MAX_ABANDONED:
            # Earlier readers are still stuck: the file system hangs.  Starting more would only
            # pile up unkillable processes.
            raise TimeoutError(errno.ETIMEDOUT, "file system not answering")
        kwargs: dict[str, Any] = {}
        if os.geteuid() == 0:
            kwargs = {"user": self.uid, "group": self.gid, "extra_groups": self._groups()}
        elif self.uid != os.geteuid():
            # An unprivileged daemon cannot become somebody else; refusing is the only safe answer.
            raise PermissionError(errno.EACCES, "daemon cannot read files as that user")
        try:
            proc = subprocess.Popen(self._command(full), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
                                    close_fds=True, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                                    **kwargs)
        except OSError as exc:
            raise OSError(exc.errno, "cannot start reader") from None
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # A FIFO or a hung NFS mount: give up on the file, not on the worker.
            self._give_up(proc)
            raise TimeoutError(errno.ETIMEDOUT, "reading the file took too long") from None
        if proc.returncode != 0:
            text = err.decode("utf-8", "replace")
            if "Permission denied" in text:
                raise PermissionError(errno.EACCES, "Permission denied")
            if "No such file" in text or "Not a directory" in text:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory")
            if "Is a directory" in text:
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            raise OSError(errno.EIO, "cannot read file")
        if len(out) > self.max_bytes:
            raise FileTooLarge(errno.EFBIG, f"file larger than {self.max_bytes} bytes")
        self.contents.append(out)
        return out

    def _give_up(self, proc: subprocess.Popen) -> None:
        """Kill the child and wait a moment; if it is still there, abandon it (never block)."""
        global abandoned_total
        self._kill(proc)
        try:
            proc.wait(timeout=REAP_GRACE_S)
        except subprocess.TimeoutExpired:
            for pipe in (proc.stdout, proc.stderr):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:
                    pass
            _abandoned.append(proc)
            abandoned_total += 1
            log_event("reader_abandoned", level=logging.WARNING, reader_pid=proc.pid,
                      uid=self.uid, stuck=len(_abandoned), total=abandoned_total)
            return
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
