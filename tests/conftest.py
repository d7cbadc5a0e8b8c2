"""Settings for the whole suite, applied before any test module loads XGBoost or LightGBM."""
import os

# Two OpenMP runtimes (XGBoost's and LightGBM's) spinning on a 2-core CI machine can stall fits
# for minutes; passive waiting keeps them from starving each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_prediction_memos():
    # Tests change loaded platforms and module constants in place (monkeypatch); the predictor
    # memoises answers per loaded platform, which in production never changes once loaded.
    from predictor.estimate import clear_memos
    clear_memos()
    yield
