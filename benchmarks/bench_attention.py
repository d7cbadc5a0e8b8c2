#!/usr/bin/env python3
"""Attention kernels at long sequences: the model's H100/A100 time ratio against kernel figures.

    python benchmarks/bench_attention.py

For each kernel (model.attention_impl) and sequence length 2k-32k (b = 1, 32 heads of 128), the
forward and backward time of one causal attention call on dgx-h100 and perlmutter-a100 as the
predictor costs it (predictor/attention.py over the bundles' samples), and the H100/A100 forward
ratio the published kernel figures give: the FlashAttention-3 paper's H100 throughputs (Fig. 5,
causal, head dim 128) over FlashAttention-2's causal forward on an A100 (156 TFLOP/s at b = 1,
s = 4,096, 32 heads; github.com/liangan1/GPU_travel performance/flash-attn), each held at its
largest measured length.  "before" is the model without kernels (every job costed as the bundle's
flash_atten samples, the A100's non-causal samples read as causal).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from predictor import TrainingJob, load_platform  # noqa: E402
from predictor import attention  # noqa: E402
from predictor.estimate import QuerySet, _attention_cost  # noqa: E402
from predictor.operators import OPERATORS  # noqa: E402

A100_FLASH2_CAUSAL_FWD_TFLOPS = 156.0
SEQS = (2048, 4096, 8192, 16384, 32768)
IMPLS = ("flash2", "triton", "cudnn", "flash3")


def call_seconds(plat, impl: str, seq: int) -> tuple[float, float, float, float]:
    """(fwd, bwd) seconds with the kernel, and (fwd, bwd) as the bundle's samples alone give."""
    job = TrainingJob.from_dict({"model": {"layers": 1, "hidden": 4096, "heads": 32, "seq_len": seq,
                                           "attention": "flash", "attention_impl": impl}})
    shape = {"b": 1, "heads": 32, "l": seq, "d": 128}
    q = QuerySet(plat)
    hf, hb = q.op("flash_atten", "fwd", "bf16", shape), q.op("flash_atten", "bwd", "bf16", shape)
    secs, _, _ = q.evaluate()
    cost = _attention_cost(job, plat, float(seq))
    return (secs[hf] * cost.forward_ratio, secs[hb] * cost.backward_ratio, secs[hf], secs[hb])


def main() -> int:
    h100, a100 = load_platform("dgx-h100"), load_platform("perlmutter-a100")
    flops = OPERATORS["flash_atten"].flops
    print(f"{'kernel':<8}{'seq':>7}{'H100 fwd':>10}{'bwd':>9}{'A100 fwd':>10}{'bwd':>9}"
          f"{'H100/A100':>11}{'figures':>9}{'before':>8}   (ms; TFLOP/s in brackets)")
    for impl in IMPLS:
        for seq in SEQS:
            hf, hb, hf0, _ = call_seconds(h100, impl, seq)
            try:
                af, ab, af0, _ = call_seconds(a100, impl, seq)
            except Exception:      # FlashAttention-3 runs on Hopper only
                af = ab = af0 = float("nan")
            tf = flops({"b": 1.0, "heads": 32.0, "l": float(seq), "d": 128.0}) / 1e12
            fig_h = attention._interp(seq, attention._H100_TFLOPS["fwd"][impl])
            fig_ratio = fig_h / A100_FLASH2_CAUSAL_FWD_TFLOPS if impl != "flash3" else float("nan")
            print(f"{impl:<8}{seq:>7}{1e3 * hf:>10.3f}{1e3 * hb:>9.3f}{1e3 * af:>10.3f}{1e3 * ab:>9.3f}"
                  f"{af / hf:>10.2f}x{fig_ratio:>8.2f}x{af0 / hf0:>7.2f}x   [{tf / hf:.0f} / {tf / af:.0f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
