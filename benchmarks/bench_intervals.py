#!/usr/bin/env python3
"""How honest are the intervals?  Leave-one-out coverage and width on every shipped recorded run.

    python benchmarks/bench_intervals.py            # old rule against new rule, per platform
    python benchmarks/bench_intervals.py --pooled   # recompute SHIPPED_PRIOR, SHIPPED_BUNDLE_RUNS
    python benchmarks/bench_intervals.py --json     # the same figures, machine-readable

Every run is judged by an interval built WITHOUT it: its platform's other runs, and a pooled prior
from every shipped platform's runs less this one.  Points are the recorded predictions (made
without the run: docs/modelling.md §4); each run's operator spread (every term at the low / high
end of its own validation error) comes from predicting its job again on the platform.

- old: the operator spread × the min–max of measured / predicted over the platform's other runs
  (0.90–1.60 with none): predictor.validation.ratio_range, what estimate.py did before
  predictor.interval.  "old, shipped" is that rule with every run included (the width users saw).
- new: predictor.interval.IntervalRule, the operator spread counting only where a job is flagged
  (extrapolated shape, analytic collectives, uncalibrated platform), in quadrature.  The columns
  "spread never" / "spread always" are the same rule with the spread ignored / always counted;
  "spread multiplied": flagged runs get the spread multiplied on instead of in quadrature.
- as an unseen platform: none of the platform's own runs, the prior pooled from the OTHER
  platforms' runs only (what a platform that recorded nothing gets).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor.estimate import predict_many  # noqa: E402
from predictor.interval import (ALPHA, MIN_OWN_RUNS, SHIPPED_BUNDLE_RUNS, SHIPPED_PRIOR,  # noqa: E402
                                IntervalRule, PooledPrior, bundle_runs, conformal_rank,
                                interval_seconds, leave_one_out)
from predictor.platform import SHIPPED_DIR, Platform, load_platform  # noqa: E402
from predictor.validation import DEFAULT_TIMELINE_RATIO, MeasuredRun, ratio_range  # noqa: E402


@dataclass(frozen=True)
class RunFacts:
    platform: str
    run: MeasuredRun
    op_lo: float          # operator spread, relative to the point (≤ 1)
    op_hi: float          # (≥ 1)
    extrapolated: bool
    analytic: bool


def shipped_platforms() -> list[Platform]:
    return [load_platform(d) for d in sorted(SHIPPED_DIR.iterdir())
            if (d / "platform.toml").is_file()]


def pooled_scores(platforms: list[Platform]) -> list[tuple[str, MeasuredRun]]:
    return [(p.name, r) for p in platforms for r in p.validation]


def run_facts(plat: Platform) -> list[RunFacts]:
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


def _judge(f: RunFacts, lo_factor: float, hi_factor: float) -> tuple[bool, float]:
    """(inside, width / point) of an interval given as factors on the recorded point."""
    point = f.run.predicted_iteration_seconds
    lo, hi = lo_factor * point, hi_factor * point
    return lo <= f.run.measured_iteration_seconds <= hi, (hi - lo) / point


def new_factors(f: RunFacts, rule: IntervalRule, spread: str) -> tuple[float, float]:
    flagged = {"never": False, "flagged": f.extrapolated or f.analytic, "always": True}[spread]
    lo, hi = interval_seconds(1.0, f.op_lo, f.op_hi, rule, extrapolated=flagged)
    return lo, hi


def evaluate(platforms: list[Platform]) -> dict[str, Any]:
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
            cols["old"].append(_judge(f, f.op_lo * r_lo, f.op_hi * r_hi))
            cols["old_shipped"].append(_judge(f, f.op_lo * r_all[0], f.op_hi * r_all[1]))
            cols["new"].append(_judge(f, *new_factors(f, rule, "flagged")))
            cols["spread_never"].append(_judge(f, *new_factors(f, rule, "never")))
            cols["spread_always"].append(_judge(f, *new_factors(f, rule, "always")))
            # Flagged runs with the spread multiplied on (added on the log scale), not in quadrature.
            c_lo, c_hi = rule.factors
            flagged = f.extrapolated or f.analytic
            cols["spread_added"].append(_judge(f, c_lo * (f.op_lo if flagged else 1.0),
                                               c_hi * (f.op_hi if flagged else 1.0)))
            cols["unseen"].append(_judge(f, *new_factors(f, unseen, "flagged")))
        entry = {"platform": plat.name, "runs": len(facts), "rule_source": rules[0].source,
                 "extrapolated_runs": sum(f.extrapolated for f in facts),
                 "analytic_runs": sum(f.analytic for f in facts),
                 "shipped_rule": IntervalRule.for_platform(plat).describe()}
        for k, v in cols.items():
            entry[k] = _summary(v)
            every.setdefault(k, []).extend(v)
        report["platforms"].append(entry)
    report["all"] = {k: _summary(v) for k, v in every.items()}
    return report


def _summary(v: list[tuple[bool, float]]) -> dict[str, Any]:
    return {"inside": sum(ok for ok, _ in v), "runs": len(v),
            "coverage": sum(ok for ok, _ in v) / len(v),
            "median_width": statistics.median(w for _, w in v)}


def pooled_report(platforms: list[Platform]) -> dict[str, Any]:
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


def _cell(s: dict[str, Any]) -> str:
    return f"{s['inside']:>2}/{s['runs']:<2} {100 * s['coverage']:>3.0f}% {s['median_width']:>5.2f}"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pooled", action="store_true", help="recompute the pooled prior (SHIPPED_PRIOR)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    platforms = shipped_platforms()
    if args.pooled:
        rep = pooled_report(platforms)
        if args.json:
            print(json.dumps(rep, indent=2))
            return 0
        print(f"pooled |log(measured / predicted)| over {rep['runs']} shipped runs {rep['per_platform']}")
        print(f"  conformal quantile: rank ⌈({rep['runs']} + 1)·(1 − {ALPHA})⌉ = {rep['rank']}: "
              f"{rep['quantile']:.6f} (×{math.exp(-rep['quantile']):.3f}–{math.exp(rep['quantile']):.3f})")
        print(f"  maximum: {rep['maximum']:.6f} ({rep['maximum_run']})")
        print(f"  SHIPPED_PRIOR = PooledPrior(quantile={rep['shipped_quantile']}, "
              f"maximum={rep['shipped_maximum']}, runs={rep['runs']})   (rounded up)")
        ok = (SHIPPED_PRIOR.quantile, SHIPPED_PRIOR.maximum, SHIPPED_PRIOR.runs) == (
            rep["shipped_quantile"], rep["shipped_maximum"], rep["runs"])
        print(f"  predictor.interval.SHIPPED_PRIOR: {'matches' if ok else 'STALE: ' + repr(SHIPPED_PRIOR)}")
        print("SHIPPED_BUNDLE_RUNS (per compute bundle: worst over- / under-prediction, rounded up):")
        for sha, b in rep["bundles"].items():
            shipped = SHIPPED_BUNDLE_RUNS.get(sha)
            same = shipped is not None and (shipped.platform, shipped.low, shipped.high, shipped.runs) == (
                b["platform"], b["shipped_low"], b["shipped_high"], b["runs"])
            print(f"  {sha[:12]}  {b['platform']:<16} low={b['shipped_low']} high={b['shipped_high']} "
                  f"runs={b['runs']}   {'matches' if same else 'STALE: ' + repr(shipped)}")
        return 0
    rep = evaluate(platforms)
    if args.json:
        print(json.dumps(rep, indent=2))
        return 0
    print(f"{1 - ALPHA:.0%} intervals, leave-one-out on the shipped platforms' recorded runs: "
          "inside/runs, coverage, median width / point")
    head = ("old", "old_shipped", "new", "spread_never", "spread_always", "spread_added", "unseen")
    labels = ("old (LOO)", "old, shipped", "new (LOO)", "spread never", "spread always",
              "spread multiplied", "unseen platform")
    print(f"{'platform':<17}{'rule':<8}" + "".join(f"{h:>20}" for h in labels))
    for e in rep["platforms"] + [dict(rep["all"], platform="all", rule_source="")]:
        print(f"{e['platform']:<17}{e['rule_source']:<8}" + "".join(f"{_cell(e[k]):>20}" for k in head))
    for e in rep["platforms"]:
        r = e["shipped_rule"]
        print(f"{e['platform']}: shipped rule ×{r['factors'][0]:.3f}–{r['factors'][1]:.3f} "
              f"({r['source']}, {r['runs']} runs); {e['extrapolated_runs']} runs extrapolated, "
              f"{e['analytic_runs']} with analytic collectives")
    return 0


if __name__ == "__main__":
    sys.exit(main())
