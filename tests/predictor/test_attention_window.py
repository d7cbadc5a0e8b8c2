"""model.attention_window (sliding-window attention) and model.linear_bias."""
from __future__ import annotations

import pytest

from predictor import Predictor, TrainingJob, load_platform
from predictor.errors import JobError
from predictor.recipe import (attention_window_fraction, layer_parameters, micro_batch_recipe,
                              model_flops_per_iteration, total_parameters)

LLAMA = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "activation": "swiglu",
         "norm": "rmsnorm", "attention": "flash", "vocab": 128256, "seq_len": 8192}


def _job(window: int = 0, cp: int = 1, recompute: str = "none", **model) -> TrainingJob:
    m = {**LLAMA, **model}
    if window:
        m["attention_window"] = window
    return TrainingJob.from_dict({"model": m,
                                  "layout": {"pp": 1, "tp": 4, "cp": cp, "dp": 8 // cp, "micro_batch": 1,
                                             "micro_batches": 16, "zero_stage": 1, "recompute": recompute},
                                  "run": {"precision": "bf16", "train_iters": 100, "framework": "megatron"}},
                                 source="job.toml")


@pytest.fixture(scope="module")
def predictor():
    return Predictor(load_platform("dgx-h100"))


def _brute(s: int, w: int) -> float:
    return sum(min(i + 1, w) for i in range(s)) / (s * (s + 1) / 2)


@pytest.mark.parametrize("s, w", [(8192, 4096), (8192, 1), (4096, 4095), (100, 7), (2048, 1024)])
def test_fraction_counts_the_keys_each_query_meets(s, w):
    assert attention_window_fraction(s, w) == pytest.approx(_brute(s, w), rel=1e-12)


@pytest.mark.parametrize("w", [0, 8192, 8193, 1 << 20])
def test_no_window_or_a_window_past_the_sequence_is_exactly_one(w):
    assert attention_window_fraction(8192, w) == 1.0


def test_window_at_least_the_sequence_predicts_the_same_bits(predictor):
    base = predictor.predict(_job()).to_dict(80.0)
    for w in (8192, 100000):
        d = predictor.predict(_job(w)).to_dict(80.0)
        assert d["job"]["model"].pop("attention_window") == w
        base["job"]["model"].pop("attention_window", None)
        assert d == base


def test_window_scales_the_attention_kernel_by_its_fraction(predictor):
    """The stage time is linear in the kernel's share: two windows' savings are in the ratio of
    their skipped shares (the kernel's measured time at this length, times the fraction)."""
    t = {w: predictor.predict(_job(w)).details.to_dict() for w in (0, 1024, 4096)}
    for key in ("stage_forward_seconds", "stage_backward_seconds"):
        t0, t1, t2 = (t[w][key][0] for w in (0, 1024, 4096))
        f1, f2 = attention_window_fraction(8192, 1024), attention_window_fraction(8192, 4096)
        assert t1 < t2 < t0
        assert (t0 - t1) / (t0 - t2) == pytest.approx((1 - f1) / (1 - f2), rel=1e-9)


def test_window_scales_model_flops_not_memory(predictor):
    full, win = _job(), _job(2048)
    f = attention_window_fraction(8192, 2048)
    flash = next(c for c in micro_batch_recipe(win.model, win.layout).layer if c.name == "flash_atten")
    assert flash.work == f and flash.count == 1
    layout = full.layout
    per_call = next(c for c in micro_batch_recipe(full.model, layout).layer if c.name == "flash_atten").forward_flops()
    saved = 3 * full.model.layers * per_call * (1 - f) * layout.tp * layout.micro_batches * layout.dp
    assert model_flops_per_iteration(full.model, layout) - model_flops_per_iteration(win.model, layout) == \
        pytest.approx(saved, rel=1e-12)
    a, b = predictor.predict(full).to_dict(80.0), predictor.predict(win).to_dict(80.0)
    assert [s["peak_memory_bytes"] for s in a["stages"]] == [s["peak_memory_bytes"] for s in b["stages"]]
    assert a["parameters"] == b["parameters"]


@pytest.mark.parametrize("attention", ["unfused", "fused_softmax"])
def test_unfused_attention_computes_the_whole_square(predictor, attention):
    full = predictor.predict(_job(attention=attention))
    win = predictor.predict(_job(1024, attention=attention))
    assert win.iteration_seconds == full.iteration_seconds
    assert any("model.attention_window 1024" in w and "saves nothing" in w for w in win.warnings)


def test_window_with_context_parallelism_is_said(predictor):
    win = predictor.predict(_job(2048, cp=2))
    assert win.iteration_seconds < predictor.predict(_job(cp=2)).iteration_seconds
    assert any("layout.cp 2" in w for w in win.warnings)


@pytest.mark.parametrize("value", [-1, -4096])
def test_negative_window_is_refused_naming_file_and_key(value):
    with pytest.raises(JobError, match="model.attention_window: must not be negative") as err:
        _job(attention_window=value)
    assert str(err.value).startswith("job.toml: ")


def test_zero_window_is_none_and_the_resolved_job_round_trips():
    job = _job(attention_window=0)
    assert job.model.attention_window == 0 and job == _job()
    assert TrainingJob.from_dict(_job(2048).to_dict()).model.attention_window == 2048
    assert TrainingJob.from_dict(job.to_dict()) == job


def test_linear_bias_defaults_to_the_norm_and_can_be_said():
    base = {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 128}
    ln = TrainingJob.from_dict({"model": base}).model
    rms = TrainingJob.from_dict({"model": {**base, "norm": "rmsnorm"}}).model
    assert ln.linear_bias is True and rms.linear_bias is False
    ln_nobias = TrainingJob.from_dict({"model": {**base, "linear_bias": False}}).model
    rms_bias = TrainingJob.from_dict({"model": {**base, "norm": "rmsnorm", "linear_bias": True}}).model
    h, f = 256, 1024
    assert layer_parameters(ln) - layer_parameters(ln_nobias) == 3 * h + h + f + h
    assert layer_parameters(rms_bias) - layer_parameters(rms) == 3 * h + h + f + h
    assert total_parameters(rms_bias) - total_parameters(rms) == 2 * (3 * h + h + f + h)
    assert TrainingJob.from_dict({"model": {**base, "norm": "rmsnorm"}}).to_dict()["model"]["linear_bias"] is False
    with pytest.raises(JobError, match="model.linear_bias: must be true or false"):
        TrainingJob.from_dict({"model": {**base, "linear_bias": "no"}})


def test_modelling_doc_quotes_the_fraction():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "modelling.md").read_text(encoding="utf-8")
    quoted = (f"{attention_window_fraction(8192, 4096):.3f} at w = 4,096, s = 8,192; "
              f"{attention_window_fraction(8192, 1024):.3f} at w = 1,024")
    assert quoted in doc
