#!/usr/bin/env python3
"""Attention kernels at long sequences: the model's H100/A100 time ratio against kernel figures.

    python benchmarks/bench_attention.py

For each kernel (model.attention_impl) and sequence length 2k-32k (b = 1, 32 heads of 128), the
forward and backward time of one causal attention call on dgx-h100 and perlmutter-a100 as the
predictor costs it (predictor/attention.py over the bundles' samples), and the H100/A100 forward
ratio the kernel micro-benchmarks give: the lent H100's own causal forward (2026-11-26,
benchmarks/data/h100-lent/stacks/attention.json; FlashAttention-3, not measured there, from the
FlashAttention-3 paper's Fig. 5) over FlashAttention-2's causal forward on an A100 (156 TFLOP/s at
b = 1, s = 4,096, 32 heads; github.com/liangan1/GPU_travel performance/flash-attn), held at its
measured length.  "lent" is the H100's measured forward TFLOP/s beside the model's.  "before" is
the model without kernels (every job costed as the bundle's flash_atten samples, the A100's
non-causal samples read as causal).

    python benchmarks/bench_attention.py --measure [--device cuda] [--seqs 2048,4096,...]

times every attention kernel this machine has (calibrate/attention.py's survey; the missing ones
listed with the reason) at those lengths, forward and backward, and prints TFLOP/s beside what
the dgx-h100 model predicts for each: the check to run on a lent GPU (CPU: SDPA's own kernel).
"""
from __future__ import annotations

import sys

from predictor import TrainingJob, load_platform
from predictor import attention
from predictor.estimate import QuerySet, _attention_cost
from predictor.job import ATTENTION_IMPLS
from predictor.operators import OPERATORS

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


def measure(device: str, seqs: list[int], heads: int = 32, d: int = 128) -> None:
    """Time each kernel the device has (b = 1) and print it beside the model's time."""
    from calibrate.attention import survey
    from calibrate.kernels import build_kernel
    kernels = survey(device)
    print(f"SDPA picks {kernels.default or '?'} here; not here: {'; '.join(kernels.missing_lines()) or 'none'}")
    h100 = load_platform("dgx-h100")
    precision = "bf16" if device == "cuda" else "fp32"
    print(f"{'kernel':<16}{'seq':>7}{'fwd ms':>9}{'bwd ms':>9}{'fwd TF/s':>10}{'bwd TF/s':>10}{'model fwd':>11}{'bwd':>8}")
    for impl in ["flash_atten"] + [f"flash_atten_{k}" for k in kernels.available if k != kernels.default]:
        for seq in seqs:
            t = build_kernel(impl, {"b": 1, "heads": heads, "l": seq, "d": d}, precision, device).time(warmup=2, repeats=5)
            tf = OPERATORS["flash_atten"].flops({"b": 1.0, "heads": float(heads), "l": float(seq), "d": float(d)}) / 1e12
            name = impl[len("flash_atten_"):] if impl != "flash_atten" else (kernels.default or "default")
            mf, mb, _, _ = call_seconds(h100, name if name in ATTENTION_IMPLS else "", seq)
            print(f"{name:<16}{seq:>7}{1e3 * t['fwd'].seconds:>9.3f}{1e3 * t['bwd'].seconds:>9.3f}"
                  f"{tf / t['fwd'].seconds:>10.1f}{2.5 * tf / t['bwd'].seconds:>10.1f}{1e3 * mf:>10.3f}ms{1e3 * mb:>7.3f}ms")


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="time the kernels this machine has")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seqs", default="2048,4096,8192,16384,32768")
    args = ap.parse_args()
    if args.measure:
        measure(args.device, [int(x) for x in args.seqs.split(",")])
        return 0
    h100, a100 = load_platform("dgx-h100"), load_platform("perlmutter-a100")
    flops = OPERATORS["flash_atten"].flops
    print(f"{'kernel':<8}{'seq':>7}{'H100 fwd':>10}{'bwd':>9}{'A100 fwd':>10}{'bwd':>9}"
          f"{'H100/A100':>11}{'figures':>9}{'before':>8}   (ms; TFLOP/s in brackets: model H100 / A100; lent H100)")
    for impl in IMPLS:
        for seq in SEQS:
            hf, hb, hf0, _ = call_seconds(h100, impl, seq)
            try:
                af, ab, af0, _ = call_seconds(a100, impl, seq)
            except Exception:      # FlashAttention-3 runs on Hopper only
                af = ab = af0 = float("nan")
            tf = flops({"b": 1.0, "heads": 32.0, "l": float(seq), "d": 128.0}) / 1e12
            lent = attention._H100_LENT_MS["fwd"].get(impl)
            fig_h = (tf / (attention._interp(seq, lent, attention._LENT_SEQ) / 1e3) if lent
                     else attention._interp(seq, attention._H100_TFLOPS["fwd"][impl]))
            fig_ratio = fig_h / A100_FLASH2_CAUSAL_FWD_TFLOPS
            print(f"{impl:<8}{seq:>7}{1e3 * hf:>10.3f}{1e3 * hb:>9.3f}{1e3 * af:>10.3f}{1e3 * ab:>9.3f}"
                  f"{af / hf:>10.2f}x{fig_ratio:>8.2f}x{af0 / hf0:>7.2f}x   [{tf / hf:.0f} / {tf / af:.0f}; {fig_h:.0f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
