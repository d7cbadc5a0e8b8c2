from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="calibrate.kernels are torch implementations (the calibrate extra)")
import torch.nn.functional as F  # noqa: E402

from calibrate import kernels as K  # noqa: E402
from calibrate.errors import CalibrationError  # noqa: E402
from calibrate.timing import measure, middle_half_mean  # noqa: E402
from predictor.operators import CALIBRATED, OPERATORS  # noqa: E402

SMALL = {"m": 16, "k": 32, "n": 24, "batch": 4, "l": 16, "d": 8, "b": 2, "heads": 2, "tokens": 16,
         "width": 32, "dim": 32, "vocab": 64, "params": 1000}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("op", sorted(CALIBRATED))
def test_every_operator_runs_forward_and_backward(op, precision):
    k = K.build_kernel(op, {f: SMALL[f] for f in OPERATORS[op].features}, precision, "cpu")
    t = k.time(warmup=1, repeats=2)
    assert tuple(t) == OPERATORS[op].directions
    assert all(v.seconds > 0 and math.isfinite(v.seconds) for v in t.values())


def test_bad_kernel_requests_refused():
    with pytest.raises(CalibrationError, match="unknown operator"):
        K.build_kernel("conv", {}, "fp32", "cpu")
    with pytest.raises(CalibrationError, match="lacks"):
        K.build_kernel("linear1", {"m": 1}, "fp32", "cpu")
    with pytest.raises(CalibrationError, match="at least 1"):
        K.build_kernel("gelu", {"tokens": 0, "width": 4}, "fp32", "cpu")


def test_vocab_parallel_cross_entropy_matches_torch():
    logits = torch.randn(10, 33, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 33, (10,))
    ours = K.vocab_parallel_cross_entropy(logits, target).double()
    ref = F.cross_entropy(logits, target, reduction="none")
    assert torch.allclose(ours, ref.float().double(), atol=1e-5)
    g1, = torch.autograd.grad(ours.sum(), logits)
    g2, = torch.autograd.grad(ref.sum(), logits)
    assert torch.allclose(g1, g2, atol=1e-5)


def test_scaled_masked_softmax_is_causal():
    x = torch.randn(3, 5, 5)
    mask = K.causal_mask(5, torch.device("cpu"))
    p = K.scaled_masked_softmax(x, 0.5, mask)
    assert torch.allclose(p.sum(-1), torch.ones(3, 5))
    assert (p[:, 0, 1:] == 0).all()
    ref = torch.softmax((0.5 * x).masked_fill(mask, float("-inf")), -1)
    assert torch.allclose(p, ref)


def test_master_adam_updates_the_half_copy():
    p = torch.zeros(8, dtype=torch.bfloat16)
    g = torch.ones(8, dtype=torch.bfloat16)
    opt = K.MasterAdam(p, g, lr=0.1)
    opt.step()
    assert opt.master.dtype == torch.float32
    assert torch.all(p < 0)


def test_middle_half_mean_drops_outliers():
    assert middle_half_mean([1.0, 1.0, 1.0, 100.0, 0.0, 1.0, 1.0, 1.0]) == 1.0
    assert middle_half_mean([2.0]) == 2.0
    with pytest.raises(ValueError):
        middle_half_mean([])


def test_measure_runs_warmup_and_repeats():
    calls = []
    t = measure(lambda: calls.append(1), "cpu", warmup=2, repeats=5)
    assert len(calls) == 7 and len(t.samples) == 5 and t.us >= 0


def test_cpu_statistic_resists_contention_gpu_keeps_the_middle_half():
    # Contention only adds time: on a CPU the fastest quarter stands for the kernel; on a GPU
    # (exclusive) the middle half drops cold and preempted repetitions alike.
    from calibrate.timing import robust_seconds
    reps = [1.0, 1.1, 2.9, 3.0, 1.05, 2.8, 3.1, 1.0]
    assert robust_seconds(reps, "cpu") == pytest.approx(1.0)
    assert robust_seconds(reps, "cuda") == middle_half_mean(reps)
    assert robust_seconds([5.0], "cpu") == 5.0
    with pytest.raises(ValueError):
        robust_seconds([], "cpu")


def test_attention_kernels_surveyed_and_timed_on_cpu():
    from calibrate import attention
    from calibrate.plans import OperatorPoint, Plan, add_attention_kernels
    s = attention.survey("cpu")
    # CPU has SDPA's flash backend (its own kernel), and it is what SDPA picks; the rest are
    # listed with a reason, never silently dropped.
    assert s.default == "sdpa_flash" and "sdpa_flash" in s.available
    assert set(s.available) | set(s.missing) == set(attention.KERNELS)
    assert all(why for why in s.missing.values())
    assert "cudnn" in s.missing and "does not run on cpu" in s.missing["cudnn"]
    k = K.build_kernel("flash_atten_sdpa_flash", {"b": 1, "heads": 2, "l": 32, "d": 8}, "fp32", "cpu")
    t = k.time(warmup=1, repeats=2)
    assert set(t) == {"fwd", "bwd"} and all(v.seconds > 0 for v in t.values())
    # The pinned kernel computes the same causal attention as the default one.
    q, kk, v = (torch.randn(1, 2, 32, 8) for _ in range(3))
    assert torch.allclose(s.available["sdpa_flash"](q, kk, v), K.flash_attention(q, kk, v), atol=1e-5)
    plan = Plan("p", "", ("fp32",), [OperatorPoint("flash_atten", "fp32", (1, 2, 32, 8)),
                                     OperatorPoint("gelu", "fp32", (16, 32))], [], 1, 2)
    assert add_attention_kernels(plan, ["cudnn", "flash2"]) == 2
    assert sorted(p.op for p in plan.operators) == ["flash_atten", "flash_atten_cudnn", "flash_atten_flash2", "gelu"]
    with pytest.raises(CalibrationError, match="no attention kernel 'flash9'"):
        add_attention_kernels(plan, ["flash9"])
