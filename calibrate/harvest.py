"""``perf-calibrate harvest``: every finished job that perfcast predicted becomes a measured run.

For each job that ended (COMPLETED, TIMEOUT, FAILED, ...) and carries a perfcast record in its
AdminComment (``perfcast:v1 ... rec=<id>``):

1. **Accounting** says how it ended: ``sacct`` (``--json``, else ``-P``) where slurmdbd runs, else
   ``scontrol -o show job`` while slurmctld still knows the job (``MinJobAge``, 300 s by default).
2. **The record** (:mod:`slurm_plugin.records`, written by perf-predictd) says what was predicted,
   for which job, whose job it is and where its output goes.  It is the trusted side: the uid a
   log is read as comes from the record (the daemon took it from slurmctld), never from a log or
   from text a user controls (a job name, a working directory).
3. **The job's own output file** is read *as the job's user* (a child that drops to the user's
   uid, gid and groups before it opens the file, exactly as perf-predictd reads a script's config
   files), its last :data:`MAX_LOG_BYTES` only, within :data:`LOG_READ_TIMEOUT_S`; so is its stderr
   file when the job sent stderr apart (``--error``: scontrol's StdErr, else the record's, since
   sacct names neither file).  Steady-state iteration times come from :mod:`calibrate.joblogs`.

Each job's :class:`~slurm_plugin.records.JobOutcome` goes into the record store (the report reads
it); each job with a measured iteration time also becomes a ``[[run]]`` of its partition's runs
file (``<out>/<partition>.toml``, the format of ``perf-calibrate validate --runs``), de-duplicated
by job id and bounded to the newest :data:`predictor.validation.MAX_RUNS`.

With ``--refit`` (:func:`refit_partitions`), each partition's runs then refit the end-to-end terms
of the platform installed for it (:func:`calibrate.install.refit_partition`: ``validate --fit`` on
a copy, installed as a new version only when leave-one-out improves; ``rollback`` undoes it).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import errno
import json
import logging
import os
import pwd
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from predictor.errors import JobError, PerfcastError, RunRecordError
from predictor.job import TrainingJob
from predictor.platform import find_platform, search_roots
from predictor.validation import MeasuredRun
from slurm_plugin.policy import plural
from slurm_plugin.records import (RECORD_KEY, RECORD_TAG, JobOutcome, PredictionRecord, RecordStore,
                                  is_record_id, parse_admin_comment)
from slurm_plugin.slurm_client import SlurmClient, SlurmError, name_and_id, scontrol_job_lines

from .install import DEFAULT_REFIT_MIN_RUNS, RefitResult, platform_under_root, refit_partition, refit_target
from .joblogs import IterationTimes, best_log, iteration_times
from .runs_files import BAD_RUNS_FILE_HINT, PARTITION_RE, RunsFileError, merge_runs, runs_file

log = logging.getLogger(__name__)

DEFAULT_OUT = Path("/var/lib/perfcast/runs")
# Read at most the last 8 MiB of a job's output: ~20,000 Megatron log lines (~400 bytes each at
# log_interval 1), far more than a steady-state median needs, and bounded whatever the job wrote.
MAX_LOG_BYTES = 8 << 20
# A local disk reads 8 MiB in well under a second; a slow network file system in a few.  Past this
# the file is a FIFO, a device or a hung mount: give up on that job, not on the harvest.
LOG_READ_TIMEOUT_S = 10.0
# Logs are read this many at a time (each read is a child process as the job's user, mostly waiting
# on a file system), and all of a run's reads share a budget: one user's FIFOs or a hung mount cost
# the hourly harvest at most LOG_READ_TIMEOUT_S per slot, and a run at most LOG_BUDGET_S; jobs whose
# logs were not read in time are left for the next run (not stored, so not "harvested before").
LOG_READ_WORKERS = 8
LOG_BUDGET_S = 120.0
# SlurmClient's 30 s default is for interactive queries; a harvest is a batch task that may wait
# longer for a week of a busy cluster's accounting, and 4x that still bounds a hung slurmdbd.
SLURM_TIMEOUT_S = 120.0
# The harvest runs daily (docs/harvest.md); a week back covers missed days.  --since overrides.
DEFAULT_SINCE = "7d"
# States of a job that has ended (Slurm's job state codes); anything else is harvested later.
FINISHED = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY",
                      "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
# Slurm's NO_VAL / INFINITE markers in 32-bit fields (slurm_plugin.policy).
_NO_VAL32 = 0xFFFFFFFE
# Unlikely in any field and plain ASCII (sacct --delimiter takes characters): with AdminComment
# last, a delimiter inside a user-controlled field shows up as a wrong field count and the line is
# refused (see parse_sacct_parsable).
_DELIM = "|#pc#|"
_SACCT_FIELDS = ("JobIDRaw", "JobName", "Partition", "State", "ElapsedRaw", "TimelimitRaw", "Start",
                 "End", "NNodes", "ExitCode", "User", "UID", "WorkDir", "NodeList", "AdminComment")
TAIL = "/usr/bin/tail" if os.path.exists("/usr/bin/tail") else "tail"


class HarvestError(PerfcastError):
    """The harvest cannot run (no accounting source, a bad runs file); one line for the admin."""


class LogReadError(OSError):
    """A job's output file could not be read as its user (the reason is one line)."""


# --------------------------------------------------------------------------------------------
# accounting

@dataclass(frozen=True)
class AccountingJob:
    """One job as Slurm accounting (sacct) or slurmctld (scontrol) describes it."""

    job_id: int
    state: str
    partition: str = ""
    name: str = ""
    user: str = ""
    uid: Optional[int] = None
    elapsed_seconds: Optional[float] = None
    time_limit_seconds: Optional[float] = None     # None: unlimited or unknown
    start: Optional[float] = None                  # UNIX seconds
    end: Optional[float] = None
    nodes: Optional[int] = None
    exit_code: str = ""
    work_dir: str = ""
    std_out: str = ""                              # scontrol only (sacct 22.05 has no StdOut)
    std_err: str = ""                              # scontrol only; differs from std_out with --error
    node_list: str = ""
    batch_host: str = ""
    admin_comment: str = ""
    array_job_id: Optional[int] = None
    array_task_id: Optional[int] = None
    source: str = ""


def _int(v: Any) -> Optional[int]:
    """An integer from Slurm's answer: plain, a string, or 22.05+'s {"set","infinite","number"}."""
    if isinstance(v, Mapping):
        if v.get("infinite") or v.get("set") is False:
            return None
        v = v.get("number")
    if isinstance(v, bool):
        return None
    try:
        out = int(str(v).strip())
    except (TypeError, ValueError):
        return None
    return None if out < 0 or out >= _NO_VAL32 else out


def _state(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        v = v[0] if v else ""
    text = str(v or "").strip().split(" ")[0].rstrip("+").upper()
    return text


def _epoch(v: Any) -> Optional[float]:
    """UNIX seconds from an epoch number (JSON) or Slurm's local ISO time (``2024-05-01T10:00:01``)."""
    n = _int(v)
    if n is not None and not isinstance(v, str):
        return float(n) if n > 0 else None
    text = str(v or "").strip()
    if not text or text in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return float(n) if n else None


def duration_seconds(text: str) -> Optional[float]:
    """Slurm's ``[D-]HH:MM:SS`` / ``MM:SS`` / ``MM`` as seconds; None for UNLIMITED and the like."""
    text = (text or "").strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A", "", "(NULL)", "PARTITION_LIMIT"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        return None
    d, a, b, c = m.groups()
    if d is not None:
        h, mi, s = int(a), int(b or 0), int(c or 0)
        return float(((int(d) * 24 + h) * 60 + mi) * 60 + s)
    if c is not None:
        return float((int(a) * 60 + int(b)) * 60 + int(c))
    if b is not None:
        return float(int(a) * 60 + int(b))
    return float(int(a) * 60)


def parse_sacct_json(data: Mapping[str, Any]) -> list[AccountingJob]:
    """``sacct --json`` (openapi/dbv0.0.38 in Slurm 22.05; later versions' wrapped numbers too)."""
    out = []
    for j in data.get("jobs") or []:
        if not isinstance(j, Mapping):
            continue
        jid = _int(j.get("job_id"))
        if jid is None:
            continue
        t = j.get("time") if isinstance(j.get("time"), Mapping) else {}
        st = j.get("state") if isinstance(j.get("state"), Mapping) else {}
        ec = j.get("exit_code") if isinstance(j.get("exit_code"), Mapping) else {}
        rc = _int(ec.get("return_code"))
        sig = ec.get("signal") if isinstance(ec.get("signal"), Mapping) else {}
        comment = j.get("comment") if isinstance(j.get("comment"), Mapping) else {}
        arr = j.get("array") if isinstance(j.get("array"), Mapping) else {}
        limit = _int(t.get("limit"))
        elapsed = _int(t.get("elapsed"))
        out.append(AccountingJob(
            job_id=jid, state=_state(st.get("current")), partition=str(j.get("partition") or ""),
            name=str(j.get("name") or ""), user=str(j.get("user") or ""),
            elapsed_seconds=float(elapsed) if elapsed is not None else None,
            time_limit_seconds=60.0 * limit if limit is not None else None,
            start=_epoch(t.get("start")), end=_epoch(t.get("end")),
            nodes=_int(j.get("allocation_nodes")),
            exit_code=f"{rc if rc is not None else ''}:{_int(sig.get('signal_id')) or 0}",
            work_dir=str(j.get("working_directory") or ""), node_list=str(j.get("nodes") or ""),
            admin_comment=str(comment.get("administrator") or ""),
            array_job_id=_int(arr.get("job_id")) or None, array_task_id=_int(arr.get("task_id")),
            source="sacct"))
    return out


def parse_sacct_parsable(text: str, delimiter: str = _DELIM) -> list[AccountingJob]:
    """``sacct -P --delimiter=D -o`` :data:`_SACCT_FIELDS` lines; a line with the wrong number of
    fields (a delimiter or a newline inside a field a user controls) is refused, not guessed at."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(delimiter)
        if len(parts) != len(_SACCT_FIELDS):
            log.warning("sacct: skipped a line with %d fields (expected %d)", len(parts), len(_SACCT_FIELDS))
            continue
        f = dict(zip(_SACCT_FIELDS, parts))
        jid = _int(f["JobIDRaw"])
        if jid is None:
            continue
        limit = _int(f["TimelimitRaw"])
        elapsed = _int(f["ElapsedRaw"])
        out.append(AccountingJob(
            job_id=jid, state=_state(f["State"]), partition=f["Partition"], name=f["JobName"],
            user=f["User"], uid=_int(f["UID"]),
            elapsed_seconds=float(elapsed) if elapsed is not None else None,
            time_limit_seconds=60.0 * limit if limit is not None else None,
            start=_epoch(f["Start"]), end=_epoch(f["End"]), nodes=_int(f["NNodes"]),
            exit_code=f["ExitCode"], work_dir=f["WorkDir"], node_list=f["NodeList"],
            admin_comment=f["AdminComment"], source="sacct"))
    return out


def parse_scontrol_jobs(text: str, must_contain: str = "") -> list[AccountingJob]:
    """``scontrol -o show job`` (every job slurmctld still knows, one line each); with
    ``must_contain``, only the lines holding that text are parsed (and so returned)."""
    out = []
    keep = (lambda line: must_contain in line) if must_contain else None
    for jid, kv in scontrol_job_lines(text, keep=keep):
        user, uid = name_and_id(kv.get("UserId", ""))
        out.append(AccountingJob(
            job_id=jid, state=_state(kv.get("JobState")), partition=kv.get("Partition", ""),
            name=kv.get("JobName", ""), user=user, uid=uid,
            elapsed_seconds=duration_seconds(kv.get("RunTime", "")),
            time_limit_seconds=duration_seconds(kv.get("TimeLimit", "")),
            start=_epoch(kv.get("StartTime")), end=_epoch(kv.get("EndTime")),
            nodes=_int((kv.get("NumNodes") or "").split("-")[0]), exit_code=kv.get("ExitCode", ""),
            work_dir=kv.get("WorkDir", ""), std_out=kv.get("StdOut", ""), std_err=kv.get("StdErr", ""),
            node_list=kv.get("NodeList", ""), batch_host=kv.get("BatchHost", ""),
            admin_comment=kv.get("AdminComment", ""),
            array_job_id=_int(kv.get("ArrayJobId")), array_task_id=_int(kv.get("ArrayTaskId")),
            source="scontrol"))
    return out


class AccountingClient(SlurmClient):
    """:class:`~slurm_plugin.slurm_client.SlurmClient` plus the two listings a harvest needs."""

    def sacct_jobs(self, since: float, partition: Optional[str] = None) -> list[AccountingJob]:
        """Jobs of every user that were eligible or ran since ``since``: ``--json``, else ``-P``."""
        start = _dt.datetime.fromtimestamp(since).strftime("%Y-%m-%dT%H:%M:%S")
        base = ["sacct", "-a", "-X", "-S", start, "-E", "now"] + (["-r", partition] if partition else [])
        try:
            proc = self._cmd(base + ["--json"])
            data = json.loads(proc.stdout)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            errors = data.get("errors") or []
            if errors:
                raise SlurmError(f"sacct --json: {errors[0]}")
            return parse_sacct_json(data)
        except (ValueError, SlurmError) as exc:
            # A build without the JSON plugins, or one that prints a warning first: the plain form.
            log.info("sacct --json unusable (%s); using sacct -P", exc)
        proc = self._cmd(base + ["-n", "-P", f"--delimiter={_DELIM}", "-o", ",".join(_SACCT_FIELDS)])
        return parse_sacct_parsable(proc.stdout.decode("utf-8", "replace"))

    def scontrol_jobs(self) -> list[AccountingJob]:
        """The jobs slurmctld still knows that carry a perfcast record (the others, most of them on
        a busy controller, are not parsed: ~0.1 ms a line)."""
        proc = self._cmd(["scontrol", "-o", "show", "job"])
        return parse_scontrol_jobs(proc.stdout.decode("utf-8", "replace"), must_contain=RECORD_TAG)


def finished_jobs(client: AccountingClient, since: float, partition: Optional[str] = None,
                  source: str = "auto") -> tuple[list[AccountingJob], str]:
    """Ended jobs carrying a perfcast record, and which source answered (sacct or scontrol)."""
    jobs: Optional[list[AccountingJob]] = None
    used = ""
    if source in ("auto", "sacct"):
        try:
            jobs, used = client.sacct_jobs(since, partition), "sacct"
        except SlurmError as exc:
            if source == "sacct":
                raise HarvestError(f"sacct: {exc}") from None
            log.warning("no accounting (%s); using scontrol (jobs slurmctld still knows only)", exc)
    if jobs is None:
        try:
            jobs, used = client.scontrol_jobs(), "scontrol"
        except SlurmError as exc:
            # --source scontrol never asked sacct: only scontrol's answer is the reason.
            raise HarvestError(f"scontrol did not answer (--source scontrol): {exc}" if source == "scontrol" else
                               f"neither sacct nor scontrol answered: {exc}") from None
    out = []
    for j in jobs:
        if j.state not in FINISHED or RECORD_TAG not in j.admin_comment:
            continue
        if partition and j.partition != partition:
            continue
        if j.end is not None and j.end < since:
            continue
        out.append(j)
    return out, used


# --------------------------------------------------------------------------------------------
# the job's output file

_PATTERN = re.compile(r"%(\d{0,9})([%AaJjNnstux])")


def first_node(node_list: str) -> str:
    """The first host of a Slurm node list (``gpu[003-004,7],cpu1`` -> ``gpu003``)."""
    m = re.match(r"([^\[,]+)(?:\[(\d+))?", node_list or "")
    if not m or node_list in ("None assigned", "(null)"):
        return ""
    return m.group(1) + (m.group(2) or "")


def expand_output_pattern(pattern: str, job: AccountingJob) -> str:
    """Slurm's filename pattern (sbatch --output) for the batch step of ``job``.

    ``%j``/``%J`` job id, ``%A``/``%a`` array job and task ids, ``%x`` job name, ``%u`` user, ``%N``
    the batch host, ``%n``/``%t`` 0, ``%s`` batch, ``%%``; a number after ``%`` zero-pads numbers.
    A backslash anywhere turns expansion off (sbatch does the same).
    """
    if "\\" in pattern:
        return pattern.replace("\\", "")
    array_job = job.array_job_id or job.job_id
    values: dict[str, Any] = {
        "j": job.job_id, "J": job.job_id, "A": array_job,
        "a": job.array_task_id if job.array_task_id is not None else 4294967294,
        "x": job.name, "u": job.user, "N": job.batch_host or first_node(job.node_list),
        "n": 0, "t": 0, "s": "batch", "%": "%"}

    def sub(m: "re.Match[str]") -> str:
        width, c = m.groups()
        v = values[c]
        if isinstance(v, int) and width:
            return str(v).zfill(min(int(width), 10))
        return str(v)

    return _PATTERN.sub(sub, pattern)


def output_path(job: AccountingJob, record: PredictionRecord) -> Optional[str]:
    """The job's stdout file: scontrol's StdOut, else the record's --output (or Slurm's default
    ``slurm-%j.out``, ``slurm-%A_%a.out`` for arrays) in its working directory."""
    work_dir = record.work_dir or job.work_dir
    if job.std_out:
        raw = job.std_out
    elif record.std_out:
        raw = record.std_out
    else:
        raw = "slurm-%A_%a.out" if job.array_task_id is not None else "slurm-%j.out"
    path = expand_output_pattern(raw, job)
    if not os.path.isabs(path):
        if not work_dir or not os.path.isabs(work_dir):
            return None
        path = os.path.join(work_dir, path)
    return os.path.normpath(path)


def error_path(job: AccountingJob, record: PredictionRecord) -> Optional[str]:
    """The job's stderr file when it is not its stdout file (``#SBATCH --error``): scontrol's
    StdErr, else the record's ``--error`` (sacct of Slurm 22.05 has no StdErr: a job slurmctld has
    forgotten is known by its record alone), expanded and placed like :func:`output_path`; None when
    it is the stdout file, or neither names one (stderr then went to stdout)."""
    raw = job.std_err or record.std_err
    if not raw:
        return None
    # Exactly as stdout's is: the same patterns, relative to the same working directory.
    path = output_path(dataclasses.replace(job, std_out=raw), record)
    return None if path is None or path == output_path(job, record) else path


def log_paths(job: AccountingJob, record: PredictionRecord) -> list[tuple[str, str]]:
    """The files a job's iteration lines may be in, as ``(stream, path)``: its stdout (``StdOut``)
    and, when the job sent stderr elsewhere, that file (``StdErr``; a training log written through
    Python's logging goes there by default).  [] without an output path."""
    out = output_path(job, record)
    if out is None:
        return []
    err = error_path(job, record)
    return [("StdOut", out)] + ([("StdErr", err)] if err else [])


def _groups(uid: int, gid: int) -> list[int]:
    try:
        return sorted(set(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)))
    except (KeyError, OSError):
        return [gid]


def read_tail_as(path: str, uid: int, gid: Optional[int] = None, *, max_bytes: int = MAX_LOG_BYTES,
                 timeout_s: float = LOG_READ_TIMEOUT_S) -> bytes:
    """The last ``max_bytes`` of ``path``, read by a child running as ``uid``/``gid`` and that
    user's groups -- never as root.  ``subprocess`` drops the credentials (setgroups, setregid,
    setreuid) in C between fork and exec, so the kernel checks the open exactly as for the user:
    permissions, ACLs, root-squashed NFS.  Not root: only one's own files (anything else is refused).
    """
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        raise LogReadError(errno.EINVAL, "not an absolute path")
    if gid is None:
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            raise LogReadError(errno.EPERM, f"uid {uid} has no passwd entry (its primary group is unknown)") from None
    kwargs: dict[str, Any] = {}
    if os.geteuid() == 0:
        kwargs = {"user": uid, "group": gid, "extra_groups": _groups(uid, gid)}
    elif uid != os.geteuid():
        raise LogReadError(errno.EPERM, f"cannot read as uid {uid} without root (run the harvest as root: "
                           "it reads each job's output as that job's user)")
    try:
        proc = subprocess.run([TAIL, "-c", str(int(max_bytes)), "--", path], capture_output=True,
                              timeout=timeout_s, cwd="/", close_fds=True,
                              env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}, **kwargs)
    except subprocess.TimeoutExpired:
        raise LogReadError(errno.ETIMEDOUT, f"no answer within {timeout_s:g} s (a FIFO, a device or a "
                           "hung mount?)") from None
    except OSError as exc:
        raise LogReadError(exc.errno or errno.EIO, f"cannot start the reader: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace")
        for needle, code, why in (("Permission denied", errno.EACCES, "permission denied (as the job's user)"),
                                  ("No such file", errno.ENOENT, "no such file"),
                                  ("Not a directory", errno.ENOENT, "no such file"),
                                  ("Is a directory", errno.EISDIR, "a directory")):
            if needle in err:
                raise LogReadError(code, why)
        raise LogReadError(errno.EIO, "cannot read")
    return proc.stdout[-max_bytes:]


def _drop_partial_first_line(data: bytes, max_bytes: int) -> bytes:
    """A tail that was cut starts mid-line: drop that fragment."""
    if len(data) < max_bytes:
        return data
    nl = data.find(b"\n")
    return data[nl + 1:] if nl >= 0 else data


# --------------------------------------------------------------------------------------------
# the harvest

@dataclass(frozen=True)
class HarvestOptions:
    records: Path
    out_dir: Path = DEFAULT_OUT
    partition: Optional[str] = None
    since: float = 0.0                    # UNIX seconds; 0 = DEFAULT_SINCE before now
    source: str = "auto"                  # auto | sacct | scontrol
    rescan: bool = False                  # read jobs harvested before again
    dry_run: bool = False
    max_log_bytes: int = MAX_LOG_BYTES
    log_timeout_s: float = LOG_READ_TIMEOUT_S
    log_workers: int = LOG_READ_WORKERS       # logs read at once
    log_budget_s: float = LOG_BUDGET_S        # all of this run's log reads together
    refit: bool = False                   # then refit each partition's installed platform
    refit_min_runs: int = DEFAULT_REFIT_MIN_RUNS
    platforms_root: Optional[Path] = None     # None: calibrate.install.platforms_root()
    pid_file: Optional[Path] = None           # perf-predictd's, for the reload after a refit
    # partition -> the platform perfcast.toml predicts it with (None: not managed); unset: unknown
    site_platform: Optional[Callable[[str], Optional[str]]] = None
    site_path: str = ""                       # that perfcast.toml (named in errors about it)


@dataclass
class HarvestResult:
    source: str = ""
    outcomes: list[JobOutcome] = field(default_factory=list)
    runs_files: dict[str, tuple[Path, int, int]] = field(default_factory=dict)   # partition -> (file, added, total)
    skipped: list[tuple[int, str]] = field(default_factory=list)                 # (job id, why)
    refits: list[RefitResult] = field(default_factory=list)                      # with --refit
    users: dict[int, str] = field(default_factory=dict)      # job id -> user (accounting, else the record)
    errors: list[str] = field(default_factory=list)          # runs files that could not be written
    dry_run: bool = False                                    # --dry-run: the summary says so once

    @property
    def ok(self) -> bool:
        """False when a runs file was not written, a refit failed or the daemon did not reload after one."""
        return not self.errors and all(r.ok for r in self.refits)

    @property
    def exit_status(self) -> int:
        """2 when perfcast.toml is wrong for a partition refitted (the CLI's configuration-error
        code: the admin must fix the file), else 1 when anything failed, else 0."""
        if any(r.config_error for r in self.refits):
            return 2
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source,
                "jobs": [dict(o.to_dict(), user=self.users.get(o.slurm_job_id, "")) for o in self.outcomes],
                "runs_files": {p: {"path": str(f), "added": a, "total": t}
                               for p, (f, a, t) in self.runs_files.items()},
                "skipped": [{"job_id": j, "reason": r} for j, r in self.skipped],
                "refits": [r.to_dict() for r in self.refits], "errors": list(self.errors)}

    def summary(self) -> str:
        """One line per job harvested now and per job skipped for a reason worth reading; the
        jobs harvested on earlier runs (every hourly run sees its window's again) in one line."""
        measured = sum(1 for o in self.outcomes if o.measured_iteration_seconds is not None)
        lines = [f"harvested {plural(len(self.outcomes), 'finished perfcast job')} from {self.source or '-'} "
                 f"({measured} with iteration times from their logs)" + (f" {DRY_RUN_NOTE}" if self.dry_run else "")]
        for o in self.outcomes:
            it = (f"{o.measured_iteration_seconds:.4g} s/iter ({o.log_format}, {plural(o.log_samples, 'sample')})"
                  if o.measured_iteration_seconds is not None else f"no iteration time: {o.note}")
            user = self.users.get(o.slurm_job_id)
            lines.append(f"  job {o.slurm_job_id}{f' ({user})' if user else ''}: {o.state}, elapsed "
                         f"{o.elapsed_seconds or 0:.0f} s; {it}")
        for part, (f, added, total) in sorted(self.runs_files.items()):
            lines.append(f"runs of {part}: {f} (+{added}, {total} in all)")
        before = [jid for jid, why in self.skipped if why == HARVESTED_BEFORE]
        for jid, why in self.skipped:
            if why != HARVESTED_BEFORE:
                lines.append(f"  skipped job {jid}: {why}")
        if before:
            lines.append(f"{plural(len(before), 'job')} harvested before (--rescan reads them again)")
        for r in self.refits:
            # The first line already says a dry run wrote nothing (a dry-run refit says it too).
            msg = r.message.replace(f" {DRY_RUN_NOTE}", "") if self.dry_run else r.message
            lines.append(f"error: refit of {r.partition}: {msg}" if r.config_error else
                         f"refit of {r.partition}: {r.status}: {msg}")
        lines.extend(f"error: {e}" for e in self.errors)
        return "\n".join(lines)


HARVESTED_BEFORE = "harvested before (--rescan reads it again)"
DRY_RUN_NOTE = "(dry run: nothing written)"


def parse_since(text: Optional[str], now: Optional[float] = None) -> float:
    """``7d``, ``12h``, ``30m``, ``2w`` before now, or a date / local time (``2024-05-01[T10:00[:00]]``)."""
    now = time.time() if now is None else now
    text = (text or DEFAULT_SINCE).strip()
    m = re.fullmatch(r"(\d{1,6})\s*([mhdw])", text)
    if m:
        unit = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]
        return now - int(m.group(1)) * unit
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return _dt.datetime.strptime(text, fmt).timestamp()
        except ValueError:
            continue
    raise HarvestError(f"--since: {text!r} is not a duration (7d, 12h, 30m, 2w) or a date (YYYY-MM-DD[THH:MM[:SS]])")


def harvest(opts: HarvestOptions, client: Optional[AccountingClient] = None) -> HarvestResult:
    """Collect the finished perfcast jobs since ``opts.since`` (see the module docstring)."""
    if opts.partition is not None and not PARTITION_RE.match(opts.partition):
        raise HarvestError(f"--partition: bad partition name {opts.partition!r}")
    store = RecordStore(opts.records, create=False)
    store.count()                 # a missing or broken store says so before Slurm is asked anything
    since = opts.since or parse_since(None)
    client = client or AccountingClient(timeout=SLURM_TIMEOUT_S)
    jobs, used = finished_jobs(client, since, opts.partition, opts.source)
    res = HarvestResult(source=used, dry_run=opts.dry_run)
    new_runs: dict[str, list[MeasuredRun]] = {}
    merged: dict[str, list[MeasuredRun]] = {}
    matched: list[tuple[AccountingJob, PredictionRecord]] = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        record, why = _match(job, store, opts)
        if record is None:
            res.skipped.append((job.job_id, why))
        else:
            matched.append((job, record))
    timings = _measure_all(matched, opts)
    done: list[tuple[JobOutcome, Optional[str]]] = []
    for job, record in matched:
        got = timings.get(job.job_id)
        if got is None:
            res.skipped.append((job.job_id, f"log not read: this run's {opts.log_budget_s:.0f} s for reading "
                                             "logs was spent (the next harvest reads it)"))
            continue
        outcome, run = _outcome(job, record, *got)
        user = job.user or record.user
        if user:
            res.users[job.job_id] = user
        done.append((outcome, run[0] if run is not None else None))
        if run is not None:
            new_runs.setdefault(run[0], []).append(run[1])
    # Runs first, outcomes after: a job whose run could not be written (the file broken, or held
    # by another writer too long) is not stored as harvested, so the next harvest takes it again.
    unwritten: dict[str, str] = {}
    for part, runs in sorted(new_runs.items()):
        try:
            path, added, total, merged[part] = merge_runs(opts.out_dir, part, runs, dry_run=opts.dry_run)
        except RunsFileError as exc:
            unwritten[part] = str(exc)
            res.errors.append(f"runs of {part} not written: {exc}")
            continue
        res.runs_files[part] = (path, added, total)
    for outcome, part in done:
        if part in unwritten:
            res.skipped.append((outcome.slurm_job_id, f"its run was not written ({unwritten[part]}); the next "
                                                      "harvest takes it again"))
            continue
        res.outcomes.append(outcome)
        if not opts.dry_run:
            store.put_outcome(outcome)
    res.skipped.sort(key=lambda s: s[0])
    if opts.refit:
        res.refits = refit_partitions(opts, merged)
    return res


def _measure_all(matched: Sequence[tuple[AccountingJob, PredictionRecord]], opts: HarvestOptions
                 ) -> dict[int, tuple[Optional[IterationTimes], str]]:
    """Each job's log read and timed, ``opts.log_workers`` at a time, all within ``opts.log_budget_s``;
    the jobs missing from the answer were not read in time."""
    if not matched:
        return {}
    from concurrent.futures import ThreadPoolExecutor, wait
    pool = ThreadPoolExecutor(max_workers=max(1, min(opts.log_workers, len(matched))),
                              thread_name_prefix="harvest-log")
    try:
        futures = {pool.submit(_measure, job, record, opts): job.job_id for job, record in matched}
        done, _ = wait(futures, timeout=max(0.0, opts.log_budget_s))
        return {futures[f]: f.result() for f in done}
    finally:
        # Reads not started are dropped; one already running ends within its own timeout.
        pool.shutdown(wait=False, cancel_futures=True)


def refit_partitions(opts: HarvestOptions, harvested: Optional[Mapping[str, Sequence[MeasuredRun]]] = None
                     ) -> list[RefitResult]:
    """``--refit``: refit each partition that has harvested runs (``opts.partition`` only, if
    set) with :func:`calibrate.install.refit_partition`.  ``harvested``: runs files as this
    harvest left them (a dry run writes none), by partition; the others are read from disk.
    A partition that cannot be refitted is reported, never stops the others.

    Partitions whose refits write the same platform directory (``gpu`` and ``gpu-long`` both on
    ``dgx-h100``) are refitted together, once, on all their runs
    (:func:`calibrate.install.refit_shared`; one by one, each fit would replace the other's).
    With ``opts.partition``, the partitions sharing its platform come along (their runs files as
    on disk), each with its line."""
    from .install import platforms_root, refit_shared
    harvested = dict(harvested or {})
    on_disk = []
    if opts.out_dir.is_dir():
        on_disk = [f.stem for f in opts.out_dir.glob("*.toml") if PARTITION_RE.match(f.stem)]
    known = sorted(set(on_disk) | set(harvested))
    parts = [opts.partition] if opts.partition else known
    base = platforms_root(opts.platforms_root)
    # The running daemon's platform roots, read once for every partition's checks and notes.
    daemon = _daemon_platforms(opts.pid_file) if opts.site_platform is not None else None

    def platform_of(part: str) -> Optional[str]:
        return opts.site_platform(part) if opts.site_platform is not None else None

    targets: dict[str, str] = {}

    def target_of(part: str) -> str:
        """The directory its refit writes ("": none, or perfcast.toml is wrong for it)."""
        if part not in targets:
            targets[part] = "" if _site_platform_problem(opts, part, daemon) else \
                refit_target(part, base, platform_of(part))[0]
        return targets[part]

    if opts.partition and target_of(opts.partition):
        mine = target_of(opts.partition)
        parts += [p for p in known if p != opts.partition and target_of(p) == mine]
    done: dict[str, RefitResult] = {}
    ready: dict[str, tuple[Sequence[MeasuredRun], Path]] = {}
    for part in parts:
        problem = _site_platform_problem(opts, part, daemon)
        if problem:
            # perfcast.toml is wrong for it (a misspelt platform): an error, not a skip, so a timer
            # shows it; the other partitions are refitted regardless.
            done[part] = RefitResult(part, "failed", problem, config_error=True)
            continue
        path = runs_file(opts.out_dir, part)
        runs = harvested.get(part)
        if runs is None:
            if not path.exists():
                done[part] = RefitResult(part, "skipped", f"no harvested runs ({path} does not exist)")
                continue
            from .validate import load_runs
            try:
                runs = load_runs(path)
            except RunRecordError as exc:
                done[part] = RefitResult(part, "failed", f"{exc} ({BAD_RUNS_FILE_HINT})")
                continue
        ready[part] = (runs, path)
    # One refit per platform directory: partitions that share one go together (the first named leads).
    groups: dict[str, list[str]] = {}
    for part in parts:
        target = target_of(part) if part in ready or done[part].status == "failed" else ""
        groups.setdefault(target or f"/{part}", []).append(part)
    for target, members in groups.items():
        broken = [p for p in members if p in done and done[p].status == "failed"]
        fit = [p for p in members if p in ready]
        if broken and fit and len(members) > 1:
            # Without a partition's runs the shared fit would drop what the platform learnt from them.
            for p in fit:
                done[p] = RefitResult(p, "skipped", f"not refitted: platform {target} is shared with "
                                                   f"{', '.join(broken)}, whose refit failed (its line says why)",
                                      target=target, shared_with=[o for o in members if o != p])
            continue
        if len(fit) == 1:
            (part,) = fit
            runs, path = ready[part]
            done[part] = refit_partition(part, runs, root=opts.platforms_root, min_runs=opts.refit_min_runs,
                                         pid_file=opts.pid_file, dry_run=opts.dry_run, runs_file=str(path),
                                         platform=platform_of(part))
        elif fit:
            for res in refit_shared({p: ready[p][0] for p in fit}, root=opts.platforms_root,
                                    min_runs=opts.refit_min_runs, pid_file=opts.pid_file, dry_run=opts.dry_run,
                                    runs_files={p: str(ready[p][1]) for p in fit},
                                    platforms={p: platform_of(p) for p in fit}):
                done[res.partition] = res
    out = []
    for part in parts:
        res = done[part]
        if part in ready:
            if res.status == "installed" and res.target and res.target != part:
                # Kept under the platform's name, not the partition's: say which name undoes it.
                res.message += f"; `perf-calibrate rollback {res.target}` undoes it"
            note = _site_note(opts, part, res, daemon)
            if note:
                res.message += f"; {note}"
        out.append(res)
    return out


def _daemon_platforms(pid_file: Optional[Path]) -> Optional[tuple[int, Optional[str], str]]:
    """The running perf-predictd's (pid, $PERFCAST_PLATFORMS or None when unset, working
    directory), read from ``/proc/<pid>/environ`` through its pid file (``pid_file``,
    ``$PERFCAST_DAEMON_PIDFILE``, the packaged one); None when that cannot be known: no pid file,
    not perf-predictd, or not root nor the daemon's user (the kernel refuses another's environ)."""
    from . import install
    path = pid_file or (Path(os.environ["PERFCAST_DAEMON_PIDFILE"]) if os.environ.get("PERFCAST_DAEMON_PIDFILE")
                        else install.DEFAULT_PIDFILE)
    try:
        pid = int(Path(path).read_text(encoding="utf-8").split()[0])
        argv = install.daemon_argv(pid)
        if not argv or not install.is_predictd(argv):
            return None
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (OSError, ValueError, IndexError):
        return None
    env = None
    for item in raw.split(b"\0"):
        if item.startswith(b"PERFCAST_PLATFORMS="):
            env = item.split(b"=", 1)[1].decode("utf-8", "replace")
    return pid, env, cwd


def _site_platform_problem(opts: HarvestOptions, partition: str,
                           daemon: Optional[tuple[int, Optional[str], str]]) -> str:
    """One error line when the platform perfcast.toml names for ``partition`` is found nowhere: not
    by a lookup (``$PERFCAST_PLATFORMS``, the site root, the shipped platforms; the running
    daemon's own roots when they can be read), not under the refit's root, not as a path.  The
    daemon cannot predict the partition's jobs with it, and a refit has nothing to refit: a typo
    (``dgx-h10``) gets a did-you-mean.  "" when it resolves, or perfcast.toml is not known."""
    import predictor.platform as pp
    from predictor.errors import PlatformNotFound, did_you_mean

    from .install import _installed_partitions, platforms_root
    if opts.site_platform is None:
        return ""
    name = opts.site_platform(partition)
    if not name:
        return ""
    try:
        pp.resolve_platform(name)
        return ""
    except PlatformNotFound:
        pass
    where = opts.site_path or "perfcast.toml"
    base = platforms_root(opts.platforms_root)
    if "/" in name:
        under = platform_under_root(name, base)
        hint = f" (the active version of {base / under} is {base / under / 'current'})" \
            if under and (base / under / "current").is_symlink() else ""
        return f"{where}: partition {partition}'s platform {name!r} is not a platform directory{hint}; not refitted"
    if find_platform(name, [base]) is not None:
        return ""
    if daemon is not None and find_platform(name, search_roots(daemon[1], daemon[2])) is not None:
        return ""
    known = sorted({str(i["name"]) for i in pp.list_platforms()} | set(_installed_partitions(base)))
    return (f"{where}: partition {partition}'s platform {name!r} is neither installed under {base} nor "
            f"shipped with perfcast{did_you_mean(name, known)}; not refitted")


def _site_note(opts: HarvestOptions, partition: str, res: RefitResult,
               daemon: Optional[tuple[int, Optional[str], str]]) -> str:
    """A note when perf-predictd does not predict ``partition`` with the platform the refit updates
    (``<root>/<target>/current``, the partition's own installed platform or the site overlay of the
    shipped one perfcast.toml names): a refit the daemon never loads would mislead the admin.  In
    a dry run the overlay's ``current`` does not exist yet: what the lookup would find once it
    does decides.  Only what is true is said ("" when the daemon loads the refitted platform).

    A platform named by name is looked up in the daemon's ``$PERFCAST_PLATFORMS``, which need not
    be this shell's (systemd and the dev cluster start it with their own environment).  When the
    daemon's environment can be read (root, its pid file), it decides; else, when ``--root`` is
    not this shell's platforms root, the note says what the daemon must be started with instead of
    guessing which platform it uses; else this shell's lookup stands in for the daemon's."""
    from predictor.errors import PlatformNotFound
    from predictor.platform import SITE_ROOT, resolve_platform

    from .install import platforms_root
    if opts.site_platform is None or res.status == "failed":
        return ""
    name = opts.site_platform(partition)
    if name is None:
        return "note: perfcast.toml does not manage this partition"
    base = platforms_root(opts.platforms_root)
    target = res.target or refit_target(partition, base, name)[0]
    refitted = base / target / "current" if target else None
    if refitted is None:
        return ""
    by_name = "/" not in name
    if by_name and daemon is not None:
        pid, env, cwd = daemon
        roots = search_roots(env, cwd)
        found = find_platform(name, roots, refitted)
        if found is not None and found.resolve() == refitted.resolve():
            return ""
        setting = f"PERFCAST_PLATFORMS={env}" if env is not None else "no PERFCAST_PLATFORMS"
        reach = find_platform(target, roots, refitted)
        advice = (f"perfcast.toml: platform = \"{target}\" would use the refitted one"
                  if reach is not None and reach.resolve() == refitted.resolve() else
                  f"it uses the refitted one once started with PERFCAST_PLATFORMS={base}"
                  + (f" and perfcast.toml says platform = \"{target}\"" if target != name else ""))
        return (f"note: perf-predictd (pid {pid}, {setting}) predicts it with {name!r} "
                f"({found if found is not None else 'not found'}), not with {refitted}; {advice}")
    shell_base = platforms_root(None)
    if by_name and opts.platforms_root is not None and _resolved(base) != _resolved(shell_base):
        default = (f" (or with none: {base} is its default root)"
                   if target == name and _resolved(base) == _resolved(SITE_ROOT) else "")
        return (f"note: perf-predictd uses {refitted} only if it runs with PERFCAST_PLATFORMS={base}{default}"
                + (f" and perfcast.toml says platform = \"{target}\"" if target != name else "")
                + f"; --root is not this shell's platforms root ({shell_base}), and the daemon's "
                  "environment is its own (its unit's, the dev cluster's PERFCAST_DEV_PLATFORMS)")
    try:
        used = resolve_platform(name, pending=refitted)
    except PlatformNotFound:
        return f"note: perfcast.toml names platform {name!r} for it, which does not resolve"
    if used.resolve() == refitted.resolve():
        return ""
    try:
        reached = resolve_platform(target, pending=refitted).resolve() == refitted.resolve()
    except PlatformNotFound:
        reached = False
    advice = (f"perfcast.toml: platform = \"{target}\" would use the refitted one" if reached else
              f"perf-predictd's lookup of {target!r} ($PERFCAST_PLATFORMS, {SITE_ROOT}, then the shipped "
              f"platforms) does not reach {refitted}")
    return f"note: perf-predictd predicts it with {name!r} ({used}), not with {refitted}; {advice}"


def _resolved(p: Path) -> Path:
    try:
        return p.resolve()
    except OSError:
        return p


# --------------------------------------------------------------------------------------------
# partition names an admin types (harvest --partition, report PARTITION, rollback)

def _did_you_mean(name: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _has_data(partition: str, store: Optional[RecordStore], runs_dir: Optional[Path]) -> bool:
    """Whether perfcast kept a record for ``partition`` or a runs file of it exists."""
    if runs_dir is not None and runs_file(runs_dir, partition).exists():
        return True
    return store is not None and bool(store.find(partition=partition, limit=1))


def check_partition(partition: str, site: Any, *, store: Optional[RecordStore] = None,
                    runs_dir: "Optional[Path]" = None, what: str = "--partition",
                    verbs: Sequence[str] = ()) -> str:
    """Check a partition name an admin typed (``harvest --partition``, ``report PARTITION``) against
    the site config ``site`` (a :class:`~slurm_plugin.siteconfig.SiteConfig`, or None when there is
    none) and what perfcast kept (records in ``store``, a runs file under ``runs_dir``).

    Returns "" when the partition is one perfcast manages, or a one-line warning when it may be
    right: a partition perfcast.toml no longer manages but has records or a runs file (harvested
    anyway: they are real jobs perfcast predicted), one no record names under ``[defaults] platform``
    (which manages every partition) or without a site config.  Raises :class:`HarvestError` (one
    line: the configured partitions, a did-you-mean) for a partition perfcast.toml does not manage
    and nothing was ever kept for: a harvest or report of it can only be empty.  ``verbs``: commands
    a misplaced word might have been meant as (``report wacth``)."""
    if not PARTITION_RE.match(partition or ""):
        raise HarvestError(f"{what}: bad partition name {partition!r}")
    configured = sorted(site.partitions) if site is not None else []
    if partition in configured:
        return ""
    known = _has_data(partition, store, runs_dir)
    listed = f"configured: {', '.join(configured)}" if configured else "none configured"
    guess = _did_you_mean(partition, configured)
    verb = difflib.get_close_matches(partition, list(verbs), n=1)
    if verb and not guess:
        guess = f"; did you mean `perf-calibrate {verb[0]}`?"
    if site is None:
        return "" if known else (f"{what} {partition}: no perfcast record names it (no site config "
                                 "to check it against)")
    if site.defaults.platform:
        return "" if known else (f"{what} {partition}: no perfcast record names it ({site.path} manages "
                                 f"every partition through [defaults] platform; {listed}){guess}")
    if known:
        return (f"{what} {partition}: {site.path} does not manage partition {partition} ({listed}); "
                "using what perfcast kept for it before")
    raise HarvestError(f"{what} {partition}: not a partition {site.path} manages, and no perfcast record "
                       f"names it ({listed}){guess}")


def rollback_hint(name: str, site: Any, root: "str | Path | None" = None) -> str:
    """For ``perf-calibrate rollback NAME`` / ``status`` given a partition where the platforms root
    keeps a platform's name: installed platforms, and refit site overlays (``<root>/dgx-h100``), are
    kept under the name perfcast.toml gives them.  When ``<root>/NAME`` does not exist but ``site``
    (a SiteConfig, or None) predicts partition NAME with a platform that has a directory there,
    one line naming it (``partition h100 is predicted with platform dgx-h100 (perfcast.toml): run
    perf-calibrate rollback dgx-h100``); else ""."""
    from .install import platforms_root
    base = platforms_root(root)
    if site is None or not PARTITION_RE.match(name or "") or (base / name).is_dir():
        return ""
    pol = site.partition(name)
    platform = pol.platform if pol is not None else ""
    if not platform:
        return ""
    if (base / platform).is_dir() and PARTITION_RE.match(platform):
        where = platform
    else:
        # A path (platform = "/var/lib/perfcast/platforms/gpu/current"): its directory under the root.
        try:
            rel = Path(platform).resolve().relative_to(base.resolve())
        except (ValueError, OSError):
            return ""
        where = rel.parts[0] if rel.parts and (base / rel.parts[0]).is_dir() else ""
        if not where or where == name:
            return ""
    return (f"partition {name} is predicted with platform {platform} ({site.path}), kept under "
            f"{base / where}: perf-calibrate rollback {where}")


def _match(job: AccountingJob, store: RecordStore, opts: HarvestOptions
           ) -> tuple[Optional[PredictionRecord], str]:
    """The job's record, or None and why the job is skipped."""
    fields_ = parse_admin_comment(job.admin_comment)
    rid = fields_.get(RECORD_KEY, "")
    record: Optional[PredictionRecord] = None
    if is_record_id(rid):
        record = store.get(rid)
        if record is None:
            return None, f"record {rid} is not in {store.path} (pruned, or another controller's)"
    else:
        found = store.find(slurm_job_id=job.job_id, limit=2)
        if len(found) != 1:
            return None, "its AdminComment record has no rec= id (predicted before records were kept)"
        record = found[0]
    if record.slurm_job_id is not None and record.slurm_job_id != job.job_id:
        return None, f"record {record.record_id} belongs to job {record.slurm_job_id}"
    if record.uid is not None and job.uid is not None and record.uid != job.uid:
        return None, f"record {record.record_id} is uid {record.uid}'s, the job is uid {job.uid}'s"
    if record.user and job.user and job.uid is None and record.user != job.user:
        return None, f"record {record.record_id} is {record.user}'s, the job is {job.user}'s"
    if job.partition and record.partition and job.partition != record.partition:
        return None, f"ran in {job.partition}, predicted for {record.partition}"
    if not opts.rescan:
        prev = store.outcome(record.record_id)
        if prev is not None and prev.slurm_job_id == job.job_id:
            return None, HARVESTED_BEFORE

    return record, ""


def _outcome(job: AccountingJob, record: PredictionRecord, timing: Optional[IterationTimes], note: str
             ) -> tuple[JobOutcome, Optional[tuple[str, MeasuredRun]]]:
    """The job's outcome and, with a measured iteration time, its run for the partition's runs file."""
    measured = timing.median_seconds if timing is not None else None
    if measured is not None and job.elapsed_seconds:
        # At least half the steady samples are >= their median, so median x iterations spanned is
        # at most twice the time those iterations took, which cannot exceed the job's wall time.
        span = timing.iterations_spanned
        if measured > job.elapsed_seconds or (span and measured * span > 2.0 * job.elapsed_seconds):
            note = (f"log claims {measured:.4g} s/iter over {span or 1} iterations, more than the job's "
                    f"{job.elapsed_seconds:.0f} s: not this job's log")
            measured = None
    outcome = JobOutcome(
        record_id=record.record_id, slurm_job_id=job.job_id, state=job.state,
        elapsed_seconds=job.elapsed_seconds, time_limit_seconds=job.time_limit_seconds,
        start=job.start, end=job.end, nodes=job.nodes, exit_code=job.exit_code,
        measured_iteration_seconds=measured,
        log_format=timing.format if timing is not None else "",
        log_samples=len(timing.steady) if timing is not None else 0,
        note=note[:500], source=job.source)
    if measured is None:
        return outcome, None
    try:
        tj = TrainingJob.from_dict(record.job)
    except JobError as exc:
        return dataclasses.replace(outcome, note=f"record's job unusable: {exc}"[:500]), None
    run = MeasuredRun(
        name=f"slurm job {job.job_id}", job=tj, measured_iteration_seconds=measured,
        predicted_iteration_seconds=record.iteration_seconds if record.iteration_seconds > 0 else 0.0,
        source=(f"perf-calibrate harvest: partition {record.partition}, record {record.record_id}, "
                f"{job.state} after {job.elapsed_seconds or 0:.0f} s, {timing.format} log"
                f"{' ' + timing.note if timing.note.startswith('from its StdErr') else ''}, "
                f"median of {len(timing.steady)} steady-state samples, platform {record.platform} "
                f"bundle {record.bundle}" + (f", user {job.user or record.user}" if job.user or record.user else ""))[:1000])
    return outcome, (record.partition, run)


def _measure(job: AccountingJob, record: PredictionRecord, opts: HarvestOptions
             ) -> tuple[Optional[IterationTimes], str]:
    paths = log_paths(job, record)
    if not paths:
        return None, "no output path (no --output and no absolute working directory)"
    if record.uid is None:
        return None, "the record names no uid: its output is never read as anyone else"
    timings: list[Optional[IterationTimes]] = []
    errors: list[str] = []
    for stream, path in paths:
        try:
            data = read_tail_as(path, record.uid, record.gid, max_bytes=opts.max_log_bytes,
                                timeout_s=opts.log_timeout_s)
        except LogReadError as exc:
            errors.append(f"log unreadable: {exc.strerror or exc}" if len(paths) == 1 else
                          f"{stream} {path} unreadable: {exc.strerror or exc}")
            timings.append(None)
            continue
        timings.append(iteration_times(_drop_partial_first_line(data, opts.max_log_bytes)))
    pick = best_log(timings)
    timing = timings[pick] if pick is not None else None
    if timing is None or timing.median_seconds is None:
        if errors:
            return timing, "; ".join(errors)
    if timing is None:
        # Neither Slurm (sacct has no StdErr) nor the record (one kept before --error was) names a
        # stderr file: a job with `#SBATCH --error` apart had its iteration lines there, unread.
        unknown = "" if len(paths) > 1 or job.std_err or record.std_err else (
            "; stderr not read: the record names no --error file (if the job had one, it was submitted "
            "through an older job_submit.lua or kept before the store's upgrade; sacct does not name it)")
        return None, "no iteration times in its log (Megatron, GPT-NeoX, NeMo, DeepSpeed formats)" + (
            "" if len(paths) == 1 else f" ({' and '.join(f'{s} {p}' for s, p in paths)})") + unknown
    if timing.median_seconds is None:
        return timing, timing.note or "too few iterations after warm-up"
    if pick:                               # found in its StdErr: say where (the run's source)
        timing = dataclasses.replace(timing, note=f"from its StdErr {paths[pick][1]}")
    return timing, ""


# --------------------------------------------------------------------------------------------
# the runs files (calibrate.runs_files: one locked, atomic writer for the harvest and the watch)

def append_runs(out_dir: "str | os.PathLike[str]", partition: str, runs: Sequence[MeasuredRun], *,
                dry_run: bool = False) -> tuple[Path, int, int]:
    """Merge ``runs`` into ``<out_dir>/<partition>.toml`` (by name: one run per job id, the newer
    wins), keep the newest :data:`MAX_RUNS`; (file, runs added, runs in the file)."""
    path, added, total, _ = merge_runs(out_dir, partition, runs, dry_run=dry_run)
    return path, added, total


__all__ = ["AccountingClient", "AccountingJob", "HarvestError", "HarvestOptions", "HarvestResult",
           "LogReadError", "append_runs", "check_partition", "error_path", "expand_output_pattern",
           "finished_jobs", "harvest", "log_paths", "output_path", "parse_sacct_json", "parse_sacct_parsable",
           "parse_scontrol_jobs", "parse_since", "read_tail_as", "refit_partitions", "rollback_hint"]
