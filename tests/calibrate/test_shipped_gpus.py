"""calibrate/shipped_gpus.py: the specs are the ones the shipped platforms were fitted with."""
from __future__ import annotations

import pytest

from calibrate import shipped_gpus
from predictor import load_platform


@pytest.mark.parametrize("platform, spec", [("perlmutter-a100", "A100"), ("dgx-a100", "A100"),
                                            ("vista-gh200", "GH200"), ("dgx-h100", "H100")])
def test_a_shipped_platform_carries_the_spec_its_bundle_was_fitted_with(platform, spec):
    # The roofline normalises the fitted ratios: benchmarks/bench_operators.py must use the same peaks.
    assert load_platform(platform).gpu == getattr(shipped_gpus, spec)
