#!/usr/bin/env python3
"""End-to-end calibration benchmark on this machine's CPU: measure → fit → predict → train for real.

    python benchmarks/bench_calibrate_e2e.py [--plan smoke] [--work DIR] [--json]

1. ``perf-calibrate run --device cpu --plan smoke`` (operators on one rank's share of the cores,
   2-rank gloo collectives), resumable in ``--work``/samples (re-running reuses it);
2. ``perf-calibrate fit`` into ``--work``/platform (validation report + PNG there);
3. predict a small GPT training job (pp = 1, tp = 1, dp = 2, ZeRO-1, fp32) on that platform;
4. train that job for real with the GPT-shaped model built from the same kernels (2 gloo ranks),
   and print predicted vs measured seconds per iteration and the relative error.

A benchmark, not a test: the error depends on the machine and on what else runs on it.
For a family of such runs (dp 1 and 2, micro-batch 1–8, hidden 128–1024, recompute none and
full) measured against their predictions, see benchmarks/bench_cpu_family.py.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import os
import time
from pathlib import Path

# Before xgboost/lightgbm load: their two OpenMP runtimes must not spin against each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from calibrate.fitting import fit_platform  # noqa: E402
from calibrate.gpt_model import measure_training  # noqa: E402
from calibrate.runner import RunOptions, run_calibration  # noqa: E402
from predictor import TrainingJob, load_platform, predict  # noqa: E402

JOB = {
    "model": {"layers": 4, "hidden": 256, "heads": 4, "seq_len": 128, "vocab": 2048,
              "attention": "fused_softmax", "pos_emb": "rotary", "norm": "layernorm", "activation": "gelu"},
    "layout": {"pp": 1, "tp": 1, "dp": 2, "micro_batch": 2, "micro_batches": 2, "zero_stage": 1,
               "recompute": "none"},
    "run": {"precision": "fp32", "train_iters": 100},
    "cluster": {"gpus_per_node": 2},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="smoke")
    ap.add_argument("--work", default=None, help="keep samples and platform here (default: a temp dir)")
    ap.add_argument("--steps", type=int, default=20, help="timed training iterations")
    ap.add_argument("--libraries", default="", help="regressor libraries for the fit (default all)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    tmp = None
    if args.work:
        work = Path(args.work)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="perfcast-e2e-")
        work = Path(tmp.name)
    samples, platform_dir = work / "samples", work / "platform"

    # Other work on the machine skews both phases (and not equally): report the load next to them.
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    run = run_calibration(RunOptions(out=samples, device="cpu", plan=args.plan, progress=args.verbose))
    t_run = time.monotonic() - t0
    if not run.complete:
        print("calibration incomplete", file=sys.stderr)
        return 1
    t0 = time.monotonic()
    libs = tuple(x for x in args.libraries.split(",") if x) or None
    fit = fit_platform(samples, platform_dir, name=f"cpu-{args.plan}", overwrite=True, candidates=libs)
    t_fit = time.monotonic() - t0

    job = TrainingJob.from_dict(JOB)
    pred = predict(job, load_platform(platform_dir, reload=True))
    load_calibration = os.getloadavg()[0]
    t0 = time.monotonic()
    meas = measure_training(job, steps=args.steps, warmup=3, threads=0)
    t_train = time.monotonic() - t0
    load_training = os.getloadavg()[0]
    err = (pred.iteration_seconds - meas.iteration_seconds) / meas.iteration_seconds
    lo, hi = pred.interval_seconds
    result = {
        "plan": args.plan,
        "job": JOB,
        "predicted_iteration_s": pred.iteration_seconds,
        "predicted_interval_s": [lo, hi],
        "measured_iteration_s": meas.iteration_seconds,
        "measured_steps_s": meas.steps,
        "relative_error": err,
        "inside_interval": lo <= meas.iteration_seconds <= hi,
        "breakdown_s": pred.breakdown.to_dict(),
        "warnings": pred.warnings,
        "calibration": {"seconds": t_run, "measured_operators": run.measured_operators,
                        "measured_collectives": run.measured_collectives,
                        "already_done": run.already_done,
                        "estimated_seconds": run.cost.wall_minutes * 60},
        "fit": {"seconds": t_fit, "compute_mape": fit.compute_mape, "collective_mape": fit.collective_mape},
        "train_seconds": t_train,
        "params": meas.params,
        "threads_per_rank": meas.threads,
        "platform_dir": str(platform_dir) if args.work else None,
        "load_average": {"before": load_before, "after_calibration": load_calibration,
                         "after_training": load_training, "cpus": os.cpu_count()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"calibration ({args.plan}): {t_run:.0f} s (estimated {run.cost.wall_minutes * 60:.0f} s), "
              f"{run.measured_operators} operator + {run.measured_collectives} collective points "
              f"measured, {run.already_done} reused")
        print(f"fit: {t_fit:.0f} s; hold-out MAPE compute {100 * fit.compute_mape:.1f} %, collectives "
              f"{100 * (fit.collective_mape or 0):.1f} %")
        print(f"job: {JOB['model']['layers']} layers, hidden {JOB['model']['hidden']}, seq "
              f"{JOB['model']['seq_len']}, dp 2 (gloo), ZeRO-1, {meas.params:,} parameters, "
              f"{meas.threads} thread(s) per rank")
        print(f"predicted  {1e3 * pred.iteration_seconds:8.2f} ms/iteration  "
              f"(interval {1e3 * lo:.2f}–{1e3 * hi:.2f})")
        print(f"measured   {1e3 * meas.iteration_seconds:8.2f} ms/iteration  (fastest-quarter mean of "
              f"{len(meas.steps)} steps, min {1e3 * min(meas.steps):.2f}, max {1e3 * max(meas.steps):.2f})")
        print(f"error      {100 * err:+8.1f} %  ({'inside' if result['inside_interval'] else 'outside'} "
              "the predicted interval)")
        print("breakdown (ms): " + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in pred.breakdown.to_dict().items() if v))
        print(f"load average (1 min) on {os.cpu_count()} CPUs: {load_before:.1f} before, "
              f"{load_calibration:.1f} after calibration, {load_training:.1f} after training "
              "(anything above the 2 ranks' own load skews the comparison)")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
