"""Attention kernels timed alone at long sequences: forward and backward milliseconds, causal.

``benchmarks/bench_gpu_stacks.py``'s attention part times each kernel calibrate/attention.py's survey
finds (and ``flex``: ``torch.nn.attention.flex_attention`` compiled into a Triton kernel with a causal
block mask) with :func:`time_attention` at (1, :data:`HEADS`, s, :data:`HEAD_DIM`), bf16, s =
:data:`SEQS`; predictor/attention.py's ``_H100_LENT_MS`` is the lent H100's result
(benchmarks/data/h100-lent/stacks/attention.json).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

SEQS = (2048, 4096, 8192, 16384, 32768)
MATH_MAX_SEQ = 8192      # the math kernel's score matrix grows as s^2
HEADS, HEAD_DIM = 32, 128


def events_ms(device: str, fn: Callable[[], None]) -> float:
    """Milliseconds ``fn`` takes: between CUDA events on a GPU, wall-clock elsewhere."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def time_attention(fn: Callable[..., torch.Tensor], seq: int, device: str, dtype: torch.dtype, repeats: int,
                   warmup: int = 2) -> tuple[float, float]:
    """Median forward and backward milliseconds of causal ``fn`` at (1, HEADS, seq, HEAD_DIM), fresh
    random inputs per call (4 heads of 32 off a GPU: a smoke run)."""
    heads, d = (HEADS, HEAD_DIM) if device == "cuda" else (4, 32)
    q, k, v = (torch.randn(1, heads, seq, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, seq, d, device=device, dtype=dtype)
    fwd, bwd = [], []
    for r in range(warmup + repeats):
        box = {}

        def f() -> None:
            box["o"] = fn(q, k, v)

        tf = events_ms(device, f)
        tb = events_ms(device, lambda: box["o"].backward(grad))
        q.grad = k.grad = v.grad = None
        if r >= warmup:
            fwd.append(tf)
            bwd.append(tb)
    return statistics.median(fwd), statistics.median(bwd)


def flex_kernel(device: str) -> Callable[..., torch.Tensor]:
    """``flex_attention`` compiled by Inductor, with a causal block mask per sequence length."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention, dynamic=False)
    masks: dict[int, object] = {}

    def causal(b, h, q_idx, kv_idx):  # noqa: ANN001 - flex's mask_mod signature
        return q_idx >= kv_idx

    def run(q, k, v):
        s = q.shape[2]
        if s not in masks:
            masks[s] = create_block_mask(causal, None, None, s, s, device=device)
        return compiled(q, k, v, block_mask=masks[s])
    return run
