"""calibrate/sm_margin.py: the summaries of the SM-margin rows, and the shipped slowdown is the
committed measurement's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate import sm_margin
from predictor import tp_overlap

SM_MARGIN = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent" / "sm-margin.json"


def _row(precision: str, **ratios: float) -> dict:
    return {"precision": precision, "ratio": {k.removeprefix("m"): v for k, v in ratios.items()}}


def test_ratio_summary_is_over_one_precision():
    rows = [_row("bf16", m16=1.10), _row("bf16", m16=1.04), _row("bf16", m16=1.20), _row("fp8", m16=2.0)]
    assert sm_margin.ratio_summary(rows, "bf16", 16) == (pytest.approx(1.10), 1.04, 1.20, 3)
    with pytest.raises(ValueError, match="no fp16 rows"):
        sm_margin.ratio_summary(rows, "fp16", 16)


def test_a_carveout_that_changed_nothing_is_told_apart():
    flat = [_row("bf16", m8=1.001, m16=0.995, m32=1.009)]
    assert sm_margin.carveout_ignored(flat)
    assert not sm_margin.carveout_ignored(flat + [_row("fp8", m8=1.0, m16=1.0, m32=1.02)])


def test_the_shipped_slowdown_is_the_committed_measurements_median():
    data = json.loads(SM_MARGIN.read_text())
    (sms, margin), slowdown = next(iter(tp_overlap.MEASURED_MARGIN_SLOWDOWN.items()))
    assert data["sms"] == sms
    median, low, high, count = sm_margin.ratio_summary(data["rows"], "bf16", margin)
    assert round(median, 3) == slowdown and count == len(sm_margin.SHAPES)
    assert not sm_margin.carveout_ignored(data["rows"])


def test_the_shapes_measured_are_the_modules():
    data = json.loads(SM_MARGIN.read_text())
    assert sorted({(r["m"], r["k"], r["n"]) for r in data["rows"]}) == sorted(sm_margin.SHAPES)
    assert {r["precision"] for r in data["rows"]} == set(sm_margin.PRECISIONS)
