"""FP8 GEMMs (run.fp8): read from a bundle's own FP8 samples where it has them (dgx-h100, measured
on the lent H100), else the tensor-core part of the 16-bit time at the FP8 peak (the prior: the
GH200 bundle has FP8 tensor cores and no FP8 samples); casts as memory passes either way."""
import copy
import dataclasses

import numpy as np
import pytest

from predictor import JobError, TrainingJob, load_platform, predict
from predictor import fp8
from predictor.recipe import micro_batch_recipe

P16, P8 = 989e12, 1979e12
ETA = fp8.ACHIEVABLE_TENSOR_FRACTION

LLAMA8B = {"layers": 8, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "seq_len": 8192,
           "vocab": 128256, "norm": "rmsnorm", "activation": "swiglu", "attention": "flash",
           "tied_embeddings": False}
SMALL = {"layers": 8, "hidden": 512, "heads": 8, "seq_len": 512, "vocab": 32000, "norm": "rmsnorm",
         "activation": "swiglu", "attention": "flash", "tied_embeddings": False}


@pytest.fixture(scope="module")
def h100():
    """FP8 GEMMs measured (benchmarks/data/h100-lent/operators/linear*_fp8.csv)."""
    return load_platform("dgx-h100")


@pytest.fixture(scope="module")
def gh200():
    """FP8 tensor cores, no FP8 samples: the prior."""
    return load_platform("vista-gh200")


def job(model, fp8_recipe="", precision="bf16", **layout):
    lay = {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 1, "micro_batches": 4, "recompute": "none"}
    lay.update(layout)
    return TrainingJob.from_dict({"model": model, "layout": lay,
                                  "run": {"precision": precision, "fp8": fp8_recipe, "framework": "megatron"}})


def test_gemm_seconds_halves_only_the_tensor_core_part():
    flops = np.array([1e12, 1e12, 1e6])
    t16 = np.array([flops[0] / (0.6 * P16),      # slower than η: a part stays
                    flops[1] / (0.9 * P16),      # faster than η: all tensor-core time
                    20e-6])                      # a launch-bound GEMM
    t8, gap = fp8.gemm_seconds(t16, flops, np.zeros(3), P16, P8, 3.35e12)
    tc = flops[0] / (ETA * P16)
    assert t8[0] == pytest.approx(t16[0] - tc + tc * P16 / P8)
    assert t16[0] / 2 < t8[0] < t16[0]
    assert t8[1] == pytest.approx(t16[1] * P16 / P8) and gap[1] == pytest.approx(0.0)
    assert t8[2] == pytest.approx(t16[2], rel=1e-3)            # nothing to halve
    assert 0 < gap[0] < 0.5 and gap[2] == pytest.approx(0.5, abs=1e-3)


def test_gemm_seconds_never_beats_the_memory():
    # M = N = 8192, K = 256: the 16-bit result alone is 128 MiB of writes
    m, k, n = 8192, 256, 8192
    flops = np.array([2.0 * m * k * n])
    byt = np.array([fp8.gemm_bytes(m, k, n, "fwd")])
    t8, gap = fp8.gemm_seconds(flops / (0.9 * P16), flops, byt, P16, P8, 3.35e12)
    assert t8[0] == pytest.approx(byt[0] / 3.35e12) and gap[0] == pytest.approx(0.0)
    assert fp8.gemm_bytes(m, k, n, "bwd") == pytest.approx(2 * m * n + 3 * m * k + 3 * k * n)


@pytest.mark.parametrize("plat", ["h100", "gh200"])
def test_fp8_job_is_faster_than_bf16_but_not_twice(plat, request):
    p = request.getfixturevalue(plat)
    b = predict(job(LLAMA8B), p)
    f = predict(job(LLAMA8B, "delayed"), p)
    assert b.iteration_seconds / 2 < f.iteration_seconds < b.iteration_seconds
    # the prior says so; measured FP8 samples need no warning
    assert any("FP8" in w for w in f.warnings) == (plat == "gh200")
    assert not any("FP8" in w for w in b.warnings)
    # the attention and the communication do not change: only the GEMMs (and the casts)
    assert f.breakdown.optimizer_seconds == pytest.approx(b.breakdown.optimizer_seconds)


def test_fp8_prior_interval_is_wider_relative_to_the_point(gh200):
    b = predict(job(LLAMA8B), gh200)
    f = predict(job(LLAMA8B, "delayed"), gh200)
    width = lambda p: (p.interval_seconds[1] - p.interval_seconds[0]) / p.iteration_seconds  # noqa: E731
    assert width(f) > width(b)


@pytest.mark.parametrize("plat", ["h100", "gh200"])
def test_small_gemms_gain_less_than_large_ones(plat, request):
    p = request.getfixturevalue(plat)

    def gain(model):
        return predict(job(model), p).iteration_seconds / predict(job(model, "delayed"), p).iteration_seconds
    assert gain(SMALL) < gain(LLAMA8B)
    assert gain(SMALL) >= 0.9           # casts may cost more than a small GEMM saves, not much more


def test_current_scaling_costs_an_extra_pass(h100):
    d = predict(job(LLAMA8B, "delayed"), h100).iteration_seconds
    c = predict(job(LLAMA8B, "current"), h100).iteration_seconds
    assert d < c < d * 1.1


def test_measured_fp8_samples_replace_the_prior(h100, gh200):
    assert fp8.measured(h100.compute) and not fp8.measured(gh200.compute)
    assert not fp8.measured(load_platform("perlmutter-a100").compute)
    # Without its FP8 models the same bundle falls back to the prior, and costs differently.
    measured = predict(job(LLAMA8B, "delayed"), h100)
    prior_bundle = copy.copy(h100.compute)
    prior_bundle.models = {k: v for k, v in h100.compute.models.items() if not k.endswith(".fp8")}
    prior = predict(job(LLAMA8B, "delayed"), dataclasses.replace(h100, compute=prior_bundle))
    assert any("16-bit measurements" in w for w in prior.warnings)
    assert not any("16-bit measurements" in w for w in measured.warnings)
    assert measured.iteration_seconds != pytest.approx(prior.iteration_seconds, rel=1e-3)
    # The 16-bit job does not read the FP8 models.
    bf16 = predict(job(LLAMA8B), h100)
    assert bf16.iteration_seconds == pytest.approx(
        predict(job(LLAMA8B), dataclasses.replace(h100, compute=prior_bundle)).iteration_seconds)


def test_fp8_samples_are_issued_apart_on_the_host(h100):
    # FP8 samples are direct _scaled_mm calls (no autograd): their own host figures, not the
    # 16-bit linear's, are what the sample less its host lead-in uses.
    host = h100.host
    assert host.call_seconds("linear1", "bwd", "fp8") > 0
    assert host.call_seconds("linear1", "bwd", "fp8") != host.call_seconds("linear1", "bwd", "bf16")
    assert host.call_seconds("linear1", "bwd") == host.call_seconds("linear1", "bwd", "bf16")
    assert host.call_seconds("gelu", "fwd", "fp8") == 0.0      # never measured in FP8


def test_casts_follow_the_linears():
    recipe = micro_batch_recipe(job(LLAMA8B).model, job(LLAMA8B).layout)
    casts = fp8.layer_casts(recipe.layer, "delayed", micro_batches=4)
    linears = [c for c in recipe.layer if c.name in fp8.FP8_LINEARS]
    assert len(linears) == 4
    # per linear: its input and its weight in forward (the weight once per step), its output
    # gradient in backward
    assert len(casts.forward) == 8 and len(casts.backward) == 4
    assert casts.launches_forward == pytest.approx(4 + 4 / 4)
    q = [c for c in linears if c.name == "linear1"][0]
    inputs = [c for c in casts.forward if c.shape == {"tokens": q.shape["m"], "dim": q.shape["k"]}]
    assert inputs
    current = fp8.layer_casts(recipe.layer, "current", micro_batches=4)
    assert len(current.forward) == 16 and {c.name for c in current.forward} == {"fp8_cast", "amax"}


def test_platform_without_fp8_tensor_cores_is_refused():
    a100 = load_platform("dgx-a100")
    with pytest.raises(JobError, match=r"run\.fp8.*no FP8 tensor cores"):
        predict(job(LLAMA8B, "delayed"), a100)


def test_bad_fp8_values_name_the_key():
    with pytest.raises(JobError, match=r"run\.fp8.*not one of.*delayed, current"):
        job(LLAMA8B, "hybrid")
    with pytest.raises(JobError, match=r"run\.fp8.*fp32"):
        job(LLAMA8B, "delayed", precision="fp32")


def test_fp8_round_trips_through_the_job_dict():
    j = job(LLAMA8B, "current")
    assert j.to_dict()["run"]["fp8"] == "current"
    assert TrainingJob.from_dict(j.to_dict()) == j
