"""The time-limit policy: from a prediction and what the user asked, what Slurm should get.

Per partition (see :mod:`slurm_plugin.siteconfig`):

- ``fill`` (default): no ``--time`` -> predicted total x (1 + margin) + startup, rounded *up* to
  ``round_minutes`` -- or, with ``cover_interval`` (default), the total at the prediction's upper
  bound at ``fill_level`` (default 0.98: its interval's upper end, widened from 95 % to 98 %) if
  that is longer: on a platform whose measured runs show it under-predicts (vista-gh200 by up to
  37 %), a 15 % margin would get jobs killed -- capped at the partition's MaxTime, or at the
  job's QOS or association MaxWall when that is shorter (:class:`WallCap`, found by
  :mod:`slurm_plugin.qos_limits`), with a warning saying how many iterations fit.  With ``time_min``
  (default) ``--time-min`` is set too, to the point prediction + startup, so that backfill may
  start the job in a shorter hole (Slurm lowers the limit no further than that).  ``--time``
  given -> kept, with a warning when the job would be killed before it finishes (at which
  iteration), when it asks for more than ``over_ask_factor`` x the prediction (long limits hurt
  backfill), or when it exceeds the partition's MaxTime or the QOS/association MaxWall (the job
  would pend forever, or be rejected under the QOS flag DenyOnLimit).
- ``advise``: never change the limit; the user gets the recommendation and the warnings.
- ``enforce``: the recommended limit replaces a user's ``--time`` too.
- ``off``: nothing (the daemon does not even predict).

perfcast never rejects a job: every outcome here is "set this limit" or "leave it".
The record written to the job's AdminComment (``perfcast:v1 key=value ...``) lets predictions be
compared with actual run times later; its first five keys are fixed, more may follow.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

from predictor.interval import upper_at_level

from .siteconfig import FILL_LEVEL, PartitionPolicy

RECORD_TAG = "perfcast:v1"
# Slurm's "no limit" markers as they reach job_submit.lua (NO_VAL, INFINITE).
NO_VAL = 0xFFFFFFFE
INFINITE = 0xFFFFFFFF


@dataclass(frozen=True)
class PredictionFacts:
    """The few numbers of a ``predictor.Prediction`` the policy needs (keeps this module pure)."""

    iteration_seconds: float
    iterations: int
    total_seconds: float
    platform: str
    bundle: str
    interval_seconds: tuple[float, float] = (0.0, 0.0)
    # The prediction's own start-up (platform [overheads] startup_seconds: launch, NCCL init, model
    # build), inside total_seconds; 0 when unknown (then the site's allowance is simply added).
    startup_seconds: float = 0.0
    # Whose fitted factors predicted it (the prediction's details.kind): "kind", "partition",
    # "platform" (a site's fit) or "none"/"" (none), the job's kind key and that kind's run count.
    factors: str = ""
    kind: str = ""
    kind_runs: int = 0

    @property
    def overhead_seconds(self) -> float:
        """Everything in the total that is not training iterations (startup, eval, checkpoints)."""
        return max(0.0, self.total_seconds - self.iterations * self.iteration_seconds)


@dataclass(frozen=True)
class WallCap:
    """A MaxWall of Slurm's accounting that applies to the job beside its partition's MaxTime
    (:mod:`slurm_plugin.qos_limits` finds it): ``kind`` ``"qos"`` (``name``: the QOS) or
    ``"assoc"`` (``name``: ``user/account``, the association's user and account)."""

    minutes: int
    kind: str
    name: str

    @property
    def who(self) -> str:
        """What allows it: ``QOS long`` / ``user alice's association in account proj``."""
        if self.kind == "qos":
            return f"QOS {self.name}"
        user, _, account = self.name.partition("/")
        return f"user {user}'s association in account {account}"

    @property
    def what(self) -> str:
        """The limit by name: ``QOS long's MaxWall`` / ``the MaxWall of user alice's association
        in account proj`` (as "the partition's MaxTime" is written)."""
        return f"{self.who}'s MaxWall" if self.kind == "qos" else f"the MaxWall of {self.who}"

    @property
    def pending_reason(self) -> str:
        """The reason Slurm shows for a job pending on it."""
        return "QOSMaxWallDurationPerJobLimit" if self.kind == "qos" else "AssocMaxWallDurationPerJobLimit"


@dataclass(frozen=True)
class Decision:
    """What to do with the job: a new limit (or None = leave it), the record, the user's line."""

    time_limit_minutes: Optional[int]
    recommended_minutes: int
    admin_comment: str
    message: str
    warnings: list[str] = field(default_factory=list)
    action: str = "keep"       # set | keep | advise
    time_min_minutes: Optional[int] = None    # --time-min to set (None: leave it)


def normalize_limit(minutes: Optional[int]) -> Optional[int]:
    """A time limit as job_submit.lua sends it; None when the user gave none (NO_VAL / absent)."""
    if minutes is None or minutes in (NO_VAL, INFINITE) or minutes < 0:
        return None
    return int(minutes)


def normalize_max_time(minutes: Optional[int]) -> Optional[int]:
    """A partition MaxTime; None = unlimited (INFINITE, NO_VAL, absent or 0)."""
    if minutes is None or minutes in (NO_VAL, INFINITE) or minutes <= 0:
        return None
    return int(minutes)


def startup_seconds(pred: PredictionFacts, part: PartitionPolicy) -> float:
    """Start-up counted once: the site's ``startup_minutes`` allowance and the prediction's own
    start-up cover the same time (from the job's start to its first iteration), so the longer of
    the two stands, never their sum (docs: packaging/INSTALL.md, "Policies")."""
    return max(part.startup_minutes * 60.0, pred.startup_seconds)


def _without_startup(total_seconds: float, pred: PredictionFacts) -> float:
    return max(0.0, total_seconds - pred.startup_seconds)


def upper_total_seconds(pred: PredictionFacts, level: float = FILL_LEVEL) -> float:
    """The job's total with every iteration at the upper bound at one-sided ``level``: the
    interval's upper end with its log half-width scaled from its own level (1 − α/2) to ``level``
    (:func:`predictor.interval.upper_at_level`; benchmarks/bench_fit_transfer.py --site counts the
    kills it leaves)."""
    upper = upper_at_level(pred.iteration_seconds, pred.interval_seconds[1], level)
    extra = max(0.0, upper - pred.iteration_seconds)
    return pred.total_seconds + pred.iterations * extra


def recommended_minutes(pred: PredictionFacts, part: PartitionPolicy) -> int:
    """max(predicted total x (1 + margin), the upper total at ``fill_level`` if ``cover_interval``) +
    startup, rounded up to ``round_minutes`` (at least one step)."""
    upper = upper_total_seconds(pred, part.fill_level) if part.cover_interval else 0.0
    return _recommended(pred, part, startup_seconds(pred, part), upper)


def _recommended(pred: PredictionFacts, part: PartitionPolicy, startup_s: float, upper_s: float) -> int:
    """:func:`recommended_minutes` from its start-up and upper total, computed once by the caller."""
    seconds = _without_startup(pred.total_seconds, pred) * (1.0 + part.margin)
    if part.cover_interval:
        seconds = max(seconds, _without_startup(upper_s, pred))
    return _round_up((seconds + startup_s) / 60.0, part.round_minutes)


def _round_up(minutes: float, step: int) -> int:
    """Up to a multiple of ``step`` minutes (at least one step)."""
    # A hair of tolerance so that exactly 30.0000001 minutes does not become 35.
    return max(step, int(math.ceil(minutes / step - 1e-9)) * step)


def iterations_within(minutes: float, pred: PredictionFacts, part: PartitionPolicy,
                      iteration_seconds: Optional[float] = None) -> int:
    """How many iterations complete within ``minutes`` (startup and fixed overheads first), at
    the predicted rate or at ``iteration_seconds`` (the interval's upper end, say)."""
    per = pred.iteration_seconds if iteration_seconds is None else iteration_seconds
    if per <= 0:
        return pred.iterations
    usable = minutes * 60.0 - startup_seconds(pred, part) - (pred.overhead_seconds - pred.startup_seconds)
    return max(0, min(pred.iterations, int(usable // per)))


def point_minutes(pred: PredictionFacts, part: PartitionPolicy) -> int:
    """The point prediction + startup, rounded up to ``round_minutes`` (the --time-min)."""
    return _round_up(needed_seconds(pred, part) / 60.0, part.round_minutes)


def needed_seconds(pred: PredictionFacts, part: PartitionPolicy) -> float:
    """The point prediction with start-up counted once (:func:`startup_seconds`)."""
    return _without_startup(pred.total_seconds, pred) + startup_seconds(pred, part)


def decide(pred: PredictionFacts, user_limit: Optional[int], part: PartitionPolicy,
           max_time: Optional[int] = None, wall: Optional[WallCap] = None,
           user_time_min: Optional[int] = None) -> Decision:
    """Apply the partition's policy.  ``user_limit`` / ``max_time`` are minutes or None;
    ``wall``: the QOS or association MaxWall that applies to the job (None: none);
    ``user_time_min``: the user's own --time-min (minutes or None)."""
    user_limit = normalize_limit(user_limit)
    user_time_min = normalize_limit(user_time_min)
    cap = part.max_time_minutes if part.max_time_minutes is not None else normalize_max_time(max_time)
    # The shorter of the partition's MaxTime and the accounting's MaxWall binds (the partition's
    # when they are equal); ``by`` is the MaxWall when it is the one that binds.
    by: Optional[WallCap] = None
    if wall is not None and wall.minutes > 0 and (cap is None or wall.minutes < cap):
        cap, by = int(wall.minutes), wall
    # Each figure once: the upper bound costs two normal quantiles, and the message repeats some.
    startup_s = startup_seconds(pred, part)
    upper_s = upper_total_seconds(pred, part.fill_level) if part.cover_interval else 0.0
    rec = _recommended(pred, part, startup_s, upper_s)
    warnings: list[str] = []
    capped = cap is not None and rec > cap
    if capped:
        fit = iterations_within(cap, pred, part)
        allows = by.who if by is not None else (part.name or 'the partition')
        if fit < pred.iterations:
            warnings.append(
                f"needs about {_hm(rec)} but {allows} allows {_hm(cap)}: "
                f"only about {fit} of {pred.iterations} iterations fit; checkpoint and resubmit")
        else:
            # The cap lies between the point prediction and the limit that covers its interval:
            # every iteration fits at the predicted rate, not at the interval's upper end.
            safe_rate = (upper_at_level(pred.iteration_seconds, pred.interval_seconds[1], part.fill_level)
                         if part.cover_interval else pred.iteration_seconds * (1.0 + part.margin))
            hi = iterations_within(cap, pred, part, max(safe_rate, pred.iteration_seconds))
            bound = (f"the prediction's {100 * part.fill_level:g} % upper bound" if part.cover_interval
                     else f"{part.margin:.0%} over the prediction")
            warnings.append(
                f"needs about {_hm(rec)} to be safe but {allows} allows {_hm(cap)}: all {pred.iterations} "
                f"iterations fit at the predicted rate, only about {hi} at {bound}; checkpoint so that a "
                "resubmission can go on")
        rec = cap

    # One predicted figure everywhere in the message: the total with the site's start-up allowance.
    needed_min = needed_seconds(pred, part) / 60.0
    needed_hm = _hm(needed_min)
    action = "keep"
    new_limit: Optional[int] = None
    time_min: Optional[int] = None
    raised_to_time_min = False
    if part.policy == "enforce" or (part.policy == "fill" and user_limit is None):
        new_limit, action = rec, "set"
        if user_time_min is not None:
            # The user's --time-min stands: Slurm refuses a limit below it ("Invalid time-min
            # specification"), so a filled limit is at least that (within the cap: above it Slurm
            # refuses the job whatever the limit), and perfcast sets no --time-min of its own.
            if new_limit < user_time_min and (cap is None or user_time_min <= cap):
                new_limit = rec = user_time_min     # (the AdminComment's rec_min is the limit set)
                raised_to_time_min = True
            elif cap is not None and user_time_min > cap:
                allows = by.who if by is not None else (part.name or 'the partition')
                warnings.append(f"--time-min {_hm(user_time_min)} is more than {allows} allows "
                                f"({_hm(cap)}): Slurm refuses such a job whatever its limit")
        elif part.time_min:
            point = point_minutes(pred, part)
            # Only below the limit: equal, it would say nothing; a capped job gets no time-min
            # (it cannot finish anyway, and a shorter limit would lose it more iterations).
            time_min = point if point < new_limit and not capped else None
    elif part.policy == "advise":
        action = "advise"

    over_max = over_wall = False
    if user_limit is not None:
        if cap is not None and user_limit > cap and by is not None:
            over_wall = True
            warnings.append(
                f"--time {_hm(user_limit)} exceeds {by.what} {_hm(cap)}: Slurm keeps such a job "
                f"pending ({by.pending_reason}) or rejects it; ask for --time={_slurm_time(min(rec, cap))}")
        elif cap is not None and user_limit > cap:
            over_max = True
            warnings.append(
                f"--time {_hm(user_limit)} exceeds {part.name or 'the partition'}'s MaxTime {_hm(cap)}: "
                f"Slurm keeps such a job pending (PartitionTimeLimit); ask for --time={_slurm_time(min(rec, cap))}")
        if user_limit < needed_min:
            at = iterations_within(user_limit, pred, part)
            what = "was" if action == "set" else "is"
            warnings.append(
                f"--time {_hm(user_limit)} {what} too short for the predicted {needed_hm}: "
                f"the job would be killed at about iteration {at} of {pred.iterations}")
        elif user_limit > part.over_ask_factor * needed_min and user_limit > rec:
            warnings.append(
                f"--time {_hm(user_limit)} is over {part.over_ask_factor:g}x the predicted "
                f"{needed_hm}; a shorter limit (e.g. --time={_slurm_time(rec)}) starts sooner via backfill")

    head = (f"perfcast: predicted {pred.iteration_seconds:.3g} s/iter x {pred.iterations} iters "
            f"= {needed_hm} with start-up on {pred.platform}{fit_note(pred)}")
    if action == "set" and user_limit is not None and user_limit != new_limit:
        tail = f"; time limit {_hm(user_limit)} replaced by {_hm(new_limit)} (site policy)"
    elif action == "set" and raised_to_time_min:
        tail = f"; time limit set to {_hm(new_limit)} (your --time-min, more than the prediction needs)"
    elif action == "set" and capped:
        limit_name = by.what if by is not None else "the partition's MaxTime"
        tail = f"; time limit set to {_hm(new_limit)} ({limit_name})"
    elif action == "set" and part.cover_interval and upper_s > pred.total_seconds * (1.0 + part.margin):
        tail = (f"; time limit set to {_hm(new_limit)} (the prediction's {100 * part.fill_level:g} % upper bound, "
                f"start-up {_hm(startup_s / 60.0)})")
    elif action == "set":
        tail = (f"; time limit set to {_hm(new_limit)} ({part.margin:.0%} margin, start-up "
                f"{_hm(startup_s / 60.0)})")
    elif user_limit is None:
        tail = f"; suggested --time={_slurm_time(rec)}"
    else:
        tail = f"; keeping --time {_hm(user_limit)}"
    if time_min is not None:
        tail += f", --time-min {_hm(time_min)} (backfill may start it in a shorter slot)"
    message = head + tail + "".join(f"; WARNING: {w}" for w in warnings)

    record = (f"{RECORD_TAG} iter_s={pred.iteration_seconds:.6g} iters={pred.iterations} "
              f"total_min={pred.total_seconds / 60.0:.1f} platform={_token(pred.platform)} "
              f"bundle={_token(pred.bundle)} policy={part.policy} action={action} rec_min={rec}"
              + (f" min_min={time_min}" if time_min is not None else "")
              + (f" user_min={user_limit}" if user_limit is not None else "")
              + (" warn=short" if any("too short" in w for w in warnings) else "")
              + (" warn=capped" if capped else "")
              + (f" cap={by.kind}" if capped and by is not None else "")
              + (" warn=overmax" if over_max else "")
              + (" warn=overwall" if over_wall else "")
              + (" warn=overask" if any("backfill" in w for w in warnings) else ""))
    return Decision(time_limit_minutes=new_limit, recommended_minutes=rec, admin_comment=record,
                    message=message, warnings=warnings, action=action, time_min_minutes=time_min)


def fit_note(pred: PredictionFacts) -> str:
    """`` (site fit ...)`` when factors a site fitted on its finished jobs predicted the job (a
    shipped platform has none), so a user and an admin see that the site's learning applied."""
    if pred.factors == "kind":
        return f" (site fit for its kind {pred.kind}, {pred.kind_runs} run{'s' if pred.kind_runs != 1 else ''})"
    if pred.factors == "partition":
        return f" (site fit; none for its kind {pred.kind})" if pred.kind else " (site fit)"
    if pred.factors == "platform":
        return " (site fit)"
    return ""


def slurm_duration(seconds: float) -> str:
    """A duration as Slurm writes and --time reads one: ``HH:MM:SS``, ``D-HH:MM:SS`` past a day
    (whole seconds, rounded up). perfcast's one spelling of a duration wherever users read one."""
    total = max(0, int(math.ceil(seconds - 1e-6)))
    d, rem = divmod(total, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def plural(n: int, word: str) -> str:
    """``1 checkpoint``, ``20,000 iterations``: a count as users read it."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _slurm_time(minutes: float) -> str:
    """Whole minutes (rounded up) as Slurm's duration, for --time=… suggestions."""
    return slurm_duration(int(math.ceil(minutes - 1e-9)) * 60.0)


_hm = _slurm_time


def _token(text: str) -> str:
    """One whitespace-free token for the record (platform names and bundle ids normally are)."""
    text = str(text)
    if not (text.isprintable() and _SPACE.search(text) is None):   # (the rare case: char by char)
        text = "".join(c if c.isprintable() and not c.isspace() else "_" for c in text)
    return text[:80] or "-"


_SPACE = re.compile(r"\s")
