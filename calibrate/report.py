"""``perf-calibrate report``: how perfcast's predictions and limits did on the jobs that finished.

Reads the record store (what perf-predictd answered, :mod:`slurm_plugin.records`) joined with the
outcomes ``perf-calibrate harvest`` stored.  Per job: state, elapsed seconds, time limit, predicted
and measured seconds per iteration, predicted total.  Per partition:

- **iteration MAPE** and **signed mean error** (predicted / measured - 1: < 0 is an
  under-prediction, the sign of :attr:`predictor.validation.MeasuredRun.error`), over the jobs
  whose log gave an iteration time;
- **interval coverage**: the share of those whose measured time lies inside the interval the
  prediction gave;
- **timeouts at a perfcast limit**: jobs that ended TIMEOUT at a ``--time`` perfcast set (the
  failure a too-short prediction causes);
- **over-reservation**: time limit / elapsed of jobs that COMPLETED (median and 90th percentile),
  for limits perfcast set and, apart, for limits users set -- long limits are what hurts backfill;
- **the watch** (``perf-calibrate watch``, :mod:`calibrate.watch`): each job's ``watch_actions``
  (extend / shrink / none, from and to seconds, when, why), and per partition the extensions and
  shrinks, hours returned to backfill, kills avoided (jobs that COMPLETED after running past the
  limit they had before the watch extended it), jobs that still timed out and why, and
  extensions per user.  Jobs the watch acted on that are not harvested yet are listed too, with
  the state the watch last saw (RUNNING).

This module is unrelated to :mod:`calibrate.fitting.report` (the operator-fit validation report).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from predictor.errors import PerfcastError
from slurm_plugin.policy import plural, slurm_duration
from slurm_plugin.records import JobOutcome, PredictionRecord

from .watch_log import WatchAction


@dataclass(frozen=True)
class JobRow:
    job_id: int
    partition: str
    state: str
    elapsed_seconds: Optional[float]
    time_limit_seconds: Optional[float]
    predicted_iteration_seconds: float
    measured_iteration_seconds: Optional[float]
    predicted_total_seconds: float
    interval_seconds: tuple[float, float]
    limit_set_by_perfcast: bool
    time_min_seconds: Optional[float]
    record_id: str
    platform: str
    user: str
    log_format: str
    note: str
    watch_actions: tuple[WatchAction, ...] = ()

    @property
    def limit_before_watch(self) -> Optional[float]:
        """The limit the job had before the watch's first extension or shrink (None: untouched)."""
        changes = [a for a in self.watch_actions if a.action != "none"]
        return changes[0].from_seconds if changes else None

    @property
    def kill_avoided(self) -> bool:
        """COMPLETED after running past the limit it had before the watch extended it."""
        before = self.limit_before_watch
        return (self.state == "COMPLETED" and before is not None and self.elapsed_seconds is not None
                and any(a.action == "extend" for a in self.watch_actions) and self.elapsed_seconds > before)

    @property
    def no_measurement_reason(self) -> str:
        """Why the report shows '-' for the measured iteration time."""
        if self.measured_iteration_seconds is not None:
            return ""
        if self.state == "RUNNING" and not self.note:
            return "still running (not harvested yet)"
        return self.note or "no reason recorded"

    @property
    def error(self) -> Optional[float]:
        """predicted / measured - 1 of the iteration time (None without a measurement)."""
        if not self.measured_iteration_seconds or self.predicted_iteration_seconds <= 0:
            return None
        return self.predicted_iteration_seconds / self.measured_iteration_seconds - 1.0

    @property
    def inside_interval(self) -> Optional[bool]:
        lo, hi = self.interval_seconds
        if self.measured_iteration_seconds is None or hi <= 0:
            return None
        return lo <= self.measured_iteration_seconds <= hi

    @property
    def over_reservation(self) -> Optional[float]:
        """limit / elapsed of a job that completed (how much longer the limit was than needed)."""
        if self.state != "COMPLETED" or not self.time_limit_seconds or not self.elapsed_seconds:
            return None
        return self.time_limit_seconds / self.elapsed_seconds

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["interval_seconds"] = list(self.interval_seconds)
        d["iteration_error"] = self.error
        d["inside_interval"] = self.inside_interval
        d["over_reservation"] = self.over_reservation
        d["watch_actions"] = [a.brief() for a in self.watch_actions]
        d["no_measurement_reason"] = self.no_measurement_reason or None
        d["kill_avoided"] = self.kill_avoided
        return d


@dataclass(frozen=True)
class Spread:
    n: int
    median: Optional[float]
    p90: Optional[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> "Spread":
        v = sorted(x for x in values if x is not None and math.isfinite(x))
        if not v:
            return cls(0, None, None)
        return cls(len(v), statistics.median(v), _percentile(v, 0.90))


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class PartitionSummary:
    partition: str
    jobs: int
    measured: int                       # jobs with an iteration time from their log
    mape: Optional[float]               # of the iteration time
    signed_error: Optional[float]       # mean of predicted / measured - 1
    coverage: Optional[float]           # share of measured jobs inside their interval
    limits_set: int                     # jobs whose --time perfcast set
    timeouts_at_perfcast_limit: int
    timeout_jobs: list[int]
    over_reservation: Spread            # limits perfcast set, COMPLETED jobs
    over_reservation_user_limits: Spread
    watch: Optional["WatchSummary"] = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["over_reservation"] = asdict(self.over_reservation)
        d["over_reservation_user_limits"] = asdict(self.over_reservation_user_limits)
        return d


@dataclass(frozen=True)
class WatchSummary:
    """What ``perf-calibrate watch`` did in one partition."""

    jobs_watched: int
    extensions: int                     # extend actions
    shrinks: int
    jobs_extended: int
    jobs_shrunk: int
    hours_returned: float               # limit hours shrinks gave back to backfill
    hours_extended: float
    kills_avoided: int
    kills_avoided_jobs: list[int]
    still_timed_out: list[dict[str, Any]]      # {job_id, reason}: the watch's last word on it
    extensions_per_user: dict[str, int]


def summarize_watch(rows: Sequence[JobRow]) -> Optional[WatchSummary]:
    watched = [r for r in rows if r.watch_actions]
    if not watched:
        return None
    ext = [a for r in watched for a in r.watch_actions if a.action == "extend"]
    shr = [a for r in watched for a in r.watch_actions if a.action == "shrink"]
    per_user: dict[str, int] = {}
    for a in ext:
        per_user[a.user or "?"] = per_user.get(a.user or "?", 0) + 1
    timed_out = []
    for r in watched:
        if r.state == "TIMEOUT":
            last = r.watch_actions[-1]
            timed_out.append({"job_id": r.job_id, "reason": f"{last.action}: {last.reason}"})
    avoided = [r.job_id for r in watched if r.kill_avoided]
    return WatchSummary(
        jobs_watched=len(watched), extensions=len(ext), shrinks=len(shr),
        jobs_extended=len({a.slurm_job_id for a in ext}), jobs_shrunk=len({a.slurm_job_id for a in shr}),
        hours_returned=sum((a.from_seconds or 0) - (a.to_seconds or 0) for a in shr) / 3600.0,
        hours_extended=sum((a.to_seconds or 0) - (a.from_seconds or 0) for a in ext) / 3600.0,
        kills_avoided=len(avoided), kills_avoided_jobs=avoided, still_timed_out=timed_out,
        extensions_per_user=dict(sorted(per_user.items())))


@dataclass
class Report:
    jobs: list[JobRow] = field(default_factory=list)
    partitions: dict[str, PartitionSummary] = field(default_factory=dict)
    record_losses: dict[str, int] = field(default_factory=dict)   # RecordStore.losses(): by reason

    def to_dict(self) -> dict[str, Any]:
        out = {"jobs": [j.to_dict() for j in self.jobs],
               "partitions": {p: s.to_dict() for p, s in sorted(self.partitions.items())}}
        if self.record_losses:
            out["record_losses"] = dict(sorted(self.record_losses.items()))
        return out

    def losses_line(self) -> str:
        """Predictions perf-predictd answered but could not keep a record of (never harvested)."""
        if not self.record_losses:
            return ""
        return (f"records perf-predictd could not keep: {sum(self.record_losses.values())} ("
                + ", ".join(f"{k} {v}" for k, v in sorted(self.record_losses.items())) + ")")

    def table(self) -> str:
        if not self.jobs:
            return "\n".join(filter(None, ["no harvested jobs (run perf-calibrate harvest first)",
                                            self.losses_line()]))
        lines = [f"{'job':>10} {'partition':<12} {'state':<10} {'elapsed':>9} {'limit':>9} "
                 f"{'pred s/it':>10} {'meas s/it':>10} {'error':>8}  {'pred total':>10}"]
        for j in self.jobs:
            err = f"{100 * j.error:+.1f}%" if j.error is not None else "-"
            lines.append(f"{j.job_id:>10} {j.partition[:12]:<12} {j.state[:10]:<10} {_hms(j.elapsed_seconds):>9} "
                         f"{_hms(j.time_limit_seconds):>9} {j.predicted_iteration_seconds:>10.4g} "
                         f"{_num(j.measured_iteration_seconds):>10} {err:>8}  {_hms(j.predicted_total_seconds):>10}")
        missing = [j for j in self.jobs if j.no_measurement_reason]
        if missing:
            lines.append("")
            lines.append("no measured iteration time ('-' above):")
            lines.extend(f"  job {j.job_id}: {j.no_measurement_reason}" for j in missing)
        acted = [j for j in self.jobs if j.watch_actions]
        if acted:
            lines.append("")
            lines.append("watch actions (perf-calibrate watch):")
            for j in acted:
                for a in j.watch_actions:
                    change = (f"{_hms(a.from_seconds)} -> {_hms(a.to_seconds)}" if a.action != "none"
                              else f"kept {_hms(a.from_seconds)}")
                    lines.append(f"  job {j.job_id} {_stamp(a.at)} {a.action:<6} {change}: {a.reason}")
        for name, s in sorted(self.partitions.items()):
            lines.append("")
            lines.append(f"partition {name}: {plural(s.jobs, 'job')}, {s.measured:,} with a measured iteration time")
            if s.measured:
                text = (f"  iteration time: MAPE {100 * s.mape:.1f}%, signed mean error "
                        f"{100 * s.signed_error:+.1f}% (< 0: under-predicted)")
                if s.coverage is not None:
                    text += f", interval coverage {100 * s.coverage:.0f}%"
                lines.append(text)
            lines.append(f"  limits perfcast set: {s.limits_set}; ended TIMEOUT at one: "
                         f"{s.timeouts_at_perfcast_limit}"
                         + (f" (jobs {', '.join(map(str, s.timeout_jobs[:10]))})" if s.timeout_jobs else ""))
            for label, sp in (("perfcast's limits", s.over_reservation),
                              ("users' limits", s.over_reservation_user_limits)):
                if sp.n:
                    lines.append(f"  over-reservation (limit / elapsed, completed jobs) of {label}: "
                                 f"median {sp.median:.2f}x, p90 {sp.p90:.2f}x over {plural(sp.n, 'job')}")
            w = s.watch
            if w is not None:
                lines.append(f"  watch: {plural(w.jobs_watched, 'job')} watched; {plural(w.extensions, 'extension')} "
                             f"({w.hours_extended:.2f} h) of {plural(w.jobs_extended, 'job')}, "
                             f"{plural(w.shrinks, 'shrink')} of {plural(w.jobs_shrunk, 'job')} "
                             f"({w.hours_returned:.2f} h returned to backfill); "
                             f"kills avoided: {w.kills_avoided}"
                             + (f" (jobs {', '.join(map(str, w.kills_avoided_jobs[:10]))})"
                                if w.kills_avoided_jobs else ""))
                if w.extensions_per_user:
                    lines.append("  extensions per user: "
                                 + ", ".join(f"{u} {n}" for u, n in w.extensions_per_user.items()))
                for t in w.still_timed_out[:10]:
                    lines.append(f"  still timed out: job {t['job_id']}: {t['reason']}")
        if self.record_losses:
            lines += ["", self.losses_line()]
        return "\n".join(lines)


def _stamp(at: float) -> str:
    import datetime as _dt
    return _dt.datetime.fromtimestamp(at, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(v: Optional[float]) -> str:
    return f"{v:.4g}" if v is not None else "-"


def _hms(seconds: Optional[float]) -> str:
    """Slurm's spelling (limits and elapsed times are Slurm's)."""
    return "-" if seconds is None else slurm_duration(seconds)


def job_row(record: PredictionRecord, outcome: JobOutcome,
            watch_actions: Sequence[WatchAction] = ()) -> JobRow:
    return JobRow(
        job_id=outcome.slurm_job_id, partition=record.partition, state=outcome.state,
        elapsed_seconds=outcome.elapsed_seconds, time_limit_seconds=outcome.time_limit_seconds,
        predicted_iteration_seconds=record.iteration_seconds,
        measured_iteration_seconds=outcome.measured_iteration_seconds,
        predicted_total_seconds=record.total_seconds, interval_seconds=tuple(record.interval_seconds),
        limit_set_by_perfcast=record.action == "set" and record.time_limit_minutes is not None,
        time_min_seconds=60.0 * record.time_min_minutes if record.time_min_minutes is not None else None,
        record_id=record.record_id, platform=record.platform, user=record.user,
        log_format=outcome.log_format, note=outcome.note, watch_actions=tuple(watch_actions))


def summarize(partition: str, rows: Sequence[JobRow]) -> PartitionSummary:
    errors = [r.error for r in rows if r.error is not None]
    inside = [r.inside_interval for r in rows if r.inside_interval is not None]
    timeouts = [r.job_id for r in rows if r.state == "TIMEOUT" and r.limit_set_by_perfcast]
    return PartitionSummary(
        partition=partition, jobs=len(rows), measured=len(errors),
        mape=sum(abs(e) for e in errors) / len(errors) if errors else None,
        signed_error=sum(errors) / len(errors) if errors else None,
        coverage=sum(inside) / len(inside) if inside else None,
        limits_set=sum(1 for r in rows if r.limit_set_by_perfcast),
        timeouts_at_perfcast_limit=len(timeouts), timeout_jobs=timeouts,
        over_reservation=Spread.of([r.over_reservation for r in rows if r.limit_set_by_perfcast]),
        over_reservation_user_limits=Spread.of([r.over_reservation for r in rows if not r.limit_set_by_perfcast]),
        watch=summarize_watch(rows))


def build_report(pairs: Sequence[tuple[PredictionRecord, JobOutcome]],
                 partition: Optional[str] = None, *,
                 watch_actions: Sequence[WatchAction] = (),
                 watched_records: Optional[dict[str, PredictionRecord]] = None) -> Report:
    """Rows of harvested jobs, each with its watch actions; plus, from ``watched_records``
    (record id -> record), a RUNNING row for each job the watch acted on that is not harvested."""
    by_job: dict[int, list[WatchAction]] = {}
    for a in watch_actions:
        by_job.setdefault(a.slurm_job_id, []).append(a)
    rows = [job_row(r, o, by_job.get(o.slurm_job_id, ())) for r, o in pairs
            if partition is None or r.partition == partition]
    seen = {r.job_id for r in rows}
    for jid, acts in sorted(by_job.items()):
        rec = (watched_records or {}).get(acts[-1].record_id)
        if jid in seen or rec is None or (partition is not None and rec.partition != partition):
            continue
        last = acts[-1]
        measured = next((a.measured_iteration_seconds for a in reversed(acts)
                         if a.measured_iteration_seconds is not None), None)
        rows.append(job_row(rec, JobOutcome(record_id=rec.record_id, slurm_job_id=jid, state="RUNNING",
                                            time_limit_seconds=last.to_seconds,
                                            measured_iteration_seconds=measured,
                                            note="" if measured else last.reason), acts))
    rows.sort(key=lambda j: j.job_id)
    rep = Report(jobs=rows)
    for part in sorted({r.partition for r in rows}):
        rep.partitions[part] = summarize(part, [r for r in rows if r.partition == part])
    return rep


def plot_report(report: Report, path: "str | Path") -> Path:
    """Predicted vs measured seconds per iteration, and limit / elapsed, per partition, as a PNG."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PerfcastError(f"--plot needs matplotlib (pip install 'perfcast[plot]'): {exc}") from None
    out = Path(path)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for part in sorted(report.partitions):
        rows = [j for j in report.jobs if j.partition == part and j.measured_iteration_seconds]
        ax1.scatter([j.measured_iteration_seconds for j in rows], [j.predicted_iteration_seconds for j in rows],
                    label=part, s=18)
    vals = [v for j in report.jobs for v in (j.measured_iteration_seconds, j.predicted_iteration_seconds)
            if v]
    if vals:
        lo, hi = min(vals) / 1.2, max(vals) * 1.2
        ax1.plot([lo, hi], [lo, hi], color="grey", lw=1)
        ax1.set_xscale("log")
        ax1.set_yscale("log")
    ax1.set_xlabel("measured s/iteration (job log)")
    ax1.set_ylabel("predicted s/iteration")
    ax1.set_title("iteration time")
    ratios = [j.over_reservation for j in report.jobs if j.over_reservation is not None]
    if ratios:
        ax2.hist(ratios, bins=min(30, max(5, len(ratios) // 2)))
    ax2.axvline(1.0, color="red", lw=1)
    ax2.set_xlabel("time limit / elapsed (completed jobs)")
    ax2.set_ylabel("jobs")
    ax2.set_title("over-reservation")
    if report.partitions:
        ax1.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out


__all__ = ["JobRow", "PartitionSummary", "Report", "Spread", "WatchSummary", "build_report", "plot_report",
           "summarize", "summarize_watch"]
