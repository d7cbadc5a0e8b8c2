#!/usr/bin/env python3
"""Real training steps of a family of small GPT jobs, measured, and (optionally) predicted.

    python benchmarks/bench_train_family.py --device cuda --out runs.json            # measure
    python benchmarks/bench_train_family.py --runs runs.json --platform NAME [--json] # compare

Measuring trains each job of the family (calibrate/train_family.py: ``family(device)``) for a few steps with the GPT-shaped
model built from the calibrated kernels (calibrate/gpt_model.py: pp = tp = 1, one process per
data-parallel rank) and appends one entry per job to ``--out`` as it goes (a killed run keeps
what it measured).  The file is the input of ``perf-calibrate validate`` once converted
(``--toml``), and of the comparison mode, which prints predicted vs measured seconds per iteration.

A benchmark, not a test: measured times depend on the machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from calibrate.train_family import family, fp8_pairs, heldout

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def measure(device: str, out: Path, steps: int, warmup: int, only: str, jobs: str = "family") -> int:
    from calibrate.gpt_model import measure_training
    from predictor import TrainingJob

    done = json.loads(out.read_text()) if out.exists() else []
    seen = {d["name"] for d in done}
    env = {}
    if device == "cuda":
        import torch
        env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cuda": torch.version.cuda or ""}
    for name, job in {"heldout": heldout, "fp8": fp8_pairs, "family": family}[jobs](device):
        if name in seen or (only and only not in name):
            continue
        t0 = time.monotonic()
        try:
            m = measure_training(TrainingJob.from_dict(job), device=device, steps=steps, warmup=warmup)
        except Exception as exc:  # noqa: BLE001 - one job failing (OOM) must not lose the others
            print(f"{name}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
            continue
        done.append({"name": name, "job": job, "measured_iteration_seconds": m.iteration_seconds,
                     "steps": m.steps, "params": m.params, "device": device, **env})
        out.write_text(json.dumps(done, indent=1))
        print(f"{name}: {m.iteration_seconds * 1e3:.2f} ms/iteration "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


def compare(runs_file: Path, platform: str, as_json: bool) -> int:
    from predictor import TrainingJob, load_platform, predict

    plat = load_platform(platform)
    rows = []
    for d in json.loads(runs_file.read_text()):
        pred = predict(TrainingJob.from_dict(d["job"]), plat)
        meas = float(d["measured_iteration_seconds"])
        lo, hi = pred.interval_seconds
        rows.append({"name": d["name"], "measured_seconds": meas, "predicted_seconds": pred.iteration_seconds,
                     "error": pred.iteration_seconds / meas - 1.0, "covered": lo <= meas <= hi})
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'run':<34} {'measured ms':>12} {'predicted ms':>13} {'error':>8}  interval")
    for r in rows:
        print(f"{r['name']:<34} {r['measured_seconds'] * 1e3:>12.2f} {r['predicted_seconds'] * 1e3:>13.2f} "
              f"{100 * r['error']:>+7.1f}%  {'covers' if r['covered'] else 'MISSES'}")
    if rows:
        mape = sum(abs(r["error"]) for r in rows) / len(rows)
        cover = sum(r["covered"] for r in rows) / len(rows)
        print(f"MAPE {100 * mape:.1f} % over {len(rows)} runs; interval covers {100 * cover:.0f} %")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", type=Path, help="measure into this JSON file (appends, resumes)")
    ap.add_argument("--runs", type=Path, help="compare these measured runs with --platform")
    ap.add_argument("--platform", default="")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default="", help="measure only jobs whose name contains this")
    ap.add_argument("--set", choices=("family", "heldout", "fp8"), default="family",
                    help="which jobs to measure (heldout: kept out of modelling decisions; fp8: FP8 "
                         "linears and their 16-bit twins)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.out:
        return measure(args.device, args.out, args.steps, args.warmup, args.only, args.set)
    if args.runs and args.platform:
        return compare(args.runs, args.platform, args.json)
    ap.error("give --out (measure) or --runs and --platform (compare)")
    return 2


if __name__ == "__main__":
    sys.exit(main())
