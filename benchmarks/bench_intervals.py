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

The figures are calibrate/interval_coverage.py's; this prints them.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Optional

from calibrate.interval_coverage import evaluate, pooled_report, shipped_platforms
from predictor.interval import ALPHA, SHIPPED_BUNDLE_RUNS, SHIPPED_PRIOR


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
