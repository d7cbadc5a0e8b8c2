"""Per-operator regressors: choose RandomForest / XGBoost / LightGBM by validation error, refit on all.

The target is ``log(measured / roofline)``: relative errors weigh alike for small and large
shapes, and outside the sampled range the prediction falls back to the roofline times the ratio
at the edge of the range, which is how efficiency behaves for large GEMMs.

Models are stored in the libraries' own portable formats, gzip-compressed: XGBoost JSON (for
both gradient boosting and its random-forest mode, which stands in for scikit-learn's forest
because a scikit-learn forest can only be saved with pickle) and LightGBM text.
"""
from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from .trees import Forest, TreeTable, from_lightgbm_text, from_xgboost_json

log = logging.getLogger(__name__)

CANDIDATES = ("random_forest", "xgboost", "lightgbm")


@dataclass
class FitResult:
    library: str                     # one of CANDIDATES
    model_bytes: bytes               # gzip-compressed model file
    table_bytes: bytes               # the same trees as a TreeTable (.npz), what predictions use
    validation_mape: float           # on the 20 % hold-out, of time (not of the log ratio)
    validation_p90: float            # 90th percentile of |relative error| on the hold-out
    candidate_mape: dict[str, float]
    samples: int


# Below this many rows a second thread costs more than it saves, and with XGBoost and LightGBM
# both loaded their OpenMP pools can spin against each other on a busy machine (fits that took
# 0.03 s stalled for minutes in calibration tests).
THREADED_MIN_ROWS = 2000


def _make(library: str, n_samples: int, seed: int) -> Any:
    # Imported here: the daemon loads models without ever constructing estimators.
    import lightgbm as lgb
    import xgboost as xgb

    n_jobs = 2 if n_samples >= THREADED_MIN_ROWS else 1
    if library == "random_forest":
        return xgb.XGBRFRegressor(n_estimators=100, max_depth=10, subsample=0.8, colsample_bynode=1.0,
                                  learning_rate=1.0, min_child_weight=1, n_jobs=n_jobs, random_state=seed)
    if library == "xgboost":
        return xgb.XGBRegressor(n_estimators=300, max_depth=6, learning_rate=0.08, subsample=0.9,
                                min_child_weight=1, n_jobs=n_jobs, random_state=seed)
    if library == "lightgbm":
        # Depth is bounded so the vectorised evaluator needs few steps (predictor.trees).
        return lgb.LGBMRegressor(n_estimators=300, learning_rate=0.06, num_leaves=31, max_depth=10,
                                 min_child_samples=max(2, min(5, n_samples // 20)), subsample=0.9,
                                 subsample_freq=1, verbose=-1, n_jobs=n_jobs, random_state=seed)
    raise ValueError(f"unknown regressor library {library!r}")


def _serialise(library: str, est: Any, n_features: int) -> tuple[bytes, bytes]:
    """(gzip-compressed library model file, tree table) of a fitted estimator."""
    if library == "lightgbm":
        raw = est.booster_.model_to_string().encode()
        table = from_lightgbm_text(raw.decode(), n_features)
    else:
        raw = bytes(est.get_booster().save_raw(raw_format="json"))
        table = from_xgboost_json(raw, n_features)
    return gzip.compress(raw, compresslevel=9, mtime=0), table.to_bytes()


def fit_ratio_model(X: np.ndarray, log_ratio: np.ndarray, *, seed: int = 0,
                    candidates: tuple[str, ...] = CANDIDATES, min_samples: int = 8) -> FitResult:
    """Choose the library with the lowest hold-out error on an 80/20 split, refit it on all rows."""
    n = len(log_ratio)
    if n < min_samples:
        raise ValueError(f"only {n} samples (need at least {min_samples})")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_val = max(2, n // 5)
    val, train = order[:n_val], order[n_val:]
    scores: dict[str, float] = {}
    p90: dict[str, float] = {}
    for lib in candidates:
        est = _make(lib, len(train), seed)
        est.fit(X[train], log_ratio[train])
        err = np.abs(np.exp(est.predict(X[val]) - log_ratio[val]) - 1.0)
        scores[lib] = float(np.mean(err))
        p90[lib] = float(np.quantile(err, 0.9))
    best = min(scores, key=scores.get)
    est = _make(best, n, seed)
    est.fit(X, log_ratio)
    model_bytes, table_bytes = _serialise(best, est, X.shape[1])
    return FitResult(best, model_bytes, table_bytes, scores[best], p90[best], scores, n)


class RatioModel:
    """One loaded regressor: ``predict(X)`` gives measured/roofline ratios for rows of features.

    Predictions go through the tree table; many models are better evaluated together through a
    :class:`predictor.trees.Forest` (the bundle does that).
    """

    def __init__(self, table: TreeTable, library: str = "", name: str = ""):
        self.table = table
        self.library = library
        self.name = name
        self._forest = Forest([table])

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.exp(self._forest.predict([(0, X)])[0])


def library_predict(library: str, model_bytes: bytes, X: np.ndarray) -> np.ndarray:
    """The library's own prediction from a stored model file (used to check the tree tables)."""
    raw = gzip.decompress(model_bytes)
    if library == "lightgbm":
        import lightgbm as lgb
        return np.asarray(lgb.Booster(model_str=raw.decode()).predict(X), dtype=float)
    import xgboost as xgb
    booster = xgb.Booster()
    booster.load_model(bytearray(raw))
    return np.asarray(booster.inplace_predict(np.asarray(X, dtype=np.float32)), dtype=float)
