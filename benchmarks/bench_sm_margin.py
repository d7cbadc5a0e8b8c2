#!/usr/bin/env python3
"""How much longer a GEMM runs when some SMs are kept back for communication (a GPU benchmark).

Transformer Engine's overlapped tensor parallelism keeps ``COMM_SMS`` SMs for a pipelined or bulk
collective (``set_sm_margin``: cuBLASLt's SM-count target is the GPU's SMs less the margin), and
predictor/tp_overlap.py costs the GEMM beside it ``S / (S - margin)`` times as long.  This times
the layers' GEMM shapes (16-bit ``F.linear`` with a bias, which PyTorch sends to cuBLASLt, and FP8
``torch._scaled_mm``) with PyTorch's SM carve-out (``torch._C._set_sm_carveout_experimental``,
the same cuBLASLt attribute) at 0 and at each margin, and prints the measured ratio beside that
rule.  A carve-out PyTorch ignores shows as a ratio of 1.00 at every margin, and says so.  The
measurement and its summaries are calibrate/sm_margin.py's.

    python benchmarks/bench_sm_margin.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from calibrate.sm_margin import MARGINS, PRECISIONS, carveout_ignored, measure_rows, ratio_summary


def _print_row(row: dict) -> None:
    t = {int(g): s for g, s in row["seconds"].items()}
    print(f"{row['precision']:5} m={row['m']:6} k={row['k']:5} n={row['n']:5}  {t[0] * 1e6:9.1f} us  "
          + "  ".join(f"margin {g}: x{t[g] / t[0]:.3f}" for g in MARGINS), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from predictor.tp_overlap import margin_slowdown

    if not torch.cuda.is_available():
        print("bench_sm_margin: needs a GPU", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = measure_rows(on_row=_print_row)
    print(f"\n{sms} SMs; the rule S/(S-margin): " + ", ".join(
        f"{g}: x{sms / (sms - g):.3f}" for g in MARGINS) + f" (predictor: x{margin_slowdown(sms):.3f} at 16)")
    for prec in PRECISIONS:
        for g in MARGINS:
            median, low, high, count = ratio_summary(rows, prec, g)
            print(f"{prec} margin {g}: median x{median:.3f}, range x{low:.3f}-x{high:.3f}"
                  f" over {count} shapes")
    if carveout_ignored(rows):
        print("every ratio is within 1 % of 1: this PyTorch build's carve-out did not reach these GEMMs")
    if args.json:
        # Provenance in the file itself: which GPU, when, on which software.
        provenance = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "torch": torch.__version__, "cuda": torch.version.cuda}
        args.json.write_text(json.dumps({**provenance, "sms": sms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
