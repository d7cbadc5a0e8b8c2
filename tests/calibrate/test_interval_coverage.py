"""calibrate/interval_coverage.py: how a run is judged and summed (the shipped runs' leave-one-out
figures are checked in tests/predictor/test_interval.py); and the measurement modules that read rows
import without torch."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from calibrate.interval_coverage import judge, summary


def _facts(predicted: float, measured: float) -> SimpleNamespace:
    return SimpleNamespace(run=SimpleNamespace(predicted_iteration_seconds=predicted,
                                               measured_iteration_seconds=measured))


def test_judge_puts_the_interval_around_the_recorded_point():
    assert judge(_facts(2.0, 2.5), 0.8, 1.3) == (True, pytest.approx(0.5))
    assert judge(_facts(2.0, 2.7), 0.8, 1.3) == (False, pytest.approx(0.5))
    assert judge(_facts(2.0, 1.5), 0.8, 1.3)[0] is False


def test_summary_counts_and_takes_the_median_width():
    s = summary([(True, 0.2), (False, 0.9), (True, 0.4)])
    assert (s["inside"], s["runs"]) == (2, 3)
    assert s["coverage"] == pytest.approx(2 / 3) and s["median_width"] == 0.4


def test_the_row_reading_measurement_modules_import_without_torch():
    # torch is the calibrate extra: what reads recorded rows must not need it.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import calibrate.interval_coverage, calibrate.shipped_gpus, calibrate.sm_margin, "
            "calibrate.stack_files, calibrate.step_profile, calibrate.train_family")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
