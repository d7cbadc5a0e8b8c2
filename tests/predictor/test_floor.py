"""Below the sampled range an operator costs at least a launch (issue: floors below the range)."""
from __future__ import annotations

import numpy as np
import pytest

from predictor import load_platform
from predictor.estimate import QuerySet
from predictor.operators import OPERATORS


@pytest.mark.parametrize("platform", ["perlmutter-a100", "vista-gh200", "dgx-h100"])
def test_a_shape_below_every_sample_costs_at_least_the_bundles_least_measured_time(platform):
    plat = load_platform(platform)
    floor = plat.compute.kernel_floor_seconds
    # A launch: microseconds, not the roofline's nanoseconds nor a large kernel's milliseconds.
    assert 1e-6 < floor < 1e-4
    q = QuerySet(plat)
    tiny = q.op("gelu", "fwd", "fp16", {"tokens": 1, "width": 1})
    roof = OPERATORS["gelu"].roofline_seconds({"tokens": 1.0, "width": 1.0}, "fwd", "fp16", plat.gpu)
    secs, _, extra = q.evaluate()
    assert extra[tiny]
    assert roof < 1e-6 < floor
    # The host share of a timed call is taken off after the floor (predictor/host.py): the device
    # time keeps at least the floor less half that call.
    call = plat.host.call_seconds("gelu", "fwd") if plat.host is not None else 0.0
    assert secs[tiny] >= max(floor - 0.5 * call, roof) * (1 - 1e-12)


def test_the_floor_is_the_least_corner_of_the_bundles_models():
    plat = load_platform("perlmutter-a100")
    b = plat.compute
    corners = []
    for key, lm in b.models.items():
        name, direction, precision = key.split(".")
        op = OPERATORS[name]
        shape = dict(zip(op.features, map(float, lm.info.feature_min)))
        (r,) = b.ratios([(key, np.log2(np.maximum([lm.info.feature_min], 1.0)))])
        corners.append(float(r[0]) * op.roofline_seconds(shape, direction, precision, b.gpu))
    assert b.kernel_floor_seconds == pytest.approx(min(corners), rel=1e-12)
