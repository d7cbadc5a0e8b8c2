"""The wall-clock limits Slurm's accounting puts on a job beside its partition's MaxTime: the
MaxWall of its QOS and of its association, as ``sacctmgr`` shows them.

perf-predictd caps the limits it fills (and ``--time-min``) with them (:class:`WallLimits.cap`),
so that a filled limit never makes Slurm keep a job pending (``QOSMaxWallDurationPerJobLimit``,
``AssocMaxWallDurationPerJobLimit``) or reject it (QOS flag ``DenyOnLimit``); ``perf-calibrate
watch`` caps the limits it extends with the same (one lookup per pass, shared by its jobs).
Which limit applies follows Slurm 22.05's ``acct_policy_validate`` as far as a job's time limit
is concerned:

- None at all unless ``AccountingStorageEnforce`` has ``limits`` (or ``safe``, which implies it):
  without it Slurm ignores every MaxWall, and so does perfcast.
- The QOS first: the partition's own QOS (slurm.conf ``QOS=``) before the job's, or the job's
  first when it has flag ``OverPartQOS``.  The first of the two with a MaxWall sets the limit.
  The job's QOS is ``--qos``, else its association's default QOS, else the association's only
  QOS, else the cluster's (root association's) default QOS, else ``normal``.
- The association only when neither QOS has a MaxWall: the user's association in the job's
  account (``--account``, else the user's default account) on the job's partition, else the one
  for all partitions, then each account above it up to root: the smallest MaxWall on that chain
  (Slurm walks the same chain).  ``sacctmgr show assoc`` already shows each row with the limits it
  inherits from its parents.
- The partition's MaxTime applies beside these unless the job's own QOS (not the partition's: Slurm
  22.05 reads the flags of ``job_ptr->qos_ptr``) has flag ``PartitionTimeLimit``, which lets the
  job's limit exceed it (:meth:`WallLimits.lifts_max_time`); the MaxWalls above still apply.

Not covered: limits that depend on what else runs (``GrpWall``, ``GrpTRESRunMins``), a reservation's
end, and ``MaxWall`` changes that reach sacctmgr but not slurmctld (a slurmdbd that is down).

:func:`lookup_wall_limits` asks ``scontrol show config`` and ``sacctmgr`` (run as the daemon:
root); :class:`WallLimitsSource` keeps the answer, refreshes it in the background every
:data:`REFRESH_S` seconds, and keeps the last good one while a refresh fails.  Nothing here ever
makes a job fail: an unknown QOS, account or user simply adds no cap.
"""
from __future__ import annotations

import functools
import logging
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from .policy import WallCap
from .slurm_client import SlurmClient, SlurmError, parse_slurm_time

REFRESH_S = 300.0          # a known answer is looked up again after this long (on the next request)
RETRY_S = 30.0             # a failed lookup is tried again after this long
LOOKUP_TIMEOUT_S = 10.0    # per command
MAX_ROWS = 1_000_000       # rows kept per sacctmgr listing (a bound, not a site size)

_ENFORCE_LIMITS = {"limits", "safe"}   # AccountingStorageEnforce words that make Slurm apply MaxWall


@dataclass(frozen=True)
class Qos:
    max_wall: Optional[int]            # minutes; None: none
    over_part_qos: bool = False        # flag OverPartQOS: the job's QOS before the partition's
    part_time_limit: bool = False      # flag PartitionTimeLimit: its jobs may exceed the partition's MaxTime


@dataclass(frozen=True)
class Assoc:
    """One ``sacctmgr show assoc`` row, with the values it inherits from its parents."""

    max_wall: Optional[int]            # minutes; None: none
    parent: str = ""                   # account rows: the parent account ("" at root)
    default_qos: str = ""
    qos: tuple[str, ...] = ()


@dataclass(frozen=True)
class WallLimits:
    """What :func:`lookup_wall_limits` found.  ``enforced`` False: Slurm applies no MaxWall."""

    enforced: bool
    qos: Mapping[str, Qos] = field(default_factory=dict)
    users: Mapping[tuple[str, str, str], Assoc] = field(default_factory=dict)   # (user, account, partition|"")
    accounts: Mapping[str, Assoc] = field(default_factory=dict)                 # account rows
    default_accounts: Mapping[str, str] = field(default_factory=dict)           # user -> account
    why: str = ""                      # not enforced: why (for the log)

    @functools.cached_property
    def any_assoc_wall(self) -> bool:
        """Whether any association has a MaxWall (else the user's name is never needed)."""
        return any(a.max_wall is not None for a in self.users.values()) or \
            any(a.max_wall is not None for a in self.accounts.values())

    def summary(self) -> dict[str, Any]:
        """Counts for the log line (no names)."""
        if not self.enforced:
            return {"enforced": "false"}
        return {"enforced": "true", "qos": len(self.qos),
                "qos_max_wall": sum(1 for q in self.qos.values() if q.max_wall is not None),
                "assocs": len(self.users) + len(self.accounts),
                "assoc_max_wall": sum(1 for a in list(self.users.values()) + list(self.accounts.values())
                                      if a.max_wall is not None)}

    def job_qos(self, user: Optional[str], account: Optional[str], partition: str,
                default_qos: Optional[str] = None) -> Optional[str]:
        """The QOS a job without ``--qos`` gets (``default_qos``: slurmctld's own answer, from
        job_submit.lua's ``job_desc.default_qos``, wins when given)."""
        if default_qos:
            return default_qos
        assoc = self.association(user, account, partition)
        if assoc is not None:
            if assoc.default_qos:
                return assoc.default_qos
            if len(assoc.qos) == 1:
                return assoc.qos[0]
        root = self.accounts.get("root")
        if root is not None and root.default_qos:
            return root.default_qos
        return "normal"

    def association(self, user: Optional[str], account: Optional[str],
                    partition: str) -> Optional[Assoc]:
        if not user or not account:
            return None
        return self.users.get((user, account, partition)) or self.users.get((user, account, ""))

    def account_of(self, user: Callable[[], Optional[str]], account: Optional[str],
                   default_account: Optional[str]) -> Optional[str]:
        """The job's account: ``--account``, else slurmctld's default for it (``job_desc.default_account``),
        else the user's default account in sacctmgr (``user`` gives the name, asked only then)."""
        return account or default_account or self.default_accounts.get(user() or "")

    def lifts_max_time(self, *, user: "Callable[[], Optional[str]] | Optional[str]", account: Optional[str],
                       qos: Optional[str], partition: str, default_account: Optional[str] = None,
                       default_qos: Optional[str] = None) -> bool:
        """Whether the job's QOS (``qos``, else the one it gets, as :meth:`cap` finds it) has flag
        ``PartitionTimeLimit``: Slurm then lets its time limit exceed the partition's MaxTime.
        False where limits are not enforced (the QOS list was not read) or the QOS is unknown."""
        if not self.enforced or not any(q.part_time_limit for q in self.qos.values()):
            return False
        job_qos = qos or default_qos
        if not job_qos:
            who = user() if callable(user) else user
            job_qos = self.job_qos(who, self.account_of(lambda: who, account, default_account), partition)
        info = self.qos.get(job_qos)
        return info is not None and info.part_time_limit

    def cap(self, *, user: "Callable[[], Optional[str]] | Optional[str]", account: Optional[str],
            qos: Optional[str], partition: str, partition_qos: Optional[str] = None,
            default_account: Optional[str] = None, default_qos: Optional[str] = None) -> Optional[WallCap]:
        """The MaxWall that applies to a job (module docstring), or None.  ``user``: the user's
        name, or a function giving it (called only when an association is needed)."""
        if not self.enforced:
            return None
        name: Optional[str] = None
        named = False

        def user_name() -> Optional[str]:
            nonlocal name, named
            if not named:
                name, named = (user() if callable(user) else user), True
            return name

        def the_account() -> Optional[str]:
            return self.account_of(user_name, account, default_account)

        job_qos = qos or default_qos or self.job_qos(user_name(), the_account(), partition)
        order = [q for q in (partition_qos, job_qos) if q]
        if len(order) == 2 and order[0] != order[1]:
            jq = self.qos.get(job_qos)
            if jq is not None and jq.over_part_qos:
                order.reverse()
        for q in order:
            info = self.qos.get(q)
            if info is not None and info.max_wall is not None:
                return WallCap(minutes=info.max_wall, kind="qos", name=q)
        if not self.any_assoc_wall:
            return None
        who, acct = user_name(), the_account()
        row = self.association(who, acct, partition)
        if row is None or acct is None:
            return None
        walls = [row.max_wall] if row.max_wall is not None else []
        seen = set()
        a: Optional[str] = acct
        while a and a not in seen and len(seen) < 64:
            seen.add(a)
            arow = self.accounts.get(a)
            if arow is None:
                break
            if arow.max_wall is not None:
                walls.append(arow.max_wall)
            a = arow.parent
        if not walls:
            return None
        return WallCap(minutes=min(walls), kind="assoc", name=f"{who}/{acct}")


# ---- reading Slurm's answers (pure; unit-tested) ------------------------------------------------

def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = value`` lines -> {key: value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def limits_enforced(config: Mapping[str, str]) -> tuple[bool, str]:
    """Whether slurmctld applies MaxWall limits, and why not."""
    storage = config.get("AccountingStorageType", "")
    if "slurmdbd" not in storage:
        return False, f"AccountingStorageType={storage or 'none'}"
    words = {w.strip().lower() for w in config.get("AccountingStorageEnforce", "").split(",")}
    if not words & _ENFORCE_LIMITS:
        return False, f"AccountingStorageEnforce={config.get('AccountingStorageEnforce') or 'none'}"
    return True, ""


def _wall(text: str) -> Optional[int]:
    text = text.strip()
    if not text:
        return None
    try:
        minutes = parse_slurm_time(text)
    except SlurmError:
        return None
    return minutes if minutes is None or minutes > 0 else None


def _rows(text: str, width: int) -> list[list[str]]:
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= width:
            out.append([p.strip() for p in parts[:width]])
            if len(out) >= MAX_ROWS:
                break
    return out


def parse_qos(text: str) -> dict[str, Qos]:
    """``sacctmgr -n -P show qos format=Name,MaxWall,Flags``."""
    out: dict[str, Qos] = {}
    for name, wall, flags in _rows(text, 3):
        if name:
            fl = {f.strip().lower() for f in flags.split(",")}
            out[name] = Qos(max_wall=_wall(wall), over_part_qos="overpartqos" in fl,
                            part_time_limit="partitiontimelimit" in fl)
    return out


ASSOC_FORMAT = "format=Account,User,Partition,ParentName,MaxWall,DefaultQOS,QOS"


def parse_assocs(text: str) -> tuple[dict[tuple[str, str, str], Assoc], dict[str, Assoc]]:
    """``sacctmgr -n -P show assoc cluster=C`` :data:`ASSOC_FORMAT`: (user rows keyed (user,
    account, partition or ""), account rows keyed by account)."""
    users: dict[tuple[str, str, str], Assoc] = {}
    accounts: dict[str, Assoc] = {}
    for account, user, partition, parent, wall, def_qos, qos in _rows(text, 7):
        if not account:
            continue
        row = Assoc(max_wall=_wall(wall), parent=parent, default_qos=def_qos,
                    qos=tuple(q for q in (s.strip() for s in qos.split(",")) if q))
        if user:
            users[(user, account, partition)] = row
        else:
            accounts[account] = row
    return users, accounts


def parse_users(text: str) -> dict[str, str]:
    """``sacctmgr -n -P show user format=User,DefaultAccount``."""
    return {user: account for user, account in _rows(text, 2) if user and account}


Runner = Callable[..., "subprocess.CompletedProcess[bytes]"]


def lookup_wall_limits(run: Optional[Runner] = None, env: Optional[Mapping[str, str]] = None,
                       timeout: float = LOOKUP_TIMEOUT_S, *, client: Optional[SlurmClient] = None) -> WallLimits:
    """Ask Slurm (``scontrol show config``, then -- only when limits are enforced -- ``sacctmgr``
    for the QOS, this cluster's associations and the users' default accounts).  Raises
    :class:`SlurmError` when a command fails or is missing.  ``client``: ask through it (the
    watch's, with its own timeout; ``run``, ``env`` and ``timeout`` are then not used)."""
    cmd = (client or SlurmClient(timeout=timeout, runner=run, env=env)).text

    config = parse_config(cmd(["scontrol", "show", "config"]))
    enforced, why = limits_enforced(config)
    if not enforced:
        return WallLimits(enforced=False, why=why)
    cluster = config.get("ClusterName", "")
    if not cluster or not re.fullmatch(r"[\w.-]+", cluster):
        raise SlurmError("scontrol show config: no ClusterName")
    qos = parse_qos(cmd(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxWall,Flags"]))
    users, accounts = parse_assocs(cmd(["sacctmgr", "-n", "-P", "show", "assoc", f"cluster={cluster}",
                                        ASSOC_FORMAT]))
    defaults = parse_users(cmd(["sacctmgr", "-n", "-P", "show", "user", "format=User,DefaultAccount"]))
    return WallLimits(enforced=True, qos=qos, users=users, accounts=accounts, default_accounts=defaults)


# ---- kept and refreshed in the background --------------------------------------------------------

LogFn = Callable[..., None]


def _log_std(event: str, level: int = logging.INFO, **fields: Any) -> None:
    logging.getLogger("perfcast.daemon").log(
        level, "event=%s %s", event, " ".join(f"{k}={v}" for k, v in fields.items()))


class WallLimitsSource:
    """The last :class:`WallLimits` looked up, refreshed in the background (never on a request's
    path): at :meth:`refresh` (the daemon's start and every reload) and, on the next request, once
    it is :data:`REFRESH_S` old (:data:`RETRY_S` after a failure).  A failed lookup keeps the last
    good answer (none at first: no caps, as without accounting).  Logged once per change of state
    (``event=slurm_limits`` / ``event=slurm_limits_failed``), not at every refresh."""

    def __init__(self, lookup: Callable[[], WallLimits], *, refresh_s: float = REFRESH_S,
                 retry_s: float = RETRY_S, log: Optional[LogFn] = None,
                 clock: Callable[[], float] = time.monotonic):
        self._lookup = lookup
        self.refresh_s, self.retry_s = refresh_s, retry_s
        self.log = log or _log_std
        self._clock = clock
        self.limits: Optional[WallLimits] = None
        self._next = 0.0                      # when the next lookup is due
        self._lock = threading.Lock()
        self._running: Optional[threading.Event] = None
        self._said: Optional[tuple] = None    # what the log last said (logged once per change)
        self.lookups = 0                      # (tests)

    def current(self) -> Optional[WallLimits]:
        """The limits known now (None: none yet); starts a background refresh when one is due."""
        if self._clock() >= self._next and self._running is None:
            self.refresh()
        return self.limits

    def refresh(self) -> threading.Event:
        """Start a lookup in the background unless one runs; an event set when it has ended."""
        with self._lock:
            if self._running is not None:
                return self._running
            done = self._running = threading.Event()
        try:
            threading.Thread(target=self._run, args=(done,), daemon=True, name="slurm-limits").start()
        except RuntimeError:                  # no thread to be had: try again later
            with self._lock:
                self._running = None
                self._next = self._clock() + self.retry_s
            done.set()
        return done

    def wait(self, timeout: float) -> bool:
        """Until the running lookup (if any) has ended, at most ``timeout`` s."""
        running = self._running
        return running is None or running.wait(timeout)

    def _run(self, done: threading.Event) -> None:
        try:
            self.lookups += 1
            try:
                found = self._lookup()
            except SlurmError as exc:
                self._failed(str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug here must not stop the daemon: fail open
                self._failed(type(exc).__name__)
            else:
                self.limits = found
                self._next = self._clock() + self.refresh_s
                state = ("ok", tuple(sorted(found.summary().items())), found.why)
                if state != self._said:
                    self._said = state
                    self.log("slurm_limits", **found.summary(), **({"why": found.why} if found.why else {}))
        finally:
            with self._lock:
                self._running = None
            done.set()

    def _failed(self, why: str) -> None:
        self._next = self._clock() + self.retry_s
        state = ("failed", why)
        if state != self._said:
            self._said = state
            self.log("slurm_limits_failed", level=logging.WARNING, error=why,
                     kept="last" if self.limits is not None else "none")


_SHARED: Optional[WallLimitsSource] = None
_SHARED_LOCK = threading.Lock()


def shared_source(log: Optional[LogFn] = None) -> WallLimitsSource:
    """The daemon's one source (real Slurm), shared by the engines a reload replaces, so that a
    reload keeps serving the limits known while it looks them up again."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = WallLimitsSource(lookup_wall_limits, log=log)
        elif log is not None:
            _SHARED.log = log
        return _SHARED
