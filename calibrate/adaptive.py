"""Adaptive refinement: after a space-filling round, measure more where the model is worst.

Per (operator, precision), a quick random forest on the same target as the predictor's
regressors (log of measured time over the roofline, from log2 features) gives a 5-fold
cross-validated error.  The next round's budget is shared out in proportion to those errors, and
inside an operator the candidates chosen are those on which the forest's trees disagree most
(the usual query-by-committee rule).  scikit-learn only; no torch.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from predictor.operators import OPERATORS, GpuSpec, regressor_features
from predictor.samples import SampleSet

from .plans import OperatorPoint, Plan, point_seconds

log = logging.getLogger(__name__)

_MIN_ROWS = 8
_ERROR_FLOOR = 0.02


@dataclass(frozen=True)
class OperatorError:
    op: str
    precision: str
    rows: int
    cv_mape: float            # mean absolute percentage error of time, 5-fold


def _targets(op: str, rows: np.ndarray, precision: str, spec: GpuSpec) -> tuple[np.ndarray, np.ndarray]:
    o = OPERATORS[op]
    nf = len(o.features)
    shape = {f: rows[:, i] for i, f in enumerate(o.features)}
    X = regressor_features(o, shape)
    ys = []
    for j, d in enumerate(o.directions):
        roof = o.roofline_seconds(shape, d, precision, spec)
        ys.append(np.log(np.maximum(rows[:, nf + j] * 1e-6, 1e-9) / roof))
    return X, np.column_stack(ys)


def _forest(n: int):
    from sklearn.ensemble import RandomForestRegressor
    return RandomForestRegressor(n_estimators=n, min_samples_leaf=1, random_state=0, n_jobs=1)


def cross_validated_errors(samples: SampleSet, spec: GpuSpec) -> list[OperatorError]:
    """5-fold CV error of a quick forest per (operator, precision) with enough rows."""
    from sklearn.model_selection import KFold

    out = []
    for (op, prec), table in sorted(samples.operators.items()):
        n = len(table)
        if n < _MIN_ROWS:
            out.append(OperatorError(op, prec, n, 1.0))     # too few rows: treat as badly known
            continue
        X, Y = _targets(op, table.rows, prec, spec)
        errs = []
        for tr, te in KFold(n_splits=5, shuffle=True, random_state=0).split(X):
            model = _forest(40).fit(X[tr], Y[tr])
            pred = model.predict(X[te]).reshape(len(te), -1)
            errs.append(np.abs(np.exp(pred - Y[te]) - 1.0).mean())
        out.append(OperatorError(op, prec, n, float(np.mean(errs))))
    return out


def next_round(plan: Plan, samples: SampleSet, spec: GpuSpec, device: str,
               seconds: float) -> list[OperatorPoint]:
    """Points worth ``seconds`` of device time, taken from ``plan.candidates`` (which shrinks)."""
    errors = {(e.op, e.precision): e for e in cross_validated_errors(samples, spec)}
    pool: dict[tuple[str, str], list[OperatorPoint]] = {}
    for p in plan.candidates:
        pool.setdefault((p.op, p.precision), []).append(p)
    if not pool:
        return []
    weight = {k: max(errors[k].cv_mape if k in errors else 1.0, _ERROR_FLOOR) for k in pool}
    total = sum(weight.values())
    chosen: list[OperatorPoint] = []
    for key, cands in sorted(pool.items()):
        share = seconds * weight[key] / total
        table = samples.operators.get(key)
        if table is not None and len(table) >= _MIN_ROWS:
            X, Y = _targets(key[0], table.rows, key[1], spec)
            forest = _forest(40).fit(X, Y)
            cand_rows = np.asarray([c.shape for c in cands], dtype=float)
            shape = {f: cand_rows[:, i] for i, f in enumerate(OPERATORS[key[0]].features)}
            Xc = regressor_features(OPERATORS[key[0]], shape)
            per_tree = np.stack([t.predict(Xc).reshape(len(cands), -1) for t in forest.estimators_])
            score = per_tree.std(axis=0).sum(axis=1)
        else:
            score = np.random.default_rng(0).random(len(cands))
        spent = 0.0
        for i in np.argsort(-score):
            if spent >= share:
                break
            spent += point_seconds(cands[i], spec, device, plan.warmup, plan.repeats)
            chosen.append(cands[i])
    taken = set(chosen)
    plan.candidates = [p for p in plan.candidates if p not in taken]
    worst = sorted(errors.values(), key=lambda e: -e.cv_mape)[:3]
    log.info("adaptive round: %d new points; worst CV errors: %s", len(chosen),
             ", ".join(f"{e.op}/{e.precision} {e.cv_mape:.1%}" for e in worst))
    return chosen
