"""Per-kind factors fitted on measured runs: the hierarchical fit behind ``validate --fit``.

A partition runs jobs of several kinds (:mod:`predictor.kinds`: framework, attention, precision,
recompute), and one global compute scale cannot serve a stack the shipped models under-predict by a
quarter and another they predict within 5 %.  The physical factors of ``[fitted]`` (device compute,
host per layer, per micro-batch, per launch, network between nodes; :data:`FACTORS`) are fitted per
kind, partially pooled:

    log factor of kind c = beta_P + delta_c,   delta_c ~ N(0, tau^2),   beta_P ~ N(0, tau_0^2)

on the linearised model ``log(measured / predicted at factors 1) = J_i . (beta_P + delta_c(i)) +
noise`` (J: each run's elasticity of its prediction to each factor, measured by moving the factor
4 % through the real predictor).  tau_0 is the bound of a factor (ln 2 / 2: a factor of 2 is two
standard deviations; the attention scale's ln 4 / 2, predictor.platform.scale_range); the pooling
strength ``lambda = sigma^2 / tau^2`` (how far a kind may stray from the partition, given its run
count and scatter) is chosen by leave-one-out over a grid, never
by hand: each run is predicted by the fit on the others (exact for a penalised least-squares fit,
through its hat matrix).  lambda = inf is "one factor set for every kind", the fit of earlier
versions; a kind with few runs or much scatter stays near the partition's factors, one with many
consistent runs gets its own.  The factors then go through the real predictor twice more, the
linearisation's remainder taken off (factors of 1.5 move a max() or an overlap).

Host against device: a factor a kind's runs cannot tell from another (the runs all of one
micro-batch size and depth: host per micro-batch and compute move every run alike) has no
identified standard deviation on those runs (:func:`calibrate.fitting.identification.identified`); the report
says so and the shrinkage keeps that direction at the partition's.

Each kind's runs give its interval (:mod:`predictor.interval`): their scores are each run
predicted by the whole fit redone without it (as a new job of the kind would be).  A kind with no
runs gets a bound from the spread *across* kinds: each kind's runs predicted without any run of
its kind (the partition's factors fitted on the other kinds; with one kind, the models as they
are) give that kind one score, pooled with the kinds measured elsewhere
(:data:`predictor.interval.SHIPPED_KIND_SPREADS`), and the quantile is taken over kinds
(:func:`predictor.interval.unseen_kind_bound`).  A declined fit still gives each kind its interval
(:meth:`HierarchicalFit.interval_terms`).  No torch here.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from predictor.interval import (SHIPPED_KIND_SPREADS, SHIPPED_PRIOR, IntervalRule, KindSpread, kind_score,
                                unseen_kind_bound, upper_at_level)
from predictor.kinds import kind_of
from predictor.platform import (FITTED_SCALE_RANGE, KIND_SCALES, FitDomain, FittedTerms, KindTerms,
                                Platform, scale_range)
from predictor.validation import MeasuredRun
from slurm_plugin.siteconfig import PartitionPolicy

from .identification import MIN_FIT_RUNS, NOISE_FLOOR, identified

log = logging.getLogger(__name__)

FACTORS = KIND_SCALES
LABEL = {"compute_scale": "compute", "attention_scale": "attention", "host_layer_scale": "host per layer",
         "host_micro_batch_scale": "host per micro-batch", "host_launch_scale": "host per launch",
         "network_scale": "network between nodes"}
# A factor's prior: FITTED_SCALE_RANGE (a factor of 2 either way) as two standard deviations of
# its log; a factor is "identified" by a kind's runs when they pin its log to half that.
TAU0 = math.log(FITTED_SCALE_RANGE[1]) / 2
# Each factor's log bounds, and its prior's weight against TAU0's: a factor with a wider range
# (the attention scale, predictor.platform.scale_range) has a wider prior, its range as 2 sd too.
_LOG_LO = np.array([math.log(scale_range(f)[0]) for f in KIND_SCALES])
_LOG_HI = np.array([math.log(scale_range(f)[1]) for f in KIND_SCALES])
_PRIOR_WEIGHT = (TAU0 / (_LOG_HI / 2)) ** 2
# Identified: the runs pin the factor's log to half its prior's width (TAU0 / 2 for most).
_MAX_STD = _LOG_HI / 4
MIN_ELASTICITY = NOISE_FLOOR / math.log(2.0)
# The pooling strengths leave-one-out chooses among (sigma^2 / tau^2; inf: no per-kind factors).
LAMBDAS = tuple(float(x) for x in np.geomspace(1e-5, 1e3, 17)) + (math.inf,)
_BUMP = 1.04
# The interval scores' refits: one per run up to this many runs, then this many folds (K-fold
# CV+, Barber et al. 2021), which bounds validate's and refit's cost at MAX_REFITS fits.
MAX_REFITS = 20


@dataclass(frozen=True)
class FactorFit:
    value: float
    std_error: float          # of its log (posterior, sigma^2 (X'X + P)^-1)
    status: str               # "fitted" | "pooled: <why>" | "not seen"


@dataclass(frozen=True)
class KindFit:
    """One kind's result, for the report and for ``[[fitted_kind]]``."""

    kind: str
    runs: int
    mape_before: float
    loo_mape_after: float
    factors: dict[str, FactorFit]
    scores: tuple[float, ...]              # leave-one-out log(measured / predicted)
    coverage_before: float                 # share of its runs inside the interval, before / after
    coverage_after: float
    killed_before: int                     # runs a default filled limit would have killed
    killed_after: int
    domain: Optional[FitDomain] = None
    scores_before: tuple[float, ...] = ()  # log(measured / predicted by the platform as it is)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "runs": self.runs, "mape_before": self.mape_before,
                "loo_mape_after": self.loo_mape_after,
                "factors": {f: dataclasses.asdict(v) for f, v in self.factors.items()},
                "coverage_before": self.coverage_before, "coverage_after": self.coverage_after,
                "killed_before": self.killed_before, "killed_after": self.killed_after}


@dataclass(frozen=True)
class HierarchicalFit:
    """What ``--fit`` found (the attributes :class:`calibrate.validate.FitResult` has, so that
    validate and refit read either)."""

    mape_before: float
    loo_mape_after: float
    loo_predictions: list[float]
    loo_change_se: float
    partition: dict[str, FactorFit]
    kinds: list[KindFit]
    pooling: float                          # lambda chosen by leave-one-out (inf: none per kind)
    pooling_loo: dict[str, float]           # lambda -> linearised leave-one-out MAPE
    unseen_kind_bound: float
    domain: Optional[FitDomain] = None
    written: bool = False
    reason: str = ""
    fitted: tuple[str, ...] = ()            # partition-level factors that moved
    identification: dict[str, Optional[float]] = field(default_factory=dict)
    host_fitted: bool = False

    @property
    def improves(self) -> bool:
        return self.mape_before - self.loo_mape_after > self.loo_change_se

    def scale(self, name: str) -> float:
        f = self.partition.get(name)
        return f.value if f is not None else 1.0

    @property
    def compute_scale(self) -> float:
        return self.scale("compute_scale")

    @property
    def network_scale(self) -> float:
        return self.scale("network_scale")

    @property
    def host_scale(self) -> float:
        return 1.0

    def terms(self, **meta: Any) -> FittedTerms:
        parent = FittedTerms(**{f: _snap(self.scale(f)) for f in FACTORS}, domain=self.domain,
                             unseen_kind_bound=round(self.unseen_kind_bound, 4),
                             pooling=0.0 if math.isinf(self.pooling) else round(self.pooling, 6), **meta)
        kinds = tuple(KindTerms(k.kind, k.runs, tuple((f, _snap(k.factors[f].value)) for f in FACTORS),
                                tuple((f, round(k.factors[f].std_error, 4)) for f in FACTORS
                                      if k.factors[f].status != "not seen"),
                                tuple(k.scores), round(k.mape_before, 6), round(k.loo_mape_after, 6), k.domain)
                      for k in self.kinds)
        return dataclasses.replace(parent, kinds=kinds)

    def interval_terms(self, parent: Optional[FittedTerms] = None) -> FittedTerms:
        """Factors declined, intervals kept: ``parent`` (the platform's ``[fitted]``; None: every
        factor 1) for every kind, with each kind's residuals under it and the unseen-kind bound, so
        that a stack with no runs gets the across-kinds bound, not the recorded stack's quantile."""
        p = parent if parent is not None else FittedTerms()
        # A legacy host_scale multiplies every host factor; a kind's terms carry them folded in.
        scales = tuple((f, getattr(p, f) * (p.host_scale if f.startswith("host_") else 1.0)) for f in FACTORS)
        kinds = tuple(KindTerms(k.kind, k.runs, scales, (), k.scores_before, round(k.mape_before, 6),
                                round(k.mape_before, 6), None) for k in self.kinds)
        return dataclasses.replace(p, kinds=kinds, unseen_kind_bound=round(self.unseen_kind_bound, 4))

    def describe(self) -> str:
        parts = [f"{LABEL[f]} {v.value:.3f} ± {100 * v.std_error:.0f} %" for f, v in self.partition.items()
                 if v.status == "fitted"]
        pool = "none per kind (one set for all)" if math.isinf(self.pooling) else f"{self.pooling:.3g}"
        return (f"partition: {'; '.join(parts) or 'every factor 1'}; {len(self.kinds)} kind(s), pooling "
                f"strength {pool} (leave-one-out)")

    def report(self) -> str:
        """Per kind: runs, MAPE before / after (leave-one-out), factors with standard errors,
        interval coverage and limits killed, before -> after."""
        lines = [f"{'kind':<38}{'runs':>5}{'MAPE before':>13}{'after':>8}{'coverage':>14}{'killed':>9}  factors"]
        for k in self.kinds:
            fac = "; ".join(
                f"{LABEL[f]} {v.value:.3f}±{100 * v.std_error:.0f}%" + ("" if v.status == "fitted" else f" ({v.status})")
                for f, v in k.factors.items() if v.status != "not seen")
            lines.append(f"{k.kind[:37]:<38}{k.runs:>5}{100 * k.mape_before:>12.1f}%{100 * k.loo_mape_after:>7.1f}%"
                         f"{100 * k.coverage_before:>6.0f}→{100 * k.coverage_after:.0f}%"
                         f"{k.killed_before:>5}→{k.killed_after:<3}  {fac}")
        lines.append(f"a kind with no runs: interval ×{math.exp(-self.unseen_kind_bound):.2f}–"
                     f"×{math.exp(self.unseen_kind_bound):.2f} (the spread across kinds), the partition's factors")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"mape_before": self.mape_before, "loo_mape_after": self.loo_mape_after,
                "loo_change_se": self.loo_change_se, "written": self.written, "reason": self.reason,
                "pooling": None if math.isinf(self.pooling) else self.pooling,
                "pooling_loo": {("inf" if math.isinf(k) else f"{k:.3g}"): v for k, v in self.pooling_loo.items()},
                "unseen_kind_bound": self.unseen_kind_bound,
                "partition": {f: dataclasses.asdict(v) for f, v in self.partition.items()},
                "kinds": [k.to_dict() for k in self.kinds], "fitted": list(self.fitted),
                "compute_scale": self.compute_scale, "network_scale": self.network_scale,
                "domain": self.domain.to_dict() if self.domain is not None else None}


# A factor within half a percent of 1 is written as 1: a sixth of the scatter of repeated steps
# (NOISE_FLOOR), so no measurement can tell it from 1, and a compute scale other than 1 puts every
# operator's floor at its roofline, which moved CPU jobs of other kinds by up to 4 % for a 0.9999.
SNAP = 0.005


_DEFAULT_POLICY = PartitionPolicy()


def filled_iteration_seconds(point_seconds: float, high_seconds: float, margin: float = _DEFAULT_POLICY.margin,
                             level: float = _DEFAULT_POLICY.fill_level) -> float:
    """The iteration time a filled limit covers (slurm_plugin.policy, the default policy's margin
    and level unless given): the point with its margin, or the upper bound at ``level`` from the
    interval's upper end ``high_seconds`` if longer; its start-up allowance and rounding only
    lengthen it, so a run above this one would have been killed."""
    return max(point_seconds * (1.0 + margin), upper_at_level(point_seconds, high_seconds, level))


def _snap(value: float) -> float:
    return 1.0 if abs(math.log(value)) < SNAP else round(value, 4)


def _predict(platform: Platform, jobs: Sequence[Any], scales: Optional[dict[str, float]] = None) -> np.ndarray:
    from predictor.estimate import predict_many
    plat = dataclasses.replace(platform, fitted=None if scales is None else FittedTerms(**scales))
    return np.array([p.iteration_seconds for p in predict_many(jobs, plat)], dtype=float)


def _clamp_log(b: np.ndarray) -> np.ndarray:
    """A factor vector's logs (one per FACTORS), each within its scale range."""
    return np.clip(b, _LOG_LO, _LOG_HI)


def _design(J: np.ndarray, kind_idx: np.ndarray, nk: int) -> np.ndarray:
    """Columns: the partition's factors, then each kind's deviations (zero outside its runs)."""
    n, k = J.shape
    X = np.zeros((n, k * (nk + 1)))
    X[:, :k] = J
    for i in range(n):
        c = kind_idx[i]
        X[i, k * (c + 1):k * (c + 2)] = J[i]
    return X


def _penalty(k: int, nk: int, lam0: float, lam: float) -> np.ndarray:
    P = np.zeros(k * (nk + 1))
    P[:k] = lam0 * _PRIOR_WEIGHT
    P[k:] = lam if math.isfinite(lam) else 1e12
    return np.diag(P)


def _solve(X: np.ndarray, y: np.ndarray, P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coefficients, (X'X + P)^-1)."""
    A = X.T @ X + P
    Ainv = np.linalg.pinv(A)
    return Ainv @ (X.T @ y), Ainv


def _loo_linear(X: np.ndarray, y: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Leave-one-out residuals y_i - x_i . b(-i) of the penalised fit, through its hat matrix."""
    b, Ainv = _solve(X, y, P)
    e = y - X @ b
    h = np.einsum("ij,jk,ik->i", X, Ainv, X)
    return e / np.maximum(1.0 - h, 1e-9)


def fit_hierarchical(platform: Platform, runs: Sequence[MeasuredRun],
                     current: Optional[Sequence[float]] = None,
                     spreads: Sequence[KindSpread] = SHIPPED_KIND_SPREADS,
                     factors_only: bool = False) -> HierarchicalFit:
    """Fit per-kind factors on ``runs`` (see the module docstring); ``current``: the platform's own
    predictions of the runs as it is (with its ``[fitted]``), when already computed; ``spreads``:
    the kinds measured elsewhere that the unseen-kind bound pools with this site's;
    ``factors_only``: the factors alone, no leave-one-out, scores or coverage (what the refits
    behind the interval scores need)."""
    from predictor.estimate import predict_many
    n = len(runs)
    measured = np.array([r.measured_iteration_seconds for r in runs], dtype=float)
    if current is None:
        current = [p.iteration_seconds for p in predict_many([r.job for r in runs], platform)]
    cur = np.asarray(current, dtype=float)
    before = float(np.mean(np.abs(cur / measured - 1.0))) if n else 0.0
    keys = [kind_of(r.job).key for r in runs]
    kinds = sorted(set(keys))
    base = dataclasses.replace(platform, fitted=None)
    rule0 = IntervalRule.for_platform(platform)
    if n < MIN_FIT_RUNS:
        return HierarchicalFit(before, before, list(cur), 0.0, {}, [], math.inf, {}, SHIPPED_PRIOR.maximum,
                               reason=f"not written: fitting needs at least {MIN_FIT_RUNS} runs (got {n})")
    jobs = [r.job for r in runs]
    k = len(FACTORS)
    p0 = _predict(base, jobs)
    r = np.log(measured) - np.log(p0)
    J = np.zeros((n, k))
    for j, name in enumerate(FACTORS):
        if name.startswith("host_") and platform.host is None:
            continue
        J[:, j] = np.log(_predict(base, jobs, {name: _BUMP}) / p0) / math.log(_BUMP)
    sees = np.abs(J) > MIN_ELASTICITY
    active = [j for j in range(k) if int(sees[:, j].sum()) >= MIN_FIT_RUNS]
    J = np.where(sees, J, 0.0)
    J[:, [j for j in range(k) if j not in active]] = 0.0
    kind_idx = np.array([kinds.index(x) for x in keys])
    nk = len(kinds)
    X = _design(J, kind_idx, nk)

    # sigma: the scatter a per-kind least-squares fit leaves (never below the noise floor).
    def sigma_of(lam: float, y: np.ndarray) -> float:
        P = _penalty(k, nk, NOISE_FLOOR ** 2 / TAU0 ** 2, lam)
        b, Ainv = _solve(X, y, P)
        dof = max(n - float(np.trace(X @ Ainv @ X.T)), 1.0)
        return max(float(np.sqrt(np.sum((y - X @ b) ** 2) / dof)), NOISE_FLOOR)

    offset = np.zeros(n)          # the linearisation's remainder at the fitted factors
    y = r.copy()
    sigma = sigma_of(1.0, y)
    lam0 = sigma ** 2 / TAU0 ** 2
    loo_mape = {}
    for lam in LAMBDAS:
        e = _loo_linear(X, y, _penalty(k, nk, lam0, lam))
        loo_mape[lam] = float(np.mean(np.abs(np.exp(-e) - 1.0)))
    # Within 0.01 point of the best, the least pooling: runs of one kind alone cannot say how much
    # of their offset is the partition's, and other kinds' jobs must not pay for it.
    best = min(loo_mape.values())
    lam = min(x for x in LAMBDAS if loo_mape[x] <= best + 1e-4)
    if nk == 1:
        # One kind: how much of its offset other kinds share is not in these runs at all (every
        # pooling strength fits them alike up to the shrinkage), so the kind keeps it.
        lam = LAMBDAS[0]
    P = _penalty(k, nk, lam0, lam)
    for _ in range(2):
        b, _ = _solve(X, r - offset, P)
        betas = _kind_betas(b, k, nk)
        fitted_log = np.zeros(n)
        for c, key in enumerate(kinds):
            m = kind_idx == c
            scales = {f: float(np.exp(betas[c][j])) for j, f in enumerate(FACTORS)}
            fitted_log[m] = np.log(_predict(base, [jobs[i] for i in np.flatnonzero(m)], scales) / p0[m])
        offset = fitted_log - np.array([J[i] @ betas[kind_idx[i]] for i in range(n)])
    y = r - offset
    b, Ainv = _solve(X, y, P)
    sigma = sigma_of(lam, y)
    cov = sigma ** 2 * Ainv
    betas = _kind_betas(b, k, nk)

    # Leave-one-out through the real predictor: each run at the factors fitted without it.
    loo = np.zeros(n)
    Xt_y = X.T @ y
    A = X.T @ X + P
    if factors_only:
        loo = cur.copy()            # not used: the refit wants the factors alone
    for i in range(0 if factors_only else n):
        bi = np.linalg.pinv(A - np.outer(X[i], X[i])) @ (Xt_y - X[i] * y[i])
        beta = _clamp_log(bi[:k] + (bi[k * (kind_idx[i] + 1):k * (kind_idx[i] + 2)] if math.isfinite(lam) else 0.0))
        loo[i] = _predict(base, [jobs[i]], {f: float(np.exp(beta[j])) for j, f in enumerate(FACTORS)})[0]
    err_after = np.abs(loo / measured - 1.0)
    err_before = np.abs(cur / measured - 1.0)
    change = err_before - err_after
    change_se = float(np.std(change, ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    # The interval scores: each run predicted as a new job of its kind would be, by the whole fit
    # (pooling strength, linearisation, domain, snapping) redone without it; the leave-one-out
    # above keeps those fixed at what every run chose, and its residuals ran a few percent smaller
    # than held-out runs' (docs/calibration.md).
    loo_int = loo if factors_only or n <= MIN_FIT_RUNS else _refit_predictions(base, runs, p0, spreads)
    scores = np.log(measured / loo_int)

    part_std = identified(J, sees, y, among=active, names=FACTORS)
    partition = {}
    for j, f in enumerate(FACTORS):
        se = float(math.sqrt(max(cov[j, j], 0.0)))
        if j not in active:
            partition[f] = FactorFit(1.0, 0.0, "not seen")
        else:
            partition[f] = FactorFit(float(np.exp(_clamp_log(b[:k])[j])), se, _status(part_std.get(f), j))
    unseen = unseen_kind_bound([kind_score(u) for u in _unseen_residuals(J, y, r, kind_idx, nk, k, lam0)]
                               + [sp.score for sp in spreads], floor=SHIPPED_PRIOR.maximum)
    kind_fits = []
    for c, key in enumerate(kinds):
        m = kind_idx == c
        idx = np.flatnonzero(m)
        std = identified(J[m], sees[m], y[m], among=[j for j in active if sees[m, j].any()], names=FACTORS)
        facs = {}
        for j, f in enumerate(FACTORS):
            if j not in active or not sees[m, j].any():
                facs[f] = FactorFit(float(np.exp(_clamp_log(betas[c])[j])) if j in active else 1.0,
                                    0.0, "not seen")
                continue
            g = np.zeros(len(b))
            g[j] = 1.0
            if math.isfinite(lam):
                g[k * (c + 1) + j] = 1.0
            se = float(math.sqrt(max(g @ cov @ g, 0.0)))
            st = _status(std.get(f), j)
            facs[f] = FactorFit(float(np.exp(_clamp_log(betas[c])[j])), se,
                                st if st == "fitted" else f"pooled to the partition's: {st}")
        kind_scores = scores[m]
        cov_b, kill_b, cov_a, kill_a = 0, 0, 0, 0
        for t, i in enumerate(idx):
            lo, hi = rule0.factors
            inside = cur[i] * lo <= measured[i] <= cur[i] * hi
            cov_b += inside
            kill_b += measured[i] > filled_iteration_seconds(cur[i], cur[i] * hi)
            others = np.delete(kind_scores, t)
            rest = np.delete(scores, idx)
            rule = IntervalRule.from_scores(list(rest) if len(rest) else [], calibrated=platform.calibrated)
            rule = rule.for_kind(list(others), unseen) if len(others) else rule.for_kind(None, unseen)
            lo, hi = rule.factors
            cov_a += loo_int[i] * lo <= measured[i] <= loo_int[i] * hi
            kill_a += measured[i] > filled_iteration_seconds(loo_int[i], loo_int[i] * hi)
        kind_fits.append(KindFit(key, int(m.sum()), float(np.mean(err_before[m])), float(np.mean(err_after[m])),
                                 facs, tuple(float(x) for x in kind_scores), cov_b / len(idx), cov_a / len(idx),
                                 int(kill_b), int(kill_a),
                                 FitDomain.of_jobs([jobs[i] for i in idx], platform.gpus_per_node),
                                 tuple(float(x) for x in np.log(measured[m] / cur[m]))))
    moved = tuple(f for f, v in partition.items() if v.status == "fitted" and abs(math.log(v.value)) > 1e-3)
    log.info("hierarchical fit on %d runs of %d kinds: pooling %s, leave-one-out MAPE %.4f -> %.4f",
             n, nk, lam, before, float(np.mean(err_after)))
    return HierarchicalFit(before, float(np.mean(err_after)), [float(x) for x in loo], change_se, partition,
                           kind_fits, lam, loo_mape, unseen, FitDomain.of_jobs(jobs, platform.gpus_per_node),
                           fitted=moved, identification={f: (None if v is None or not np.isfinite(v) else
                                                             round(float(v), 4)) for f, v in part_std.items()},
                           host_fitted=any(f.startswith("host_") for f in moved))


def refit_folds(keys: Sequence[str], max_refits: int = MAX_REFITS) -> list[int]:
    """The fold of each run: up to ``max_refits`` runs, each its own (leave-one-out); above, its
    rank among its kind's runs modulo ``max_refits``, so that every fold holds a share of every
    kind."""
    if len(keys) <= max_refits:
        return list(range(len(keys)))
    seen: dict[str, int] = {}
    out = []
    for key in keys:
        out.append(seen.get(key, 0) % max_refits)
        seen[key] = seen.get(key, 0) + 1
    return out


def _refit_predictions(base: Platform, runs: Sequence[MeasuredRun], p0: np.ndarray,
                       spreads: Sequence[KindSpread]) -> np.ndarray:
    """Each run's prediction by the terms fitted on the runs outside its fold (:func:`refit_folds`),
    through the real predictor (``p0``: every run predicted by ``base``)."""
    from predictor.estimate import predict_many
    fold = np.array(refit_folds([kind_of(r.job).key for r in runs]))
    out = np.zeros(len(runs))
    for f in sorted(set(fold.tolist())):
        held = np.flatnonzero(fold == f)
        rest = np.flatnonzero(fold != f)
        fit = fit_hierarchical(base, [runs[i] for i in rest], current=list(p0[rest]), spreads=spreads,
                               factors_only=True)
        preds = predict_many([runs[i].job for i in held], dataclasses.replace(base, fitted=fit.terms()))
        out[held] = [p.iteration_seconds for p in preds]
    return out


def _kind_betas(b: np.ndarray, k: int, nk: int) -> list[np.ndarray]:
    return [_clamp_log(b[:k] + b[k * (c + 1):k * (c + 2)]) for c in range(nk)]


def _status(std: Optional[float], j: int) -> str:
    """Factor ``j``'s status given the log standard deviation its runs identify it to."""
    if std is None:
        return "not seen"
    if not np.isfinite(std):
        return "not identified: collinear with another factor on these runs"
    if std > _MAX_STD[j]:
        return f"not identified: log std {std:.2f} > {_MAX_STD[j]:.2f}"
    return "fitted"


def _unseen_residuals(J: np.ndarray, y: np.ndarray, r: np.ndarray, kind_idx: np.ndarray, nk: int, k: int,
                      lam0: float) -> list[np.ndarray]:
    """Per kind: its runs' log residuals at the partition's factors fitted on the other kinds' runs
    (linearised: ``y``), with one kind at the models as they are (``r``): each kind as never seen."""
    if nk == 1:
        return [r]
    P = lam0 * np.diag(_PRIOR_WEIGHT[:k])
    out = []
    for c in range(nk):
        m = kind_idx == c
        b = np.linalg.pinv(J[~m].T @ J[~m] + P) @ (J[~m].T @ y[~m])
        out.append(y[m] - J[m] @ b)
    return out


def kind_spreads(platform: Platform, runs: Sequence[MeasuredRun], dataset: str) -> list[KindSpread]:
    """Each kind of ``runs`` predicted by ``platform``'s measured models (no ``[fitted]`` factors):
    :data:`predictor.interval.SHIPPED_KIND_SPREADS`' rows, ``dataset`` naming where the runs are."""
    from predictor.estimate import predict_many
    by: dict[str, list[float]] = {}
    preds = predict_many([r.job for r in runs], dataclasses.replace(platform, fitted=None))
    for r, p in zip(runs, preds):
        by.setdefault(kind_of(r.job).key, []).append(math.log(r.measured_iteration_seconds / p.iteration_seconds))
    return [KindSpread(dataset, key, kind_score(v), len(v)) for key, v in sorted(by.items())]
