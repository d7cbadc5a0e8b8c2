"""The 90 % interval around a predicted iteration time, from measured residuals (split conformal).

Each run recorded on a platform (``[[validation]]``, :mod:`predictor.validation`) gives one
residual, the *score* ``log(measured / predicted)``: > 0 where the platform under-predicted.  The
recorded predictions were made without the run (the operator regressors never see end-to-end
runs; ``perf-calibrate validate --fit`` records each run with the prediction of the scales fitted
on the *other* runs), and a new job's ``|log(measured / predicted)|`` is, if the job is like the
recorded runs, exchangeable with them.  Not every run is unseen by the modelling, though: the lent
H100's family (33 of the 43 pooled runs) was the development set of the host model
(docs/modelling.md §6), so its residuals are if anything smaller than a new job's.
Then for n scores the ⌈(n + 1)(1 − α)⌉-th smallest ``|score|`` ``q`` gives an interval
``[point · e^−q, point · e^q]`` that holds the new run's measured time with probability ≥ 1 − α
(Vovk et al.; Lei et al. 2018, "Distribution-free predictive inference for regression").
One symmetric score rather than two one-sided ones at α/2: a finite bound from 9 runs, not 19.

Where the platform has too few runs of its own for that quantile to exist (n < :data:`MIN_OWN_RUNS`):

* 1 ≤ n < 9: the pooled prior's quantile (:data:`SHIPPED_PRIOR`, every shipped platform's runs),
  widened on each side to the platform's own worst run on that side (its own runs are direct
  evidence that it can be worse than the pool: Vista under-predicts by up to 37 %).
* n = 0, but the platform's compute bundle (same GPU, same manifest sha256) has runs recorded on
  another shipped platform (:data:`SHIPPED_BUNDLE_RUNS`; dgx-a100 shares Perlmutter's A100
  bundle): the pooled quantile, widened on each side to that platform's worst run.  What a job
  spends on the bundle's operators and on the host (the same prior on both) is then the evidence
  those runs give; what differs between the two machines, the network, is a ring model of this
  platform's published links, whose ±50 % operator spread widens the interval as for any
  ring-model collective (below).
* n = 0, no run at all: the pooled prior's *largest* score on both sides.  The 90 % pooled quantile
  assumes the platform's runs are like the pool's, which a platform that never recorded a run has
  not shown (docs/modelling.md §4 has the measurement).

The operator-level spread (every term at the low / high end of its own validation error, which
:func:`predictor.estimate.predict_many` assembles) already shows in the recorded residuals for
shapes like the recorded ones, and is no guide to them there (docs/modelling.md §4).  It widens
the interval only where the job leaves what the recorded runs cover, where it is the one estimate
there is:

* ``extrapolated``: a shape outside the sampled range (the regressor's p90 plus the measured
  extrapolation error, ``predictor.estimate.EXTRAPOLATION_ERROR_*``; roofline scaling);
* ``analytic_collectives``: a collective costed by the ring model of the published link speeds
  (no recorded run of any shipped platform has one);
* an uncalibrated platform (``calibrated = false``: published specs only), always.

It is then combined with the conformal bound in quadrature on the log scale, as independent errors
are: the residuals already contain the in-range operator error, and multiplying the spread on
would count it twice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from .errors import RunRecordError

if TYPE_CHECKING:    # pragma: no cover - typing only (platform.py imports validation.py)
    from .platform import Platform
    from .validation import MeasuredRun

# The interval's nominal miscoverage: a 90 % interval (the one every answer prints).
ALPHA = 0.10


def _finite(xs: Iterable[float], what: str) -> list[float]:
    out = []
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise RunRecordError(f"{what}: every residual must be a finite number, got {x!r}")
        out.append(float(x))
    return out


def _check_alpha(alpha: float) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def conformal_rank(n: int, alpha: float = ALPHA) -> int:
    """The rank (1-based) of the split-conformal quantile among n scores: ⌈(n + 1)(1 − α)⌉.

    Greater than n where n scores are too few for a finite bound at level 1 − α.
    """
    _check_alpha(alpha)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # The product is rounded first so that e.g. (9 + 1) · 0.9 = 9.000000000000002 ranks 9, not 10.
    return math.ceil(round((n + 1) * (1.0 - alpha), 9))


def min_runs(alpha: float = ALPHA) -> int:
    """The fewest scores for which the conformal quantile exists at level 1 − α (9 at α = 0.1)."""
    n = 1
    while conformal_rank(n, alpha) > n:
        n += 1
    return n


MIN_OWN_RUNS = min_runs(ALPHA)


def conformal_quantile(scores: Sequence[float], alpha: float = ALPHA) -> Optional[float]:
    """The ⌈(n + 1)(1 − α)⌉-th smallest of ``scores``; None where there are too few."""
    xs = sorted(_finite(scores, "scores"))
    k = conformal_rank(len(xs), alpha)
    return xs[k - 1] if k <= len(xs) else None


def run_scores(runs: Iterable["MeasuredRun"]) -> list[float]:
    """``log(measured / predicted)`` of each run (> 0: under-predicted); every run needs a prediction."""
    out = []
    for run in runs:
        if not run.predicted_iteration_seconds > 0:
            raise RunRecordError(f"run {run.name!r}: no predicted_iteration_seconds, so no residual "
                                 "(perf-calibrate validate records one)")
        out.append(run.log_ratio)
    return _finite(out, "scores")


@dataclass(frozen=True)
class PooledPrior:
    """What the recorded runs of many platforms say about a platform with few or none of its own."""

    quantile: float     # the conformal quantile of the pooled |scores| at level 1 - ALPHA
    maximum: float      # the largest pooled |score|
    runs: int           # how many runs were pooled

    @classmethod
    def from_scores(cls, scores: Sequence[float], alpha: float = ALPHA) -> "PooledPrior":
        mags = [abs(s) for s in _finite(scores, "pooled scores")]
        q = conformal_quantile(mags, alpha)
        if q is None:
            raise RunRecordError(f"a pooled prior needs at least {min_runs(alpha)} runs, got {len(mags)}")
        return cls(quantile=q, maximum=max(mags), runs=len(mags))


# Pooled over every shipped platform's recorded runs: dgx-h100 33, perlmutter-a100 5, vista-gh200 5
# (43 runs; dgx-a100 records none).  quantile: the ⌈44 · 0.9⌉ = 40th smallest |log(measured /
# predicted)| = 0.23246 (a dgx-h100 run: ×0.79–1.26); maximum: Vista's GPT-20B 8-4-4, under-predicted
# by 38 % (log 1.6022 = 0.47138).  Both rounded *up* at the 4th decimal, so they still cover what
# they were computed from.  Recompute: python benchmarks/bench_intervals.py --pooled;
# tests/predictor/test_interval.py checks them against the shipped records.
SHIPPED_PRIOR = PooledPrior(quantile=0.2325, maximum=0.4714, runs=43)


@dataclass(frozen=True)
class BundleRuns:
    """The runs one shipped platform recorded with its compute bundle: the evidence a platform that
    shares the bundle (the same GPU's measured operators) has before it records runs of its own."""

    platform: str       # the shipped platform the runs were recorded on
    low: float          # its worst over-prediction, −min log(measured / predicted), 0 if none
    high: float         # its worst under-prediction, max log(measured / predicted), 0 if none
    runs: int


# Keyed by the compute bundle's manifest sha256 (platform.toml's compute_bundle_sha256); each side
# rounded *up* at the 4th decimal.  Recompute: python benchmarks/bench_intervals.py --pooled;
# tests/predictor/test_interval.py checks them against the shipped records.
SHIPPED_BUNDLE_RUNS: dict[str, BundleRuns] = {
    "27ab504fcc2bd8521d3b6a28c4b0738cd4588d54281c800a46e7ecbf4133e407":
        BundleRuns("perlmutter-a100", low=0.044, high=0.0918, runs=5),
    "1dd4eed28acda1e5b15e930ca34674574c365e9cd86eea3bd3e5b8a84b9d3aa5":
        BundleRuns("dgx-h100", low=0.2686, high=0.2325, runs=33),
    "3becf2ce62d228e61cb55a129c614b3ff02536c2672de525fbb994e72969e3e6":
        BundleRuns("vista-gh200", low=0.0, high=0.4714, runs=5),
}


def bundle_runs(platforms: Iterable["Platform"]) -> dict[str, BundleRuns]:
    """What :data:`SHIPPED_BUNDLE_RUNS` holds, computed from ``platforms``' recorded runs (unrounded):
    per compute bundle, the platform with the most runs of it (the first such, on a tie)."""
    out: dict[str, BundleRuns] = {}
    for plat in platforms:
        scores = run_scores(plat.validation)
        if not scores or plat.transferred:
            continue
        sha = plat.compute.manifest_sha256
        if sha in out and out[sha].runs >= len(scores):
            continue
        out[sha] = BundleRuns(plat.name, low=max(0.0, -min(scores)), high=max(0.0, max(scores)),
                              runs=len(scores))
    return out


_NORMAL = NormalDist()
# z(1 − α/2) of the interval every answer prints (upper_at_level runs per filled time limit).
_Z_INTERVAL = _NORMAL.inv_cdf(1.0 - ALPHA / 2.0)


def upper_at_level(point: float, high: float, level: float, alpha: float = ALPHA) -> float:
    """The upper bound at one-sided ``level`` from the upper end ``high`` of a (1 − α) interval
    around ``point``: its log half-width scaled by z(level) / z(1 − α/2), a normal tail assumed
    beyond the measured quantile (the filled time limit's bound, slurm_plugin.policy)."""
    if point <= 0 or high <= point:
        return max(point, high)
    z_interval = _Z_INTERVAL if alpha == ALPHA else _NORMAL.inv_cdf(1.0 - alpha / 2.0)
    return point * (high / point) ** (_NORMAL.inv_cdf(level) / z_interval)


def kind_score(scores: Sequence[float], alpha: float = ALPHA) -> float:
    """How far one kind's runs lie from predictions that never saw a run of that kind: the conformal
    (1 − α) quantile of their ``|log(measured / predicted)|``, their largest where too few for it."""
    mags = [abs(x) for x in _finite(scores, "kind scores")]
    if not mags:
        raise ValueError("kind_score needs at least one score")
    q = conformal_quantile(mags, alpha)
    return max(mags) if q is None else q


def unseen_kind_bound(kind_scores: Sequence[float], floor: float = 0.0, alpha: float = ALPHA) -> float:
    """The log half-width of a kind with no runs, from :func:`kind_score` of K kinds measured.

    A new stack is one more *kind*, exchangeable with the kinds measured, not with their runs
    (hierarchical conformal prediction: Lee, Barber & Willett 2023), so the quantile is taken over
    kinds: the ⌈(K + 1)(1 − α)⌉-th smallest score, which is the largest until K ≥ 19 at α = 0.1
    (and the largest too where K < 9 gives no finite quantile); never below ``floor``."""
    s = _finite(kind_scores, "kind scores")
    if not s:
        return floor
    q = conformal_quantile(s, alpha)
    return max(floor, max(s) if q is None else q)


@dataclass(frozen=True)
class KindSpread:
    """One kind's runs of a development data set predicted by its platform as shipped (no run of
    the kind seen): what a stack the site has never run can be, before any run of it."""

    dataset: str        # the runs file's folder (benchmarks/data/...)
    kind: str           # predictor.kinds.JobKind.key
    score: float        # kind_score of its runs
    runs: int


# Every kind of the stack families measured for issue 28, rounded *up* at the 4th decimal.
# Recompute: python benchmarks/bench_fit_transfer.py --kind-spreads; tests/calibrate/test_kinds_fit.py
# checks the H100 rows against their runs file.
SHIPPED_KIND_SPREADS: tuple[KindSpread, ...] = (
    KindSpread('benchmarks/data/cpu-family', '-/fused_softmax/fp32/none', 0.4042, 14),
    KindSpread('benchmarks/data/cpu-family', 'deepspeed/fused_softmax/fp32/none', 0.7453, 14),
    KindSpread('benchmarks/data/cpu-family', 'torchtitan/fused_softmax/fp32/none', 0.6787, 14),
    KindSpread('benchmarks/data/h100-lent/stacks', '-/flash/bf16/none', 0.272, 61),
    KindSpread('benchmarks/data/h100-lent/stacks', '-/flash:sdpa_efficient/bf16/none', 0.4779, 28),
    KindSpread('benchmarks/data/h100-lent/stacks', '-/flash:sdpa_flash/bf16/none', 0.1333, 6),
    KindSpread('benchmarks/data/h100-lent/stacks', '-/fused_softmax/bf16/none', 0.2705, 10),
    KindSpread('benchmarks/data/h100-lent/stacks', 'llm-foundry/flash/bf16/none', 0.3083, 6),
    KindSpread('benchmarks/data/h100-lent/stacks', 'llm-foundry/flash:cudnn/bf16/none', 0.2793, 38),
    KindSpread('benchmarks/data/h100-lent/stacks', 'llm-foundry/fused_softmax/bf16/none', 0.376, 4),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/flash/bf16/full', 0.4427, 17),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/flash/bf16/none', 0.462, 6),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/flash:cudnn/bf16/full', 0.1161, 12),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/flash:cudnn/bf16/none', 0.1009, 39),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/flash:cudnn/bf16/selective', 0.2999, 33),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/fused_softmax/bf16/full', 0.0184, 1),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/fused_softmax/bf16/none', 0.5844, 5),
    KindSpread('benchmarks/data/h100-lent/stacks', 'torchtitan/fused_softmax/bf16/selective', 0.3484, 2),
)


# Where a rule's half-widths came from (IntervalRule.source): the four of a platform's runs, and the
# three of a per-kind fit ([[fitted_kind]]): "kind" (the kind's own runs, n >= MIN_OWN_RUNS),
# "kind-pooled" (the platform's rule times sqrt(1 + 1/n) around the kind's mean residual, and to
# the kind's worst runs), "unseen-kind" (a kind with no runs: no narrower than the spread measured
# across kinds).
SOURCES = ("own", "pooled", "bundle", "prior", "kind", "kind-pooled", "unseen-kind")


@dataclass(frozen=True)
class IntervalRule:
    """The log-scale half-widths of a platform's interval, built once from its recorded runs.

    ``low`` / ``high``: the interval is ``[point · e^−low, point · e^high]`` before any operator
    spread (:func:`interval_seconds`).  ``source`` says where they came from: ``"own"`` (the
    platform's runs, n ≥ :data:`MIN_OWN_RUNS`), ``"pooled"`` (the pooled prior's quantile, widened
    to the platform's own worst run on each side), ``"bundle"`` (no runs of its own: the pooled
    quantile widened to the worst runs of its compute bundle on ``evidence``, another shipped
    platform), ``"prior"`` (no runs: the pooled maximum).
    """

    low: float
    high: float
    source: str
    runs: int = 0
    calibrated: bool = True     # False: published specs only; the operator spread always widens
    alpha: float = ALPHA
    evidence: str = ""          # source "bundle": the platform whose runs of the bundle answered

    def __post_init__(self) -> None:
        for key in ("low", "high"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"IntervalRule.{key} must be a finite number >= 0, got {v!r}")
        if self.source not in SOURCES:
            raise ValueError(f"IntervalRule.source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        _check_alpha(self.alpha)

    @classmethod
    def from_scores(cls, scores: Sequence[float], *, calibrated: bool = True,
                    prior: PooledPrior = SHIPPED_PRIOR, alpha: float = ALPHA,
                    bundle: Optional[BundleRuns] = None) -> "IntervalRule":
        """From signed scores ``log(measured / predicted)`` of a platform's recorded runs;
        ``bundle``: its compute bundle's runs on another platform, used only when it has none."""
        s = _finite(scores, "scores")
        q = conformal_quantile([abs(x) for x in s], alpha)
        if q is not None:
            return cls(q, q, "own", len(s), calibrated, alpha)
        if not s and bundle is not None and bundle.runs > 0:
            return cls(max(prior.quantile, bundle.low), max(prior.quantile, bundle.high), "bundle", 0,
                       calibrated, alpha, evidence=bundle.platform)
        if not s:
            return cls(prior.maximum, prior.maximum, "prior", 0, calibrated, alpha)
        # A platform's own runs never lie outside its interval: each side reaches its worst one.
        low = max(prior.quantile, max(-x for x in s))
        high = max(prior.quantile, max(s))
        return cls(low, high, "pooled", len(s), calibrated, alpha)

    @classmethod
    def from_runs(cls, runs: Sequence["MeasuredRun"], *, calibrated: bool = True,
                  prior: PooledPrior = SHIPPED_PRIOR, alpha: float = ALPHA) -> "IntervalRule":
        """From a platform's recorded runs (``platform.validation``), each with its prediction.

        The recorded predictions must not have seen their own run; ``perf-calibrate validate``
        records them so (with ``--fit``, each run's leave-one-out prediction).
        """
        return cls.from_scores(run_scores(runs), calibrated=calibrated, prior=prior, alpha=alpha)

    @classmethod
    def for_platform(cls, platform: "Platform") -> "IntervalRule":
        """The rule of a loaded platform: its ``[[validation]]`` runs and its ``calibrated`` flag;
        with no runs, its compute bundle's runs on another shipped platform
        (:data:`SHIPPED_BUNDLE_RUNS`), when the bundle was measured on this platform's GPU and the
        platform is calibrated."""
        bundle = SHIPPED_BUNDLE_RUNS.get(platform.compute.manifest_sha256)
        if bundle is not None and (bundle.platform == platform.name or platform.transferred
                                   or not platform.calibrated):
            bundle = None
        rule = cls.from_scores(run_scores(platform.validation), calibrated=platform.calibrated,
                               bundle=bundle)
        fitted = platform.fitted
        if fitted is None or not (fitted.kind or fitted.kinds or fitted.unseen_kind_bound):
            return rule
        return rule.for_kind(fitted.kind_scores if fitted.kind else None, fitted.unseen_kind_bound)

    def for_kind(self, scores: Optional[Sequence[float]], unseen_bound: float) -> "IntervalRule":
        """This (the platform's) rule for a job of one kind of a per-kind fit: ``scores``, the
        leave-one-out ``log(measured / predicted)`` of the kind's runs (None: a kind with no runs).

        A kind with :data:`MIN_OWN_RUNS` runs or more gets its own conformal quantile; one with
        fewer, this rule's half-widths times sqrt(1 + 1/n) around the runs' mean residual, never
        narrower than this rule and reaching its worst run on each side; a kind with none, this rule
        widened to ``unseen_bound`` (the spread measured across kinds): a stack never seen gets a
        safe limit, a well-known one a tight limit."""
        if scores is None:
            return IntervalRule(max(self.low, unseen_bound), max(self.high, unseen_bound), "unseen-kind",
                                0, self.calibrated, self.alpha)
        s = _finite(scores, "kind scores")
        q = conformal_quantile([abs(x) for x in s], self.alpha)
        if q is not None:
            return IntervalRule(q, q, "kind", len(s), self.calibrated, self.alpha)
        # Too few runs for a quantile of their own, but enough to show the kind's offset from the
        # models: the platform's spread around that offset, never narrower than the platform's rule
        # or the kind's worst run (the worst run alone covers a next run only n/(n+1) of the time).
        # The offset is the mean of n runs, so a next run's distance from it has the variance of
        # one run's and the mean's together: (1 + 1/n) times one run's.
        offset = sum(s) / len(s)
        widen = math.sqrt(1.0 + 1.0 / len(s))
        low = max([self.low, widen * self.low - offset] + [-x for x in s])
        high = max([self.high, widen * self.high + offset] + list(s))
        return IntervalRule(low, high, "kind-pooled", len(s), self.calibrated, self.alpha)

    @property
    def factors(self) -> tuple[float, float]:
        """(low, high) multipliers of the point before any operator spread: e^−low, e^high."""
        return math.exp(-self.low), math.exp(self.high)

    def describe(self) -> dict[str, Any]:
        """For an answer's ``details``: the factors and where they came from."""
        lo, hi = self.factors
        out = {"factors": [lo, hi], "source": self.source, "runs": self.runs,
               "level": 1.0 - self.alpha, "calibrated": self.calibrated}
        if self.evidence:
            out["evidence"] = self.evidence
        return out


def interval_seconds(point_seconds: float, spread_lo_seconds: float, spread_hi_seconds: float,
                     rule: IntervalRule, *, extrapolated: bool = False,
                     analytic_collectives: bool = False) -> tuple[float, float]:
    """(low, high) seconds of the interval around ``point_seconds``.

    ``spread_lo_seconds`` / ``spread_hi_seconds``: the iteration assembled with every term at the
    low / high end of its own uncertainty.  It widens the interval only where the job leaves what
    the recorded runs cover (``extrapolated``, ``analytic_collectives``, or an uncalibrated
    platform), in quadrature with the rule's bound on the log scale; otherwise it is not used.
    """
    if not (type(point_seconds) is float and type(spread_lo_seconds) is float and type(spread_hi_seconds) is float
            and 0.0 < point_seconds < math.inf and 0.0 <= spread_lo_seconds < math.inf
            and 0.0 <= spread_hi_seconds < math.inf):
        # Not three finite floats (the common case, checked at once): which one, and why.
        for key, v in (("point_seconds", point_seconds), ("spread_lo_seconds", spread_lo_seconds),
                       ("spread_hi_seconds", spread_hi_seconds)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{key} must be a finite number of seconds >= 0, got {v!r}")
        if point_seconds <= 0:
            raise ValueError(f"point_seconds must be > 0, got {point_seconds!r}")
    low, high = rule.low, rule.high
    if extrapolated or analytic_collectives or not rule.calibrated:
        # A spread end on the wrong side of the point (cannot happen when each term's low end is
        # below its value) widens nothing; a low end of 0 s is capped like estimate.py caps a term
        # (at 5 % of it), so the logarithm stays finite.
        s_lo = math.log(point_seconds / max(min(spread_lo_seconds, point_seconds), 0.05 * point_seconds))
        s_hi = math.log(max(spread_hi_seconds, point_seconds) / point_seconds)
        low, high = math.hypot(low, s_lo), math.hypot(high, s_hi)
    return point_seconds * math.exp(-low), point_seconds * math.exp(high)


def leave_one_out(scores: Sequence[float], *, calibrated: bool = True,
                  pooled: Optional[Sequence[float]] = None,
                  pooled_index: Optional[Sequence[int]] = None,
                  alpha: float = ALPHA) -> list[IntervalRule]:
    """For each score: the rule the *other* scores would have built (a run judged by the others).

    ``pooled``: the signed scores the pooled prior is built from (every shipped platform's runs);
    ``pooled_index``: where each of ``scores`` sits in ``pooled``, so that it is left out of the
    prior too and no run's own residual widens its own interval.  Without ``pooled``,
    :data:`SHIPPED_PRIOR`, which contains the shipped runs: use ``pooled`` to judge those.
    """
    s = _finite(scores, "scores")
    if pooled_index is not None and (pooled is None or len(pooled_index) != len(s)):
        raise ValueError("pooled_index needs pooled and one index per score")
    rules = []
    for i in range(len(s)):
        others = s[:i] + s[i + 1:]
        prior = SHIPPED_PRIOR
        if pooled is not None:
            skip = pooled_index[i] if pooled_index is not None else -1
            prior = PooledPrior.from_scores([x for j, x in enumerate(pooled) if j != skip], alpha)
        rules.append(IntervalRule.from_scores(others, calibrated=calibrated, prior=prior, alpha=alpha))
    return rules
