"""``perf-calibrate watch``: correct running jobs' time limits from their own progress.

One pass (``--every SECONDS`` repeats it) on the controller, as root:

1. lists the RUNNING jobs that carry a perfcast record (``scontrol -o show job``) in partitions the
   site's ``[watch]`` policy covers (:class:`slurm_plugin.siteconfig.WatchPolicy`; a partition's
   ``[partitions.<name>.watch]`` table replaces some of its keys for that partition's jobs);
2. reads each one's log tail (its StdOut, and its StdErr when that is another file) **as the
   job's user** with the harvest's reader
   (:func:`calibrate.harvest.read_tail_as`: bounded bytes and time), several at once, within a
   total budget, so one user's hung file system stalls neither the pass nor the other jobs;
3. takes the iteration time (the slower of the steady-state median and the median of the recent
   samples) and the current iteration from the log (:mod:`calibrate.joblogs`), the planned
   iterations and checkpoint interval from the record the daemon kept at submission (the trusted
   side), the job's run time from Slurm (``RunTime``: suspended time left out, as Slurm counts the
   limit), and decides (:func:`decide`):

   - **extend** when the rest of the run (plus a margin for a checkpoint save and the last
     evaluation) does not fit in the limit: up to the partition's MaxTime, the QOS or association
     MaxWall Slurm holds the job to (the fill's :mod:`slurm_plugin.qos_limits`, looked up once per
     pass; none where Slurm does not enforce them), the policy's growth and per-user caps, no
     later than any pending job waiting for resources planned on the job's nodes may start (``squeue
     --start``) plus the site's backfill allowance, and no later than the start of a reservation
     on its nodes that it is not in -- but never below the limit the job had before the watch
     shrank it, for the watch's own caps.  When the rest cannot
     fit, only up to just after the last checkpoint that fits (never a limit that ends between
     checkpoints for nothing);
   - **shrink** a limit perfcast set and that nobody changed since (site option) when the job
     will clearly end long before it,
     never below the measured end plus the margin;
   - **none**, with the reason, otherwise -- and on any doubt: unreadable log, too few samples,
     a log that claims more iteration time than the job has run, an iteration count that
     disagrees with the record, no progress for ``stall_minutes`` of run time, requeued and
     heterogeneous jobs, Slurm not answering (the QOS and association MaxWall included).  The watch
     fails closed: no update without every fact checked.

4. writes each action as one line into the job's AdminComment (after the perfcast record, which
   stays as it was), into the record store's ``watch_actions`` table (:mod:`calibrate.watch_log`,
   read by ``perf-calibrate report``), and each measured rate into the partition's runs file as a
   harvestable run (the finished job's harvest replaces it, by name).

The record store never stops a pass.  A job whose record is missing from it (the store was moved
aside and the daemon started a new one, the record was pruned or never kept) or cannot be read
there (a corrupt page, a corrupt or missing file) is judged from what the daemon wrote into its
AdminComment at submission (:func:`record_from_comment`: planned iterations, predicted s/iter,
the limit perfcast set, ...): extended when it needs it, never shrunk, and its reason says so; an
AdminComment without those fields is named in the reason.  The watch's own tables in the store
fall back to memory for the pass when they cannot be read or written (corrupt, locked past the
busy timeout: :class:`calibrate.watch_log.PassLog`).  What failed is said once per pass
(:attr:`WatchResult.warnings`, logged as one warning): with a corrupt store, how to keep its rows
(``sqlite3 ... .recover``) and what moving it aside costs; with a locked one, whether any limit
changed this pass, and that the next pass retries; ``perf-calibrate watch`` then exits
:data:`WARNINGS_EXIT_STATUS`.  Jobs are named as Slurm names them (``76_2`` for an array task:
:func:`job_name`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as _dt
import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from predictor.errors import JobError, PerfcastError
from predictor.job import TrainingJob
from predictor.validation import MeasuredRun
from slurm_plugin.policy import WallCap, slurm_duration
from slurm_plugin.qos_limits import WallLimits, lookup_wall_limits
from slurm_plugin.records import (DAMAGED_ADVICE, RECORD_KEY, RECORD_TAG, PredictionRecord, RecordStore,
                                  RecordStoreError, is_record_id, parse_admin_comment)
from slurm_plugin.siteconfig import WatchPolicy
from slurm_plugin.slurm_client import (PartitionInfo, PlannedStart, Reservation, RunningJob, SlurmClient,
                                       SlurmError, expand_hostlist, parse_slurm_time)

from .harvest import DEFAULT_OUT, MAX_LOG_BYTES, AccountingJob, LogReadError, log_paths, read_tail_as
from .joblogs import WARMUP_ITERATIONS, IterationTimes, best_log, iteration_times
from .runs_files import RunsFileError, merge_runs
from .watch_log import BUSY_TIMEOUT_S, JobState, PassLog, WatchAction, WatchLog

log = logging.getLogger(__name__)

# The AdminComment segment the watch owns, after the daemon's record (which it never touches).
WATCH_TAG = "perfcast-watch:"
_SEGMENT = " | " + WATCH_TAG
# A log's claims must fit the time the job has run: at least half the steady samples are at or
# above their median, so median x iterations spanned is at most twice the time those took
# (the harvest's bound).
_CLAIM_FACTOR = 2.0
# Decisions that are no news to the job's user: kept in the store, not put in the AdminComment.
_QUIET = frozenset({"on-track", "warm-up", "no-shrink"})
# A measured rate is written to the runs file again only when it moved more than this.
_RUN_REWRITE = 0.02
# perf-calibrate watch's exit status after a pass that ran but had store warnings
# (WatchResult.warnings): non-zero so that a systemd timer's unit shows the failure; not 1 or 2,
# which the CLI uses for unfinished work and for errors that stopped the command.
WARNINGS_EXIT_STATUS = 3


class WatchError(PerfcastError):
    """The pass cannot run (Slurm not answering); one line.  A record store that is missing,
    corrupt or locked does not stop a pass: it goes on from the jobs' AdminComments and says so
    (:attr:`WatchResult.warnings`)."""


@dataclass(frozen=True)
class Progress:
    """What a running job's log says about it (after warm-up)."""

    iteration: int                       # the last iteration the log reports
    iteration_seconds: float             # steady-state median
    samples: int                         # steady-state samples behind the median
    log_format: str
    planned_iterations: Optional[int] = None   # the total the log prints (a check, never trusted)
    iterations_spanned: Optional[int] = None
    recent_seconds: Optional[float] = None     # median of the last samples (joblogs.IterationTimes.recent)
    recent_samples: int = 0
    recent_span: Optional[int] = None          # iterations those samples cover
    log_stream: str = ""                       # StdOut | StdErr: the file the numbers come from
    log_path: str = ""

    @property
    def seconds(self) -> float:
        """The rate the rest of the run is projected with: the slower of the whole-run median and
        the median of the recent samples (a job that slowed down is judged by its recent speed; one
        that sped up keeps the whole-run median until that is confirmed by enough samples)."""
        return max(self.iteration_seconds, self.recent_seconds or 0.0)


@dataclass(frozen=True)
class Limits:
    """The caps on a job's new limit, in seconds (None: none of that kind)."""

    max_time_seconds: Optional[float] = None        # partition MaxTime
    # The MaxWall Slurm holds the job to (watch.wall_cap): a QOS's, else -- no QOS having one --
    # its association's; at most one of the two is set, as Slurm applies one.
    qos_max_seconds: Optional[float] = None         # QOS MaxWall
    assoc_max_seconds: Optional[float] = None       # the job's association's MaxWall
    growth_seconds: Optional[float] = None          # first limit x (1 + max_growth)
    user_seconds: Optional[float] = None            # current limit + what the user's cap has left
    fairness_seconds: Optional[float] = None        # earliest planned start on its nodes + allowance
    fairness_job: Optional[int] = None
    reservation_seconds: Optional[float] = None     # start of a reservation on its nodes it is not in
    reservation_name: str = ""
    # The limit the job had before the watch shrank it (None: never shrunk).  The watch's own caps
    # (fairness, the user's extension hours) never hold a job below it: the job was granted it, and
    # a pending job planned into the time the shrink returned was planned on the watch's doing.
    restore_seconds: Optional[float] = None

    def cap(self) -> tuple[Optional[float], str]:
        """The tightest cap and which one it is."""
        named = [(self.max_time_seconds, "the partition's MaxTime"), (self.qos_max_seconds, "the QOS MaxWall"),
                 (self.assoc_max_seconds, "the association's MaxWall"),
                 (self.growth_seconds, "the site's max_growth"),
                 self._soft(self.user_seconds, "the user's extension cap"),
                 self._soft(self.fairness_seconds, f"pending job {self.fairness_job}'s planned start"),
                 (self.reservation_seconds, f"reservation {self.reservation_name}'s start")]
        present = [(v, n) for v, n in named if v is not None]
        if not present:
            return None, ""
        return min(present, key=lambda p: p[0])

    def _soft(self, value: Optional[float], name: str) -> tuple[Optional[float], str]:
        if value is not None and self.restore_seconds is not None and value < self.restore_seconds:
            return self.restore_seconds, f"the limit it had before the watch shrank it ({name} allows less)"
        return value, name


@dataclass(frozen=True)
class Decision:
    action: str                          # extend | shrink | none
    code: str                            # short reason key
    reason: str
    from_seconds: Optional[float]
    to_seconds: Optional[float]
    checkpoint_iteration: Optional[int] = None

    @property
    def to_minutes(self) -> Optional[int]:
        return None if self.to_seconds is None else int(round(self.to_seconds / 60.0))


def _ceil_minute(seconds: float) -> float:
    return 60.0 * math.ceil(seconds / 60.0 - 1e-9)


def _floor_minute(seconds: float) -> float:
    return 60.0 * math.floor(seconds / 60.0 + 1e-9)


def _none(code: str, reason: str, limit: Optional[float]) -> Decision:
    return Decision("none", code, reason, limit, limit)


def _hm(seconds: Optional[float]) -> str:
    """Slurm's duration format, the context being Slurm's limits."""
    return "UNLIMITED" if seconds is None else slurm_duration(seconds)


def save_interval(record: PredictionRecord) -> int:
    """The checkpoint interval the job file said (0: unknown or none)."""
    run = record.job.get("run") if isinstance(record.job, Mapping) else None
    try:
        value = int((run or {}).get("save_interval") or 0)
    except (TypeError, ValueError):
        return 0
    return max(0, value)


def starting_seconds(record: PredictionRecord, min_samples: int) -> float:
    """How long a job may run before its log shows steady iteration times, by its own prediction:
    twice the time it spends outside iterations (start-up, evaluations, checkpoints: an upper
    bound on its start-up) and its first warm-up and ``min_samples`` iterations at the interval's
    upper end.  Before that, a log with no iteration time is a job starting, not a log the watch
    cannot read."""
    iter_s = max(float(record.iteration_seconds or 0.0), float(record.interval_seconds[1] or 0.0))
    outside = max(0.0, float(record.total_seconds or 0.0) - int(record.iterations or 0) * float(record.iteration_seconds or 0.0))
    return 2.0 * (outside + (WARMUP_ITERATIONS + max(1, min_samples)) * iter_s)


def decide(*, now: float, start: float, limit_seconds: Optional[float], record: PredictionRecord,
           progress: Progress, policy: WatchPolicy, limits: Limits, perfcast_limit: bool,
           user_limit_note: str = "") -> Decision:
    """What to do with a running job's limit (pure: every fact comes in as an argument).

    ``start`` is when the job would have started had it never been suspended (now minus its
    RunTime): Slurm counts the limit against run time.  ``user_limit_note`` says why a limit is
    the user's (in the reason)."""
    if limit_seconds is None:
        return _none("unlimited", "no time limit to correct", None)
    planned = int(record.iterations or 0)
    if planned <= 0:
        return _none("no-plan", "the record has no planned iteration count", limit_seconds)
    if progress.planned_iterations is not None and abs(progress.planned_iterations - planned) > 1:
        return _none("plan-mismatch", f"the log plans {progress.planned_iterations} iterations, the record "
                     f"{planned}: not acting on a job that is not the one predicted", limit_seconds)
    i, s = progress.iteration, progress.seconds
    if i > planned:
        return _none("plan-mismatch", f"the log is at iteration {i}, past the {planned} planned", limit_seconds)
    if progress.samples < policy.min_samples:
        return _none("warm-up", f"{progress.samples} steady-state samples, {policy.min_samples} needed",
                     limit_seconds)
    elapsed = max(0.0, now - start)
    margin_s = policy.margin_minutes * 60.0

    def limit_at(iteration: int) -> float:
        """The limit (whole minutes) that lets the job reach ``iteration`` plus the margins."""
        return _ceil_minute(now + (iteration - i) * s * (1.0 + policy.margin) + margin_s - start)

    need = limit_at(planned)
    recent = (f" (median of its last {progress.recent_samples} samples; {progress.iteration_seconds:.4g} over "
              "the run)" if s > progress.iteration_seconds else "")
    where = f", from its StdErr {progress.log_path}" if progress.log_stream == "StdErr" else ""
    rate = (f"{s:.4g} s/iter measured{recent} vs {record.iteration_seconds:.4g} predicted, iteration {i} of "
            f"{planned}{where}")
    if need > limit_seconds:
        if not policy.extend:
            return _none("extend-off", f"would need {_hm(need)}; extending is off ([{policy.table}] extend)",
                         limit_seconds)
        if not perfcast_limit and not policy.extend_user_limits:
            return _none("user-limit", f"would need {_hm(need)}, but the user set this limit{user_limit_note} "
                         f"([{policy.table}] extend_user_limits = false)", limit_seconds)
        cap, which = limits.cap()
        cap = _floor_minute(cap) if cap is not None else None
        if cap is None or need <= cap:
            return Decision("extend", "extend", f"{rate}: needs {_hm(need)}", limit_seconds, need)
        every = save_interval(record)
        if every <= 0:
            return _none("no-fit", f"{rate}: needs {_hm(need)}, more than {which} allows ({_hm(cap)}), and "
                         "the record names no checkpoint interval to stop at; it will time out",
                         limit_seconds)
        best = None
        c = (i // every + 1) * every
        while c < planned:
            if limit_at(c) > cap:
                break
            best = c
            c += every
        if best is None:
            return _none("no-fit", f"{rate}: needs {_hm(need)}, more than {which} allows ({_hm(cap)}); "
                         f"not even the next checkpoint (iteration {(i // every + 1) * every}) fits; it "
                         "will time out", limit_seconds)
        to = limit_at(best)
        if to <= limit_seconds:
            return _none("no-fit", f"{rate}: needs {_hm(need)}, more than {which} allows ({_hm(cap)}); the "
                         f"limit already reaches the last checkpoint that fits (iteration {best})", limit_seconds)
        return Decision("extend", "checkpoint", f"{rate}: needs {_hm(need)}, more than {which} allows "
                        f"({_hm(cap)}); extended to just after the last checkpoint that fits (iteration "
                        f"{best}); the job will not finish", limit_seconds, to, best)
    floor = _ceil_minute(elapsed + margin_s)
    to = max(need, floor)
    if limit_seconds - to >= max(60.0, policy.shrink_min_minutes * 60.0):
        if not policy.shrink:
            return _none("shrink-off", f"{rate}: needs {_hm(to)}; shrinking is off ([{policy.table}] shrink)",
                         limit_seconds)
        if not perfcast_limit and not policy.shrink_user_limits:
            return _none("user-limit", f"{rate}: needs {_hm(to)}, but the user set this limit{user_limit_note} "
                         f"([{policy.table}] shrink_user_limits = false)", limit_seconds)
        return Decision("shrink", "shrink", f"{rate}: needs {_hm(to)}; {_hm(limit_seconds - to)} back to "
                        "backfill", limit_seconds, to)
    return _none("on-track", f"{rate}: needs {_hm(need)} of {_hm(limit_seconds)}", limit_seconds)


def fairness_cap(job: RunningJob, planned: Sequence[PlannedStart], nodes: Sequence[str],
                 allowance_seconds: float) -> tuple[Optional[float], Optional[int]]:
    """The latest end (UNIX seconds) that delays no planned pending job on the job's nodes by more
    than the allowance, and that job; a plan with unknown nodes in the job's partition counts (it
    may be planned there).  Only jobs that wait for resources count (``PlannedStart.reason``:
    Resources, Priority, ...; :data:`slurm_plugin.slurm_client.RESOURCE_REASONS`): the start of a
    job waiting for its ``--begin`` time, a dependency or a hold is not set by this job's end."""
    mine = set(nodes)
    best: Optional[tuple[float, int]] = None
    for p in planned:
        if p.job_id == job.job_id or not p.waits_for_resources:
            continue
        shares = bool(mine & set(p.nodes)) if p.nodes else p.partition == job.partition
        if not shares:
            continue
        end = p.start + allowance_seconds
        if best is None or end < best[0]:
            best = (end, p.job_id)
    return (best[0], best[1]) if best else (None, None)


def reservation_cap(job: RunningJob, reservations: Sequence[Reservation], nodes: Sequence[str],
                    now: float) -> tuple[Optional[float], str]:
    """The earliest start (UNIX seconds) of a reservation that covers any of the job's nodes, that
    the job does not run in, and that began after the job did (a maintenance window created with
    ``ignore_jobs`` while it runs); and its name.  A reservation that had begun when the job
    started is one the job runs beside (part of a node, OVERLAP): it sets no end.  Ended ones and
    ones on other nodes do not count."""
    mine = set(nodes)
    best: Optional[tuple[float, str]] = None
    for r in reservations:
        if r.start is None or (job.reservation and r.name == job.reservation):
            continue
        if r.end is not None and r.end <= now:
            continue
        if job.start is not None and r.start <= job.start:
            continue
        if not (r.all_nodes or mine & set(r.nodes)):
            continue
        if best is None or r.start < best[0]:
            best = (r.start, r.name)
    return (best[0], best[1]) if best else (None, "")


_WATCH_CHANGE_RE = re.compile(re.escape(_SEGMENT) + r" (extend|shrink) (\S+)->(\S+) at ")


def _slurm_seconds(text: str) -> Optional[float]:
    try:
        minutes = parse_slurm_time(text)
    except SlurmError:
        return None
    return 60.0 * minutes if minutes is not None else None


def watch_change(admin_comment: str) -> Optional[tuple[str, Optional[float], Optional[float]]]:
    """The last change the watch's segment of an AdminComment tells: ``(extend|shrink, from
    seconds, to seconds)`` (None: the watch changed nothing there).  Only the segment's head is
    read (its reason may quote a path the user named)."""
    at = admin_comment.find(_SEGMENT)
    m = _WATCH_CHANGE_RE.match(admin_comment, at) if at >= 0 else None
    if not m:
        return None
    return m.group(1), _slurm_seconds(m.group(2)), _slurm_seconds(m.group(3))


def watch_set_limit(admin_comment: str) -> Optional[float]:
    """The limit (seconds) the watch's segment of an AdminComment says it set last (None: none)."""
    change = watch_change(admin_comment)
    return change[2] if change else None


def comment_fields(admin_comment: str) -> dict[str, str]:
    """The daemon's ``perfcast:v1 key=value ...`` record in an AdminComment, read from the part
    before the watch's segment only (the segment's reason may quote text the user chose, such as
    the path of their log, which must not pass for the daemon's fields)."""
    return parse_admin_comment(admin_comment.split(_SEGMENT)[0])


def _positive(text: Optional[str], kind: type) -> Any:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


# What the watch needs of a job's AdminComment to work without its record (slurm_plugin.policy
# writes them all): key -> what it is, for the reason when one is missing.
COMMENT_NEEDS = {"iters": "the planned iterations", "iter_s": "the predicted seconds per iteration",
                 "action": "whether perfcast set the limit", "rec_min": "the limit perfcast set"}


def record_from_comment(job: RunningJob) -> tuple[Optional[PredictionRecord], str]:
    """A stand-in for a running job's missing record, rebuilt from what the daemon wrote into its
    AdminComment at submission (``perfcast:v1 iter_s=0.5 iters=1000 total_min=9.2 platform=...
    bundle=... policy=fill action=set rec_min=12 [min_min=10] [user_min=...] rec=<id>``;
    :func:`slurm_plugin.policy.decide`): the planned iterations (``iters``), the predicted seconds
    per iteration (``iter_s``), the predicted total (``total_min``), whether perfcast set the
    limit (``action``) and which (``rec_min``, with ``action=set``), its ``--time-min``
    (``min_min``), platform, bundle and policy.  Whose job it is, its partition and its output
    come from Slurm (users cannot set an AdminComment, and slurmctld names the job's user).  The
    AdminComment has no checkpoint interval, no prediction interval and not the job file: a job
    rebuilt so cannot be extended to a checkpoint, and gives no harvestable run.  (None, what is
    missing) when a needed field is absent or not a number."""
    f = comment_fields(job.admin_comment)
    iters, iter_s = _positive(f.get("iters"), int), _positive(f.get("iter_s"), float)
    action = f.get("action", "")
    rec_min = _positive(f.get("rec_min"), int)
    missing = [k for k, ok in (("iters", iters), ("iter_s", iter_s), ("action", action in ("set", "keep", "advise")),
                               ("rec_min", rec_min is not None or action != "set")) if not ok]
    if missing:
        return None, "its AdminComment lacks " + ", ".join(
            f"{k}= ({COMMENT_NEEDS[k]})" if k not in f else f"a valid {k}= ({COMMENT_NEEDS[k]}; it says {f[k]!r})"
            for k in missing)
    if job.uid is None:
        return None, "scontrol names no UserId for it (the log is read as the job's user)"
    total_min = _positive(f.get("total_min"), float)
    rid = f.get(RECORD_KEY, "")
    return PredictionRecord(
        partition=job.partition, platform=f.get("platform", ""), bundle=f.get("bundle", ""), job={},
        iteration_seconds=iter_s, iterations=iters,
        total_seconds=60.0 * total_min if total_min else iters * iter_s,
        time_limit_minutes=rec_min if action == "set" else None,
        time_min_minutes=_positive(f.get("min_min"), int) if action == "set" else None,
        recommended_minutes=rec_min, action=action, policy=f.get("policy", ""), std_out=job.std_out,
        std_err=job.std_err, work_dir=job.work_dir, job_name=job.name, uid=job.uid, gid=job.gid, user=job.user,
        record_id=rid if is_record_id(rid) else ""), ""


def submission_limit(admin_comment: str) -> Optional[float]:
    """The limit (seconds) the job had at submission as the daemon's AdminComment record tells:
    the one perfcast set (``action=set``: ``rec_min``), else the user's ``--time`` (``user_min``);
    None when it does not say."""
    f = comment_fields(admin_comment)
    minutes = _positive(f.get("rec_min") if f.get("action") == "set" else f.get("user_min"), int)
    return 60.0 * minutes if minutes else None


def first_limit_seen(job: RunningJob, limit: Optional[float]) -> Optional[float]:
    """The base of ``max_growth`` for a job the watch has no state of: its limit now -- unless its
    AdminComment shows the watch changed that limit before (the state went with a record store
    moved aside, or was not written while the store was locked), when it is the lowest of that, the
    limit at submission (:func:`submission_limit`) and the limit the watch's last change started
    from: the watch's earlier extensions do not raise the base of its next."""
    change = watch_change(job.admin_comment)
    if change is None or limit is None:
        return limit
    return min(v for v in (limit, change[1], submission_limit(job.admin_comment)) if v)


def job_name(job: "RunningJob | AccountingJob") -> str:
    """How Slurm names the job: ``ArrayJobId_ArrayTaskId`` for an array task (``76_2``; its own
    job id, 78, is what ``scontrol update`` takes), else its job id."""
    if job.array_job_id is not None and job.array_task_id is not None:
        return f"{job.array_job_id}_{job.array_task_id}"
    return str(job.job_id)


def limit_owner(job: RunningJob, record: PredictionRecord, watch_limit: Optional[float]) -> tuple[bool, str]:
    """Whether the job's current limit is perfcast's to correct, and when it is not, a note for the
    reason.  It is when perfcast set the job's limit at submission (``action == "set"``) and the
    limit is still the one perfcast set: the record's ``--time``, the last limit the watch set
    (``watch_limit``: the store, else the AdminComment's watch segment), or, before the watch set
    any, a limit between the record's ``--time-min`` and ``--time`` (the backfill scheduler may
    start a job with ``--time-min`` in a shorter slot).  Any other limit was changed since (``scontrol
    update`` by the user or an admin): it is theirs."""
    if record.action != "set":
        return False, ""
    limit = _limit_s(job)
    if limit is None:
        return True, ""
    ours = [60.0 * record.time_limit_minutes] if record.time_limit_minutes is not None else []
    if watch_limit is not None:
        ours.append(watch_limit)
    if not ours or any(abs(limit - v) < 30.0 for v in ours):
        return True, ""
    # (the user's own --time-min when perfcast set none: backfill uses it the same way)
    lo = record.time_min_minutes if record.time_min_minutes is not None else job.time_min_minutes
    hi = record.time_limit_minutes
    if watch_limit is None and lo is not None and hi is not None and 60.0 * lo - 30.0 <= limit <= 60.0 * hi:
        return True, ""
    who = (f"the watch set {_hm(watch_limit)}" if watch_limit is not None else
           f"perfcast set {_hm(60.0 * hi)} at submission" if hi is not None else "perfcast set it")
    return False, f" (changed to {_hm(limit)} after {who})"


def progress_of(timing: Optional[IterationTimes], log_stream: str = "", log_path: str = "") -> Optional[Progress]:
    if timing is None or timing.median_seconds is None or timing.last_iteration is None:
        return None
    recent = timing.recent()
    return Progress(iteration=timing.last_iteration, iteration_seconds=timing.median_seconds,
                    samples=len(timing.steady), log_format=timing.format,
                    planned_iterations=timing.planned_iterations, iterations_spanned=timing.iterations_spanned,
                    recent_seconds=recent.seconds if recent else None, recent_samples=recent.samples if recent else 0,
                    recent_span=recent.iterations_spanned if recent else None,
                    log_stream=log_stream, log_path=log_path)


def admin_comment_with(comment: str, decision: Decision, at: float, count: int) -> str:
    """The job's AdminComment with the watch's segment replaced by this action (one line; the
    perfcast record before it stays as it was)."""
    base = comment.split(_SEGMENT)[0].rstrip()
    stamp = _dt.datetime.fromtimestamp(at, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    what = (f"{decision.action} {_hm(decision.from_seconds)}->{_hm(decision.to_seconds)}"
            if decision.action != "none" else "none")
    why = " ".join(decision.reason.split())[:500]
    seg = f"{_SEGMENT} {what} at {stamp} ({why}); actions={count}"
    return (base + seg)[:4000]


# --------------------------------------------------------------------------------------------
# a pass

@dataclass(frozen=True)
class WatchOptions:
    records: Path
    policy: WatchPolicy
    out_dir: Optional[Path] = DEFAULT_OUT        # runs files (None: no harvestable runs written)
    dry_run: bool = False
    max_log_bytes: int = MAX_LOG_BYTES


@dataclass
class JobReport:
    job_id: int
    partition: str
    user: str
    decision: Decision
    applied: bool = False
    name: str = ""                 # how Slurm names it: ``76_2`` for an array task ("" = the job id)
    # Why the job was judged from its AdminComment, not its record ("" = from its record).
    from_comment: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self.decision)
        d.update(job_id=self.job_id, job=self.name or str(self.job_id), partition=self.partition, user=self.user,
                 applied=self.applied, from_comment=self.from_comment)
        return d


@dataclass
class WatchResult:
    jobs: list[JobReport] = field(default_factory=list)
    at: float = 0.0
    # What went wrong with the record store this pass (one line each; also logged as one warning).
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "jobs": [j.to_dict() for j in self.jobs], "warnings": list(self.warnings)}

    def summary(self) -> str:
        acted = [j for j in self.jobs if j.decision.action != "none"]
        lines = [f"watched {len(self.jobs)} running perfcast jobs: "
                 f"{sum(1 for j in acted if j.decision.action == 'extend')} extended, "
                 f"{sum(1 for j in acted if j.decision.action == 'shrink')} shrunk"]
        for j in self.jobs:
            d = j.decision
            head = (f"{d.action} {_hm(d.from_seconds)} -> {_hm(d.to_seconds)}"
                    + ("" if j.applied else " (not applied)") if d.action != "none" else "none")
            lines.append(f"  job {j.name or j.job_id} ({j.partition}, {j.user}): {head}: {d.reason}")
        return "\n".join(lines)


class _StoreReads:
    """The pass's reads of records: each job's record is tried (a corrupt file may still give most
    rows), until an error that every later read would repeat (a missing or foreign file, a lock
    held past the busy timeout: not one 5 s wait per job); the first error is kept for the pass's
    warning."""

    def __init__(self, store: RecordStore):
        self.store = store
        self.error: Optional[str] = None
        self.given_up = False

    def get(self, rid: str) -> tuple[Optional[PredictionRecord], str]:
        """The record (None: not there, or unreadable: then why)."""
        if self.given_up:
            return None, "unreadable"
        try:
            return self.store.get(rid), ""
        except RecordStoreError as exc:
            text = str(exc)
            self.error = self.error or text
            self.given_up = "malformed" not in text
            return None, "unreadable"


def _record_for(job: RunningJob, reads: _StoreReads) -> tuple[Optional[PredictionRecord], str, str]:
    """The job's record, why there is none, and -- for a record missing from the store (not kept,
    pruned, moved aside with the store) or unreadable there -- why the one returned was rebuilt
    from its AdminComment (:func:`record_from_comment`; no record returned: the AdminComment lacks
    what that needs).  A record that is there but names another job, uid or partition is never
    replaced so: that is a doubt, not a loss."""
    rid = comment_fields(job.admin_comment).get(RECORD_KEY, "")
    if not is_record_id(rid):
        missing = "its AdminComment names no record (no rec= id: the daemon kept none of this prediction)"
    else:
        record, failed = reads.get(rid)
        if record is not None:
            if record.slurm_job_id is not None and record.slurm_job_id not in (job.job_id, job.array_job_id) \
                    and not (job.array_job_id is not None and record.slurm_job_id > job.array_job_id):
                # (An array's tasks share one record, which the harvest of the first task to end
                # attaches to that task's own id: one Slurm gave it after the array's.)
                return None, f"record {rid} belongs to job {record.slurm_job_id}", ""
            if record.uid is None or job.uid is None or record.uid != job.uid:
                return None, f"record {rid} is uid {record.uid}'s, the job uid {job.uid}'s", ""
            if record.partition and record.partition != job.partition:
                return None, f"ran in {job.partition}, predicted for {record.partition}", ""
            return record, "", ""
        missing = (f"record {rid} could not be read from the store" if failed else
                   f"record {rid} is not in the store")
    rebuilt, lacks = record_from_comment(job)
    if rebuilt is None:
        return None, f"{missing}, and {lacks}: nothing to work from", missing
    return rebuilt, "", missing


def _as_accounting(job: RunningJob) -> AccountingJob:
    return AccountingJob(job_id=job.job_id, state="RUNNING", partition=job.partition, name=job.name,
                         user=job.user, uid=job.uid, work_dir=job.work_dir, std_out=job.std_out,
                         std_err=job.std_err, node_list=job.node_list, batch_host=job.batch_host,
                         admin_comment=job.admin_comment, array_job_id=job.array_job_id,
                         array_task_id=job.array_task_id, source="scontrol")


def read_logs(items: Sequence[tuple[Any, str, int, Optional[int]]], policy: WatchPolicy,
              max_bytes: int = MAX_LOG_BYTES) -> dict[Any, "bytes | str"]:
    """``(key, path, uid, gid)`` -> the log tail (bytes) or why not (str), by key (a job id, or a
    job id and stream), read in parallel (at most ``max_parallel_reads`` at once, each within
    ``read_timeout_seconds``, all within ``pass_budget_seconds``)."""
    out: dict[Any, "bytes | str"] = {}
    if not items:
        return out
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(policy.max_parallel_reads, len(items)),
                                                 thread_name_prefix="watch-read")
    futures = {pool.submit(read_tail_as, path, uid, gid, max_bytes=max_bytes,
                           timeout_s=policy.read_timeout_seconds): jid for jid, path, uid, gid in items}
    try:
        for fut in concurrent.futures.as_completed(futures, timeout=policy.pass_budget_seconds):
            jid = futures[fut]
            try:
                out[jid] = fut.result()
            except LogReadError as exc:
                out[jid] = f"log unreadable: {exc.strerror or exc}"
            except Exception as exc:  # noqa: BLE001 - one job's read never stops the pass
                out[jid] = f"log unreadable: {exc}"
    except concurrent.futures.TimeoutError:
        for jid in futures.values():
            out.setdefault(jid, f"log not read within the pass budget ({policy.pass_budget_seconds:g} s)")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return out


@dataclass(frozen=True)
class _LogRead:
    """What the job's files (StdOut, and StdErr when separate) gave: the timing of the one that
    says the most (None: none had a line of any format), where it came from, and the reads that
    failed."""

    timing: Optional[IterationTimes]
    stream: str
    path: str
    failed: tuple[str, ...]            # "<why> (<stream> <path>)" of each file not read
    paths: tuple[tuple[str, str], ...]

    def files(self) -> str:
        return " and ".join(f"{s} {p}" for s, p in self.paths)


def _pick_log(job_id: int, paths: Sequence[tuple[str, str]], data: Mapping[Any, "bytes | str"],
              max_bytes: int) -> _LogRead:
    timings: list[Optional[IterationTimes]] = []
    failed = []
    for stream, path in paths:
        got = data.get((job_id, stream), "log not read")
        if isinstance(got, str):
            failed.append(got if len(paths) == 1 else f"{got} ({stream} {path})")
            timings.append(None)
            continue
        if len(got) >= max_bytes:          # a cut tail starts mid-line: drop that fragment
            got = got[got.find(b"\n") + 1:]
        timings.append(iteration_times(got))
    pick = best_log(timings)
    stream, path = paths[pick] if pick is not None else paths[0]
    return _LogRead(timings[pick] if pick is not None else None, stream, path, tuple(failed), tuple(paths))


def watch_once(opts: WatchOptions, client: Optional[SlurmClient] = None, *,
               now: Optional[float] = None) -> WatchResult:
    """One pass over the running jobs (see the module docstring)."""
    policy = opts.policy
    client = client or SlurmClient(timeout=60.0)
    res = WatchResult(at=time.time() if now is None else now)
    if not policy.enabled:
        return res
    try:
        running = client.running_jobs()
    except SlurmError as exc:
        raise WatchError(f"cannot list running jobs: {exc}") from None
    jobs = [j for j in running if RECORD_TAG in j.admin_comment and policy.watches(j.partition)]
    if not jobs:
        return res
    # A missing, corrupt or locked store stops nothing: each job's record is read where it can be,
    # else rebuilt from its AdminComment; the watch's own tables fall back to memory for the pass.
    reads = _StoreReads(RecordStore(opts.records, create=False))
    wlog = PassLog(WatchLog(opts.records))
    extended_by_comment = _comment_extended(jobs)
    # Facts every extension needs; any of them missing closes extensions (shrinks need none).
    doubt = ""
    part_qos: dict[str, str] = {}
    try:
        parts = client.partitions()
        max_time = {p.name: p.max_time_minutes for p in parts}
        part_qos = partition_qos(parts)
    except SlurmError as exc:
        max_time, doubt = {}, f"partition limits unreadable ({exc})"
    try:
        planned = client.planned_starts()
    except SlurmError as exc:
        planned, doubt = [], doubt or f"the backfill plan is unreadable ({exc})"
    walls, walls_error = _wall_limits(client)
    doubt = doubt or walls_error
    try:
        reservations = client.reservations()
    except SlurmError as exc:
        reservations, doubt = [], doubt or f"reservations unreadable ({exc})"

    todo: list[tuple[RunningJob, PredictionRecord, list[tuple[str, str]], str]] = []
    log_reads: list[tuple[Any, str, int, Optional[int]]] = []
    lacking: list[str] = []
    for job in sorted(jobs, key=lambda j: j.job_id):
        record, why, from_comment = _record_for(job, reads)
        if record is None:
            res.jobs.append(JobReport(job.job_id, job.partition, job.user,
                                      _none("no-record", why, _limit_s(job)), name=job_name(job)))
            if from_comment:              # missing, and its AdminComment lacks what the watch needs
                lacking.append(job_name(job))
            continue
        skip = _skip_reason(job)
        paths = log_paths(_as_accounting(job), record)
        if not skip and not paths:
            skip = ("no-log", "no output path (no --output and no absolute working directory)")
        if skip:
            _finish(res, wlog, job, record, _none(skip[0], skip[1], _limit_s(job)), None, opts, client,
                    from_comment)
            continue
        todo.append((job, record, paths, from_comment))
        log_reads.extend(((job.job_id, stream), path, record.uid, record.gid) for stream, path in paths)
    data = read_logs(log_reads, policy, opts.max_log_bytes)
    t = res.at
    for job, record, paths, from_comment in todo:
        def finish(decision: Decision, progress: Optional[Progress] = None) -> None:
            _finish(res, wlog, job, record, decision, progress, opts, client, from_comment)
        got = _pick_log(job.job_id, paths, data, opts.max_log_bytes)
        limit = _limit_s(job)
        timing = got.timing
        progress = progress_of(timing, got.stream, got.path)
        # Slurm counts the limit against the job's RunTime, which leaves out time suspended.
        elapsed = job.run_seconds if job.run_seconds is not None else (t - job.start if job.start else 0.0)
        run_start = t - elapsed
        if progress is None:
            if got.failed and (timing is None or timing.median_seconds is None):
                why = "; ".join(got.failed)
                if timing is not None or len(got.failed) < len(paths):
                    why += f"; no iteration times after warm-up in {got.stream} {got.path}"
                finish(_none("unreadable", why, limit))
                continue
            no_times = timing is None or timing.median_seconds is None
            grace = starting_seconds(record, policy.for_partition(job.partition).min_samples)
            if no_times and elapsed < grace:
                # A job still starting has printed no iteration yet: warming up, not news.
                finish(_none("warm-up", f"no iteration time in its log yet after {elapsed / 60:.0f} min: still "
                             f"starting (the prediction allows {grace / 60:.0f} min)", limit))
                continue
            why = ("no iteration times after warm-up in its log (Megatron, GPT-NeoX, NeMo, DeepSpeed formats; "
                   f"read {got.files()})" if no_times else
                   f"its {timing.format} log lines carry no iteration number: where the job is is unknown")
            finish(_none("no-samples", why, limit))
            continue
        span = progress.iterations_spanned or 0
        claims = ""
        if progress.iteration_seconds * max(span, 1) > _CLAIM_FACTOR * max(elapsed, 1.0):
            claims = f"{progress.iteration_seconds:.4g} s/iter over {span} iterations"
        elif progress.recent_seconds is not None and progress.recent_span and \
                progress.recent_seconds * progress.recent_span > _CLAIM_FACTOR * max(elapsed, 1.0):
            claims = (f"{progress.recent_seconds:.4g} s/iter over its last {progress.recent_span} iterations")
        if claims:
            finish(_none("claims", f"the log claims {claims}, more than the job's {elapsed:.0f} s of running: "
                         "not acting on it", limit), progress)
            continue
        state = wlog.job(job.job_id)
        # When the log last moved, as the job's run time (JobState.progress_at): a job suspended
        # for longer than stall_minutes has not stalled.  A value past the run time now is no run
        # time of this job (a UNIX time an older watch kept): counting starts again now.
        if state is None or state.last_iteration is None or progress.iteration > state.last_iteration \
                or state.progress_at is None or state.progress_at > elapsed:
            progress_at = elapsed
        else:
            progress_at = state.progress_at
        first_limit = state.first_limit_seconds if state is not None else first_limit_seen(job, limit)
        pol = policy.for_partition(job.partition)
        if not opts.dry_run:
            wlog.put_job(JobState(job.job_id, record.record_id, first_limit, progress.iteration, progress_at,
                                  state.last_code if state else "",
                                  state.run_iteration_seconds if state else None, t))
        if elapsed - progress_at > pol.stall_minutes * 60.0:
            finish(_none("stalled", f"no new iteration for {(elapsed - progress_at) / 60:.0f} min of run time "
                         f"(stall_minutes {pol.stall_minutes:g}; time suspended not counted): not progressing",
                         limit), progress)
            continue
        changes = [a for a in wlog.actions(slurm_job_ids=[job.job_id]) if a.action != "none"]
        watch_limit = changes[-1].to_seconds if changes else watch_set_limit(job.admin_comment)
        perfcast_limit, owner_note = limit_owner(job, record, watch_limit)
        shrunk = [a.from_seconds for a in changes if a.action == "shrink" and a.from_seconds is not None]
        told = watch_change(job.admin_comment)
        if not changes and told is not None and told[0] == "shrink" and told[1] is not None:
            shrunk = [told[1]]          # the store lost the shrink; the AdminComment tells it
        restore = max(shrunk) if shrunk and perfcast_limit else None
        limits = dataclasses.replace(
            _limits(job, pol, {} if max_time_lifted(job, walls) else max_time, wall_cap(job, walls, part_qos),
                    planned, wlog, first_limit, limit, t,
                    run_start, reservations, extended_by_comment),
            restore_seconds=restore)
        decision = decide(now=t, start=run_start, limit_seconds=limit, record=record,
                          progress=progress, policy=pol, limits=limits,
                          perfcast_limit=perfcast_limit, user_limit_note=owner_note)
        if decision.action == "extend":
            why = doubt or wall_doubt(job, walls)
            if why:
                decision = _none("doubt", f"{why}: not extending ({decision.reason})", limit)
        if decision.action == "shrink" and from_comment:
            # Rebuilt from the AdminComment, the plan is the daemon's but nothing else the record
            # held is: protect the job, return nothing on that basis.
            decision = _none("no-shrink", decision.reason.replace(" back to backfill", " could go back to backfill")
                             + "; not shrunk: working from its AdminComment, the watch extends but never shrinks",
                             limit)
        finish(decision, progress)
    _warn(res, opts.records, reads, wlog, lacking)
    return res


def _wall_limits(client: SlurmClient) -> tuple[Optional[WallLimits], str]:
    """The QOS and association MaxWall of the cluster, looked up once per pass
    (:func:`slurm_plugin.qos_limits.lookup_wall_limits`, the fill's lookup), and why they are
    unknown ("" when they are known).  Unknown, no job is extended this pass (a doubt, as for
    MaxTime): the watch updates limits as root, past any QOS limit, so a cap it cannot read could be
    overrun -- where the fill, whose job Slurm still holds to the QOS, goes on without it."""
    try:
        return lookup_wall_limits(client=client), ""
    except SlurmError as exc:
        return None, f"QOS and association limits unreadable ({exc})"


def partition_qos(parts: Sequence[PartitionInfo]) -> dict[str, str]:
    """Each partition's own QOS (slurm.conf ``QOS=``; scontrol's ``QoS``), as the fill reads it
    (``N/A``: none)."""
    out = {}
    for p in parts:
        q = str(p.raw.get("QoS", "")).strip()
        if q and q not in ("N/A", "(null)"):
            out[p.name] = q
    return out


def wall_cap(job: RunningJob, walls: Optional[WallLimits], part_qos: Mapping[str, str]) -> Optional[WallCap]:
    """The QOS or association MaxWall Slurm holds the running job to, as the fill caps a limit
    (:meth:`slurm_plugin.qos_limits.WallLimits.cap`: the partition's QOS and the job's in Slurm
    22.05's order, else its association's chain; none unless AccountingStorageEnforce has limits);
    None when none applies or the limits could not be looked up.  The QOS and account are the ones
    scontrol names for the running job (a job without an account -- ``(null)`` -- gets the user's
    default, as the fill would)."""
    if walls is None:
        return None
    return walls.cap(user=job.user or None, account=job.account or None, qos=job.qos or None,
                     partition=job.partition, partition_qos=part_qos.get(job.partition))


def max_time_lifted(job: RunningJob, walls: Optional[WallLimits]) -> bool:
    """Whether the running job's QOS has flag ``PartitionTimeLimit``
    (:meth:`slurm_plugin.qos_limits.WallLimits.lifts_max_time`): Slurm lets its limit exceed the
    partition's MaxTime, so the watch may extend it past MaxTime too (the MaxWalls still cap it)."""
    return walls is not None and walls.lifts_max_time(user=job.user or None, account=job.account or None,
                                                      qos=job.qos or None, partition=job.partition)


def wall_doubt(job: RunningJob, walls: Optional[WallLimits]) -> str:
    """Why the job's MaxWall cannot be known although Slurm enforces limits ("" when it can): its
    QOS, or its association (where any association has a MaxWall), is not in what sacctmgr listed
    (an answer older than the job's, say).  The fill then adds no cap, and Slurm still holds the
    job; the watch, which updates limits as root past any such limit, extends nothing."""
    if walls is None or not walls.enforced:
        return ""
    if job.qos and job.qos not in walls.qos:
        return f"QOS {job.qos!r} unknown to sacctmgr"
    if job.account and walls.any_assoc_wall and \
            walls.association(job.user or None, job.account, job.partition) is None:
        return (f"no association of user {job.user}, account {job.account} (partition {job.partition} or all) "
                "in sacctmgr")
    return ""


def _limit_s(job: RunningJob) -> Optional[float]:
    return None if job.time_limit_minutes is None else 60.0 * job.time_limit_minutes


def _skip_reason(job: RunningJob) -> Optional[tuple[str, str]]:
    if job.het_job_id is not None:
        return ("het", "heterogeneous job: its components have limits of their own; not watched")
    if job.restarts > 0:
        return ("requeued", f"requeued ({job.restarts} restarts): its log mixes runs; not watched")
    if job.start is None:
        return ("no-start", "no start time")
    if job.time_limit_minutes is None:
        return ("unlimited", "no time limit to correct")
    return None


def _limits(job: RunningJob, policy: WatchPolicy, max_time: Mapping[str, Optional[int]],
            wall: Optional[WallCap], planned: Sequence[PlannedStart], wlog: "WatchLog | PassLog",
            first_limit: Optional[float], limit: Optional[float], now: float, run_start: float,
            reservations: Sequence[Reservation] = (),
            extended_by_comment: Optional[Mapping[str, float]] = None) -> Limits:
    """The caps, as limits (seconds of run time): an end at wall time ``e`` is a limit of
    ``e - run_start`` (``run_start``: now minus the job's RunTime).  ``extended_by_comment``
    (:func:`_comment_extended`) counts the user's extensions when the watch's tables cannot be read.
    ``wall``: the QOS or association MaxWall that applies (:func:`wall_cap`)."""
    mt = max_time.get(job.partition)
    user_s = None
    if policy.user_extra_hours > 0 and limit is not None:
        used = wlog.extended_seconds(job.user, now - 86400.0)
        if getattr(wlog, "read_error", None) and extended_by_comment:
            used = max(used, extended_by_comment.get(job.user, 0.0))
        user_s = limit + max(0.0, policy.user_extra_hours * 3600.0 - used)
    try:
        nodes = expand_hostlist(job.node_list)
    except SlurmError:
        nodes = ()
    fair_end, fair_job = fairness_cap(job, planned, nodes, policy.backfill_allowance_minutes * 60.0)
    resv_start, resv_name = reservation_cap(job, reservations, nodes, now)
    return Limits(max_time_seconds=60.0 * mt if mt is not None else None,
                  qos_max_seconds=60.0 * wall.minutes if wall is not None and wall.kind == "qos" else None,
                  assoc_max_seconds=60.0 * wall.minutes if wall is not None and wall.kind == "assoc" else None,
                  growth_seconds=first_limit * (1.0 + policy.max_growth) if first_limit else None,
                  user_seconds=user_s,
                  fairness_seconds=(fair_end - run_start) if fair_end is not None else None,
                  fairness_job=fair_job,
                  reservation_seconds=(resv_start - run_start) if resv_start is not None else None,
                  reservation_name=resv_name)


def _comment_extended(jobs: Sequence[RunningJob]) -> dict[str, float]:
    """Seconds of extension each user's running jobs hold, as their AdminComments tell: for a job
    whose last watch change was an extension, its limit now above the one at submission.  The
    per-user cap's count when the watch's tables cannot be read (a corrupt store): it misses the
    extensions of jobs that ended, so it never counts more than the store would."""
    out: dict[str, float] = {}
    for job in jobs:
        change, limit = watch_change(job.admin_comment), _limit_s(job)
        if change is None or change[0] != "extend" or limit is None:
            continue
        base = submission_limit(job.admin_comment) or change[1]
        if base:
            out[job.user] = out.get(job.user, 0.0) + max(0.0, limit - base)
    return out


def _finish(res: WatchResult, wlog: "WatchLog | PassLog", job: RunningJob, record: PredictionRecord,
            decision: Decision, progress: Optional[Progress], opts: WatchOptions, client: SlurmClient,
            from_comment: str = "") -> None:
    """Apply a decision (fail closed), tell the job's AdminComment and the store, and keep the
    measured rate as a harvestable run.  ``from_comment``: why the record was rebuilt from the
    AdminComment (said in the reason; such a job gives no run: its record's job file is lost)."""
    at = res.at
    applied = False
    if from_comment:
        reason = decision.reason.replace("the record names no checkpoint interval",
                                         "its AdminComment names no checkpoint interval (its record did)")
        decision = dataclasses.replace(decision, reason=f"{reason}; from its AdminComment ({from_comment})")
    if decision.action != "none" and not opts.dry_run:
        try:
            to = decision.to_minutes
            # Slurm refuses a limit below the job's TimeMin unless the update names a TimeMin too,
            # but changes no running job's TimeMin (22.05: only a pending job's): scontrol then
            # shows TimeMin above TimeLimit, and a requeued job restarts with at least its TimeMin.
            low_min = job.time_min_minutes is not None and job.time_min_minutes > to
            client.set_time_limit(job.job_id, to, time_min=to if low_min else None)
            applied = True
            if low_min:
                decision = dataclasses.replace(decision, reason=(
                    f"{decision.reason}; its TimeMin stays {_hm(job.time_min_minutes * 60.0)} (Slurm changes no "
                    "running job's TimeMin; requeued, the job restarts with at least it)"))
        except SlurmError as exc:
            decision = _none("update-failed", f"scontrol update failed ({exc}); the limit stays "
                             f"({decision.reason})", decision.from_seconds)
    state = wlog.job(job.job_id)
    new_code = decision.code
    write = decision.action != "none" or state is None or state.last_code != new_code
    rep = JobReport(job.job_id, job.partition, job.user, decision, applied, job_name(job), from_comment)
    res.jobs.append(rep)
    if opts.dry_run:
        return
    # The action reaches the store last, so whoever sees it (a report, an admin's harvest, a test
    # polling the store) finds the run it was measured from and the AdminComment that tells it.
    base = state or JobState(job.job_id, record.record_id, _limit_s(job), progress.iteration if progress else None,
                             at if progress else None)
    run_s = base.run_iteration_seconds
    if progress is not None and decision.code not in ("claims", "plan-mismatch", "warm-up") and opts.out_dir \
            and not from_comment:
        if run_s is None or abs(progress.iteration_seconds / run_s - 1.0) > _RUN_REWRITE:
            if _write_run(opts.out_dir, job, record, progress):
                run_s = progress.iteration_seconds
    if write:
        action = WatchAction(
            slurm_job_id=job.job_id, record_id=record.record_id, partition=job.partition, user=job.user,
            action=decision.action, from_seconds=decision.from_seconds, to_seconds=decision.to_seconds,
            at=at, code=decision.code, reason=decision.reason,
            iteration=progress.iteration if progress else None,
            planned_iterations=record.iterations or None,
            measured_iteration_seconds=progress.iteration_seconds if progress else None,
            predicted_iteration_seconds=record.iteration_seconds or None,
            limit_set_by_perfcast=record.action == "set")
        # The user sees the last change of their limit; a later "none" (on track, no checkpoint
        # left to reach) would only hide it, and stays in the store.  Before any change, a none
        # that is news (an unreadable log, a job that will time out) is shown.
        before = wlog.actions(slurm_job_ids=[job.job_id])
        changed_before = any(a.action != "none" for a in before)
        if decision.action != "none" or (decision.code not in _QUIET and not changed_before):
            count = sum(1 for a in (*before, action) if a.code not in _QUIET)
            try:
                client.set_admin_comment(job.job_id, admin_comment_with(job.admin_comment, decision, at, count))
            except SlurmError as exc:
                log.warning("job %s: AdminComment not updated: %s", job_name(job), exc)
        wlog.add(action)
    wlog.put_job(dataclasses.replace(base, last_code=new_code, run_iteration_seconds=run_s, updated=at))


def _write_run(out_dir: Path, job: RunningJob, record: PredictionRecord, progress: Progress) -> bool:
    """The running job's measured rate as ``slurm job <id>`` of its partition's runs file (the job
    id, not an array task's ``A_a``: the harvest names the finished job's run so, and replaces this
    one by that name; the source names the task)."""
    try:
        tj = TrainingJob.from_dict(record.job)
    except JobError as exc:
        log.info("job %s: record's job unusable for a run: %s", job_name(job), exc)
        return False
    run = MeasuredRun(
        name=f"slurm job {job.job_id}", job=tj, measured_iteration_seconds=progress.iteration_seconds,
        predicted_iteration_seconds=record.iteration_seconds if record.iteration_seconds > 0 else 0.0,
        source=(f"perf-calibrate watch: partition {record.partition}, record {record.record_id}, "
                + (f"array task {job_name(job)}, " if job.array_task_id is not None else "") + "RUNNING at "
                f"iteration {progress.iteration}, {progress.log_format} log, median of {progress.samples} "
                f"steady-state samples, platform {record.platform} bundle {record.bundle}")[:1000])
    try:
        merge_runs(out_dir, record.partition, [run])
    except RunsFileError as exc:
        log.warning("job %s: run not written: %s", job_name(job), exc)
        return False
    return True


_CORRUPT_ADVICE = (
    "to keep its records, recover them before moving it aside (as root, perf-predictd and the watch and harvest "
    "timers stopped: sqlite3 records.sqlite \".recover\" | sqlite3 recovered.sqlite, or .dump where .recover "
    "is not built in, as in Debian's and Ubuntu's sqlite3; docs/harvest.md \"When the store is damaged\"); moved "
    "aside without that, every running job loses its record: the watch then works from its AdminComment "
    "(extends, never shrinks) and the harvest cannot match it")


def _store_problem(text: str) -> str:
    """A record store error as the watch says it: records.py's short advice is replaced by what
    moving it aside costs and how to keep the rows."""
    text = text.replace(f": {DAMAGED_ADVICE}", "")
    low = text.lower()
    if "corrupt" in low or "malformed" in low or "not a database" in low:
        return f"{text}; {_CORRUPT_ADVICE}"
    if "database is locked" in low:
        return f"{text} (another process has held its write lock for more than {BUSY_TIMEOUT_S:g} s)"
    return text


def _warn(res: WatchResult, path: Path, reads: _StoreReads, wlog: PassLog, lacking: Sequence[str]) -> None:
    """The pass's one warning about the record store (into ``res.warnings`` and the log): what
    failed, what the pass did without it, whether any limit changed, and that the next pass
    retries."""
    rebuilt = [j for j in res.jobs if j.from_comment]
    problem = reads.error or wlog.read_error or wlog.write_error
    if not problem and not rebuilt and not lacking:
        return
    n = len(rebuilt) + len(lacking)
    parts = [_store_problem(problem) if problem else
             f"{path}: {n} running perfcast job{'s' if n != 1 else ''} without a record there (the store they "
             "were kept in was moved aside, or pruned, or none was kept)"]
    if wlog.write_error and wlog.write_error != problem and "locked" in wlog.write_error:
        parts.append(_store_problem(wlog.write_error))       # records read, the watch's writes locked out
    if rebuilt:
        ext = sum(1 for j in rebuilt if j.applied and j.decision.action == "extend")
        parts.append(f"{len(rebuilt)} running job{'s' if len(rebuilt) != 1 else ''} worked from "
                     f"{'their AdminComments' if len(rebuilt) != 1 else 'its AdminComment'} "
                     f"({ext} extended; never shrunk): {', '.join(j.name for j in rebuilt[:20])}"
                     + (", ..." if len(rebuilt) > 20 else ""))
    if lacking:
        parts.append(f"{len(lacking)} left alone, their AdminComments lacking what the watch needs: "
                     f"{', '.join(lacking[:20])}" + (", ..." if len(lacking) > 20 else ""))
    if wlog.write_error or wlog.read_error:
        parts.append(f"{wlog.unrecorded} of this pass's actions not recorded in the store (changes are told in "
                     "the jobs' AdminComments)" if wlog.unrecorded else
                     "the watch's own state kept in memory for this pass")
    changed = [j for j in res.jobs if j.applied]
    parts.append("no limits were changed this pass" if not changed else
                 f"limits changed this pass: {', '.join(j.name for j in changed[:20])}"
                 + (", ..." if len(changed) > 20 else ""))
    if problem:
        parts.append("the next pass retries the store")
    text = "; ".join(parts)
    res.warnings.append(text)
    log.warning("%s", text)


__all__ = ["COMMENT_NEEDS", "Decision", "Limits", "Progress", "WARNINGS_EXIT_STATUS", "WATCH_TAG", "WatchError",
           "WatchOptions", "WatchResult", "admin_comment_with", "comment_fields", "decide", "fairness_cap",
           "first_limit_seen", "job_name", "limit_owner", "max_time_lifted", "partition_qos", "progress_of", "read_logs",
           "record_from_comment", "reservation_cap", "starting_seconds", "submission_limit", "wall_cap",
           "watch_change", "watch_once", "watch_set_limit"]
