#!/usr/bin/env python3
"""Where one real training step's device time goes, by kernel kind, and the FP8 cast kernels alone.

    python benchmarks/profile_train_step.py --device cuda [--only NAME] [--json OUT.json]

For each job of ``calibrate.train_family.fp8_pairs`` (or those whose name contains ``--only``) it
trains the GPT-shaped model (calibrate/gpt_model.py) for a few warm-up steps, then records two
steps with ``torch.profiler`` and sums the GPU kernels' time per step by kind (FP8 GEMMs, 16-bit
GEMMs, attention, casts and transposes, reductions, element-wise, optimizer, other), next to the
step's wall-clock.  ``--casts`` also times the FP8 cast and transpose kernels alone at the layers'
shapes (calibrate.kernels.fp8_cast_transpose) against a plain 16-bit copy of the same tensor.

A benchmark, not a test: it needs a GPU for the FP8 GEMMs and prints what it measured; the
profiling and timing are calibrate/step_profile.py's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from calibrate.step_profile import cast_transpose_matches_eager, profile_job, time_casts
from calibrate.train_family import fp8_pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda",), default="cuda")
    ap.add_argument("--only", default="")
    ap.add_argument("--casts", action="store_true", help="also time the cast kernels alone")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
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
        print("cast-transpose matches eager: {} {}".format(*cast_transpose_matches_eager()), flush=True)
        results["casts"] = time_casts()
        for c in results["casts"]:
            if "compile_error" in c:
                print(f"torch.compile cast-transpose failed: {c['compile_error']}"[:300])
            print(f"cast {c['shape']}: cast {c['cast_us']:.1f} us ({c['cast_GBps']:.0f} GB/s), FP8 transpose "
                  f"{c['fp8_transpose_us']:.1f} us, both {c['cast_transpose_us']:.1f} us, compiled fused "
                  f"{c['compiled_cast_transpose_us']:.1f} us; bf16 copy "
                  f"{c['copy_bf16_us']:.1f} us ({c['copy_GBps']:.0f} GB/s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
