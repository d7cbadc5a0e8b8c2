"""How honest are the intervals: leave-one-out coverage and width on every shipped recorded run.

Every run is judged by an interval built WITHOUT it: its platform's other runs, and a pooled prior
from every shipped platform's runs less this one (:func:`evaluate`); :func:`pooled_report`
recomputes predictor.interval's SHIPPED_PRIOR and SHIPPED_BUNDLE_RUNS from the same runs.  The rules
compared (old: predictor.validation.ratio_range; new: predictor.interval.IntervalRule, with the
operator spread never, when flagged, always, or multiplied on; as an unseen platform) are described
in benchmarks/bench_intervals.py, which prints these reports.  Torch-free.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from predictor.estimate import predict_many
from predictor.interval import (ALPHA, MIN_OWN_RUNS, SHIPPED_PRIOR, IntervalRule, PooledPrior, bundle_runs,
                                conformal_rank, interval_seconds, leave_one_out)
from predictor.platform import SHIPPED_DIR, Platform, load_platform
from predictor.validation import DEFAULT_TIMELINE_RATIO, MeasuredRun, ratio_range


@dataclass(frozen=True)
class RunFacts:
    """One recorded run and what its prediction on its platform says about it."""
    platform: str
    run: MeasuredRun
    op_lo: float          # operator spread, relative to the point (≤ 1)
    op_hi: float          # (≥ 1)
    extrapolated: bool
    analytic: bool


def shipped_platforms() -> list[Platform]:
    """Every platform shipped in predictor/platforms/, by name."""
    return [load_platform(d) for d in sorted(SHIPPED_DIR.iterdir())
            if (d / "platform.toml").is_file()]


def pooled_scores(platforms: list[Platform]) -> list[tuple[str, MeasuredRun]]:
    """(platform name, run) for every recorded run of ``platforms``."""
    return [(p.name, r) for p in platforms for r in p.validation]


def run_facts(plat: Platform) -> list[RunFacts]:
    """Each of ``plat``'s recorded runs with its operator spread and flags, predicted again."""
    preds = predict_many([r.job for r in plat.validation], plat)
    out = []
    for run, p in zip(plat.validation, preds):
        # details is a dict or an object with to_dict() (estimate.py is being refactored).
        d = p.details.to_dict() if hasattr(p.details, "to_dict") else dict(p.details)
        if "operator_spread_seconds" in d:          # estimate.py with predictor.interval wired
            lo, hi = d["operator_spread_seconds"]
        else:                                       # before: interval = spread × timeline ratio
            r_lo, r_hi = d["timeline_ratio"]
            lo, hi = p.interval_seconds[0] / r_lo, p.interval_seconds[1] / r_hi
        analytic = any("analytic ring model" in w for w in p.warnings)
        out.append(RunFacts(plat.name, run, lo / p.iteration_seconds, hi / p.iteration_seconds,
                            p.extrapolated, analytic))
    return out


def judge(f: RunFacts, lo_factor: float, hi_factor: float) -> tuple[bool, float]:
    """(inside, width / point) of an interval given as factors on the recorded point."""
    point = f.run.predicted_iteration_seconds
    lo, hi = lo_factor * point, hi_factor * point
    return lo <= f.run.measured_iteration_seconds <= hi, (hi - lo) / point


def new_factors(f: RunFacts, rule: IntervalRule, spread: str) -> tuple[float, float]:
    """The rule's interval as factors on the point; the spread counted ``never``, ``flagged``, ``always``."""
    flagged = {"never": False, "flagged": f.extrapolated or f.analytic, "always": True}[spread]
    lo, hi = interval_seconds(1.0, f.op_lo, f.op_hi, rule, extrapolated=flagged)
    return lo, hi


def evaluate(platforms: list[Platform]) -> dict[str, Any]:
    """Leave-one-out coverage and median width of each rule, per platform and over ``"all"``."""
    pool = pooled_scores(platforms)
    pooled = [r.log_ratio for _, r in pool]
    report: dict[str, Any] = {"alpha": ALPHA, "platforms": []}
    every: dict[str, list[tuple[bool, float]]] = {}
    for plat in platforms:
        if not plat.validation:
            continue
        facts = run_facts(plat)
        index = [i for i, (name, _) in enumerate(pool) if name == plat.name]
        scores = [f.run.log_ratio for f in facts]
        rules = leave_one_out(scores, calibrated=plat.calibrated, pooled=pooled, pooled_index=index)
        cols: dict[str, list[tuple[bool, float]]] = {k: [] for k in (
            "old", "old_shipped", "new", "spread_never", "spread_always", "spread_added", "unseen")}
        r_all = ratio_range(plat.validation)
        rest = [s for (name, _), s in zip(pool, pooled) if name != plat.name]
        others_prior = PooledPrior.from_scores(rest) if len(rest) >= MIN_OWN_RUNS else None
        unseen = IntervalRule.from_scores([], calibrated=plat.calibrated,
                                          prior=others_prior or SHIPPED_PRIOR)
        for i, (f, rule) in enumerate(zip(facts, rules)):
            others = [r for j, r in enumerate(plat.validation) if j != i]
            r_lo, r_hi = ratio_range(others) if others else DEFAULT_TIMELINE_RATIO
            cols["old"].append(judge(f, f.op_lo * r_lo, f.op_hi * r_hi))
            cols["old_shipped"].append(judge(f, f.op_lo * r_all[0], f.op_hi * r_all[1]))
            cols["new"].append(judge(f, *new_factors(f, rule, "flagged")))
            cols["spread_never"].append(judge(f, *new_factors(f, rule, "never")))
            cols["spread_always"].append(judge(f, *new_factors(f, rule, "always")))
            # Flagged runs with the spread multiplied on (added on the log scale), not in quadrature.
            c_lo, c_hi = rule.factors
            flagged = f.extrapolated or f.analytic
            cols["spread_added"].append(judge(f, c_lo * (f.op_lo if flagged else 1.0),
                                               c_hi * (f.op_hi if flagged else 1.0)))
            cols["unseen"].append(judge(f, *new_factors(f, unseen, "flagged")))
        entry = {"platform": plat.name, "runs": len(facts), "rule_source": rules[0].source,
                 "extrapolated_runs": sum(f.extrapolated for f in facts),
                 "analytic_runs": sum(f.analytic for f in facts),
                 "shipped_rule": IntervalRule.for_platform(plat).describe()}
        for k, v in cols.items():
            entry[k] = summary(v)
            every.setdefault(k, []).extend(v)
        report["platforms"].append(entry)
    report["all"] = {k: summary(v) for k, v in every.items()}
    return report


def summary(v: list[tuple[bool, float]]) -> dict[str, Any]:
    """Runs inside, runs, coverage and median width of (inside, width) pairs."""
    return {"inside": sum(ok for ok, _ in v), "runs": len(v),
            "coverage": sum(ok for ok, _ in v) / len(v),
            "median_width": statistics.median(w for _, w in v)}


def pooled_report(platforms: list[Platform]) -> dict[str, Any]:
    """The pooled prior and per-bundle extremes from every recorded run, and their shipped roundings."""
    pool = pooled_scores(platforms)
    scores = [r.log_ratio for _, r in pool]
    prior = PooledPrior.from_scores(scores)
    k = conformal_rank(len(scores))
    worst = max(pool, key=lambda pr: abs(pr[1].log_ratio))
    per = {}
    for name, _ in pool:
        per[name] = per.get(name, 0) + 1
    return {"runs": prior.runs, "per_platform": per, "rank": k, "quantile": prior.quantile,
            "maximum": prior.maximum, "maximum_run": f"{worst[0]}: {worst[1].name}",
            # Rounded up so that the shipped constant still covers what it was computed from.
            "shipped_quantile": math.ceil(prior.quantile * 1e4) / 1e4,
            "shipped_maximum": math.ceil(prior.maximum * 1e4) / 1e4,
            "bundles": {sha: {"platform": b.platform, "runs": b.runs, "low": b.low, "high": b.high,
                              "shipped_low": math.ceil(b.low * 1e4) / 1e4,
                              "shipped_high": math.ceil(b.high * 1e4) / 1e4}
                        for sha, b in bundle_runs(platforms).items()}}
