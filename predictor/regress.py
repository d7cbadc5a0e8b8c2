"""A loaded per-operator regressor: measured/roofline ratios from its trees, without the libraries.

The target the regressors learn is ``log(measured / roofline)``: relative errors weigh alike for
small and large shapes, and outside the sampled range the prediction falls back to the roofline
times the ratio at the edge of the range, which is how efficiency behaves for large GEMMs.

Fitting (choosing RandomForest / XGBoost / LightGBM by validation error) lives in
:mod:`calibrate.fitting`; the predictor only evaluates what was fitted, through
:class:`predictor.trees.Forest`.  A bundle evaluates all its models together
(:meth:`predictor.bundle.Bundle.ratios`); this class is one model on its own.
"""
from __future__ import annotations

import numpy as np

from .trees import Forest, TreeTable


class RatioModel:
    """One loaded regressor: ``predict(X)`` gives measured/roofline ratios for rows of features."""

    def __init__(self, forest: Forest, index: int = 0, *, library: str = "", name: str = ""):
        if not 0 <= index < len(forest.models):
            raise ValueError(f"model index {index} outside a forest of {len(forest.models)} models")
        self.forest = forest
        self.index = index
        self.library = library
        self.name = name

    @classmethod
    def from_table(cls, table: TreeTable, *, library: str = "", name: str = "") -> "RatioModel":
        return cls(Forest.from_tables([table], [name or "model"]), 0, library=library, name=name)

    @property
    def n_features(self) -> int:
        return self.forest.models[self.index].n_features

    def predict_log(self, X: np.ndarray) -> np.ndarray:
        """The model's raw output: log(measured / roofline) per row."""
        return self.forest.predict([(self.index, X)])[0]

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.exp(self.predict_log(X))
