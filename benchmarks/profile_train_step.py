#!/usr/bin/env python3
"""Where one real training step's device time goes, by kernel kind, and the FP8 cast kernels alone.

    python benchmarks/profile_train_step.py --device cuda [--only NAME] [--json OUT.json]

For each job of ``bench_train_family.fp8_pairs`` (or those whose name contains ``--only``) it
trains the GPT-shaped model (calibrate/gpt_model.py) for a few warm-up steps, then records two
steps with ``torch.profiler`` and sums the GPU kernels' time per step by kind (FP8 GEMMs, 16-bit
GEMMs, attention, casts and transposes, reductions, element-wise, optimizer, other), next to the
step's wall-clock.  ``--casts`` also times the FP8 cast and transpose kernels alone at the layers'
shapes (calibrate.kernels.fp8_cast_transpose) against a plain 16-bit copy of the same tensor.

A benchmark, not a test: it needs a GPU for the FP8 GEMMs and prints what it measured.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

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
    low = name.lower()
    for kind, pat in KINDS:
        if re.search(pat, low):
            return kind
    return "other"


def profile_job(name: str, job_dict: dict, steps: int = 2, warmup: int = 3) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from calibrate.gpt_model import rank_state
    from predictor import TrainingJob

    job = TrainingJob.from_dict(job_dict)
    st = rank_state(job, "cuda", 1, 0)

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
    per_kind: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = getattr(ev, "cuda_time_total", 0.0)
        if not us or ev.key.startswith("ProfilerStep") or "aten::" in ev.key:
            continue
        per_kind[kind_of(ev.key)] += us / steps
        per_kernel[ev.key] += us / steps
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]
    return {"name": name, "wall_ms": 1e3 * min(walls), "device_ms": sum(per_kind.values()) / 1e3,
            "kinds_ms": {k: v / 1e3 for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms": [(k[:90], v / 1e3) for k, v in top]}


def time_casts() -> list[dict]:
    import torch

    from calibrate.kernels import fp8_cast_transpose
    from calibrate.timing import measure

    def fused(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return t.to(torch.float8_e4m3fn), t.t().contiguous().to(torch.float8_e4m3fn)
    compiled = torch.compile(fused)
    x = torch.randn(1000, 776, device="cuda", dtype=torch.bfloat16)
    y, yt = fp8_cast_transpose(x, torch.float8_e5m2)
    ref = x.to(torch.float8_e5m2)
    print(f"cast-transpose matches eager: {torch.equal(y.view(torch.uint8), ref.view(torch.uint8))} "
          f"{torch.equal(yt.view(torch.uint8), ref.t().contiguous().view(torch.uint8))}", flush=True)
    out = []
    for rows, cols in ((4096, 2048), (4096, 6144), (4096, 24576), (6144, 6144)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        x8 = x.to(torch.float8_e4m3fn)
        gib = rows * cols / 2**30
        cast = measure(lambda: x.to(torch.float8_e4m3fn), "cuda").seconds
        transpose = measure(lambda: x8.t().contiguous(), "cuda").seconds
        both = measure(lambda: fp8_cast_transpose(x, torch.float8_e4m3fn), "cuda").seconds
        copy16 = measure(lambda: x.clone(), "cuda").seconds
        try:
            comp = measure(lambda: compiled(x), "cuda").seconds * 1e6
        except Exception as exc:  # noqa: BLE001 - a compiler missing on the node is a finding, not a crash
            print(f"torch.compile cast-transpose failed: {type(exc).__name__}: {exc}"[:300])
            comp = float("nan")
        out.append({"shape": [rows, cols], "cast_us": cast * 1e6, "fp8_transpose_us": transpose * 1e6,
                    "cast_transpose_us": both * 1e6, "copy_bf16_us": copy16 * 1e6,
                    "compiled_cast_transpose_us": comp,
                    "cast_GBps": 3 * gib * 2**30 / cast / 1e9, "copy_GBps": 4 * gib * 2**30 / copy16 / 1e9})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda",), default="cuda")
    ap.add_argument("--only", default="")
    ap.add_argument("--casts", action="store_true", help="also time the cast kernels alone")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from bench_train_family import fp8_pairs

    results: dict = {"jobs": [], "casts": []}
    for name, job in fp8_pairs("cuda"):
        if args.only and args.only not in name:
            continue
        r = profile_job(name, job)
        results["jobs"].append(r)
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in r["kinds_ms"].items())
        print(f"{name}: wall {r['wall_ms']:.2f} ms, kernels {r['device_ms']:.2f} ms ({kinds})", flush=True)
        for k, v in r["top_kernels_ms"][:6]:
            print(f"    {v:8.3f} ms  {k}")
    if args.casts:
        results["casts"] = time_casts()
        for c in results["casts"]:
            print(f"cast {c['shape']}: cast {c['cast_us']:.1f} us ({c['cast_GBps']:.0f} GB/s), FP8 transpose "
                  f"{c['fp8_transpose_us']:.1f} us, both {c['cast_transpose_us']:.1f} us, compiled fused "
                  f"{c['compiled_cast_transpose_us']:.1f} us; bf16 copy "
                  f"{c['copy_bf16_us']:.1f} us ({c['copy_GBps']:.0f} GB/s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
