#!/usr/bin/env python3
"""How much longer a GEMM runs when some SMs are kept back for communication (a GPU benchmark).

Transformer Engine's overlapped tensor parallelism keeps ``COMM_SMS`` SMs for a pipelined or bulk
collective (``set_sm_margin``: cuBLASLt's SM-count target is the GPU's SMs less the margin), and
predictor/tp_overlap.py costs the GEMM beside it ``S / (S - margin)`` times as long.  This times
the layers' GEMM shapes (16-bit ``F.linear`` with a bias, which PyTorch sends to cuBLASLt, and FP8
``torch._scaled_mm``) with PyTorch's SM carve-out (``torch._C._set_sm_carveout_experimental``,
the same cuBLASLt attribute) at 0 and at each margin, and prints the measured ratio beside that
rule.  A carve-out PyTorch ignores shows as a ratio of 1.00 at every margin, and says so.

    python benchmarks/bench_sm_margin.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARGINS = (8, 16, 32)
# (m, k, n): tokens x input width x output width of the linears of Llama-3 8B (tp 1, 2) and 70B
# (tp 4, 8) at 2,048-16,384 tokens a micro-batch: the shapes the TP overlap chunks.
SHAPES = [(m, k, n) for m in (2048, 8192, 16384)
          for k, n in ((4096, 6144), (4096, 4096), (4096, 7168), (7168, 4096),
                       (8192, 2560), (2048, 8192), (8192, 7168), (3584, 8192))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from calibrate.timing import measure
    from predictor.tp_overlap import margin_slowdown

    if not torch.cuda.is_available():
        print("bench_sm_margin: needs a GPU", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    one = torch.ones((), device="cuda")
    rows = []
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        b = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        runs = {"bf16": lambda: F.linear(x, w, b),
                "fp8": lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, bias=b,
                                                out_dtype=torch.bfloat16)}
        for prec, fn in runs.items():
            t = {}
            for margin in (0,) + MARGINS:
                torch._C._set_sm_carveout_experimental(margin or None)
                t[margin] = measure(fn, "cuda", warmup=3, repeats=20).seconds
            torch._C._set_sm_carveout_experimental(None)
            row = {"m": m, "k": k, "n": n, "precision": prec, "seconds": {str(g): s for g, s in t.items()},
                   "ratio": {str(g): t[g] / t[0] for g in MARGINS}}
            rows.append(row)
            print(f"{prec:5} m={m:6} k={k:5} n={n:5}  {t[0] * 1e6:9.1f} us  " + "  ".join(
                f"margin {g}: x{t[g] / t[0]:.3f}" for g in MARGINS), flush=True)
    print(f"\n{sms} SMs; the rule S/(S-margin): " + ", ".join(
        f"{g}: x{sms / (sms - g):.3f}" for g in MARGINS) + f" (predictor: x{margin_slowdown(sms):.3f} at 16)")
    for prec in ("bf16", "fp8"):
        for g in MARGINS:
            r = [row["ratio"][str(g)] for row in rows if row["precision"] == prec]
            print(f"{prec} margin {g}: median x{statistics.median(r):.3f}, range x{min(r):.3f}-x{max(r):.3f}"
                  f" over {len(r)} shapes")
    if all(abs(row["ratio"][str(g)] - 1.0) < 0.01 for row in rows for g in MARGINS):
        print("every ratio is within 1 % of 1: this PyTorch build's carve-out did not reach these GEMMs")
    if args.json:
        # Provenance in the file itself: which GPU, when, on which software.
        provenance = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "torch": torch.__version__, "cuda": torch.version.cuda}
        args.json.write_text(json.dumps({**provenance, "sms": sms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
