"""The memory model against published configurations, and its cost per layout.

    python benchmarks/bench_memory.py

Hand-derived figures come straight from the papers' formulas (see predictor/memory.py):
ZeRO (Rajbhandari et al. 2020) model states for a 7.5 B model on 64 GPUs, Korthikanti et al.
(2022) first-stage activations of GPT-3 175B, 530B and 1T at their Table 3 layouts, and the
GPT-NeoX-20B parameter count (Black et al. 2022).  Then the per-GPU breakdown of the GPT-20B
layouts of Zhang et al. (2025) on an 80 GiB A100, and the time one estimate takes.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from predictor import memory as mem  # noqa: E402
from predictor.job import Layout, ModelSpec  # noqa: E402

GB = 1e9


def row(config: str, what: str, paper: float, model: float, unit: str = "GB") -> None:
    err = (model - paper) / paper * 100 if paper else 0.0
    print(f"  {config:28} {what:48} {paper:12.3f} {model:12.3f} {unit:3} {err:+7.3f}%")


def main() -> None:
    print("published configurations: paper formula (hand-derived) vs. predictor.memory")
    print(f"  {'configuration':28} {'quantity':48} {'paper':>12} {'model':>12}     {'diff':>7}")
    for stage, paper in ((0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)):
        row("ZeRO 7.5B, Nd=64", f"model states, ZeRO-{stage}", paper,
            mem.model_states_bytes(7.5e9, 64, stage) / GB)

    neox = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048, vocab=50432,
                     tied_embeddings=False, parallel_residual=True)
    row("GPT-NeoX-20B", "parameters (billions)", 20.55456768,
        mem.stage_parameters(neox, Layout(), 0) / 1e9, "B")

    configs = [
        ("GPT-3 175B t8 p8 b1", ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200), 8),
        ("MT-NLG 530B t8 p35 b1", ModelSpec(layers=105, hidden=20480, heads=128, seq_len=2048, vocab=51200), 35),
        ("1T t8 p64 b1", ModelSpec(layers=128, hidden=25600, heads=160, seq_len=2048, vocab=51200), 64),
    ]
    for name, m, p in configs:
        sbh = m.seq_len * m.hidden
        a, s, h, t, L = m.heads, m.seq_len, m.hidden, 8, m.layers
        cases = [
            ("TP, no recompute", "none", False, sbh * L * (10 + 24 / t + 5 * a * s / (h * t)) + sbh * p),
            ("TP+SP, no recompute", "none", True, sbh * L / t * (34 + 5 * a * s / h) + sbh * p / t),
            ("TP+SP, selective", "selective", True, sbh * L * 34 / t + sbh * p / t),
            ("TP, full (+1 rebuilt layer)", "full", False,
             2 * sbh * L + sbh * (10 + 24 / t + 5 * a * s / (h * t)) + sbh * p),
        ]
        for label, rc, sp, paper in cases:
            lay = Layout(pp=p, tp=t, dp=1, micro_batch=1, micro_batches=p, recompute=rc,
                         sequence_parallel=sp, zero_stage=0)
            row(name, f"stage-0 activations, {label}", paper / GB,
                mem.stage_activation_bytes(m, lay, "fp16", 0) / GB)

    print("\nGPT-20B (Zhang et al. 2025) on 128 A100-80GB, fp16, ZeRO-1, micro-batch 4: GiB per GPU")
    m20 = ModelSpec(layers=44, hidden=6144, heads=64, seq_len=2048, parallel_residual=True)
    print(f"  {'PP-MP-DP':9} {'recompute':10} {'weights':>8} {'grads':>8} {'optim':>8} {'activ':>8} "
          f"{'reserve':>8} {'total':>8}  fits")
    for pp, tp, dp in ((4, 4, 8), (4, 8, 4), (8, 4, 4), (2, 4, 16), (1, 4, 32)):
        for rc in ("full", "selective", "none"):
            lay = Layout(pp=pp, tp=tp, dp=dp, micro_batch=4, micro_batches=512 // (4 * dp),
                         recompute=rc, zero_stage=1)
            e = mem.estimate(m20, lay, "fp16")
            g = mem.GIB
            print(f"  {pp}-{tp}-{dp:<5} {rc:10} {e.weights / g:8.2f} {e.gradients / g:8.2f} "
                  f"{e.optimizer / g:8.2f} {e.activations / g:8.2f} {e.reserve / g:8.2f} "
                  f"{e.total_gib:8.2f}  {'yes' if e.fits(80) else 'no'}")

    # Interleaved: 44 layers over pp 4 x 11 virtual stages (the chunks must divide the layers).
    lay = Layout(pp=4, tp=4, dp=8, micro_batch=2, micro_batches=16, recompute="selective",
                 virtual_stages=11, zero_stage=1)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        mem.estimate(m20, lay, "fp16")
    dt = (time.perf_counter() - t0) / n
    print(f"\none estimate: {dt * 1e6:.1f} µs; 2,600 layouts (a 1024-GPU search) "
          f"≈ {2600 * dt * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
