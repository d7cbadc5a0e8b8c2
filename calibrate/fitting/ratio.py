"""The per-operator regressor, fitted: choose RandomForest / XGBoost / LightGBM by hold-out error,
refit the winner on every row.

The target is ``log(measured / roofline)`` (see :mod:`predictor.regress` for why).  The estimator
follows scikit-learn's conventions: parameters are set (and checked) in the constructor,
``fit(X, y)`` returns the estimator, and what fitting learnt ends in ``_``::

    est = RatioRegressor(candidates=("xgboost", "lightgbm"), seed=0).fit(X, log_ratio)
    est.library_, est.validation_mape_, est.predict(X_new)        # ratios, from the tree table
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from predictor.regress import RatioModel
from predictor.trees import MAX_FEATURES

from .libraries import CANDIDATES, check_candidates, library_predict, make_estimator, serialise

# 80/20: every fifth row (at least two) is held out to choose the library.
HOLDOUT_DIVISOR = 5


def holdout_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, validation rows) of ``n``: the split the library choice is made on."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = max(2, n // HOLDOUT_DIVISOR)
    return order[n_val:], order[:n_val]


class RatioRegressor:
    """Chooses the library with the lowest hold-out MAPE on an 80/20 split and refits it on all rows.

    Parameters: ``candidates`` (libraries to choose from, :data:`CANDIDATES` by default), ``seed``
    (the split and the libraries' own randomness), ``min_samples`` (fewer rows than this is an
    error: a tree model of a handful of shapes says nothing).

    After :meth:`fit`: ``library_``, ``model_bytes_`` (the gzip-compressed library model file),
    ``table_`` (the same trees as a :class:`~predictor.trees.TreeTable`), ``validation_mape_`` and
    ``validation_p90_`` (of time, not of the log ratio, on the hold-out), ``candidate_mape_``,
    ``n_samples_``, ``n_features_in_``.
    """

    def __init__(self, candidates: Sequence[str] = CANDIDATES, *, seed: int = 0, min_samples: int = 8):
        self.candidates = check_candidates(candidates)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if isinstance(min_samples, bool) or not isinstance(min_samples, (int, np.integer)) or min_samples < 2:
            raise ValueError(f"min_samples must be an integer >= 2 (a hold-out needs two rows), got {min_samples!r}")
        self.seed = int(seed)
        self.min_samples = int(min_samples)
        self.library_: Optional[str] = None

    def fit(self, X: np.ndarray, y: np.ndarray) -> "RatioRegressor":
        """Fit on rows ``X`` (log2 features) and targets ``y`` (log of measured / roofline)."""
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
            raise ValueError(f"X must be rows × features and y one value per row; got shapes {X.shape} and {y.shape}")
        if not 1 <= X.shape[1] <= MAX_FEATURES:
            raise ValueError(f"{X.shape[1]} features: the tree evaluator takes 1 to {MAX_FEATURES}")
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(y))):
            raise ValueError("X and y must be finite (drop rows that were not measured first)")
        n = len(y)
        if n < self.min_samples:
            raise ValueError(f"only {n} samples (need at least {self.min_samples})")
        train, val = holdout_split(n, self.seed)
        scores: dict[str, float] = {}
        p90: dict[str, float] = {}
        for lib in self.candidates:
            est = make_estimator(lib, len(train), self.seed)
            est.fit(X[train], y[train])
            err = np.abs(np.exp(est.predict(X[val]) - y[val]) - 1.0)
            scores[lib] = float(np.mean(err))
            p90[lib] = float(np.quantile(err, 0.9))
        best = min(scores, key=scores.get)
        est = make_estimator(best, n, self.seed)
        est.fit(X, y)
        self.model_bytes_, self.table_ = serialise(best, est, X.shape[1])
        self.library_ = best
        self.validation_mape_ = scores[best]
        self.validation_p90_ = p90[best]
        self.candidate_mape_ = scores
        self.n_samples_ = n
        self.n_features_in_ = X.shape[1]
        self._model = RatioModel.from_table(self.table_, library=best)
        return self

    def _check_fitted(self) -> None:
        if self.library_ is None:
            raise RuntimeError("RatioRegressor is not fitted yet: call fit(X, y) first")

    @property
    def model(self) -> RatioModel:
        """The fitted trees as the predictor loads them."""
        self._check_fitted()
        return self._model

    def predict(self, X: np.ndarray) -> np.ndarray:
        """measured/roofline ratios, through the tree table (what the predictor will compute)."""
        return self.model.predict(X)

    def predict_log(self, X: np.ndarray) -> np.ndarray:
        return self.model.predict_log(X)

    def library_predict(self, X: np.ndarray) -> np.ndarray:
        """The library's own log-ratio prediction from the stored model file."""
        self._check_fitted()
        return library_predict(self.library_, self.model_bytes_, X)


__all__ = ["RatioRegressor", "CANDIDATES", "HOLDOUT_DIVISOR", "holdout_split"]
