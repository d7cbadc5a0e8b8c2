#!/usr/bin/env python3
"""Per-operator validation error on the paper's measured samples (the estimate-train-time data).

    python benchmarks/bench_operators.py --data DIR [--systems Perlmutter Vista]

DIR is the estimate-train-time data (its Perlmutter/ and Vista/ folders).

For each operator and direction, three splits, each fitted with perfcast's regressor (library chosen
by validation, target = measured / roofline):
  random   80/20 split of all rows
  hidden   train on hidden ≤ 6144, test on larger hidden
  batch    train on micro-batch ≤ 4, test on micro-batch 8
and, for contrast, the paper's approach (a tree regressor on raw time) on the extrapolation splits.
Prints MAPE per row and the GEMM-class summary against the targets (≤ 5 % in range, ≤ 10 % out).
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

from calibrate.fitting import RatioRegressor
from calibrate.importers import _OPERATORS  # their column -> our shape conversions
from calibrate.shipped_gpus import A100, GH200
from predictor.operators import OPERATORS, regressor_features

GEMM = ("linear1", "linear2", "linear3", "linear4", "linear_final")
GPU = {"Perlmutter": ("NVIDIAA100-SXM4-80GB", A100), "Vista": ("NVIDIAGH200120GB", GH200)}


def rows(path: Path):
    with open(path, newline="") as fh:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]


def mape(pred, true):
    return float(np.mean(np.abs(pred / true - 1.0)))


def fit_predict(op, shape_tr, t_tr, shape_te, direction, gpu):
    X_tr, X_te = regressor_features(op, shape_tr), regressor_features(op, shape_te)
    roof_tr = op.roofline_seconds(shape_tr, direction, "fp16", gpu)
    roof_te = op.roofline_seconds(shape_te, direction, "fp16", gpu)
    return RatioRegressor().fit(X_tr, np.log(t_tr / roof_tr)).predict(X_te) * roof_te


def raw_tree(X_tr, t_tr, X_te):
    """The paper's way: a random forest on the raw features and raw time."""
    from sklearn.ensemble import RandomForestRegressor
    m = RandomForestRegressor(n_estimators=100, random_state=0, n_jobs=2).fit(X_tr, t_tr)
    return m.predict(X_te)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="the estimate-train-time data directory")
    ap.add_argument("--systems", nargs="+", default=["Perlmutter", "Vista"])
    args = ap.parse_args()
    summary = {}
    for system in args.systems:
        prefix, gpu = GPU[system]
        print(f"\n== {system} ({gpu.name})")
        print(f"{'operator':<24}{'dir':<5}{'rows':>6}{'random':>9}{'hidden>6144':>13}{'raw-tree':>10}"
              f"{'mb=8':>9}{'raw-tree':>10}")
        for their, ours, convert in _OPERATORS:
            path = Path(args.data) / system / "operator" / f"{prefix}_{their}_fp16.csv"
            if not path.is_file():
                continue
            data = rows(path)
            op = OPERATORS[ours]
            shapes = [convert(r) for r in data]
            shape = {f: np.array([s[f] for s in shapes]) for f in op.features}
            dim = np.array([r.get("dim", 0.0) for r in data])
            b = np.array([r.get("b", 0.0) for r in data])
            raw_X = np.array([[v for k, v in r.items() if "dur" not in k] for r in data])
            for direction, col in (("fwd", "F_dur(us)"), ("bwd", "B_dur(us)")):
                t = np.array([r[col] for r in data]) * 1e-6
                ok = t > 0
                res = {}
                rng = np.random.default_rng(0)
                idx = rng.permutation(np.nonzero(ok)[0])
                cut = len(idx) * 4 // 5
                splits = {"random": (idx[:cut], idx[cut:]),
                          "hidden": (np.nonzero(ok & (dim <= 6144))[0], np.nonzero(ok & (dim > 6144))[0]),
                          "batch": (np.nonzero(ok & (b <= 4))[0], np.nonzero(ok & (b == 8))[0])}
                for name, (tr, te) in splits.items():
                    if len(tr) < 20 or len(te) < 5:
                        res[name] = res[name + "_raw"] = None
                        continue
                    sub = lambda ix: {f: v[ix] for f, v in shape.items()}
                    res[name] = mape(fit_predict(op, sub(tr), t[tr], sub(te), direction, gpu), t[te])
                    if name != "random":
                        res[name + "_raw"] = mape(raw_tree(raw_X[tr], t[tr], raw_X[te]), t[te])
                f = lambda v: f"{100 * v:8.2f}%" if v is not None else f"{'-':>9}"
                print(f"{ours:<24}{direction:<5}{int(ok.sum()):>6}{f(res['random'])}{f(res['hidden']):>13}"
                      f"{f(res['hidden_raw']):>10}{f(res['batch'])}{f(res['batch_raw']):>10}")
                summary.setdefault(system, {})[(ours, direction)] = res
    print("\n== GEMM-class operators (linear1-4, linear_final): worst MAPE per split")
    for system, res in summary.items():
        for split, target in (("random", 0.05), ("hidden", 0.10), ("batch", 0.10)):
            vals = [(v[split], k) for k, v in res.items() if k[0] in GEMM and v[split] is not None]
            if vals:
                worst, key = max(vals)
                mean = np.mean([v for v, _ in vals])
                status = "met" if worst <= target else "NOT met"
                print(f"{system:<11}{split:<8} mean {100 * mean:5.2f}%  worst {100 * worst:5.2f}% "
                      f"({key[0]} {key[1]})  target ≤ {100 * target:.0f}%: {status}")
    return 0


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"\n({time.time() - t0:.0f} s)")
    sys.exit(rc)
