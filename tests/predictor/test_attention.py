"""model.attention_impl: the key, its defaults per framework, and the kernel ratios."""
from __future__ import annotations

import json
from pathlib import Path

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


LENT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent" / "stacks" / "attention.json"
# The lent H100 timed flex_attention (a Triton kernel) for "triton", SDPA's flash backend for FlashAttention-2.
LENT_NAME = {"flash2": "sdpa_flash", "triton": "flex"}


def _lent_ms() -> dict:
    rows = json.loads(LENT.read_text())["rows"]
    return {(r["impl"], r["seq"], d): r[f"{d}_ms"] for r in rows if "error" not in r for d in ("fwd", "bwd")}


def test_lent_h100_table_is_the_committed_measurement():
    measured = _lent_ms()
    for direction, kernels in attention._H100_LENT_MS.items():
        for impl, values in kernels.items():
            for seq, ms in zip(attention._LENT_SEQ, values):
                assert ms == pytest.approx(measured[(LENT_NAME.get(impl, impl), seq, direction)], rel=5e-4)


def test_relative_seconds_follow_the_kernel_figures():
    cudnn = attention.Measured("cudnn", True)
    measured = _lent_ms()
    # From 8k on, one call fills the H100: the lent machine's own ratios, both directions.
    for seq in (8192, 16384, 32768):
        for impl in ("flash2", "triton", "sdpa_efficient"):
            for d in ("fwd", "bwd"):
                r = attention.relative_seconds(impl, cudnn, d, seq, hopper=True)
                lent = measured[(LENT_NAME.get(impl, impl), seq, d)] / measured[("cudnn", seq, d)]
                assert r.ratio == pytest.approx(lent, rel=1e-3) and r.figure and not r.note
    # Below 2k, the paper's full-batch figures (FlashAttention-2 ~1.6x cuDNN); FA3 near cuDNN.
    r2 = attention.relative_seconds("flash2", cudnn, "fwd", 1024, hopper=True)
    assert r2.ratio == pytest.approx(410 / 260)
    assert 0.8 < attention.relative_seconds("flash3", cudnn, "fwd", 8192, hopper=True).ratio < 1.1
    # The same kernel through another entry point: nothing to convert.
    same = attention.relative_seconds("sdpa_flash", attention.Measured("flash2", True), "bwd", 4096, True)
    assert same.ratio == 1.0 and same.figure
    # SDPA's memory-efficient kernel: 3-4x cuDNN's time at long sequences (it was 1.0, no figure).
    assert attention.relative_seconds("sdpa_efficient", cudnn, "bwd", 16384, True).ratio > 3.0
    # No figure relates them (off Hopper): costed as the measured kernel, and said.
    none = attention.relative_seconds("sdpa_efficient", attention.Measured("flash2", True), "fwd", 4096, False)
    assert none.ratio == 1.0 and not none.figure and "no kernel figure" in none.note


def test_non_causal_samples_are_made_causal():
    noncausal = attention.Measured("flash2", False)
    short = attention.relative_seconds("flash2", noncausal, "fwd", 512, False).ratio
    long = attention.relative_seconds("flash2", noncausal, "fwd", 16384, False).ratio
    # The causal kernel skips half the blocks but pays the diagonal: closer to 1/2 the longer.
    assert 0.5 < long < short < 1.0


def _predict(platform: str, framework: str = "", **model):
    from predictor import load_platform, predict
    job = TrainingJob.from_dict({"model": {"layers": 2, "hidden": 2048, "heads": 16, "seq_len": 8192,
                                           "attention": "flash", **model},
                                 "layout": {"micro_batch": 1, "micro_batches": 2, "zero_stage": 0},
                                 "run": {"precision": "bf16", "framework": framework}}, source="job.toml")
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


def test_triton_backward_is_measured_not_borrowed_from_its_forward():
    cudnn = attention.Measured("cudnn", True)
    fwd = attention.relative_seconds("triton", cudnn, "fwd", 16384, True)
    bwd = attention.relative_seconds("triton", cudnn, "bwd", 16384, True)
    assert not bwd.note and bwd.ratio != pytest.approx(fwd.ratio, rel=0.05)


def test_a_kernel_with_samples_of_its_own_is_read_from_them():
    own = attention.attention_cost("flash2", "", 8192.0, "h100-80gb-hbm3", {},
                                   lambda op: op == "flash_atten_flash2", {"fp16": 989.0, "fp8": 1979.0}, "H100")
    assert (own.operator, own.forward_ratio, own.backward_ratio, own.warnings) == ("flash_atten_flash2", 1.0, 1.0, ())
    # Not timed, and the bundle does not say what its flash_atten timed: costed as those, said.
    unknown = attention.attention_cost("triton", "", 8192.0, "site-gpu", {}, lambda op: False, {"fp16": 312.0}, "A100")
    assert unknown.operator == "flash_atten" and unknown.forward_ratio == 1.0
    assert "does not say which attention kernel" in unknown.warnings[0]


H100_TFLOPS = {"fp16": 989.0, "fp8": 1979.0}


def test_llm_foundrys_pre_mlir_triton_is_costed_as_flash2_on_hopper():
    def cost(impl, framework, tflops=H100_TFLOPS, has=lambda op: False, bundle="h100-80gb-hbm3"):
        return attention.attention_cost(impl, framework, 16384.0, bundle, {}, has, tflops, "GPU")
    legacy, fa2, flex = cost("triton", "llm-foundry"), cost("flash2", "llm-foundry"), cost("triton", "torchtitan")
    assert (legacy.forward_ratio, legacy.backward_ratio) == (fa2.forward_ratio, fa2.backward_ratio)
    assert "pre-MLIR Triton" in legacy.warnings[0] and legacy.impl == "triton"
    # Inductor's Triton (flex_attention, TorchTitan's) is Hopper-aware: the lent H100's figures.
    assert flex.backward_ratio < 0.9 * legacy.backward_ratio
    # A bundle that timed FlashAttention-2 itself answers for the legacy kernel too.
    own = cost("triton", "llm-foundry", has=lambda op: op == "flash_atten_flash2")
    assert (own.operator, own.forward_ratio) == ("flash_atten_flash2", 1.0)
    # Off Hopper nothing relates Triton to FlashAttention-2: as before, the framework does not matter.
    a100 = {"fp16": 312.0}
    assert cost("triton", "llm-foundry", a100, bundle="a100-sxm4-80gb") == \
        cost("triton", "", a100, bundle="a100-sxm4-80gb")
    # Through the predictor: the job costs what its FlashAttention-2 twin costs, and says why.
    mpt = _predict("dgx-h100", "llm-foundry", attention_impl="triton")
    assert mpt.iteration_seconds == _predict("dgx-h100", "llm-foundry", attention_impl="flash2").iteration_seconds
    assert any("triton_pre_mlir" in w for w in mpt.warnings)


def test_the_mpt_example_in_modelling_md_is_quoted_as_it_is(tmp_path, monkeypatch):
    from predictor import Predictor, load_platform
    from slurm_plugin.launch import parse_script
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "mpt.yaml").write_text((root / "tests/launch/data/llmfoundry/mpt-7b-h100.yaml").read_text())

    def job(seq: int):
        script = tmp_path / f"job{seq}.sh"
        script.write_text("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8\n"
                          "srun composer --world_size 16 -n 8 scripts/train/train.py mpt.yaml "
                          f"variables.max_seq_len={seq} device_train_microbatch_size={32768 // seq}\n")
        res = parse_script(str(script), deadline_s=10.0)
        assert res.error is None, res.error
        return res.job

    jobs = [job(s) for s in (2048, 8192, 32768)]
    assert [j.layout.micro_batch for j in jobs] == [16, 4, 1]

    def seconds(platform: str) -> list:
        return [p.iteration_seconds for p in Predictor(load_platform(platform)).predict_many(jobs)]

    a100, h100 = seconds("dgx-a100"), seconds("dgx-h100")
    monkeypatch.setattr(attention, "PRE_HOPPER_TRITON_FRAMEWORKS", frozenset())
    before = seconds("dgx-h100")
    text = " ".join((root / "docs" / "modelling.md").read_text(encoding="utf-8").split())
    ratios = lambda h: " / ".join(f"{a / x:.2f}" for a, x in zip(a100, h))
    moves = " / ".join(f"{100 * (x / b - 1):+.1f}" for x, b in zip(h100, before))
    assert f"goes from {ratios(before)} to {ratios(h100)} at 2k / 8k / 32k" in text
    assert f"(dgx-h100 {moves} %;" in text
