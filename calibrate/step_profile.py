"""Where one real training step's device time goes, by kernel kind, and the FP8 cast kernels alone.

:func:`profile_job` trains the GPT-shaped model (calibrate/gpt_model.py) for a few warm-up steps,
then records steps with ``torch.profiler`` and sums the GPU kernels' time per step by kind
(:func:`kind_of`: FP8 GEMMs, 16-bit GEMMs, attention, casts and transposes, reductions,
element-wise, optimizer, other); :func:`time_casts` times the FP8 cast and transpose kernels alone
(calibrate.kernels.fp8_cast_transpose) against a plain 16-bit copy.  GPU only; torch is imported by
the measurements, so the kernel kinds read without it.  ``benchmarks/profile_train_step.py`` runs it.
"""
from __future__ import annotations

import re
import time
from collections import defaultdict
from typing import Iterable

# Kernel-name patterns, first match wins (CUTLASS / cuBLAS / flash / PyTorch's own kernels).
# cuBLAS's Hopper kernels are named nvjet_sm90_<operand types>...: "qq"/"qr" are E4M3/E5M2 inputs
# (FP8), none a 16-bit GEMM.  A cast's element-wise kernel names its Float8 type.
KINDS = [
    ("fp8 gemm", r"nvjet_sm90_[qr][qr]|f8f6f4|scaled_mm"),
    ("cast/transpose", r"float8|cast_transpose|_to_copy|copy_|transpose"),
    ("gemm", r"gemm|cutlass|cublas|sm90_xmma|ampere_.*(s16816|h16816)|nvjet"),
    ("attention", r"flash|fmha|attention|softmax"),
    ("reduction", r"reduce|sum|amax|norm"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("element-wise", r"elementwise|vectorized|unrolled|pointwise|triton"),
]


def kind_of(name: str) -> str:
    """The kind (:data:`KINDS`, else ``"other"``) of a GPU kernel named ``name``."""
    low = name.lower()
    for kind, pat in KINDS:
        if re.search(pat, low):
            return kind
    return "other"


def profile_job(name: str, job: dict, steps: int = 2, warmup: int = 3) -> dict:
    """``steps`` profiled steps of ``job_dict`` on the GPU after ``warmup``: the fastest wall-clock,
    the kernels' device milliseconds per step in all and per kind, and the 12 longest kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from predictor import TrainingJob

    from .gpt_model import rank_state

    st = rank_state(TrainingJob.from_dict(job), "cuda", 1, 0)

    def step() -> None:
        st.model.flat_grad.zero_()
        st.model.begin_step()
        for ids, tgt in st.batches:
            st.model.loss(ids, tgt).backward()
        st.optimizer.step()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
    kernels = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = getattr(ev, "cuda_time_total", 0.0)
        kernels.append((ev.key, us))
    return {"name": name, "wall_ms": 1e3 * min(walls), **kernel_summary(kernels, steps)}


def kernel_summary(kernels: Iterable[tuple[str, float]], steps: int) -> dict:
    """Device milliseconds per step, in all (``device_ms``), per kind (``kinds_ms``, longest first) and
    for the 12 longest kernels (``top_kernels_ms``), from (name, total microseconds over ``steps``)
    pairs; profiler step markers and ATen operators (not kernels) are left out."""
    if steps < 1:
        raise ValueError(f"steps {steps}: at least 1")
    per_kind: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, float] = defaultdict(float)
    for key, us in kernels:
        if not us or key.startswith("ProfilerStep") or "aten::" in key:
            continue
        per_kind[kind_of(key)] += us / steps
        per_kernel[key] += us / steps
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]
    return {"device_ms": sum(per_kind.values()) / 1e3,
            "kinds_ms": {k: v / 1e3 for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms": [(k[:90], v / 1e3) for k, v in top]}


def cast_transpose_matches_eager() -> tuple[bool, bool]:
    """Whether calibrate.kernels.fp8_cast_transpose's (cast, transposed cast) equal eager PyTorch's,
    bit for bit, on an odd shape (E5M2)."""
    import torch

    from .kernels import fp8_cast_transpose

    x = torch.randn(1000, 776, device="cuda", dtype=torch.bfloat16)
    y, yt = fp8_cast_transpose(x, torch.float8_e5m2)
    ref = x.to(torch.float8_e5m2)
    return (torch.equal(y.view(torch.uint8), ref.view(torch.uint8)),
            torch.equal(yt.view(torch.uint8), ref.t().contiguous().view(torch.uint8)))


def time_casts() -> list[dict]:
    """The FP8 cast, FP8 transpose, both fused, a compiled fused pair and a 16-bit copy, timed alone
    at the layers' shapes (microseconds; ``compile_error`` where torch.compile failed)."""
    import torch

    from .kernels import fp8_cast_transpose
    from .timing import measure

    def fused(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return t.to(torch.float8_e4m3fn), t.t().contiguous().to(torch.float8_e4m3fn)
    compiled = torch.compile(fused)
    out = []
    for rows, cols in ((4096, 2048), (4096, 6144), (4096, 24576), (6144, 6144)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        x8 = x.to(torch.float8_e4m3fn)
        gib = rows * cols / 2**30
        cast = measure(lambda: x.to(torch.float8_e4m3fn), "cuda").seconds
        transpose = measure(lambda: x8.t().contiguous(), "cuda").seconds
        both = measure(lambda: fp8_cast_transpose(x, torch.float8_e4m3fn), "cuda").seconds
        copy16 = measure(lambda: x.clone(), "cuda").seconds
        error = {}
        try:
            comp = measure(lambda: compiled(x), "cuda").seconds * 1e6
        except Exception as exc:  # noqa: BLE001 - a compiler missing on the node is a finding, not a crash
            error = {"compile_error": f"{type(exc).__name__}: {exc}"}
            comp = float("nan")
        out.append({**error, "shape": [rows, cols], "cast_us": cast * 1e6, "fp8_transpose_us": transpose * 1e6,
                    "cast_transpose_us": both * 1e6, "copy_bf16_us": copy16 * 1e6,
                    "compiled_cast_transpose_us": comp,
                    "cast_GBps": 3 * gib * 2**30 / cast / 1e9, "copy_GBps": 4 * gib * 2**30 / copy16 / 1e9})
    return out
