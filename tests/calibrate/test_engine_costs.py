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


def test_a_gpu_nodes_runs_ship_the_modes_they_measured(tmp_path):
    # CPU runs of every mode, a GPU node's runs of two: the engine's costs come from the GPU runs
    # alone (not pooled with the CPU's); pipe2, which no GPU node could run, from the GPU node's
    # pipe1 plus pipe2 less pipe1 on the CPU; each says where it came from.
    cpu = {"cpu": "AMD EPYC", "torch": "2.13.0+cpu", "deepspeed": "0.19.8",
           "modes": {m: {"rows": {"deepspeed": _rows(2.0 + extra, 0.2 + extra, 0.03),
                                  "plain": _rows(1.0, 0.1, 0.01)}}
                     for m, extra in (("pipe1", 0.0), ("pipe2", 0.5), ("engine", 0.0))}}
    for i in range(2):
        (tmp_path / f"cpu-{i}.json").write_text(json.dumps(cpu))
    gpu_dir = tmp_path / engine_costs.GPU_RUNS
    gpu_dir.mkdir()
    for name, mode in (("engine-1", "engine"), ("pipe1-1", "pipe1")):
        (gpu_dir / f"{name}.json").write_text(json.dumps({
            "cpu": "Xeon", "torch": "2.11.0+cu130", "deepspeed": "0.19.8 ", "device": "cuda", "gpu": "H100",
            "date": "2026-11-26T18:33:39+00:00",
            "modes": {mode: {"rows": {"deepspeed": _rows(3.0, 0.5, 0.2), "plain": _rows(2.0, 0.2, 0.1)}}}}))
    prior = engine_costs.engine_prior(tmp_path)
    assert prior["deepspeed"]["step_seconds"] == pytest.approx(1e-3)
    assert prior["deepspeed"]["micro_batch_seconds"] == pytest.approx(0.3e-3)
    assert prior["deepspeed"]["layer_seconds"] == pytest.approx(0.1e-3)
    assert "--device cuda --pool (engine, 1 run) on the lent H100 node's Xeon" in prior["deepspeed"]["source"]
    assert "deepspeed 0.19.8," in prior["deepspeed"]["source"]
    pipeline = prior["deepspeed_pipeline"]     # the GPU's pipe1 (1.0, 0.3, 0.1) + the CPU's (0.5, 0.5, 0)
    assert pipeline["step_seconds"] == pytest.approx(1.5e-3)
    assert pipeline["micro_batch_seconds"] == pytest.approx(0.8e-3)
    assert pipeline["layer_seconds"] == pytest.approx(0.1e-3)
    assert ("--device cuda --pool (pipe1, 1 run) on the lent H100 node's Xeon" in pipeline["source"]
            and "plus pipe2 less pipe1 of --pool (2 runs) on AMD EPYC" in pipeline["source"])
    assert engine_costs.pooled_costs(sorted(gpu_dir.glob("*.json")))["engine"]["runs"] == 1
    # Without the GPU node's pipe1, pipe2 is the CPU runs' alone.
    (gpu_dir / "pipe1-1.json").unlink()
    alone = engine_costs.engine_prior(tmp_path)["deepspeed_pipeline"]
    assert alone["micro_batch_seconds"] == pytest.approx(0.6e-3)
    assert "--pool (pipe2, 2 runs) on AMD EPYC" in alone["source"] and "cuda" not in alone["source"]
    # A second GPU run a day later: the source gives the dates the runs span.
    second = json.loads((gpu_dir / "engine-1.json").read_text())
    second["date"] = "2026-11-27T16:54:41+00:00"
    (gpu_dir / "engine-2.json").write_text(json.dumps(second))
    source = engine_costs.engine_prior(tmp_path)["deepspeed"]["source"]
    assert "(engine, 2 runs) on the lent H100 node's Xeon (2026-11-26T18:33 to 2026-11-27T16:54," in source


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
    # A mode a GPU node measured ships from its runs alone (the CPU runs do not pool with them);
    # pipe2, which needs two GPUs, as the GPU node's pipe1 plus pipe2 less pipe1 on the CPU.
    gpu = engine_costs.pooled_costs(sorted((runs / engine_costs.GPU_RUNS).glob("*.json")))
    assert "engine" in gpu and "pipe1" in gpu and "pipe2" not in gpu
    for engine, mode in engine_costs.ENGINE_MODES.items():      # the pooled fit, in seconds, none below 0
        proxy = engine_costs.GPU_PROXY.get(mode)
        fit = gpu[mode] if mode in gpu else {k: gpu[proxy][k] + pooled[mode][k] - pooled[proxy][k]
                                               for k in ("step_ms", "micro_batch_ms", "layer_ms")}
        assert "--device cuda" in expected[engine]["source"]
        for key in ("step", "micro_batch", "layer"):
            want = max(0.0, fit[f"{key}_ms"]) * 1e-3
            assert expected[engine][f"{key}_seconds"] == pytest.approx(want, abs=5e-8)
    for name in ("dgx-h100", "dgx-a100", "perlmutter-a100", "vista-gh200"):
        host = load_platform(name).host
        assert set(host.engines) == set(ENGINES), name
        for engine, e in host.engines.items():
            assert e.source == expected[engine]["source"]
            for key in ("step_seconds", "micro_batch_seconds", "layer_seconds"):
                assert getattr(e, key) == pytest.approx(expected[engine][key], rel=1e-9, abs=1e-12), (name, key)
            assert 0 < e.micro_batch_seconds < 5e-3 and 0 < e.step_seconds < 20e-3
