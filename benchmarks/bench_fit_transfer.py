#!/usr/bin/env python3
"""Does learning from one set of runs carry to other jobs on the same machine?

``perf-calibrate validate --fit`` (and ``harvest --refit``) fits a platform's end-to-end terms, a
compute scale and a host scale, on recorded runs.  Two physical scales cannot memorise jobs; this
benchmark checks that they also do not only help the runs they were fitted on: the platform's
recorded runs are split in two by what the jobs are (small against large models, host-bound
against device-bound shapes, one attention path against the others), the terms are fitted on one
side, and the *other* side is predicted before and after.

    python benchmarks/bench_fit_transfer.py [--platform dgx-h100]

A benchmark, not a test: it prints what it measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from calibrate.validate import fit_terms  # noqa: E402
from predictor import load_platform, predict_many  # noqa: E402
from predictor.platform import FittedTerms  # noqa: E402
from predictor.validation import MeasuredRun  # noqa: E402

# (name, predicate): a run is on the fitted side when the predicate holds; the split is then also
# run the other way round.
SPLITS: list[tuple[str, Callable[[MeasuredRun], bool]]] = [
    ("hidden <= 2048 | > 2048", lambda r: r.job.model.hidden <= 2048),
    ("micro-batch 1 | > 1", lambda r: r.job.layout.micro_batch == 1),
    ("flash attention | other paths", lambda r: r.job.model.attention == "flash"),
    ("4 layers | other depths", lambda r: r.job.model.layers == 4),
]


def _mape(runs: Sequence[MeasuredRun], predicted: Sequence[float]) -> float:
    return sum(abs(p / r.measured_iteration_seconds - 1) for r, p in zip(runs, predicted)) / len(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", default="dgx-h100")
    args = ap.parse_args()
    plat = dataclasses.replace(load_platform(args.platform), fitted=None)
    runs = list(plat.validation)
    print(f"{args.platform}: {len(runs)} recorded runs; terms fitted on one side, MAPE on the other")
    print(f"{'split (fitted side first)':<34}{'fit':>5}{'test':>6}{'compute':>9}{'host':>7}"
          f"{'MAPE before':>13}{'after':>8}  terms")
    better = worse = total = 0
    for name, pred in SPLITS:
        sides = ([r for r in runs if pred(r)], [r for r in runs if not pred(r)])
        for flip in (False, True):
            train, test = sides[::-1] if flip else sides
            if len(train) < 3 or not test:
                continue
            res = fit_terms(plat, train)
            # As validate --fit and harvest --refit do: the terms are kept only when they improve
            # leave-one-out error on the runs they were fitted on.
            accepted = res.loo_mape_after < res.mape_before
            fitted = dataclasses.replace(plat, fitted=FittedTerms(compute_scale=res.compute_scale,
                                                                  host_scale=res.host_scale)) if accepted else plat
            before = _mape(test, [p.iteration_seconds for p in predict_many([r.job for r in test], plat)])
            after = _mape(test, [p.iteration_seconds for p in predict_many([r.job for r in test], fitted)])
            label = name if not flip else " | ".join(reversed(name.split(" | ")))
            print(f"{label:<34}{len(train):>5}{len(test):>6}{res.compute_scale:>9.3f}{res.host_scale:>7.3f}"
                  f"{100 * before:>12.2f}%{100 * after:>7.2f}%  "
                  + ("kept" if accepted else f"declined (LOO {100 * res.mape_before:.2f}% -> "
                                             f"{100 * res.loo_mape_after:.2f}% on the fitted side)"))
            total += 1
            better += after < before
            worse += after > before
    print(f"held-out side: better after the fit in {better} of {total} splits, worse in {worse}, "
          f"unchanged (fit declined) in {total - better - worse}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
