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
installed.  Their residuals set the platform's intervals (:mod:`predictor.interval`); the summary
reports the error, the spread of measured / predicted (:func:`predictor.validation.ratio_range`)
and how many runs fall inside the interval the *other* runs give.

With ``--fit`` (:func:`fit_terms`) it also fits a few physical end-to-end terms on the runs: a
compute scale (multiplies every operator's device time) and, where the platform has a ``[host]``
table, a host scale (multiplies the host's issue time); each is fitted only on the runs whose
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
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from predictor.errors import JobError, RunRecordError
from predictor.job import TrainingJob
from predictor.platform import (FITTED_SCALE_RANGE, PLATFORM_FILE, FittedTerms, Platform, load_platform,
                                resolve_platform, write_platform)
from predictor import interval
from predictor.validation import MeasuredRun, parse_runs, ratio_range, runs_to_toml

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
# Fewer runs than this cannot say whether a fitted scale carries to other jobs (leave-one-out
# leaves too little to fit on).
MIN_FIT_RUNS = 3


@dataclass(frozen=True)
class FitResult:
    """What ``--fit`` found: the terms on all runs, and leave-one-out MAPE before and after."""

    compute_scale: float
    host_scale: float
    host_fitted: bool                 # False: fewer than 3 runs move with it (or no [host]): it stays 1
    mape_before: float                # the platform as it is, on these runs
    loo_mape_after: float             # each run predicted by the terms fitted on the others
    loo_predictions: list[float]      # seconds per iteration, per run
    written: bool
    reason: str                       # why written or not, one line

    @property
    def improves(self) -> bool:
        return self.loo_mape_after < self.mape_before

    def to_dict(self) -> dict[str, Any]:
        return {"compute_scale": self.compute_scale, "host_scale": self.host_scale,
                "host_fitted": self.host_fitted, "mape_before": self.mape_before,
                "loo_mape_after": self.loo_mape_after, "written": self.written, "reason": self.reason}


@dataclass(frozen=True)
class ValidationSummary:
    platform: str
    platform_file: Path
    runs: list[MeasuredRun]
    inside_loo: list[bool]
    predictions: list[Any]          # predictor.Prediction of each run, in order
    fit: Optional[FitResult] = None

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
        if self.fit is not None:
            f = self.fit
            lines.append(f"fit: compute scale {f.compute_scale:.3f}, host scale {f.host_scale:.3f}"
                         f"{'' if f.host_fitted else ' (not fitted: no [host] table, or fewer than 3 host-bound runs)'}; "
                         f"leave-one-out MAPE before {100 * f.mape_before:.2f}%, after "
                         f"{100 * f.loo_mape_after:.2f}%; {f.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = {"platform": self.platform, "platform_file": str(self.platform_file),
             "mape": self.mape, "ratio_range": list(self.ratio_range),
             "runs": [dict(r.to_dict(), ratio=r.ratio, inside_leave_one_out=ok)
                      for r, ok in zip(self.runs, self.inside_loo)]}
        if self.fit is not None:
            d["fit"] = self.fit.to_dict()
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
    all_runs = list(runs) if replace else list(plat.validation) + list(runs)
    if not all_runs:
        raise RunRecordError("no runs to record")
    preds = predict_many([r.job for r in all_runs], plat)
    recorded = [dataclasses.replace(r, predicted_iteration_seconds=p.iteration_seconds)
                for r, p in zip(all_runs, preds)]
    fit_res: Optional[FitResult] = None
    fitted: Optional[FittedTerms] = None
    if fit:
        fit_res = fit_terms(plat, all_runs, [p.iteration_seconds for p in preds])
        if fit_res.improves:
            fitted = FittedTerms(compute_scale=round(fit_res.compute_scale, 4),
                                 host_scale=round(fit_res.host_scale, 4),
                                 runs=tuple(r.name for r in all_runs),
                                 loo_mape_before=round(fit_res.mape_before, 6),
                                 loo_mape_after=round(fit_res.loo_mape_after, 6),
                                 fitted_at=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                                 source=fit_source or f"perf-calibrate validate --fit on {len(all_runs)} runs")
            fplat = dataclasses.replace(plat, fitted=fitted)
            preds = predict_many([r.job for r in all_runs], fplat)
            recorded = [dataclasses.replace(r, predicted_iteration_seconds=p)
                        for r, p in zip(all_runs, fit_res.loo_predictions)]
        fit_res = dataclasses.replace(fit_res, written=fitted is not None and not dry_run,
                                      reason=_fit_reason(fit_res, fitted is not None, dry_run))
    fpath = d / PLATFORM_FILE
    if not dry_run:
        raw = tomllib.loads(fpath.read_text(encoding="utf-8"))
        raw["validation"] = runs_to_toml(recorded)
        if fitted is not None:
            raw["fitted"] = fitted.to_dict()
        write_platform(d, raw)
    # Each run judged by the interval rule the *other* runs give (predictor/interval.py).
    rules = interval.leave_one_out([r.log_ratio for r in recorded], calibrated=plat.calibrated)
    inside = []
    for r, p, rule in zip(recorded, preds, rules):
        lo, hi = interval.interval_seconds(r.predicted_iteration_seconds, *_spread(p, r), rule,
                                           extrapolated=p.extrapolated,
                                           analytic_collectives=p.details.analytic_collectives)
        inside.append(lo <= r.measured_iteration_seconds <= hi)
    return ValidationSummary(plat.name, fpath, recorded, inside, preds, fit_res)


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
        return "not written: leave-one-out does not improve on the platform as it is"
    return "would write [fitted] (dry run)" if dry_run else "written to [fitted]"


# ------------------------------------------------------------------------------------ fitting
def fit_terms(platform: Platform, runs: Sequence[MeasuredRun],
              current: Optional[Sequence[float]] = None) -> FitResult:
    """Fit ``[fitted]`` compute and host scales on ``runs``; leave-one-out MAPE before and after.

    The scales replace any the platform has (they are fitted from the unscaled models).  The loss
    is the mean squared log of predicted / measured: symmetric in over- and under-prediction, and
    independent of a run's length.  ``current``: the platform's own predictions (as it is) of the
    runs, when already computed.
    """
    from predictor.estimate import predict_many
    measured = np.array([r.measured_iteration_seconds for r in runs], dtype=float)
    n = len(runs)
    if current is None:
        current = [p.iteration_seconds for p in predict_many([r.job for r in runs], platform)]
    before = float(np.mean(np.abs(np.asarray(current, dtype=float) / measured - 1.0)))
    if n < MIN_FIT_RUNS:
        return FitResult(1.0, 1.0, False, before, before, list(current), False,
                         f"not written: fitting needs at least {MIN_FIT_RUNS} runs (got {n})")
    base = dataclasses.replace(platform, fitted=None)
    jobs = [r.job for r in runs]
    cache: dict[tuple[int, int], np.ndarray] = {}

    def at(ci: int, hi: int) -> np.ndarray:
        key = (ci, hi)
        if key not in cache:
            plat = dataclasses.replace(base, fitted=FittedTerms(compute_scale=float(_LATTICE[ci]),
                                                                host_scale=float(_LATTICE[hi])))
            cache[key] = np.array([p.iteration_seconds for p in predict_many(jobs, plat)], dtype=float)
        return cache[key]

    logm = np.log(measured)

    def loss(ci: int, hi: int, mask: np.ndarray) -> float:
        return float(np.mean((np.log(at(ci, hi))[mask] - logm[mask]) ** 2))

    # Each scale is fitted only on the runs it moves at the unit scales, and only when at least
    # MIN_FIT_RUNS runs say something about it: a host-bound run does not see the compute scale
    # (the device waits anyway), a device-bound run not the host scale.  Fitted jointly on every
    # run, a weakly identified scale drifts to whatever a handful of runs want and then costs the
    # jobs unlike them (benchmarks/bench_fit_transfer.py: fitted on large models, a host scale of
    # 1.66 took small host-bound models from 9 % to 27 % error).
    unit = at(_ONE, _ONE)
    step = 4               # ~4 % along the lattice: beyond the float noise of a tie in max()
    compute_moves = np.abs(at(_ONE + step, _ONE) / unit - 1.0) > 1e-9
    host_moves = (np.abs(at(_ONE, _ONE + step) / unit - 1.0) > 1e-9) if platform.host is not None \
        else np.zeros(n, dtype=bool)
    host_fitted = int(host_moves.sum()) >= MIN_FIT_RUNS
    compute_fitted = int(compute_moves.sum()) >= MIN_FIT_RUNS

    def fit(mask: np.ndarray) -> tuple[int, int]:
        ci, hi = _ONE, _ONE
        cmask, hmask = mask & compute_moves, mask & host_moves
        for _ in range(6):           # coordinate descent; each pass is exact on its lattice line
            nci = _line_search(lambda i: loss(i, hi, cmask)) if compute_fitted and cmask.any() else _ONE
            nhi = _line_search(lambda j: loss(nci, j, hmask)) if host_fitted and hmask.any() else _ONE
            if (nci, nhi) == (ci, hi):
                break
            ci, hi = nci, nhi
        return ci, hi

    everyone = np.ones(n, dtype=bool)
    ci, hi = fit(everyone)
    loo = []
    for i in range(n):
        mask = everyone.copy()
        mask[i] = False
        fci, fhi = fit(mask)
        loo.append(float(at(fci, fhi)[i]))
    after = float(np.mean(np.abs(np.array(loo) / measured - 1.0)))
    log.info("fit on %d runs: compute %.3f host %.3f; %d lattice points evaluated", n,
             _LATTICE[ci], _LATTICE[hi], len(cache))
    return FitResult(float(_LATTICE[ci]), float(_LATTICE[hi]), host_fitted, before, after, loo, False, "")


def _line_search(f: Callable[[int], float]) -> int:
    """The lattice index minimising ``f``: every ``_COARSE``-th point, then every point around the best
    (ties go to the index nearest 1.0, the unscaled models)."""
    n = len(_LATTICE)
    coarse = sorted(set(range(0, n, _COARSE)) | {_ONE, n - 1})
    best = min(coarse, key=lambda i: (f(i), abs(i - _ONE)))
    fine = range(max(0, best - _COARSE), min(n, best + _COARSE + 1))
    return min(fine, key=lambda i: (f(i), abs(i - _ONE)))
