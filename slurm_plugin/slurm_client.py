"""A small Slurm client: partitions, nodes, submitting and querying jobs.

The command line is the tested path (``scontrol -o show partition``, ``sinfo --json``,
``sbatch --parsable``, ``squeue --json``, ``scontrol -o show job``, ``scancel``), because it works
against every Slurm version a site may run and needs nothing compiled.  Slurm 22.05's JSON output
ignores filters (``-j``, ``-t``) and ``scontrol ... --json`` does not exist there, so filtering
happens here.  pyslurm is not used: its releases are tied to one Slurm version each (PyPI's 25.11
does not build against 22.05), and a mismatched one fails at import or, worse, at run time.

Every failure becomes a :class:`SlurmError` with the command and Slurm's own one-line reason.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

log = logging.getLogger("perfcast.slurm")

Runner = Callable[..., subprocess.CompletedProcess]


class SlurmError(RuntimeError):
    """A Slurm command failed or answered something unreadable."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    cpus: int
    gpus: int
    partitions: tuple[str, ...]
    real_memory_mb: int = 0
    gres: str = ""


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    max_time_minutes: Optional[int]        # None = UNLIMITED
    default_time_minutes: Optional[int]    # None = NONE (MaxTime applies)
    nodes: int                             # TotalNodes
    node_list: str
    gpus_per_node: Optional[int]           # the largest of its nodes'; None if unknown
    cpus: int = 0                          # TotalCPUs
    max_nodes: Optional[int] = None        # None = UNLIMITED
    state: str = "UP"
    is_default: bool = False
    raw: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    name: str
    state: str
    partition: str
    time_limit_minutes: Optional[int]
    user: str
    nodes: Optional[int] = None
    reason: str = ""
    admin_comment: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RunningJob:
    """A running job as ``scontrol -o show job`` describes it: what ``perf-calibrate watch`` needs."""

    job_id: int
    name: str
    user: str
    uid: Optional[int]
    gid: Optional[int]
    partition: str
    qos: str
    time_limit_minutes: Optional[int]      # None = UNLIMITED
    start: Optional[float]                 # UNIX seconds
    run_seconds: Optional[float]
    node_list: str
    batch_host: str
    std_out: str
    work_dir: str
    admin_comment: str
    restarts: int = 0
    array_job_id: Optional[int] = None
    array_task_id: Optional[int] = None
    het_job_id: Optional[int] = None
    time_min_minutes: Optional[int] = None  # --time-min (None: not set)
    account: str = ""                       # "" = none (a cluster without associations)
    std_err: str = ""                       # scontrol's StdErr ("" = unknown); == std_out unless --error
    reservation: str = ""                   # the reservation it runs in ("" = none)


@dataclass(frozen=True)
class PlannedStart:
    """A pending job the backfill scheduler has planned (``squeue --start``)."""

    job_id: int
    priority: int
    start: float                           # UNIX seconds
    nodes: tuple[str, ...]                 # the nodes it is planned on (expanded); () = unknown
    partition: str
    user: str
    reason: str = ""                       # why it is pending (squeue %r); "" = not said

    @property
    def waits_for_resources(self) -> bool:
        """Whether its start depends on running jobs ending (see :func:`waits_for_resources`)."""
        return waits_for_resources(self.reason)


# Pending reasons (squeue %r; Slurm's job reason codes) of a job that waits for nodes other jobs
# hold, so that a running job's end can set its start: the resources are in use (Resources), a
# higher-priority job is planned first (Priority), a node it asks for is in use or reserved for the
# next job (ReqNodeNotAvail; "Nodes required for job are DOWN, DRAINED or reserved for jobs in
# higher priority partitions" in older Slurm), licenses other jobs hold, or no reason set yet (None,
# WaitingForScheduling: not known not to).  Every other reason -- BeginTime (--begin, a requeued
# job's hold-off), Dependency, JobHeld*, Reservation (waits for its reservation's start),
# association and QOS limits, a down or inactive partition -- sets the start by something else.
RESOURCE_REASONS = frozenset({"Resources", "Priority", "ReqNodeNotAvail", "Licenses", "None",
                              "WaitingForScheduling"})


def waits_for_resources(reason: str) -> bool:
    """Whether a pending job with this reason waits for resources running jobs hold; a reason not
    given (``""``: an older listing without it) counts, as before reasons were read."""
    text = (reason or "").strip().strip("()")
    if not text:
        return True
    head = re.split(r"[,\s]", text, maxsplit=1)[0]
    return head in RESOURCE_REASONS or head.startswith("Nodes_required_for_job") \
        or text.startswith("Nodes required for job")


@dataclass(frozen=True)
class Reservation:
    """An advanced reservation (``scontrol -o show reservation``)."""

    name: str
    start: Optional[float]                 # UNIX seconds
    end: Optional[float]
    nodes: tuple[str, ...]                 # expanded; () = none (a licenses-only reservation)
    flags: str = ""
    all_nodes: bool = False                # Nodes=ALL


@dataclass(frozen=True)
class SubmitResult:
    job_id: int
    cluster: Optional[str]
    messages: list[str]                    # sbatch's stderr lines (job_submit.lua's log_user)


# ------------------------------------------------------------------------------------------
# parsing helpers (pure; unit-tested)

_UNLIMITED = {"UNLIMITED", "INFINITE", "NONE", "N/A", "", "(null)"}


def parse_slurm_time(text: str) -> Optional[int]:
    """A Slurm duration as minutes (seconds round up); None for UNLIMITED/NONE.

    Accepts what Slurm prints and takes: ``D-HH:MM:SS``, ``D-HH:MM``, ``D-HH``, ``HH:MM:SS``,
    ``MM:SS`` and plain minutes.
    """
    text = text.strip()
    if text.upper() in _UNLIMITED:
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise SlurmError(f"unreadable Slurm time {text!r}")
    days, a, b, c = m.groups()
    if days is not None:               # D-HH[:MM[:SS]]
        h, mi, s = int(a), int(b or 0), int(c or 0)
        d = int(days)
    elif c is not None:                # HH:MM:SS
        d, h, mi, s = 0, int(a), int(b), int(c)
    elif b is not None:                # MM:SS
        d, h, mi, s = 0, 0, int(a), int(b)
    else:                              # minutes
        d, h, mi, s = 0, 0, int(a), 0
    return d * 1440 + h * 60 + mi + (1 if s else 0)


_KEY_RE = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9_:/]*)=")


def parse_oneliner(line: str) -> dict[str, str]:
    """``scontrol -o`` output: ``Key=value Key2=value with spaces ...`` -> dict.

    Keys start with an upper-case letter; a value runs until the next such key, so values with
    spaces (Reason, perfcast's lower-case ``key=value`` AdminComment record) survive.
    """
    out: dict[str, str] = {}
    matches = list(_KEY_RE.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


_GRES_GPU_RE = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def gpus_in_gres(gres: str) -> int:
    """``gpu:8``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2,gpu:v100:2`` -> total GPUs."""
    return sum(int(n) for n in _GRES_GPU_RE.findall(gres or ""))


# More hosts than any one job or plan names: a range beyond this is refused, not expanded.
MAX_HOSTS = 100_000


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Slurm's host list (``dev[001-003,7],gpu1``) as host names; () for empty/``(null)``.
    Raises :class:`SlurmError` on a list it cannot read or one longer than :data:`MAX_HOSTS`."""
    text = (text or "").strip()
    if text in ("", "(null)", "None", "N/A", "None assigned"):
        return ()
    out: list[str] = []
    for m in re.finditer(r"([^,\[\]]+)(?:\[([^\]]*)\])?([^,\[\]]*)(?:,|$)", text):
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
        if not m.group(0):
            continue
        if ranges is None:
            out.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            r = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
            if not r:
                raise SlurmError(f"unreadable host list {text!r}")
            lo, hi = r.group(1), r.group(2) or r.group(1)
            if int(hi) < int(lo) or int(hi) - int(lo) + len(out) >= MAX_HOSTS:
                raise SlurmError(f"host list {text!r}: bad or too long a range")
            out.extend(f"{prefix}{str(i).zfill(len(lo))}{suffix}" for i in range(int(lo), int(hi) + 1))
    return tuple(out)


def slurm_epoch(text: str) -> Optional[float]:
    """Slurm's local ISO time (``2024-05-01T10:00:01``) as UNIX seconds; None for Unknown/N/A."""
    try:
        return _dt.datetime.strptime((text or "").strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def scontrol_job_lines(text: str, keep: Optional[Callable[[str], object]] = None
                       ) -> Iterator[tuple[int, dict[str, str]]]:
    """``(job id, fields)`` of each job of ``scontrol -o show job`` (one line each); lines that
    are not a job's, or whose JobId is not a number, are skipped, and so are those for which
    ``keep(line)`` is false (a cheap test before the line is parsed)."""
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        if keep is not None and not keep(line):
            continue
        kv = parse_oneliner(line)
        jid = _int(kv.get("JobId"))
        if jid is not None:
            yield jid, kv


def name_and_id(text: str) -> tuple[str, Optional[int]]:
    """scontrol's ``UserId=alice(1000)`` / ``GroupId=staff(50)``: the name and the number (the text
    as it is and None when it has no number)."""
    m = re.fullmatch(r"([^()]*)\((\d+)\)", text)
    return (m.group(1), int(m.group(2))) if m else (text, None)


def job_is_running(fields: Mapping[str, str]) -> bool:
    """Whether a job's ``scontrol -o show job`` fields say it is RUNNING."""
    return fields.get("JobState", "").split(" ")[0].upper() == "RUNNING"


# True for every line whose parsed fields job_is_running calls RUNNING (and a few more): a
# controller knows many more pending and finished jobs than running ones, and parsing a line
# costs ~0.1 ms, so perf-calibrate watch spent ~1 s of CPU per pass on the 9,700 jobs a
# benchmark leaves in the dev cluster, to find none running (benchmarks/bench_watch_parse.py).
# (The literal first, not re.IGNORECASE: re then finds it with a fast search.)
_MAY_RUN_RE = re.compile(r"JobState=\s*[Rr][Uu][Nn][Nn][Ii][Nn][Gg](?=\s|$)")


def parse_running_jobs(text: str) -> list[RunningJob]:
    """The RUNNING jobs of ``scontrol -o show job`` (one line each)."""
    out = []
    for jid, kv in scontrol_job_lines(text, keep=_MAY_RUN_RE.search):
        if not job_is_running(kv):
            continue
        user, uid = name_and_id(kv.get("UserId", ""))
        _group, gid = name_and_id(kv.get("GroupId", ""))
        try:
            limit = parse_slurm_time(kv.get("TimeLimit", "UNLIMITED"))
            run_min = kv.get("RunTime", "")
            run_s = _seconds(run_min)
        except SlurmError:
            continue
        out.append(RunningJob(
            job_id=jid, name=kv.get("JobName", ""), user=user, uid=uid, gid=gid,
            partition=kv.get("Partition", ""), qos=kv.get("QOS", ""), time_limit_minutes=limit,
            start=slurm_epoch(kv.get("StartTime", "")), run_seconds=run_s, node_list=kv.get("NodeList", ""),
            batch_host=kv.get("BatchHost", ""), std_out=kv.get("StdOut", ""),
            work_dir=kv.get("WorkDir", ""), admin_comment=kv.get("AdminComment", ""),
            restarts=_int(kv.get("Restarts"), 0) or 0, array_job_id=_int(kv.get("ArrayJobId")),
            array_task_id=_int(kv.get("ArrayTaskId")), het_job_id=_int(kv.get("HetJobId")),
            time_min_minutes=_time_or_none(kv.get("TimeMin", "")),
            account="" if kv.get("Account", "") in ("", "(null)") else kv.get("Account", ""),
            std_err=kv.get("StdErr", ""),
            reservation="" if kv.get("Reservation", "") in ("", "(null)") else kv.get("Reservation", "")))
    return out


def parse_reservations(text: str) -> list[Reservation]:
    """``scontrol -o show reservation`` (one line each; "No reservations in the system" = [])."""
    out = []
    for line in text.splitlines():
        if not line.startswith("ReservationName="):
            continue
        kv = parse_oneliner(line)
        raw = kv.get("Nodes", "")
        all_nodes = raw.strip().upper() == "ALL"
        try:
            nodes = () if all_nodes else expand_hostlist(raw)
        except SlurmError:
            nodes, all_nodes = (), True          # unreadable: may cover any node
        out.append(Reservation(name=kv.get("ReservationName", ""), start=slurm_epoch(kv.get("StartTime", "")),
                               end=slurm_epoch(kv.get("EndTime", "")), nodes=nodes,
                               flags=kv.get("Flags", ""), all_nodes=all_nodes))
    return out


def _time_or_none(text: str) -> Optional[int]:
    try:
        return parse_slurm_time(text)
    except SlurmError:
        return None


def _seconds(text: str) -> Optional[float]:
    """``[D-]HH:MM:SS`` as seconds (RunTime); None when unreadable."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d+):(\d+)", (text or "").strip())
    if not m:
        return None
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


_START_DELIM = "|#pc#|"
_START_FIELDS = ("%i", "%Q", "%S", "%Y", "%P", "%u", "%r")


def parse_planned_starts(text: str) -> list[PlannedStart]:
    """``squeue --start -h -t PD -o`` :data:`_START_FIELDS` lines (the last, the pending reason,
    may be missing: a listing without it); jobs without a planned start (``N/A``: held, or not
    planned yet) are left out."""
    out = []
    for line in text.splitlines():
        parts = line.split(_START_DELIM)
        if len(parts) == len(_START_FIELDS) - 1:
            parts.append("")
        if len(parts) != len(_START_FIELDS):
            continue
        jid, prio, start, nodes, part, user, reason = (p.strip() for p in parts)
        when = slurm_epoch(start)
        job_id = _int(jid.split("_")[0] if "_" in jid and not jid.isdigit() else jid)
        if when is None or job_id is None:
            continue
        try:
            hosts = expand_hostlist(nodes)
        except SlurmError:
            hosts = ()
        out.append(PlannedStart(job_id=job_id, priority=_int(prio, 0) or 0, start=when, nodes=hosts,
                                partition=part, user=user, reason=reason))
    return out


# Commands whose first words (after options) name what they do: ``scontrol -o show partition``.
_SUBCOMMAND_TOOLS = frozenset({"scontrol", "sacctmgr"})


def command_name(args: Sequence[str]) -> str:
    """How an error names a command: ``scontrol`` and ``sacctmgr`` by their subcommand, options
    left out (``scontrol -o show partition`` -> ``scontrol show partition``, ``sacctmgr -n -P show
    qos format=...`` -> ``sacctmgr show qos``, ``scontrol update JobId=7 ...`` -> ``scontrol
    update``); any other by its first two words (``squeue --start``, ``sbatch --parsable``)."""
    if not args:
        return ""
    if args[0].rsplit("/", 1)[-1] not in _SUBCOMMAND_TOOLS:
        return " ".join(args[:2])
    words: list[str] = []
    for a in args[1:]:
        if a.startswith("-"):
            continue
        if "=" in a or len(words) == 2:
            break
        words.append(a)
    return " ".join([args[0], *words])


def _int(value: Any, default: Optional[int] = None) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# ------------------------------------------------------------------------------------------

class SlurmClient:
    """Talks to the Slurm of ``$SLURM_CONF`` (or ``conf``) through its command-line tools."""

    def __init__(self, conf: Optional[str] = None, *, timeout: float = 30.0,
                 runner: Optional[Runner] = None, env: Optional[Mapping[str, str]] = None):
        self.env = dict(os.environ if env is None else env)
        if conf:
            self.env["SLURM_CONF"] = conf
        self.timeout = timeout
        self._run = runner or subprocess.run

    @staticmethod
    def available() -> bool:
        """True when the Slurm client commands are installed here."""
        return all(shutil.which(c) for c in ("sbatch", "scontrol", "sinfo", "squeue"))

    def _cmd(self, args: Sequence[str], *, input: Optional[bytes] = None,
             cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
             user: Optional[Union[int, str]] = None) -> subprocess.CompletedProcess:
        """Run one Slurm command: the one place that does (every failure a one-line
        :class:`SlurmError` named by :func:`command_name`)."""
        full_env = dict(self.env)
        if env:
            full_env.update(env)
        argv = list(args)
        if user is not None:
            # runuser keeps the environment (SLURM_CONF) and needs no password as root.
            argv = ["runuser", "-u", str(user), "--"] + argv
        name = command_name(args)
        try:
            # Without input, stdin is /dev/null: a Slurm command run from a terminal
            # (perf-predictd --check) must never wait on it.
            proc = self._run(argv, input=input, capture_output=True, timeout=self.timeout,
                             cwd=cwd, env=full_env, stdin=None if input is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmError(f"{args[0]}: not installed") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{name}: no answer within {self.timeout:g} s") from None
        except OSError as exc:          # not executable, too many processes, ...
            raise SlurmError(f"{name}: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            err = (proc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
            why = err[-1] if err else f"exit code {proc.returncode}"
            raise SlurmError(f"{name}: {why}")
        return proc

    def text(self, args: Sequence[str]) -> str:
        """What a Slurm command prints (decoded); a failure is a :class:`SlurmError` naming it."""
        return (self._cmd(args).stdout or b"").decode("utf-8", "replace")

    # -- nodes and partitions

    def nodes(self) -> list[NodeInfo]:
        data = self._json(["sinfo", "--json"])
        out = []
        for n in data.get("nodes", []):
            state = n.get("state", "")
            if isinstance(state, list):      # newer Slurm: a list of flags
                state = "+".join(state)
            out.append(NodeInfo(name=str(n.get("name", "")), state=str(state).lower(),
                                cpus=_int(n.get("cpus"), 0) or 0, gpus=gpus_in_gres(n.get("gres", "")),
                                partitions=tuple(n.get("partitions") or ()),
                                real_memory_mb=_int(n.get("real_memory"), 0) or 0,
                                gres=str(n.get("gres", ""))))
        return out

    def partitions(self) -> list[PartitionInfo]:
        proc = self._cmd(["scontrol", "-o", "show", "partition"])
        try:
            gpus: dict[str, int] = {}
            for node in self.nodes():
                for p in node.partitions:
                    gpus[p] = max(gpus.get(p, 0), node.gpus)
        except SlurmError as exc:   # GPUs per node stay unknown; MaxTime is what matters most
            log.warning("sinfo --json failed: %s", exc)
            gpus = {}
        out = []
        for line in proc.stdout.decode("utf-8", "replace").splitlines():
            kv = parse_oneliner(line)
            if "PartitionName" not in kv:
                continue
            name = kv["PartitionName"]
            out.append(PartitionInfo(
                name=name, max_time_minutes=parse_slurm_time(kv.get("MaxTime", "UNLIMITED")),
                default_time_minutes=parse_slurm_time(kv.get("DefaultTime", "NONE")),
                nodes=_int(kv.get("TotalNodes"), 0) or 0, node_list=kv.get("Nodes", ""),
                gpus_per_node=gpus.get(name) or None, cpus=_int(kv.get("TotalCPUs"), 0) or 0,
                max_nodes=_int(kv.get("MaxNodes")), state=kv.get("State", ""),
                is_default=kv.get("Default") == "YES", raw=kv))
        return out

    def partition(self, name: Optional[str] = None) -> PartitionInfo:
        """One partition by name; the default partition when ``name`` is None."""
        parts = self.partitions()
        for p in parts:
            if (name is None and p.is_default) or p.name == name:
                return p
        raise SlurmError(f"no partition {name!r}" if name else "no default partition")

    def partition_names(self) -> list[str]:
        """Slurm's partition names (``scontrol -o show partition`` only: no ``sinfo``, nothing
        parsed beyond the names); a :class:`SlurmError` when there are none, since that is what
        scontrol may print, exiting 0, where it reaches no controller."""
        proc = self._cmd(["scontrol", "-o", "show", "partition"])
        names = [name for line in proc.stdout.decode("utf-8", "replace").splitlines()
                 if (name := parse_oneliner(line).get("PartitionName"))]
        if not names:
            err = (proc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
            raise SlurmError(f"scontrol show partition: {err[-1] if err else 'no partitions'}")
        return names

    # -- jobs

    def submit(self, script: Union[str, os.PathLike], args: Sequence[str] = (), *,
               text: Optional[str] = None, cwd: Optional[str] = None,
               env: Optional[Mapping[str, str]] = None,
               user: Optional[Union[int, str]] = None) -> SubmitResult:
        """``sbatch --parsable [args] script`` (or the script ``text`` on stdin when given).

        ``user`` (root only) submits as that user via runuser.  The result carries sbatch's
        stderr lines: that is where job_submit.lua's messages arrive.
        """
        argv = ["sbatch", "--parsable", *args]
        if text is None:
            argv.append(os.fspath(script))
        proc = self._cmd(argv, input=text.encode() if text is not None else None, cwd=cwd,
                         env=env, user=user)
        out = proc.stdout.decode("utf-8", "replace").strip().splitlines()
        m = re.fullmatch(r"(\d+)(?:;(\S+))?", out[-1].strip() if out else "")
        if not m:
            raise SlurmError(f"sbatch: unexpected answer {out[-1:]!r}")
        messages = [l for l in (proc.stderr or b"").decode("utf-8", "replace").splitlines() if l]
        return SubmitResult(job_id=int(m.group(1)), cluster=m.group(2), messages=messages)

    def job(self, job_id: int) -> JobInfo:
        """``scontrol -o show job`` (also finds jobs that ended within MinJobAge)."""
        proc = self._cmd(["scontrol", "-o", "show", "job", str(int(job_id))])
        kv = parse_oneliner(proc.stdout.decode("utf-8", "replace").splitlines()[0])
        user = kv.get("UserId", "")
        return JobInfo(job_id=_int(kv.get("JobId"), job_id) or job_id, name=kv.get("JobName", ""),
                       state=kv.get("JobState", ""), partition=kv.get("Partition", ""),
                       time_limit_minutes=parse_slurm_time(kv.get("TimeLimit", "UNLIMITED")),
                       user=user.split("(")[0], nodes=_int(kv.get("NumNodes", "").split("-")[0]),
                       reason=kv.get("Reason", ""), admin_comment=kv.get("AdminComment", ""), raw=kv)

    def jobs(self, *, user: Optional[str] = None, ids: Optional[Sequence[int]] = None,
             states: Optional[Sequence[str]] = None) -> list[JobInfo]:
        """``squeue --json``, filtered here (22.05 ignores its own filters in JSON mode)."""
        data = self._json(["squeue", "--json"])
        want_ids = set(int(i) for i in ids) if ids is not None else None
        want_states = {s.upper() for s in states} if states else None
        out = []
        for j in data.get("jobs", []):
            jid = _int(j.get("job_id"), 0) or 0
            state = j.get("job_state", "")
            if isinstance(state, list):
                state = state[0] if state else ""
            if want_ids is not None and jid not in want_ids:
                continue
            if user is not None and j.get("user_name") != user:
                continue
            if want_states is not None and str(state).upper() not in want_states:
                continue
            limit = j.get("time_limit")
            if isinstance(limit, dict):    # newer Slurm: {"set":..,"infinite":..,"number":..}
                limit = None if limit.get("infinite") or not limit.get("set") else limit.get("number")
            out.append(JobInfo(job_id=jid, name=str(j.get("name", "")), state=str(state),
                               partition=str(j.get("partition", "")),
                               time_limit_minutes=_int(limit), user=str(j.get("user_name", "")),
                               nodes=_int(j.get("node_count")),
                               reason=str(j.get("state_reason", "")),
                               admin_comment=str(j.get("admin_comment", "") or ""), raw=j))
        return out

    def wait(self, job_id: int, *, timeout: float = 3600.0, poll: float = 1.0) -> JobInfo:
        """Poll until the job has ended (any state but PENDING/RUNNING/CONFIGURING/COMPLETING/
        SUSPENDED); its final JobInfo.  Needs the job to be still known (MinJobAge, 300 s)."""
        import time
        active = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                  "RESIZING", "SIGNALING", "STAGE_OUT"}
        end = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.state.split()[0].upper() not in active:
                return info
            if time.monotonic() >= end:
                raise SlurmError(f"job {job_id} still {info.state} after {timeout:g} s")
            time.sleep(poll)

    def running_jobs(self) -> list[RunningJob]:
        """Every RUNNING job slurmctld knows (``scontrol -o show job``)."""
        proc = self._cmd(["scontrol", "-o", "show", "job"])
        return parse_running_jobs(proc.stdout.decode("utf-8", "replace"))

    def planned_starts(self) -> list[PlannedStart]:
        """Pending jobs with a start time the scheduler planned (``squeue --start``), each with its
        pending reason (``%r``)."""
        proc = self._cmd(["squeue", "--start", "-h", "-t", "PD",
                          "-o", _START_DELIM.join(_START_FIELDS)])
        return parse_planned_starts(proc.stdout.decode("utf-8", "replace"))

    def reservations(self) -> list[Reservation]:
        """Every advanced reservation slurmctld knows (``scontrol -o show reservation``)."""
        proc = self._cmd(["scontrol", "-o", "show", "reservation"])
        return parse_reservations(proc.stdout.decode("utf-8", "replace"))

    def set_time_limit(self, job_id: int, minutes: int, *, time_min: Optional[int] = None) -> None:
        """``scontrol update JobId=N TimeLimit=M`` (root or the SlurmUser may raise it).  Slurm
        refuses a limit below the job's TimeMin; ``time_min`` lowers that in the same update."""
        if int(minutes) < 1:
            raise SlurmError(f"time limit of job {job_id}: {minutes} min is not a limit")
        extra = [f"TimeMin={int(time_min)}"] if time_min is not None else []
        self._cmd(["scontrol", "update", f"JobId={int(job_id)}", *extra, f"TimeLimit={int(minutes)}"])

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """``scontrol update JobId=N AdminComment=...`` (one line; Slurm keeps it with the job)."""
        if "\n" in text or "\r" in text or "\0" in text:
            raise SlurmError("an AdminComment is one line")
        self._cmd(["scontrol", "update", f"JobId={int(job_id)}", f"AdminComment={text}"])

    def cancel(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            self._cmd(["scancel", *[str(int(j)) for j in job_ids]])

    def _json(self, argv: Sequence[str]) -> dict:
        proc = self._cmd(argv)
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            raise SlurmError(f"{' '.join(argv)}: answer is not JSON") from None
        if not isinstance(data, dict):
            raise SlurmError(f"{' '.join(argv)}: answer is not a JSON object")
        errors = data.get("errors") or []
        if errors:
            raise SlurmError(f"{' '.join(argv)}: {errors[0]}")
        return data
