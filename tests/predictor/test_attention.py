"""model.attention_impl: the key, its defaults per framework, and the kernel ratios."""
from __future__ import annotations

import pytest

from predictor import attention
from predictor.errors import JobError
from predictor.job import TrainingJob

MODEL = {"layers": 2, "hidden": 1024, "heads": 8, "seq_len": 4096}


def _job(**model) -> TrainingJob:
    return TrainingJob.from_dict({"model": {**MODEL, **model}}, source="job.toml")


def test_key_implies_fused_attention_and_is_validated():
    assert _job(attention_impl="Triton").model.attention == "flash"
    assert _job(attention_impl="triton").model.attention_impl == "triton"
    assert _job().model.attention_impl == ""
    with pytest.raises(JobError, match="model.attention_impl.*'flash4' is not one of.*did you mean 'flash3'"):
        _job(attention_impl="flash4")
    with pytest.raises(JobError, match=r"model.attention_impl: names the kernel of fused attention"):
        _job(attention="fused_softmax", attention_impl="cudnn")
    # The resolved job names it (the JSON answer's "job").
    assert _job(attention_impl="cudnn").to_dict()["model"]["attention_impl"] == "cudnn"


@pytest.mark.parametrize("framework, hopper, expected", [
    ("megatron", True, "cudnn"), ("nemo", False, "flash2"), ("neox", True, "flash2"),
    ("megatron-deepspeed", False, "flash2"), ("torchtitan", True, "sdpa_flash"), ("", True, "")])
def test_default_per_framework(framework, hopper, expected):
    assert attention.default_impl(framework, hopper) == expected


def test_shipped_bundles_say_what_they_timed():
    assert attention.measured_impl("h100-80gb-hbm3", {}) == attention.Measured("cudnn", True)
    assert attention.measured_impl("a100-sxm4-80gb", {}) == attention.Measured("flash2", False)
    # A calibrated store's own record wins over the table.
    assert attention.measured_impl("a100-sxm4-80gb", {"flash_atten_impl": "cudnn"}).impl == "cudnn"
    assert attention.measured_impl("site-gpu", {}) is None


def test_relative_seconds_follow_the_kernel_figures():
    cudnn = attention.Measured("cudnn", True)
    # FlashAttention-2 runs ~1.6x as long as cuDNN on Hopper at training lengths; FA3 less.
    for seq in (2048, 8192, 32768):
        r2 = attention.relative_seconds("flash2", cudnn, "fwd", seq, hopper=True)
        r3 = attention.relative_seconds("flash3", cudnn, "fwd", seq, hopper=True)
        assert 1.5 < r2.ratio < 1.7 and r2.figure and not r2.note
        assert 0.8 < r3.ratio < 1.0
    # The same kernel through another entry point: nothing to convert.
    same = attention.relative_seconds("sdpa_flash", attention.Measured("flash2", True), "bwd", 4096, True)
    assert same.ratio == 1.0 and same.figure
    # No figure relates them: costed as the measured kernel, and said.
    none = attention.relative_seconds("sdpa_efficient", cudnn, "fwd", 4096, True)
    assert none.ratio == 1.0 and not none.figure and "no published kernel figure" in none.note


def test_non_causal_samples_are_made_causal():
    noncausal = attention.Measured("flash2", False)
    short = attention.relative_seconds("flash2", noncausal, "fwd", 512, False).ratio
    long = attention.relative_seconds("flash2", noncausal, "fwd", 16384, False).ratio
    # The causal kernel skips half the blocks but pays the diagonal: closer to 1/2 the longer.
    assert 0.5 < long < short < 1.0


def _predict(platform: str, **model):
    from predictor import load_platform, predict
    job = TrainingJob.from_dict({"model": {"layers": 2, "hidden": 2048, "heads": 16, "seq_len": 8192,
                                           "attention": "flash", **model},
                                 "layout": {"micro_batch": 1, "micro_batches": 2, "zero_stage": 0},
                                 "run": {"precision": "bf16"}}, source="job.toml")
    return predict(job, load_platform(platform))


def test_a_measured_kernel_is_costed_from_its_samples_others_say_they_were_not():
    plain, cudnn = _predict("dgx-h100"), _predict("dgx-h100", attention_impl="cudnn")
    # The lent H100's flash_atten samples timed cuDNN's kernel: naming it changes nothing.
    assert cudnn.iteration_seconds == plain.iteration_seconds
    assert not [w for w in cudnn.warnings if "attention kernel" in w]
    fa2 = _predict("dgx-h100", attention_impl="flash2")
    assert fa2.iteration_seconds > plain.iteration_seconds
    said = [w for w in fa2.warnings if "attention kernel flash2 was not measured" in w]
    assert said and "timed cudnn" in said[0]
    # The same kernel through SDPA costs the same and says the same.
    assert _predict("dgx-h100", attention_impl="sdpa_flash").iteration_seconds == fa2.iteration_seconds


def test_flash3_needs_hopper_and_math_is_the_unfused_path():
    with pytest.raises(JobError, match="model.attention_impl: flash3 .*Hopper"):
        _predict("perlmutter-a100", attention_impl="flash3")
    math_ = _predict("perlmutter-a100", attention_impl="math")
    unfused = _predict("perlmutter-a100", attention="unfused")
    assert math_.iteration_seconds == pytest.approx(unfused.iteration_seconds)
    assert math_.stages()[0]["peak_memory_bytes"] == unfused.stages()[0]["peak_memory_bytes"]
    with pytest.raises(JobError, match="layout.cp.*math"):
        TrainingJob.from_dict({"model": {**MODEL, "attention_impl": "math"}, "layout": {"cp": 2}})


def test_non_causal_bundle_samples_are_costed_causal():
    from predictor import load_platform
    from predictor.estimate import _attention_cost
    plat = load_platform("perlmutter-a100")
    job = TrainingJob.from_dict({"model": {**MODEL, "attention": "flash"}})
    cost = _attention_cost(job, plat, 8192.0)
    assert cost.operator == "flash_atten" and not cost.warnings
    assert cost.forward_ratio == pytest.approx(attention.causal_fraction(8192.0))
    # A framework whose kernel is the one timed (NeoX: FlashAttention-2) pays only the mask.
    neox = TrainingJob.from_dict({"model": {**MODEL, "attention": "flash"}, "run": {"framework": "neox"}})
    assert _attention_cost(neox, plat, 8192.0).backward_ratio == cost.backward_ratio


def test_backward_note_only_where_the_figure_lacks_one():
    cudnn = attention.Measured("cudnn", True)
    assert not attention.relative_seconds("sdpa_flash", cudnn, "bwd", 8192, True).note
    assert "forward ratio" in attention.relative_seconds("triton", cudnn, "bwd", 8192, True).note


def test_a_kernel_with_samples_of_its_own_is_read_from_them():
    own = attention.attention_cost("flash2", "", 8192.0, "h100-80gb-hbm3", {},
                                   lambda op: op == "flash_atten_flash2", {"fp16": 989.0, "fp8": 1979.0}, "H100")
    assert (own.operator, own.forward_ratio, own.backward_ratio, own.warnings) == ("flash_atten_flash2", 1.0, 1.0, ())
    # Not timed, and the bundle does not say what its flash_atten timed: costed as those, said.
    unknown = attention.attention_cost("triton", "", 8192.0, "site-gpu", {}, lambda op: False, {"fp16": 312.0}, "A100")
    assert unknown.operator == "flash_atten" and unknown.forward_ratio == 1.0
    assert "does not say which attention kernel" in unknown.warnings[0]
