"""Record measured end-to-end runs on a platform: ``perf-calibrate validate``.

An admin who has real iteration times (from training logs) writes them as a runs file::

    [[run]]
    name = "GPT-20B 4-4-8"
    source = "our job 123456, steady-state minimum"
    measured_iteration_seconds = 17.35
    [run.job.model]      # the job, in the job-file keys (or job_file = "path/to/job.toml")
    ...

and this module predicts every run with the platform's current models and stores measured and
predicted side by side in the platform's ``platform.toml`` (``[[validation]]``).  Runs already
recorded there are predicted again too, so the record always describes the models that are
installed.  A run of the file that is already recorded (:func:`run_key`: the same name and the
same job) is not added again (:func:`merge_runs`); where its measured time differs from the
recorded one, a warning names it and the file's value replaces the recorded one.  Their residuals
set the platform's intervals (:mod:`predictor.interval`); the summary
reports the error, the spread of measured / predicted (:func:`predictor.validation.ratio_range`)
and how many runs fall inside the interval the *other* runs give.

With ``--fit`` (:func:`fit_terms`) it also fits a few physical end-to-end terms on the runs: a
compute scale (multiplies every operator's device time), where the platform has a ``[host]``
table the host's per-layer, per-micro-batch and per-launch issue costs, each its own scale, and a
network scale (multiplies communication between nodes); each is fitted only on the runs whose
prediction it moves, and only when at least three do, and each is bounded to
:data:`predictor.platform.FITTED_SCALE_RANGE`.  Leave-one-out decides: each run is predicted by
the terms fitted on the other runs, and the terms are written (``[fitted]`` in ``platform.toml``)
only when that leave-one-out MAPE is lower than the MAPE of the platform as it is.  The runs are
then recorded with their leave-one-out predictions, so that the intervals they widen are those of
runs the terms never saw.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from predictor.errors import JobError, RunRecordError
from predictor.job import TrainingJob
from predictor.kinds import kind_of
from predictor.platform import (FITTED_SCALE_RANGE, PLATFORM_FILE, FitDomain, FittedTerms, Platform,
                                load_platform, resolve_platform, write_platform)
from predictor import interval
from predictor.validation import MeasuredRun, parse_runs, ratio_range, runs_to_toml

from .fitting.identification import MIN_FIT_RUNS, NOISE_FLOOR, identified
from .fitting.kinds import fit_hierarchical

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_RUNS_FILE_BYTES = 4 << 20
log = logging.getLogger(__name__)

# The fit searches a geometric lattice over FITTED_SCALE_RANGE with ~1 % steps (141 points from
# 0.5 to 2.0, 1.0 exactly in the middle): finer than the spread of repeated measurements of one run
# (the shipped H100 steps vary by a few percent, benchmarks/data/h100-lent/train-family.json).
_LATTICE = np.geomspace(FITTED_SCALE_RANGE[0], FITTED_SCALE_RANGE[1], 141)
_ONE = 70
_COARSE = 7        # coarse pass every 7th point (~7 %), then every point within one coarse step


@dataclass(frozen=True)
class FitResult:
    """What ``--fit`` found: the factors on all runs, and leave-one-out MAPE before and after."""

    mape_before: float                # the platform as it is, on these runs
    loo_mape_after: float             # each run predicted by the factors fitted on the others
    loo_predictions: list[float]      # seconds per iteration, per run
    compute_scale: float = 1.0
    # The host scale the fitted host factors amount to on the runs' host time (geometric mean over
    # the runs that see the host): a summary; [fitted] holds the factors, not this.
    host_scale: float = 1.0
    host_layer_scale: float = 1.0
    host_micro_batch_scale: float = 1.0
    host_launch_scale: float = 1.0
    network_scale: float = 1.0
    host_fitted: bool = False         # False: no host factor identified (or no [host]): they stay 1
    fitted: tuple[str, ...] = ()      # the factors fitted; the others stay 1
    # Per factor that enough runs see: the standard deviation of its log from the runs (None:
    # collinear with another factor, not identified); fitted when at most _MAX_STD.
    identification: dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
    written: bool = False
    reason: str = ""                  # why written or not, one line

    # The standard error of the mean paired change of absolute error, run by run, between the
    # platform as it is and leave-one-out (0 when not fitted).
    loo_change_se: float = 0.0
    # The jobs the factors were fitted on; a job outside is predicted without them.
    domain: Optional[FitDomain] = None

    @property
    def improves(self) -> bool:
        """Leave-one-out beats the platform as it is by more than one standard error of the
        paired change: a gain that a run or two more or less would undo is not a gain."""
        return self.mape_before - self.loo_mape_after > self.loo_change_se

    def terms(self, **meta: Any) -> FittedTerms:
        """The ``[fitted]`` table these factors make (``meta``: runs, MAPEs, when, source)."""
        # host_scale here is a summary of the host factors, not a factor: [fitted] writes 1.
        return FittedTerms(host_scale=1.0, **{f: round(getattr(self, f), 4) for f in FACTORS},
                           domain=self.domain, **meta)

    def describe(self) -> str:
        """One line: each factor, fitted or why not."""
        parts = []
        for f in FACTORS:
            v = getattr(self, f)
            if f in self.fitted:
                parts.append(f"{_LABEL[f]} {v:.3f}")
            elif f in self.identification:
                std = self.identification[f]
                parts.append(f"{_LABEL[f]} 1 (" + (
                    "not identified: collinear with another factor on these runs)" if std is None else
                    f"not identified: log std {std:.2f} > {_MAX_STD:.2f})" if std > _MAX_STD else
                    "within the runs' scatter of 1)"))
        return "; ".join(parts) or "no factor seen by enough runs"

    def to_dict(self) -> dict[str, Any]:
        return {**{f: getattr(self, f) for f in FACTORS}, "host_scale": self.host_scale,
                "host_fitted": self.host_fitted,
                "fitted": list(self.fitted), "identification": dict(self.identification),
                "mape_before": self.mape_before, "loo_mape_after": self.loo_mape_after,
                "loo_change_se": self.loo_change_se, "written": self.written, "reason": self.reason,
                "domain": self.domain.to_dict() if self.domain is not None else None}


@dataclass(frozen=True)
class ValidationSummary:
    platform: str
    platform_file: Path
    runs: list[MeasuredRun]
    inside_loo: list[bool]
    predictions: list[Any]          # predictor.Prediction of each run, in order
    fit: Any = None                 # FitResult or calibrate.fitting.kinds.HierarchicalFit
    # The runs given (a runs file's), against those recorded before (merge_runs): None when
    # not counted.
    new_runs: Optional[int] = None          # not recorded before: added
    already_recorded: int = 0               # recorded before: not added again
    repeated_runs: int = 0                  # given twice: counted once
    warnings: tuple[str, ...] = ()          # runs recorded with another measured time, ...
    # One line: what was done with the runs, or what the real run would do (a dry run).  A plain
    # platform directory: ``recorded N runs in FILE``; an installed or shipped platform
    # (calibrate.install.validate_as_new_version): the new version installed, or to be.
    outcome: str = ""

    @property
    def mape(self) -> float:
        return sum(abs(r.error) for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def ratio_range(self) -> tuple[float, float]:
        return ratio_range(self.runs)

    def table(self) -> str:
        lines = [f"{'run':<28}{'measured':>10}{'predicted':>11}{'error':>9}  leave-one-out"]
        for r, ok in zip(self.runs, self.inside_loo):
            lines.append(f"{r.name[:27]:<28}{r.measured_iteration_seconds:>9.3g}s"
                         f"{r.predicted_iteration_seconds:>10.3g}s{100 * r.error:>+8.1f}%  "
                         f"{'inside' if ok else 'OUTSIDE'}")
        lo, hi = self.ratio_range
        lines.append(f"{len(self.runs)} runs: MAPE {100 * self.mape:.2f}%; measured/predicted "
                     f"[{lo:.3f}, {hi:.3f}]; leave-one-out coverage of the interval "
                     f"{sum(self.inside_loo)}/{len(self.inside_loo)}")
        if self.new_runs is not None:
            lines.append(self.counts())
        if self.fit is not None:
            f = self.fit
            lines.append(f"fit: {f.describe()} (host time x{f.host_scale:.3f} on these runs); "
                         f"leave-one-out MAPE before {100 * f.mape_before:.2f}%, after "
                         f"{100 * f.loo_mape_after:.2f}%; {f.reason}")
            if getattr(f, "kinds", None):
                lines.append(f.report())
            if f.domain is not None and (f.fitted or (f.written and getattr(f, "kinds", None))):
                lines.append(f"fit applies to jobs like the runs: {f.domain.describe()} (others are "
                             "predicted without it)")
        return "\n".join(lines)

    def counts(self) -> str:
        """One line: how many of the runs given were new and how many already recorded."""
        return (f"runs given: {self.new_runs} new, {self.already_recorded} already recorded (not added "
                "again)" + (f", {self.repeated_runs} given twice (counted once)" if self.repeated_runs else "")
                + (f"; {len(self.warnings)} warning{'s' if len(self.warnings) != 1 else ''}"
                   if self.warnings else ""))

    def to_dict(self) -> dict[str, Any]:
        d = {"platform": self.platform, "platform_file": str(self.platform_file),
             "new_runs": self.new_runs, "already_recorded": self.already_recorded,
             "repeated_runs": self.repeated_runs, "warnings": list(self.warnings),
             "mape": self.mape, "ratio_range": list(self.ratio_range),
             "runs": [dict(r.to_dict(), ratio=r.ratio, inside_leave_one_out=ok)
                      for r, ok in zip(self.runs, self.inside_loo)]}
        if self.fit is not None:
            d["fit"] = self.fit.to_dict()
        if self.outcome:
            d["outcome"] = self.outcome
        return d


def load_runs(path: "str | os.PathLike[str]") -> list[MeasuredRun]:
    """The ``[[run]]`` entries of a runs file; errors name the file and the entry."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_RUNS_FILE_BYTES:
            raise RunRecordError(f"{p}: larger than {MAX_RUNS_FILE_BYTES >> 20} MiB")
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RunRecordError(f"{p}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RunRecordError(f"{p}: not valid TOML: {exc}") from None
    extra = sorted(set(raw) - {"run"})
    if extra:
        raise RunRecordError(f"{p}: {extra[0]}: unknown key (a runs file holds [[run]] tables)")
    entries = raw.get("run")
    if not entries:
        raise RunRecordError(f"{p}: no [[run]] tables")
    if isinstance(entries, list):
        for i, e in enumerate(entries):
            if isinstance(e, dict) and "job_file" in e:
                e["job"] = _job_file(p, e.pop("job_file"), f"{p}: run[{i}].job_file")
    return parse_runs(entries, f"{p}: run", need_prediction=False)


def _job_file(runs_file: Path, value: Any, where: str) -> dict:
    if not isinstance(value, str) or not value:
        raise RunRecordError(f"{where}: must be a path")
    jp = (runs_file.parent / value) if not os.path.isabs(value) else Path(value)
    try:
        return TrainingJob.from_toml(jp).to_dict()
    except JobError as exc:
        raise RunRecordError(f"{where}: {exc}") from None


def validate_platform(platform: "str | os.PathLike[str]", runs: Sequence[MeasuredRun], *,
                      replace: bool = False, dry_run: bool = False, fit: bool = False,
                      fit_source: Optional[str] = None) -> ValidationSummary:
    """Predict ``runs`` (and, unless ``replace``, the runs already recorded) and record them.

    ``fit``: also fit the ``[fitted]`` terms (:func:`fit_terms`) and write them with the runs when
    leave-one-out improves; the runs are then recorded with their leave-one-out predictions.
    ``fit_source``: what ``[fitted] source`` says made them (``harvest --refit`` names itself).
    """
    from predictor.estimate import predict_many
    d = resolve_platform(platform)
    plat = load_platform(d, reload=True)
    merged = merge_runs([] if replace else plat.validation, runs)
    for w in merged.warnings:
        log.warning("%s", w)
    all_runs = merged.runs
    if not all_runs:
        raise RunRecordError("no runs to record")
    preds = predict_many([r.job for r in all_runs], plat)
    recorded = [dataclasses.replace(r, predicted_iteration_seconds=p.iteration_seconds)
                for r, p in zip(all_runs, preds)]
    fit_res: Any = None
    fitted: Optional[FittedTerms] = None
    intervals: Optional[FittedTerms] = None
    if fit:
        fit_res = fit_hierarchical(plat, all_runs, [p.iteration_seconds for p in preds])
        if fit_res.improves:
            fitted = fit_res.terms(runs=tuple(r.name for r in all_runs),
                                   loo_mape_before=round(fit_res.mape_before, 6),
                                   loo_mape_after=round(fit_res.loo_mape_after, 6),
                                   fitted_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                   source=fit_source or f"perf-calibrate validate --fit on {len(all_runs)} runs")
            fplat = dataclasses.replace(plat, fitted=fitted)
            preds = predict_many([r.job for r in all_runs], fplat)
            recorded = [dataclasses.replace(r, predicted_iteration_seconds=p)
                        for r, p in zip(all_runs, fit_res.loo_predictions)]
        elif getattr(fit_res, "kinds", None):
            # The factors are declined but the runs are recorded all the same: their kinds'
            # intervals go with them (every factor as it was), so that a stack the runs never
            # showed gets the spread across kinds, not the recorded stacks' quantile.
            intervals = fit_res.interval_terms(plat.fitted)
        fit_res = dataclasses.replace(fit_res, written=fitted is not None and not dry_run,
                                      reason=_fit_reason(fit_res, fitted is not None, dry_run))
    fpath = d / PLATFORM_FILE
    if not dry_run:
        raw = tomllib.loads(fpath.read_text(encoding="utf-8"))
        raw["validation"] = runs_to_toml(recorded)
        written = fitted if fitted is not None else intervals
        if written is not None:
            raw["fitted"] = written.to_dict()
            raw.pop("fitted_kind", None)
            if written.kinds:
                raw["fitted_kind"] = written.kinds_to_toml()
        write_platform(d, raw)
    # Each run judged by the interval rule the *other* runs give (predictor/interval.py), of its
    # own kind where the runs are of several (Predictor.kind_rule: the rule a new job of it gets).
    rules = interval.leave_one_out([r.log_ratio for r in recorded], calibrated=plat.calibrated)
    keys = [kind_of(r.job).key for r in recorded]
    if len(set(keys)) > 1:
        for i, key in enumerate(keys):
            others = [r.log_ratio for j, r in enumerate(recorded) if j != i and keys[j] == key]
            if others:
                rules[i] = rules[i].for_kind(others, 0.0)
    inside = []
    for r, p, rule in zip(recorded, preds, rules):
        lo, hi = interval.interval_seconds(r.predicted_iteration_seconds, *_spread(p, r), rule,
                                           extrapolated=p.extrapolated,
                                           analytic_collectives=p.details.analytic_collectives)
        inside.append(lo <= r.measured_iteration_seconds <= hi)
    return ValidationSummary(plat.name, fpath, recorded, inside, preds, fit_res, new_runs=merged.new,
                             already_recorded=merged.already, repeated_runs=merged.repeated,
                             warnings=merged.warnings,
                             outcome=f"{'would record' if dry_run else 'recorded'} {len(recorded)} runs in {fpath}"
                                     + (" (dry run: nothing written)" if dry_run else ""))


def run_key(run: MeasuredRun) -> tuple[str, str]:
    """What identifies a measured run: its name (a harvested run's is ``slurm job <id>``) and its
    job as resolved (every default filled in, :meth:`TrainingJob.to_dict`).  The measured time is
    not part of it (the same run measured again is the same run); two runs files' ``run 1`` of
    different jobs are two runs."""
    return run.name, json.dumps(run.job.to_dict(), sort_keys=True, default=str)


@dataclass(frozen=True)
class RunsMerge:
    """The runs to record: those recorded before, then the given ones not among them."""

    runs: list[MeasuredRun]
    new: int                      # given runs not recorded before
    already: int                  # given runs recorded before (not added again)
    repeated: int                 # given runs listed twice: counted once
    warnings: tuple[str, ...]


def _same_measure(a: MeasuredRun, b: MeasuredRun) -> bool:
    return math.isclose(a.measured_iteration_seconds, b.measured_iteration_seconds, rel_tol=1e-9)


def merge_runs(recorded: Sequence[MeasuredRun], given: Sequence[MeasuredRun]) -> RunsMerge:
    """``recorded`` then the runs of ``given`` not already among them (:func:`run_key`), each run
    once.  A given run recorded with another measured time replaces the recorded one in its place
    (the runs file is the newer word, as harvest's merge of its runs files) with a warning naming
    it; so does a run listed twice with two times (the later kept).  A name recorded with another
    job is kept as a different run, with a warning.  Runs recorded twice (by a validate before
    this check) are kept once."""
    out: list[MeasuredRun] = []
    where: dict[tuple[str, str], int] = {}
    jobs_of: dict[str, set[str]] = {}
    warnings: list[str] = []
    twice = repeated = 0

    def fold(run: MeasuredRun, what: str, outcome: str) -> None:
        """``run`` is already in ``out``: keep it once, the later measured time, saying so if it moved."""
        i = where[run_key(run)]
        if not _same_measure(out[i], run):
            warnings.append(f"run {run.name!r} {what} {out[i].measured_iteration_seconds:.6g} s per iteration "
                            f"and {run.measured_iteration_seconds:.6g} s: {outcome}")
            out[i] = run

    def add(run: MeasuredRun, key: tuple[str, str]) -> None:
        where[key] = len(out)
        out.append(run)
        jobs_of.setdefault(run.name, set()).add(key[1])

    for run in recorded:
        key = run_key(run)
        if key not in where:
            add(run, key)
        else:
            twice += 1
            fold(run, "is recorded twice, with", "the latter kept, once")
    if twice:
        warnings.append(f"{twice} recorded run{'s were' if twice != 1 else ' was'} recorded twice "
                        "(by an earlier validate): kept once")
    new = already = 0
    seen: set[tuple[str, str]] = set()
    for run in given:
        key = run_key(run)
        if key in seen:
            repeated += 1
            fold(run, "is given twice, with", "the latter kept, once")
            continue
        seen.add(key)
        if key in where:
            already += 1
            fold(run, "is recorded with", "the runs given replace it with the latter (not added beside it)")
            continue
        if run.name in jobs_of and key[1] not in jobs_of[run.name]:
            warnings.append(f"run {run.name!r} comes with two different jobs: both kept as different runs "
                            "(rename one, or --replace to drop the recorded runs)")
        add(run, key)
        new += 1
    return RunsMerge(out, new, already, repeated, tuple(warnings))


def _spread(p: Any, run: MeasuredRun) -> tuple[float, float]:
    """The operator spread of prediction ``p``, moved onto the run's recorded prediction (the
    leave-one-out one under --fit)."""
    lo, hi = p.details.operator_spread_seconds
    scale = run.predicted_iteration_seconds / p.iteration_seconds
    return lo * scale, hi * scale


def _fit_reason(res: "FitResult", improves: bool, dry_run: bool) -> str:
    if res.reason:
        return res.reason
    if not improves:
        return ("factors not written: leave-one-out does not improve on the platform as it is by more "
                f"than one standard error of the run-by-run change ({100 * res.loo_change_se:.2f} points)"
                + ("; the runs' per-kind intervals recorded with them" if getattr(res, "kinds", None) else ""))
    return "would write [fitted] (dry run)" if dry_run else "written to [fitted]"


# ------------------------------------------------------------------------------------ fitting
# The factors --fit may move (predictor/platform.py FittedTerms); the legacy host_scale, one scale
# over the whole host time, is never fitted (it conflates the per-layer and per-micro-batch costs,
# so it did not carry across depths: benchmarks/bench_fit_transfer.py).
FACTORS = ("compute_scale", "host_layer_scale", "host_micro_batch_scale", "host_launch_scale", "network_scale")
_LABEL = {"compute_scale": "compute", "host_layer_scale": "host per layer",
          "host_micro_batch_scale": "host per micro-batch", "host_launch_scale": "host per launch",
          "network_scale": "network between nodes"}
# The prior on a factor: the bound FITTED_SCALE_RANGE (a factor of 2 either way) as two standard
# deviations of its log, i.e. tau = ln(2) / 2.  A factor is fitted only when the runs pin it down,
# on their own and with the other factors free, to within half that (one standard deviation of its
# log at most tau / 2 = 17 %): the runs then say at least four times more about it than the prior.
# A factor whose effect on the runs is collinear with another's (per-layer against per-micro-batch
# cost on runs of one depth) has no such bound: both stay at 1.
_TAU = float(np.log(FITTED_SCALE_RANGE[1])) / 2
_MAX_STD = _TAU / 2
# A fitted factor is kept only when it differs from 1 by at least this many of its standard errors
# (the scatter left after the fit over its elasticities): a two-sided test at ~95 %.
_Z = 2.0
# A run "sees" a factor when doubling the factor moves its prediction by more than the spread of
# repeated steps of one run (NOISE_FLOOR: elasticity above 0.03 / ln 2 = 0.043); below, the run says nothing about the factor (a host-bound
# run about the compute scale, say) and is left out of the factor's loss and identification.
_MIN_ELASTICITY = NOISE_FLOOR / float(np.log(2.0))


def fit_terms(platform: Platform, runs: Sequence[MeasuredRun],
              current: Optional[Sequence[float]] = None) -> FitResult:
    """Fit the ``[fitted]`` factors on ``runs``; leave-one-out MAPE before and after.

    The factors (:data:`FACTORS`): the compute scale, where the platform has a ``[host]`` table the
    per-layer, per-micro-batch and per-launch host costs, each its own scale, and the network
    scale (runs on one node do not see it).  They replace any
    the platform has (fitted from the unscaled models).  A factor is fitted only when at least
    :data:`MIN_FIT_RUNS` runs see it and the runs identify it
    (:func:`calibrate.fitting.identification.identified`); otherwise it
    stays 1.  The loss is the mean squared log of predicted / measured over the runs a factor moves:
    symmetric in over- and under-prediction, and independent of a run's length.  Leave-one-out
    repeats the whole procedure (identification included) without each run.  ``current``: the
    platform's own predictions (as it is) of the runs, when already computed.
    """
    from predictor.estimate import predict_many
    measured = np.array([r.measured_iteration_seconds for r in runs], dtype=float)
    n = len(runs)
    if current is None:
        current = [p.iteration_seconds for p in predict_many([r.job for r in runs], platform)]
    before = float(np.mean(np.abs(np.asarray(current, dtype=float) / measured - 1.0)))
    if n < MIN_FIT_RUNS:
        return FitResult(mape_before=before, loo_mape_after=before, loo_predictions=list(current),
                         reason=f"not written: fitting needs at least {MIN_FIT_RUNS} runs (got {n})")
    base = dataclasses.replace(platform, fitted=None)
    jobs = [r.job for r in runs]
    k = len(FACTORS)
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def at(idx: tuple[int, ...]) -> np.ndarray:
        if idx not in cache:
            terms = FittedTerms(**{f: float(_LATTICE[i]) for f, i in zip(FACTORS, idx)})
            plat = dataclasses.replace(base, fitted=terms)
            cache[idx] = np.array([p.iteration_seconds for p in predict_many(jobs, plat)], dtype=float)
        return cache[idx]

    logm = np.log(measured)
    unit = (_ONE,) * k
    # Elasticities d log(predicted) / d log(factor) at the unit factors, one step of ~4 % along the
    # lattice (beyond the float noise of a tie in max()): which runs see which factor, and how.
    step = 4
    J = np.zeros((n, k))
    for j, name in enumerate(FACTORS):
        if name.startswith("host_") and platform.host is None:
            continue
        idx = list(unit)
        idx[j] += step
        J[:, j] = np.log(at(tuple(idx)) / at(unit)) / np.log(_LATTICE[_ONE + step] / _LATTICE[_ONE])
    sees = np.abs(J) > _MIN_ELASTICITY
    resid0 = np.log(at(unit)) - logm

    def loss(idx: tuple[int, ...], mask: np.ndarray) -> float:
        return float(np.mean((np.log(at(idx))[mask] - logm[mask]) ** 2))

    def descend(mask: np.ndarray, free: Sequence[int]) -> tuple[int, ...]:
        idx = list(unit)
        for _ in range(8):           # coordinate descent; each pass is exact on its lattice line
            old = tuple(idx)
            for j in free:
                m = mask & sees[:, j]

                def along(i: int, j: int = j, m: np.ndarray = m) -> float:
                    trial = list(idx)
                    trial[j] = i
                    return loss(tuple(trial), m)
                idx[j] = _line_search(along)
            if tuple(idx) == old:
                break
        return tuple(idx)

    # Candidates: the factors at least MIN_FIT_RUNS of the runs see (leave-one-out keeps them).
    cand = [j for j in range(k) if int(sees[:, j].sum()) >= MIN_FIT_RUNS]

    def fit(mask: np.ndarray) -> tuple[tuple[int, ...], dict[str, float], tuple[str, ...]]:
        # 1. Identified: the runs pin the factor down (with every other candidate free).
        stds = identified(J[mask], sees[mask], resid0[mask], among=cand, names=FACTORS)
        free = [j for j, name in enumerate(FACTORS) if stds.get(name, np.inf) <= _MAX_STD]
        # The host factors are shares of one host time: with one of them left at 1 for want of
        # identification, the others would absorb its part (a per-layer scale fitted on runs of
        # mostly one depth took the per-micro-batch misfit to every other depth).  All or none.
        if any(stds.get(FACTORS[j], np.inf) > _MAX_STD for j in cand if FACTORS[j].startswith("host_")):
            free = [j for j in free if not FACTORS[j].startswith("host_")]
        idx = descend(mask, free)
        # 2. Significant: the fitted factor differs from 1 by at least _Z of its standard errors
        # with the scatter left after the fit; the others go back to 1 and the rest is refitted.
        # A shift inside the runs' own scatter is what those runs happen to want, not the machine.
        for _ in range(len(FACTORS)):
            if not free:
                break
            post = identified(J[mask], sees[mask], np.log(at(idx))[mask] - logm[mask],
                              among=free, names=FACTORS)
            keep = [j for j in free if abs(np.log(_LATTICE[idx[j]])) >= _Z * post[FACTORS[j]]]
            if keep == free:
                break
            free = keep
            idx = descend(mask, free)
        return idx, stds, tuple(FACTORS[j] for j in free)

    everyone = np.ones(n, dtype=bool)
    idx, stds, fitted = fit(everyone)
    loo = []
    for i in range(n):
        mask = everyone.copy()
        mask[i] = False
        fidx, _, _ = fit(mask)
        # With the factors, even where the run lies outside the others' domain (FitDomain): this
        # asks whether the factors are real; where they apply is the domain's question.  Gating
        # here too left the smallest and largest of a handful of runs unfitted and declined fits
        # whose factor was exact.
        loo.append(float(at(fidx)[i]))
    err_after = np.abs(np.array(loo) / measured - 1.0)
    after = float(np.mean(err_after))
    change = np.abs(np.asarray(current, dtype=float) / measured - 1.0) - err_after
    change_se = float(np.std(change, ddof=1) / np.sqrt(n))
    scales = {f: float(_LATTICE[i]) for f, i in zip(FACTORS, idx)}
    host_cols = [j for j, f in enumerate(FACTORS) if f.startswith("host_")]
    # The host scale the fitted factors amount to on these runs: each host-bound run's host time
    # moves by its cost shares times the factors (the elasticities are those shares).
    hb = sees[:, host_cols].any(axis=1)
    host_fitted = any(f.startswith("host_") for f in fitted)
    if hb.any() and host_fitted:
        shares = J[hb][:, host_cols]
        shares = shares / shares.sum(axis=1, keepdims=True)
        eff = float(np.exp(np.mean(np.log(shares @ np.array([scales[FACTORS[j]] for j in host_cols])))))
    else:
        eff = 1.0
    log.info("fit on %d runs: %s; %d lattice points evaluated", n,
             ", ".join(f"{f} {scales[f]:.3f}" for f in FACTORS), len(cache))
    return FitResult(mape_before=before, loo_mape_after=after, loo_predictions=loo, loo_change_se=change_se,
                     host_scale=eff, **scales, host_fitted=host_fitted, fitted=fitted,
                     domain=FitDomain.of_jobs(jobs, platform.gpus_per_node),
                     identification={f: (None if not np.isfinite(v) else round(float(v), 4))
                                     for f, v in stds.items()})


def _line_search(f: Callable[[int], float]) -> int:
    """The lattice index minimising ``f``: every ``_COARSE``-th point, then every point around the best
    (ties go to the index nearest 1.0, the unscaled models)."""
    n = len(_LATTICE)
    coarse = sorted(set(range(0, n, _COARSE)) | {_ONE, n - 1})
    best = min(coarse, key=lambda i: (f(i), abs(i - _ONE)))
    fine = range(max(0, best - _COARSE), min(n, best + _COARSE + 1))
    return min(fine, key=lambda i: (f(i), abs(i - _ONE)))
