#!/usr/bin/env python3
"""How far off is an operator model outside the shapes it was sampled on?  The measurement behind
``predictor.estimate.EXTRAPOLATION_ERROR_ABOVE`` and ``EXTRAPOLATION_ERROR_BELOW``.

A job whose shape leaves an operator's sampled range is costed with the measured/roofline ratio
held at the range's edge (a tree model cannot do otherwise), never below the bundle's launch floor,
and the term's uncertainty is its model's in-range hold-out p90 plus an extrapolation error.  This
benchmark measures that factor on real samples: for every operator model, every feature it has
sampled at four or more values and both ends of that feature, the quarter of the rows beyond a cut
is held out, a model is fitted on the rest exactly as calibration fits one
(:class:`calibrate.fitting.ratio.RatioRegressor`), and the held-out rows are costed as the predictor
costs an out-of-range shape.  For each held-out error |predicted / measured − 1|, what it exceeds
the in-range p90 of the model that made it by (0 if nothing); the 90th percentile of those excesses
is the error that must be added to a p90 to cover 90 % of extrapolated terms, on each side of the
range (a shape below every sample meets launch and latency costs the edge's ratio does not know;
one above it tends to the roofline, which the ratio already follows).  The multiple of the p90
that would do the same is printed too: on dense, smooth samples (in-range p90s of a few per cent)
it is ill-conditioned, which is why the predictor adds rather than multiplies.

    python benchmarks/bench_extrapolation.py                       # the lent H100's samples (in the repo)
    python benchmarks/bench_extrapolation.py --samples DIR         # any perf-calibrate sample directory
    python benchmarks/bench_extrapolation.py --estimate-train-time .../Perlmutter   # imported first

A benchmark, not a test: it prints what it measured (fitting takes a few minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from calibrate.fitting import gpu_spec_from_meta
from calibrate.fitting.bundle import operator_training_rows
from calibrate.fitting.ratio import RatioRegressor
from predictor.estimate import EXTRAPOLATION_ERROR_ABOVE, EXTRAPOLATION_ERROR_BELOW
from predictor.operators import OPERATORS
from predictor.samples import load_samples

ROOT = Path(__file__).resolve().parents[1]

# The share of a feature's rows held out beyond the cut, and the fewest rows either side needs.
HELD_OUT_SHARE = 0.25
MIN_TRAIN, MIN_HELD_OUT = 24, 6
LEVEL = 0.9


@dataclass
class Case:
    model: str            # op.direction.precision
    feature: str
    side: str             # "above" / "below" the sampled range
    train_rows: int
    held_out_rows: int
    in_range_p90: float   # the refitted model's own hold-out p90 (what a bundle records)
    out_p90: float        # p90 of |predicted / measured - 1| over the held-out rows
    quotients: list       # each held-out error / in_range_p90
    excess: list          # each held-out error beyond in_range_p90 (0 where within it)


def _cases(samples, gpu, library: str, seed: int) -> list[Case]:
    out: list[Case] = []
    for (op_name, precision), table in sorted(samples.operators.items()):
        op = OPERATORS.get(op_name)
        if op is None:
            continue
        for direction in ("fwd", "bwd"):
            if f"{direction}_us" not in table.columns:
                continue
            X, y, raw = operator_training_rows(samples, op_name, direction, precision, gpu)
            ok = np.isfinite(y) & np.all(np.isfinite(X), axis=1)
            X, y, raw = X[ok], y[ok], raw[ok]
            if len(y) < MIN_TRAIN + MIN_HELD_OUT:
                continue
            measured = np.exp(y)           # measured / roofline
            for i, feature in enumerate(op.features):
                values = np.unique(raw[:, i])
                if len(values) < 4:
                    continue
                for side in ("above", "below"):
                    if side == "above":
                        cut = np.quantile(raw[:, i], 1 - HELD_OUT_SHARE)
                        held = raw[:, i] > cut
                    else:
                        cut = np.quantile(raw[:, i], HELD_OUT_SHARE)
                        held = raw[:, i] < cut
                    train = ~held
                    if held.sum() < MIN_HELD_OUT or train.sum() < MIN_TRAIN:
                        continue
                    est = RatioRegressor((library,), seed=seed).fit(X[train], y[train])
                    ratio = est.predict(X[held])
                    if side == "below":
                        # The launch floor: the least the training rows ever measured (the bundle's
                        # floor is the least over all its models; one model's is tighter, not looser).
                        roof = _roofline(op, raw[held], direction, precision, gpu)
                        floor_s = float(np.min(np.exp(y[train]) * _roofline(op, raw[train], direction,
                                                                                   precision, gpu)))
                        ratio = np.maximum(ratio * roof, floor_s) / roof
                    err = np.abs(ratio / measured[held] - 1.0)
                    p90_in = max(float(est.validation_p90_), 1e-6)
                    out.append(Case(f"{op_name}.{direction}.{precision}", feature, side, int(train.sum()),
                                    int(held.sum()), p90_in, float(np.quantile(err, LEVEL)),
                                    (err / p90_in).tolist(), np.maximum(err - p90_in, 0.0).tolist()))
    return out


def _pooled(cases: list[Case], what: str, side: Optional[str] = None) -> np.ndarray:
    """Every held-out term's ``what`` (quotients / excess), of one side of the range or both."""
    return np.concatenate([np.asarray(getattr(c, what)) for c in cases if side in (None, c.side)])


def _roofline(op, raw: np.ndarray, direction: str, precision: str, gpu) -> np.ndarray:
    shape = {f: raw[:, i] for i, f in enumerate(op.features)}
    return np.asarray(op.roofline_seconds(shape, direction, precision, gpu), dtype=float)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=Path, default=ROOT / "benchmarks" / "data" / "h100-lent",
                    help="a perf-calibrate sample directory (default: the lent H100's, in the repo)")
    ap.add_argument("--estimate-train-time", type=Path, metavar="SYSTEM_DIR",
                    help="import this estimate-train-time system folder (e.g. .../Perlmutter) and use it")
    ap.add_argument("--library", default="lightgbm", choices=("lightgbm", "xgboost", "random_forest"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src = args.samples
        if args.estimate_train_time is not None:
            from calibrate.importers import import_estimate_train_time
            src = Path(tmp) / "samples"
            import_estimate_train_time(args.estimate_train_time, src)
        samples = load_samples(src)
    gpu, _ = gpu_spec_from_meta(samples.meta, src / "samples.toml")
    cases = _cases(samples, gpu, args.library, args.seed)
    if not cases:
        print("no operator model has enough rows to hold any out", file=sys.stderr)
        return 1
    quot = _pooled(cases, "quotients")
    factor = float(np.quantile(quot, LEVEL))
    by_side = {s: float(np.quantile(_pooled(cases, "quotients", s), LEVEL))
               for s in ("above", "below") if any(c.side == s for c in cases)}
    excess = float(np.quantile(_pooled(cases, "excess"), LEVEL))
    excess_by_side = {s: float(np.quantile(_pooled(cases, "excess", s), LEVEL))
                      for s in ("above", "below") if any(c.side == s for c in cases)}
    summary = {"samples": str(src if args.estimate_train_time is None else args.estimate_train_time),
               "gpu": gpu.name, "library": args.library, "cases": len(cases), "held_out_terms": int(len(quot)),
               "factor_p90": factor, "factor_p90_by_side": by_side,
               "excess_p90": excess, "excess_p90_by_side": excess_by_side,
               "median_case_ratio": statistics.median(c.out_p90 / c.in_range_p90 for c in cases),
               "shipped_errors": {"above": EXTRAPOLATION_ERROR_ABOVE, "below": EXTRAPOLATION_ERROR_BELOW}}
    if args.json:
        rows = [{k: v for k, v in asdict(c).items() if k not in ("quotients", "excess")} for c in cases]
        print(json.dumps({"summary": summary, "cases": rows}, indent=2))
        return 0
    print(f"{'model':<32}{'feature':<10}{'side':<7}{'train':>6}{'held':>6}{'p90 in':>9}{'p90 out':>9}"
          f"{'out/in':>8}")
    for c in cases:
        print(f"{c.model:<32}{c.feature:<10}{c.side:<7}{c.train_rows:>6}{c.held_out_rows:>6}"
              f"{c.in_range_p90:>9.3f}{c.out_p90:>9.3f}{c.out_p90 / c.in_range_p90:>8.2f}")
    print(f"\n{summary['gpu']} ({summary['library']}): {len(cases)} held-out cuts, "
          f"{len(quot)} extrapolated terms")
    print(f"  factor covering 90 % of extrapolated terms (p90 of error / in-range p90): {factor:.2f}"
          + "".join(f"; {s} the range {v:.2f}" for s, v in by_side.items()))
    print(f"  error beyond the in-range p90 that covers 90 % of extrapolated terms: {excess:.3f}"
          + "".join(f"; {s} the range {v:.3f}" for s, v in excess_by_side.items()))
    print(f"  median over cuts of out-of-range p90 / in-range p90: {summary['median_case_ratio']:.2f}")
    print(f"  shipped (predictor.estimate.EXTRAPOLATION_ERROR_*): above {EXTRAPOLATION_ERROR_ABOVE}, "
          f"below {EXTRAPOLATION_ERROR_BELOW}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
