"""calibrate.fitting's estimators: parameters refused before any work, the fitted attributes, and
bundles that the predictor loads."""
from __future__ import annotations

import numpy as np
import pytest

from calibrate.fitting import BundleFitter, FitReport, RatioRegressor
from calibrate.fitting.ratio import holdout_split
from predictor import BundleError
from predictor.bundle import load_bundle
from predictor.operators import GpuSpec
from predictor.samples import SampleSet, SampleTable, collective_columns, operator_columns

GPU = GpuSpec("Test GPU", 16, {"fp16": 100.0, "bf16": 100.0, "fp32": 10.0}, 1000.0)


@pytest.mark.parametrize("kwargs,message", [
    ({"candidates": ()}, "at least one"),
    ({"candidates": ("xgboost", "catboost")}, "unknown regressor library 'catboost'"),
    ({"candidates": "xgboost"}, "not the string"),
    ({"candidates": ("lightgbm", "lightgbm")}, "named twice"),
    ({"seed": -1}, "seed must be a non-negative integer"),
    ({"seed": 1.5}, "seed must be a non-negative integer"),
    ({"min_samples": 1}, "min_samples must be an integer >= 2"),
])
def test_ratio_regressor_refuses_bad_parameters_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RatioRegressor(**kwargs)


@pytest.mark.parametrize("X,y,message", [
    (np.zeros((10, 3)), np.zeros(9), "one value per row"),
    (np.zeros(10), np.zeros(10), "rows × features"),
    (np.zeros((10, 8)), np.zeros(10), "8 features"),
    (np.full((10, 2), np.nan), np.zeros(10), "finite"),
    (np.zeros((5, 2)), np.zeros(5), "only 5 samples"),
])
def test_ratio_regressor_refuses_bad_data_before_fitting(X, y, message):
    with pytest.raises(ValueError, match=message):
        RatioRegressor(("lightgbm",)).fit(X, y)


def test_unfitted_regressor_says_so():
    with pytest.raises(RuntimeError, match="not fitted"):
        RatioRegressor().predict(np.zeros((1, 2)))


def test_fitted_attributes_and_the_holdout_split():
    rng = np.random.default_rng(0)
    X = rng.uniform(6, 14, size=(120, 2))
    y = 0.2 * X[:, 0] - 0.1 * X[:, 1] + rng.normal(0, 0.01, 120)
    est = RatioRegressor(("lightgbm", "xgboost"), seed=3).fit(X, y)
    assert est.library_ in ("lightgbm", "xgboost") and est.n_samples_ == 120 and est.n_features_in_ == 2
    assert set(est.candidate_mape_) == {"lightgbm", "xgboost"}
    assert est.validation_mape_ == min(est.candidate_mape_.values())
    assert 0 <= est.validation_mape_ <= est.validation_p90_ < 0.2
    assert est.model_bytes_[:2] == b"\x1f\x8b"                 # the library file, gzip-compressed
    np.testing.assert_allclose(np.log(est.predict(X[:20])), est.library_predict(X[:20]), atol=1e-5)
    train, val = holdout_split(120, 3)
    assert len(val) == 24 and len(train) == 96 and not set(train) & set(val)


@pytest.mark.parametrize("kwargs,message", [
    ({"name": ""}, "name must be"),
    ({"name": "a/b"}, "name must be"),
    ({"kind": "network"}, "kind must be one of compute, collectives"),
    ({"nics_per_node": 0}, "nics_per_node"),
    ({"candidates": ("svm",)}, "unknown regressor library"),
    ({"seed": -2}, "seed"),
    ({"license_file": "/nonexistent/LICENSE"}, "no such file"),
    ({"gpu": "A100"}, "GpuSpec"),
])
def test_bundle_fitter_refuses_bad_parameters_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BundleFitter(**{"name": "b", "gpu": GPU, **kwargs})


def _gelu_samples(n: int) -> SampleSet:
    rng = np.random.default_rng(1)
    tokens = rng.choice([1024, 2048, 4096, 8192], n).astype(float)
    width = rng.choice([1024, 4096, 8192], n).astype(float)
    us = tokens * width * 2 * 2 / 1000e9 * 1e6 * rng.uniform(1.2, 1.5, n)
    rows = np.column_stack([tokens, width, us, 2 * us])
    return SampleSet(meta={"gpu": "Test GPU"},
                     operators={("gelu", "fp16"): SampleTable("gelu", "fp16", operator_columns("gelu"), rows)})


def test_bundle_fitter_writes_a_bundle_the_predictor_loads(tmp_path):
    rep = BundleFitter(name="b", gpu=GPU, candidates=("lightgbm",)).fit(_gelu_samples(80), tmp_path / "b")
    assert isinstance(rep, FitReport) and set(rep.models) == {"gelu.fwd.fp16", "gelu.bwd.fp16"}
    b = load_bundle(tmp_path / "b")
    X = np.log2(np.array([[2048.0, 4096.0]]))
    (r,) = b.ratios([("gelu.fwd.fp16", X)])
    assert 1.0 < r[0] < 2.0                                  # the synthetic 1.2–1.5 × roofline
    with pytest.raises(BundleError, match="already exists"):
        BundleFitter(name="b", gpu=GPU, candidates=("lightgbm",)).fit(_gelu_samples(80), tmp_path / "b")


def test_too_few_samples_are_reported_not_fitted(tmp_path):
    with pytest.raises(BundleError, match="no model could be fitted"):
        BundleFitter(name="b", gpu=GPU, candidates=("lightgbm",)).fit(_gelu_samples(5), tmp_path / "b")
    assert not (tmp_path / "b").exists() and not list(tmp_path.iterdir())   # nothing half-written


def test_collectives_without_samples_are_refused(tmp_path):
    empty = SampleSet(meta={}, collectives={})
    with pytest.raises(BundleError, match="no collective samples"):
        BundleFitter(name="c", gpu=GPU, kind="collectives").fit(empty, tmp_path / "c")
    assert collective_columns() == ("entries", "nodes", "gpus_per_node", "us")
