"""FP8 in calibration: the layers' linear GEMMs measured with torch._scaled_mm, their host calls,
the FP8 layer of the real-training model, and a platform fitted from FP8 samples that the predictor
then reads instead of its prior.  On a CPU: torch runs _scaled_mm there too, slowly."""
from __future__ import annotations

import subprocess
import sys

import pytest

# Every test here runs torch (FP8 kernels, the model, a calibration); the torch-free FP8 checks
# are in test_plans.py and test_cli.py.
torch = pytest.importorskip("torch", reason="FP8 calibration measures with torch (the calibrate extra)")

from calibrate import kernels as K  # noqa: E402
from calibrate.errors import CalibrationError  # noqa: E402
from calibrate.gpt_model import FlatGPT  # noqa: E402
from calibrate.host import measure_host_costs  # noqa: E402
from calibrate.runner import RunOptions, run_calibration  # noqa: E402
from calibrate.store import read_meta  # noqa: E402
from predictor import TrainingJob, fp8, load_platform, predict  # noqa: E402
from predictor.samples import load_samples  # noqa: E402

from .conftest import FAST_LIBRARIES  # noqa: E402

E4M3 = torch.float8_e4m3fn


def small_job(fp8_recipe: str = "delayed", hidden: int = 64, **layout) -> TrainingJob:
    lay = {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 2, "micro_batches": 3, "zero_stage": 1,
           "recompute": "none"}
    lay.update(layout)
    return TrainingJob.from_dict({
        "model": {"layers": 2, "hidden": hidden, "heads": 4, "seq_len": 32, "vocab": 256,
                  "attention": "flash", "pos_emb": "rotary"},
        "layout": lay, "run": {"precision": "bf16", "fp8": fp8_recipe}, "cluster": {"gpus_per_node": 1}})


def test_fp8_gemm_kernel_runs_the_linear_gemms_only():
    k = K.build_kernel("linear3", {"m": 32, "k": 64, "n": 128}, "fp8", "cpu")
    fwd, bwd = k.runs["fwd"](), k.runs["bwd"]()
    assert fwd.shape == (32, 128) and fwd.dtype == torch.bfloat16
    dgrad, wgrad = bwd
    assert dgrad.shape == (32, 64) and wgrad.shape == (128, 64)
    with pytest.raises(CalibrationError, match="linear GEMMs only"):
        K.build_kernel("gelu", {"tokens": 32, "width": 64}, "fp8", "cpu")
    with pytest.raises(CalibrationError, match="multiple of 16"):
        K.build_kernel("linear1", {"m": 24, "k": 64, "n": 128}, "fp8", "cpu")


def test_cast_transpose_is_the_cast_and_its_transpose():
    x = torch.randn(48, 80, dtype=torch.bfloat16)
    y, yt = K.fp8_cast_transpose(x, E4M3)
    assert y.dtype == yt.dtype == E4M3 and yt.shape == (80, 48) and yt.is_contiguous()
    assert torch.equal(y.view(torch.uint8), x.to(E4M3).view(torch.uint8))
    assert torch.equal(yt.view(torch.uint8), x.to(E4M3).t().contiguous().view(torch.uint8))


def test_fp8_linear_computes_what_the_16_bit_one_does():
    torch.manual_seed(0)
    x = (torch.randn(64, 128) * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(96, 128) * 0.05).bfloat16().requires_grad_()
    b = torch.zeros(96, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(64, 96).bfloat16()
    y8 = K.Fp8Linear.apply(x, w, b, *K.fp8_cast_transpose(w.detach(), E4M3))
    dx8, dw8, db8 = torch.autograd.grad(y8, (x, w, b), g)
    y = K.linear(x, w, b)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), g)

    def cos(a, c):
        return torch.nn.functional.cosine_similarity(a.float().flatten(), c.float().flatten(), dim=0)
    # E4M3 keeps 3 mantissa bits, E5M2 2: close in direction, not equal
    assert cos(y8, y) > 0.99 and cos(dx8, dx) > 0.97 and cos(dw8, dw) > 0.97
    assert torch.allclose(db8.float(), db.float())
    assert not torch.equal(y8, y)


def test_fp8_model_casts_each_weight_once_per_step(monkeypatch):
    job = small_job()
    model = FlatGPT(job, "cpu", 1)
    casts = []
    real = K.fp8_cast_transpose
    monkeypatch.setattr(K, "fp8_cast_transpose", lambda t, dt: casts.append(tuple(t.shape)) or real(t, dt))
    ids = torch.randint(0, 256, (64,))
    layers, linears, mbs = 2, 4, 3
    for step in range(2):
        model.begin_step()
        for _ in range(mbs):
            model.loss(ids, ids).backward()
        # inputs in forward and output gradients in backward every micro-batch, weights once a step
        assert len(casts) == (step + 1) * (layers * linears * (2 * mbs + 1))


def test_fp8_model_refuses_what_it_cannot_run_like_for_like():
    with pytest.raises(CalibrationError, match=r"multiple of 16.*hidden = 72"):
        FlatGPT(small_job(hidden=72), "cpu", 1)
    with pytest.raises(CalibrationError, match=r"run\.fp8 = 'current'"):
        FlatGPT(small_job("current"), "cpu", 1)
    with pytest.raises(CalibrationError, match="run.fp8 with recomputation"):
        FlatGPT(small_job(recompute="full"), "cpu", 1)


def test_host_costs_time_the_fp8_calls_apart():
    costs = measure_host_costs("cpu", "fp32", ops=["linear1", "gelu"], calls=2, rounds=1, warmup=1, fp8=True)
    assert set(costs.operators) == {"linear1", "gelu", "linear1.fp8"}
    assert set(costs.operators["linear1.fp8"]) == {"fwd", "bwd"}


@pytest.fixture(scope="module")
def fp8_platform(tmp_path_factory):
    store = tmp_path_factory.mktemp("fp8") / "samples"
    res = run_calibration(RunOptions(out=store, device="cpu", plan="tiny", precisions=("bf16", "fp8"),
                                     part="operators"))
    assert res.part_complete, res
    out = store.parent / "platform"
    fit = subprocess.run([sys.executable, "-m", "calibrate.cli", "fit", str(store), "--out", str(out),
                          "--name", "cpu-fp8", "--libraries", ",".join(FAST_LIBRARIES)],
                         capture_output=True, text=True, timeout=600)
    assert fit.returncode == 0, fit.stderr
    return store, out


def test_fp8_samples_fit_into_models_the_predictor_reads(fp8_platform):
    store, out = fp8_platform
    samples = load_samples(store)
    assert {op for op, prec in samples.operators if prec == "fp8"} == set(fp8.FP8_LINEARS)
    plat = load_platform(out)
    assert fp8.measured(plat.compute)
    p = predict(small_job(micro_batches=1), plat)
    assert p.iteration_seconds > 0
    assert not any("16-bit measurements" in w for w in p.warnings)


def test_run_measures_only_the_operators_asked_for(tmp_path):
    res = run_calibration(RunOptions(out=tmp_path / "s", device="cpu", plan="tiny", part="operators",
                                     ops=("linear1", "gelu")))
    assert res.part_complete
    assert {op for op, _ in load_samples(tmp_path / "s").operators} == {"linear1", "gelu"}
    with pytest.raises(CalibrationError, match=r"--ops: plan tiny measures no conv"):
        run_calibration(RunOptions(out=tmp_path / "t", device="cpu", plan="tiny", ops=("linear1", "conv")))


def test_device_timing_needs_a_gpu(tmp_path):
    with pytest.raises(CalibrationError, match="--timing device needs --device cuda"):
        run_calibration(RunOptions(out=tmp_path / "s", device="cpu", plan="tiny", timing="device"))
    assert not (tmp_path / "s").exists()


def test_ops_run_is_never_a_complete_store(tmp_path):
    # --ops leaves the plan's other operators out: the store must not claim the plan complete
    # (fit and install read that), and says which operators the plan contributed.
    res = run_calibration(RunOptions(out=tmp_path / "s", device="cpu", plan="tiny", ops=("gelu",)))
    assert res.part_complete and not res.complete
    meta = read_meta(tmp_path / "s")
    assert meta["plans"] == ["tiny (gelu only)"] and meta["progress"]["complete"] is False


def test_a_later_precision_adds_its_peak_to_the_store(tmp_path):
    # A probed spec holds only the precisions of its run: fp8 after fp32 must keep fp32's peak.
    run_calibration(RunOptions(out=tmp_path / "s", device="cpu", plan="tiny", ops=("linear1",),
                               precisions=("fp32",), part="operators"))
    run_calibration(RunOptions(out=tmp_path / "s", device="cpu", plan="tiny", ops=("linear1",),
                               precisions=("fp8",), part="operators"))
    assert set(read_meta(tmp_path / "s")["gpu"]["tflops"]) == {"fp32", "fp8"}
