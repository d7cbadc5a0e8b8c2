"""Settings for the whole suite, applied before any test module loads XGBoost or LightGBM."""
import os

# Two OpenMP runtimes (XGBoost's and LightGBM's) spinning on a 2-core CI machine can stall fits
# for minutes; passive waiting keeps them from starving each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
