"""calibrate/framework_layer.py: Megatron-core's layer runs on a CPU as it would on a GPU, its host
time is measured against the reference layer's, and the shipped ratios are the committed runs'."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The lent H100 node's runs (what ships); the 2-core VM's, framework-layer-[0-9].json, are kept for
# reference.
RUNS = sorted((ROOT / "benchmarks" / "data" / "stack-host").glob("framework-layer-h100-[0-9].json"))


def _framework_layer():
    pytest.importorskip("torch", reason="the layers run torch (the calibrate extra)")
    from calibrate import framework_layer
    return framework_layer


@pytest.fixture
def megatron(one_rank):
    """megatron-core's model-parallel state on the test's one-rank group, torn down with it."""
    pytest.importorskip("megatron.core", reason="Megatron-core's layer is what is measured (no dependency "
                                                "of perfcast; .ci/run installs it)")
    from megatron.core import parallel_state
    yield _framework_layer()
    parallel_state.destroy_model_parallel()


def test_shipped_extras_are_the_median_of_the_committed_runs():
    from predictor.host import MEGATRON_LAYER_EXTRA_SECONDS, MEGATRON_LAYER_FORWARD_EXTRA_SECONDS
    framework_layer = _framework_layer()
    assert len(RUNS) == 3
    files = [json.loads(p.read_text()) for p in RUNS]
    assert all(f["provenance"]["backend"] == "nccl" and "H100" in f["provenance"]["gpu"] for f in files)
    runs = [f["framework_layer"] for f in files]
    for r in runs:
        # Each run's ratios are its own slopes' (not edited apart from them).
        s = r["layer_seconds"]
        assert r["ratio"] == pytest.approx(s["megatron"] / s["reference"])
        assert r["forward_ratio"] == pytest.approx(s["megatron_forward"] / s["reference_forward"])
        assert r["dropout"] == framework_layer.MEGATRON_DROPOUT
    pooled = framework_layer.pooled_extra(runs)
    assert MEGATRON_LAYER_EXTRA_SECONDS == pytest.approx(pooled["extra_seconds"], abs=5e-7)
    assert MEGATRON_LAYER_FORWARD_EXTRA_SECONDS == pytest.approx(pooled["forward_extra_seconds"], abs=5e-7)


def test_pooled_extra_is_the_median_of_the_differences():
    framework_layer = _framework_layer()
    runs = [{"layer_seconds": {"reference": 1.0, "megatron": 1.0 + d, "reference_forward": 0.5,
                               "megatron_forward": 0.5 + d / 2},
             "ratio": 1.0 + d, "forward_ratio": 1.0 + d} for d in (0.1, 0.3, 0.2)]
    pooled = framework_layer.pooled_extra(runs)
    assert pooled["extra_seconds"] == pytest.approx(0.2)
    assert pooled["forward_extra_seconds"] == pytest.approx(0.1)
    assert pooled["ratio"] == pytest.approx(1.2) and pooled["runs"] == 3
    with pytest.raises(ValueError, match="at least one run"):
        framework_layer.pooled_extra([])


def test_megatron_layers_train_on_a_cpu_and_keep_the_rng_functions(megatron):
    import torch
    from megatron.core.tensor_parallel import random as mp_random

    saved = (mp_random._get_cuda_rng_state, mp_random._set_cuda_rng_state)
    model = megatron.MegatronLayers(2)
    x = torch.randn(32, model.width, requires_grad=True)
    out = model(x)
    assert out.shape == x.shape
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in model.parameters())
    # The CPU stand-ins for the device generator are Megatron's only inside the layers' forward.
    assert (mp_random._get_cuda_rng_state, mp_random._set_cuda_rng_state) == saved
    # Dropout 0.1 is live: two forwards of the same input differ; without dropout they agree.
    assert not torch.equal(model(x), model(x))
    quiet = megatron.MegatronLayers(1, dropout=0.0)
    assert torch.equal(quiet(x), quiet(x))


def test_costs_and_operator_counts_are_measured(megatron):
    r = megatron.framework_layer_costs((1, 2), repeats=3, rounds=1)
    s = r["layer_seconds"]
    assert set(s) == {"reference", "reference_forward", "megatron", "megatron_forward"}
    assert r["extra_seconds"] == pytest.approx(s["megatron"] - s["reference"])
    assert r["forward_extra_seconds"] == pytest.approx(s["megatron_forward"] - s["reference_forward"])
    assert r["ratio"] == pytest.approx(s["megatron"] / s["reference"])
    assert all(v > 0 and math.isfinite(v) for v in r["per_config"].values())
    assert len(r["per_config"]) == 8
    ops = megatron.operator_counts()
    # Megatron's layer dispatches more ATen operators (dropouts, masked softmax, views) than the
    # reference: a count, the same on any machine.
    assert ops["megatron"] > ops["reference"] > 50
