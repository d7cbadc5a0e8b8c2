#!/usr/bin/env python3
"""Call-timed against device-timed operator samples of the same shapes, and what each predicts.

    python benchmarks/bench_timing_modes.py [--call DIR] [--device DIR]

``perf-calibrate run`` times an operator as one isolated call between CUDA events (``--timing
call``, the shipped H100 samples, benchmarks/data/h100-lent) or queued behind a device-side sleep,
the device's time alone (``--timing device``; the H100's linears re-timed so, in
benchmarks/data/h100-lent/device-timed).  This prints, per operator, precision and direction,
the ratio call / device by the device time's size: what the host's issue time and an idle GPU
between calls add to a sample.  No GPU needed: it reads the two stores.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from predictor.samples import load_samples

ROOT = Path(__file__).resolve().parents[1]

BUCKETS_US = ((0, 50), (50, 200), (200, 1000), (1000, 5000), (5000, float("inf")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = ROOT / "benchmarks" / "data" / "h100-lent"
    ap.add_argument("--call", type=Path, default=data)
    ap.add_argument("--device", type=Path, default=data / "device-timed")
    args = ap.parse_args()
    call, dev = load_samples(args.call), load_samples(args.device)
    print(f"{'operator':<20} {'dir':<4} " + " ".join(f"{f'{lo:g}-{hi:g} µs':>16}" for lo, hi in BUCKETS_US))
    for (op, prec), table in sorted(dev.operators.items()):
        other = call.operators.get((op, prec))
        if other is None:
            continue
        n_feat = len(table.columns) - 2
        by_shape = {tuple(r[:n_feat]): r for r in other.rows.tolist()}
        for i, direction in enumerate(("fwd", "bwd")):
            col = n_feat + i
            cells = []
            for lo, hi in BUCKETS_US:
                ratios = [by_shape[tuple(r[:n_feat])][col] / r[col] for r in table.rows.tolist()
                          if tuple(r[:n_feat]) in by_shape and lo <= r[col] < hi]
                cells.append(f"x{statistics.median(ratios):.2f} (n={len(ratios):3})" if ratios else "-")
            print(f"{op + '_' + prec:<20} {direction:<4} " + " ".join(f"{c:>16}" for c in cells))
    print("\ncall / device, median per bucket of the device time: above 1 is what a call-timed sample adds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
