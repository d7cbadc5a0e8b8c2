"""calibrate/engine_costs.py: what DeepSpeed's engines add, fitted from measured step times.

Nothing here runs DeepSpeed or depends on the machine: only the arithmetic that turns the
committed measurements into the shipped [host.engines] tables (numpy only, no torch).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate import engine_costs

ROOT = Path(__file__).resolve().parents[2]


def _rows(step, micro_batch, layer, noise=None):
    noise = noise or {}
    return [[layers, m, step + m * (micro_batch + layers * layer) + noise.get((layers, m), 0.0)]
            for layers in (1, 2, 4) for m in (2, 4, 8)]


def test_fit_recovers_the_three_costs():
    fit = engine_costs.fit_costs(_rows(1.5, 0.2, 0.3))
    assert fit["step_ms"] == pytest.approx(1.5)
    assert fit["micro_batch_ms"] == pytest.approx(0.2)
    assert fit["layer_ms"] == pytest.approx(0.3)
    assert fit["residual_rms_ms"] == pytest.approx(0.0, abs=1e-9)


def test_pooled_runs_keep_each_configuration_at_its_fastest(tmp_path):
    # Two runs of the same engine; the second was disturbed (other tenants' load adds time) in
    # some configurations.  Pooling keeps the undisturbed times, so the fit is the true costs.
    clean = {"deepspeed": _rows(2.0, 0.4, 0.35), "plain": _rows(0.5, 0.1, 0.3)}
    slow = {(2, 8): 3.0, (4, 4): 1.0}
    noisy = {"deepspeed": _rows(2.0, 0.4, 0.35, slow), "plain": _rows(0.5, 0.1, 0.3)}
    paths = []
    for i, rows in enumerate((noisy, clean)):
        p = tmp_path / f"run{i}.json"
        p.write_text(json.dumps({"modes": {"pipe2": {"rows": rows}}}))
        paths.append(p)
    adds = engine_costs.pooled_costs(paths)["pipe2"]
    assert adds["step_ms"] == pytest.approx(1.5)
    assert adds["micro_batch_ms"] == pytest.approx(0.3)
    assert adds["layer_ms"] == pytest.approx(0.05)
    assert adds["runs"] == 2
    # The disturbed run alone would not give them.
    alone = engine_costs.pooled_costs(paths[:1])["pipe2"]
    assert alone["micro_batch_ms"] != pytest.approx(0.3, abs=1e-3)


def test_shipped_platforms_carry_the_fit_of_the_committed_runs():
    # Every platform with a [host] table carries both engines' costs as scripts/build_platforms.py
    # fits them from the committed measurements (benchmarks/data/engine-host), with their source: a
    # refit that was not written back, or a hand edit, fails here.
    from predictor import load_platform
    from predictor.host import ENGINES
    assert set(engine_costs.ENGINE_MODES) == set(ENGINES)
    runs = ROOT / "benchmarks" / "data" / "engine-host"
    expected = engine_costs.engine_prior(runs)
    pooled = engine_costs.pooled_costs(sorted(runs.glob("*.json")))
    for engine, mode in engine_costs.ENGINE_MODES.items():      # the pooled fit, in seconds, none below 0
        for key in ("step", "micro_batch", "layer"):
            want = max(0.0, pooled[mode][f"{key}_ms"]) * 1e-3
            assert expected[engine][f"{key}_seconds"] == pytest.approx(want, abs=5e-8)
    for name in ("dgx-h100", "dgx-a100", "perlmutter-a100", "vista-gh200"):
        host = load_platform(name).host
        assert set(host.engines) == set(ENGINES), name
        for engine, e in host.engines.items():
            assert e.source == expected[engine]["source"]
            for key in ("step_seconds", "micro_batch_seconds", "layer_seconds"):
                assert getattr(e, key) == pytest.approx(expected[engine][key], rel=1e-9, abs=1e-12), (name, key)
            assert 0 < e.micro_batch_seconds < 5e-3 and 0 < e.step_seconds < 20e-3
