#!/usr/bin/env python3
"""A family of real CPU training steps, each measured against its prediction, on this machine.

    python benchmarks/bench_cpu_family.py [--work DIR] [--data DIR] [--steps 5]      # measure all
    python benchmarks/bench_cpu_family.py --runs benchmarks/data/cpu-family/runs.toml \\
        --platform benchmarks/data/cpu-family/samples [--json]                       # compare only
    python benchmarks/bench_cpu_family.py --parts "dp2 L4 h256 mb2" [--platform DIR]  # time a step's parts
    python benchmarks/bench_cpu_family.py --contention "dp2 L4 h256 mb2" [--rounds 6]  # rank alone vs concurrent
    python benchmarks/bench_cpu_family.py --stacks [--stacks-out benchmarks/data/cpu-family/stacks.toml]
                                                     # the stack family under pytorch, deepspeed, fsdp
    python benchmarks/bench_cpu_family.py --stacks --stack-family zero2 --stacks-out .../zero2.toml
                                                     # DeepSpeed's ZeRO-1 against ZeRO-2
    python benchmarks/bench_cpu_family.py --zero2-ratios --runs A.toml,B.toml --platform DIR
                                                     # their iterations' ratio, measured and predicted

Measuring does, in order:

1. ``perf-calibrate run --device cpu --plan benchmarks/data/cpu-family/plan.toml`` (the smoke
   plan's space at mp = 1, widened to micro-batch 8 and hidden 1024 so that no run of the family
   extrapolates), resumable in ``--work``/samples;
2. ``perf-calibrate fit`` into ``--work``/platform;
3. trains every job of :func:`calibrate.cpu_family.family` for real (calibrate/gpt_model.py:
   pp = tp = 1, dp 1 or 2 gloo ranks, each rank on its share of the cores), predicts it, and
   prints per run predicted, measured, error and whether the interval covers it, then the MAPE;
4. writes the measured runs to ``--data``/runs.toml (the ``[[run]]`` format of
   ``perf-calibrate validate --runs``), their step times to ``--data``/runs.json, and copies the
   sample store it calibrated with to ``--data``/samples (about 1 MB), so that
   ``--runs ... --platform DATA/samples`` re-runs the comparison without measuring anything
   (a sample store given as ``--platform`` is fitted into a temporary platform first).

``--parts`` trains one job of the family with each part of the step timed on its own (forward,
backward, gradient all-reduce, optimizer, all-gather), next to the predictor's breakdown of the
same parts: where a prediction misses, this says which part.  With dp 2 a barrier before each
collective is timed as ``wait`` (the skew between the ranks), so ``all_reduce`` is the collective
alone; columns for rank 0 and for the per-step slowest rank.  Without that barrier rank 0's
"all-reduce" was mostly waiting: on dp2 L4 h256 mb2 one rank's forward + backward took ~240 ms and
the other's ~295 ms, every step, the faster one spending the ~55 ms difference inside all_reduce,
while the all-reduce itself took 13-17 ms (calibrated: 10.8 ms).

``--contention`` times one rank's forward + backward alone (the other core idle, as
``perf-calibrate run`` times operators, and as a dp 1 run of the family runs) and beside a process
computing the same micro-batches (as the other rank does in a dp 2 run), dropping repetitions
during which other processes used the cores.  The ratio is what a dp 2 run's compute costs beyond
its calibrated operators on this machine; the predictor has no term for it (docs/calibration.md).

pp and tp are not in the family: calibrate/gpt_model.py runs pp = tp = 1 only, and a pipeline
schedule or tensor-parallel layers would be a model of their own, not a check of this one.

Measurement code: calibrate/cpu_family.py (the jobs, runs files, comparison),
calibrate/step_parts.py (``--parts``), calibrate/contention.py (``--contention``),
calibrate/stacks.py (``--stacks``), calibrate/cpu_load.py (what else used the cores).

A benchmark, not a test: measured times depend on the machine and on what else runs on it, so
the 1-minute load average is recorded with every run (the ranks themselves add up to 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform as _platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Before xgboost/lightgbm load: their two OpenMP runtimes must not spin against each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from calibrate.cpu_family import (STACKS, THREADS_PER_RANK, ZERO2_STACKS, compare_rows, family, job_named,  # noqa: E402
                                  name_of, read_runs, resolve_platform, runs_toml, stack_family,
                                  stack_family_dp1, stack_family_zero2, stack_job, write_runs,
                                  zero2_ratio_rows)
from calibrate.cpu_load import loadavg, while_measuring  # noqa: E402
from calibrate.errors import CalibrationError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "cpu-family"
THREADS = THREADS_PER_RANK
PLAN = DATA / "plan.toml"


def measure_stacks(args) -> int:
    """Train the stack family under every stack, interleaved job by job (A, B, C, A, B, C ...),
    so that the machine's changing load falls on all stacks alike; resumable (``--stacks-out``
    keeps what was measured)."""
    import torch

    from calibrate.stacks import measure_stack

    out = Path(args.stacks_out)
    side = out.with_suffix(".json")
    runs: list[dict] = json.loads(side.read_text()) if side.exists() else []
    seen = {r["name"] for r in runs}
    stacks = [s for s in args.stack_list.split(",") if s] or \
        list(ZERO2_STACKS if args.stack_family == "zero2" else STACKS)
    try:
        import deepspeed
        ds_version = deepspeed.__version__
    except ImportError:
        ds_version = ""
        if any(s.startswith("deepspeed") for s in stacks):
            print("deepspeed is not installed (pip install deepspeed): its runs are skipped", file=sys.stderr)
            stacks = [s for s in stacks if not s.startswith("deepspeed")]
    cpu = _platform.processor() or _platform.machine()
    jobs = {"dp1": stack_family_dp1, "zero2": stack_family_zero2}.get(args.stack_family, stack_family)()
    for j in jobs:
        for stack in stacks:
            sj = stack_job(j, stack)
            name = f"{stack} {name_of(sj)}"
            if name in seen:
                continue
            t0 = time.monotonic()
            (secs, steps, params), busy = while_measuring(
                lambda: measure_stack(sj, stack, threads=THREADS, steps=args.steps, warmup=args.warmup))
            load, others = busy.load, busy.others_cores
            src = (f"benchmarks/bench_cpu_family.py --stacks ({stack}), {os.cpu_count()} CPUs ({cpu}), "
                   f"torch {torch.__version__}" + (f", deepspeed {ds_version}" if stack.startswith("deepspeed") else "")
                   + f", gloo, {THREADS} thread(s) per rank, fastest-quarter mean of {len(steps)} steps, "
                   f"1-min load {load:.2f}, other processes {others:.2f} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            runs.append({"name": name, "stack": stack, "job": sj, "measured_iteration_seconds": secs,
                         "steps": steps, "params": params, "threads": THREADS, "load": load,
                         "others_cores": others, "source": src})
            side.write_text(json.dumps(runs, indent=1))
            print(f"{name}: {1e3 * secs:.1f} ms/iteration ({time.monotonic() - t0:.0f} s, load {load:.2f}, "
                  f"other processes {others:.2f} cores)", flush=True)
    header = ("# Real CPU training steps of one model family under three software stacks, measured by\n"
              "# benchmarks/bench_cpu_family.py --stacks (perf-calibrate validate --runs reads this)\n")
    out.write_text(runs_toml(runs, header), encoding="utf-8")
    print(f"{len(runs)} runs: {out}")
    return 0


def print_table(rows: list[dict]) -> None:
    print(f"{'run':<24} {'predicted ms':>12} {'measured ms':>12} {'error':>8}  {'interval ms':<19} load  others")
    for r in rows:
        lo, hi = r["interval_seconds"]
        load = f"{r['load']:.2f}" if r.get("load") is not None else "-"
        print(f"{r['name']:<24} {r['predicted_seconds'] * 1e3:>12.1f} {r['measured_seconds'] * 1e3:>12.1f} "
              f"{100 * r['error']:>+7.1f}%  {'inside ' if r['covered'] else 'OUTSIDE'} "
              f"{lo * 1e3:6.0f}–{hi * 1e3:<6.0f} {load}  "
              + (f"{r['others_cores']:.2f}" if r.get("others_cores") is not None else "-"))
    if rows:
        mape = sum(abs(r["error"]) for r in rows) / len(rows)
        cover = sum(r["covered"] for r in rows) / len(rows)
        within = sum(abs(r["error"]) <= 0.10 for r in rows)
        print(f"MAPE {100 * mape:.1f} % over {len(rows)} runs; {within} within ±10 %; "
              f"interval covers {100 * cover:.0f} %")


def measure_family(args) -> int:
    from calibrate.fitting import fit_platform
    from calibrate.gpt_model import measure_training
    from calibrate.runner import RunOptions, run_calibration
    from predictor import TrainingJob, load_platform
    import torch

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="perfcast-cpufam-"))
    samples, platform_dir = work / "samples", work / "platform"
    data = Path(args.data)
    t0 = time.monotonic()
    load0 = loadavg()
    run = run_calibration(RunOptions(out=samples, device="cpu", plan=args.plan, progress=args.verbose))
    if not run.complete:
        print("calibration incomplete", file=sys.stderr)
        return 1
    t_cal = time.monotonic() - t0
    print(f"calibration ({Path(args.plan).stem}): {t_cal:.0f} s, {run.measured_operators} operator + "
          f"{run.measured_collectives} collective points measured, {run.already_done} reused "
          f"(load {load0:.2f} → {loadavg():.2f})", flush=True)
    t0 = time.monotonic()
    if not (platform_dir / "platform.toml").exists() or run.measured_operators or run.measured_collectives:
        fit = fit_platform(samples, platform_dir, name="cpu-family", overwrite=True)
        print(f"fit: {time.monotonic() - t0:.0f} s; hold-out MAPE compute {100 * fit.compute_mape:.1f} %, "
              f"collectives {100 * (fit.collective_mape or 0):.1f} %", flush=True)
    plat = load_platform(platform_dir, reload=True)

    runs_path = work / "runs.json"
    runs: list[dict] = json.loads(runs_path.read_text()) if runs_path.exists() else []
    if args.remeasure_above is not None:
        # Runs that other processes competed with (or that predate the figure) are measured again.
        runs = [r for r in runs if r.get("others_cores", math.inf) <= args.remeasure_above]
    seen = {r["name"] for r in runs}
    cpu = _platform.processor() or _platform.machine()
    for j in family():
        name = name_of(j)
        if name in seen or (args.only and args.only not in name):
            continue
        t0 = time.monotonic()
        m, busy = while_measuring(lambda: measure_training(TrainingJob.from_dict(j), device="cpu", steps=args.steps,
                                                           warmup=args.warmup, threads=THREADS))
        load, others = busy.load, busy.others_cores
        src = (f"benchmarks/bench_cpu_family.py, {os.cpu_count()} CPUs ({cpu}), torch {torch.__version__}, "
               f"{m.threads} thread(s) per rank, fastest-quarter mean of {len(m.steps)} steps, "
               f"1-min load {load:.2f}, other processes {others:.2f} cores, {time.strftime('%Y-%m-%d')}")
        runs.append({"name": name, "job": j, "measured_iteration_seconds": m.iteration_seconds,
                     "steps": m.steps, "params": m.params, "threads": m.threads, "load": load, "others_cores": others,
                     "source": src})
        runs_path.write_text(json.dumps(runs, indent=1))
        print(f"{name}: {1e3 * m.iteration_seconds:.1f} ms/iteration ({time.monotonic() - t0:.0f} s, "
              f"load {load:.2f}, other processes {others:.2f} cores)", flush=True)
    names = {name_of(j) for j in family()}
    runs = [r for r in runs if r["name"] in names]
    write_runs(runs, data)
    if samples.resolve() != (data / "samples").resolve():
        shutil.rmtree(data / "samples", ignore_errors=True)
        shutil.copytree(samples, data / "samples")
    rows = compare_rows(runs, plat)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows)
        print(f"runs: {data / 'runs.toml'}; samples: {data / 'samples'}; platform: {platform_dir}")
    return 0


def zero2_table(ratios: list[dict]) -> str:
    lines = [f"{'job':<24} {'ZeRO-2 / ZeRO-1 measured':>25} {'predicted':>10} {'error':>8}"]
    lines += [f"{r['name']:<24} {r['measured_ratio']:>25.3f} {r['predicted_ratio']:>10.3f} {100 * r['error']:>+7.1f}%"
              for r in ratios]
    if ratios:
        mean = sum(abs(r["error"]) for r in ratios) / len(ratios)
        lines.append(f"mean |error| of the ratio {100 * mean:.1f} % over {len(ratios)} jobs")
    return "\n".join(lines)


def compare(args) -> int:
    keep: list = []
    plat = resolve_platform(args.platform, keep)
    runs = [r for f in args.runs.split(",") for r in read_runs(Path(f))]
    if args.zero2_ratios:
        ratios = zero2_ratio_rows(runs, plat)
        print(json.dumps(ratios, indent=1) if args.json else zero2_table(ratios))
        return 0
    rows = compare_rows(runs, plat)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows)
    return 0


def _family_job(name: str) -> "dict | None":
    """The family's job called ``name``; None, having said which names there are, if none is."""
    try:
        return job_named(name)
    except CalibrationError as e:
        print(e, file=sys.stderr)
        return None


def parts(args) -> int:
    from calibrate.step_parts import PARTS, measure_step_parts, predicted_ops
    from predictor import TrainingJob, predict

    j = _family_job(args.parts)
    if j is None:
        return 2
    res = measure_step_parts(j, threads=THREADS, steps=args.steps, warmup=args.warmup)
    every, iso = res.ranks, res.isolated
    rows = every[0]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    # The step is gated by the slowest rank: per step, each part's maximum over the ranks.
    slow = {k: statistics.median(max(rk[i][k] for rk in every) for i in range(len(rows))) for k in rows[0]}
    print(f"{args.parts}: rank 0 and the per-step maximum over {len(every)} rank(s), median of "
          f"{len(rows)} steps (load {loadavg():.2f}); with dp > 1 a barrier before each collective "
          f"separates the ranks' skew (wait) from the collective")
    if len(every) > 1:
        fb = [statistics.median(r["forward"] + r["backward"] for r in rk) for rk in every]
        print("forward + backward per rank (median, ms): " + ", ".join(f"rank {i} {1e3 * v:.1f}"
                                                                      for i, v in enumerate(fb)))
    pred = plat = None
    keep: list = []
    if args.platform:
        plat = resolve_platform(args.platform, keep)
        pred = predict(TrainingJob.from_dict(j), plat)
    bd = pred.breakdown.to_dict() if pred else {}
    pmap = {"forward": bd.get("forward_seconds"), "backward": bd.get("backward_seconds"),
            "all_reduce": bd.get("gradient_reduce_seconds"), "optimizer": bd.get("optimizer_seconds"),
            "step": pred.iteration_seconds if pred else None}
    m = j["layout"]["micro_batches"]
    imap = {"forward": iso.forward_seconds * m, "backward": iso.backward_seconds * m,
            "optimizer": iso.optimizer_seconds}
    print(f"{'part':<11} {'rank 0 ms':>10} {'slowest ms':>11} {'predicted ms':>13} {'isolated-op sum ms':>19}")
    for k in PARTS:
        p, i = pmap.get(k), imap.get(k)
        print(f"{k:<11} {1e3 * med[k]:>10.2f} {1e3 * slow[k]:>11.2f} {'' if p is None else f'{1e3 * p:13.2f}'} "
              f"{'' if i is None else f'{1e3 * i:19.2f}'}")
    print(f"micro-batches of one step: {med['minor_faults']:.0f} minor page faults, "
          f"{1e3 * med['sys_s']:.1f} ms in the kernel (rank 0, median)")
    per_op = predicted_ops(TrainingJob.from_dict(j), plat) if pred is not None else {}
    print(f"per operator, one step ({m} micro-batches), ms: isolated now fwd/bwd"
          + (" | predicted fwd/bwd" if per_op else ""))
    for op, (f, b) in iso.ops.items():
        pf, pb = per_op.get(op, (None, None))
        print(f"  {op:<22} {1e3 * m * f:8.2f} {1e3 * m * b:8.2f}"
              + ("" if pf is None else f" | {1e3 * m * pf:8.2f} {1e3 * m * pb:8.2f}"))
    if pred is not None:
        print("predicted optimizer (optimizer_seconds) includes the ZeRO all-gather; breakdown (ms): "
              + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in bd.items() if v))
    return 0


def contention(args) -> int:
    from calibrate.contention import concurrent_slowdown

    j = _family_job(args.contention)
    if j is None:
        return 2
    r = concurrent_slowdown(j, threads=THREADS, rounds=args.rounds)
    if args.json:
        print(json.dumps(dataclasses.asdict(r), indent=1))
        return 0
    print(f"{args.contention}: one rank's forward + backward ({THREADS} thread(s)), fastest quarter; "
          f"{r.dropped} repetitions dropped for other processes' load")
    for k in ("alone", "concurrent"):
        xs = sorted(getattr(r, k))
        print(f"  {k:<11} {1e3 * getattr(r, k + '_seconds'):8.1f} ms  (n = {len(xs)}"
              + (f", median {1e3 * statistics.median(xs):.1f} ms)" if xs else ")"))
    print(f"  concurrent / alone = {r.ratio:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default=str(PLAN), help="calibration plan (name or file)")
    ap.add_argument("--work", default=None, help="keep samples, platform and runs here (resumable)")
    ap.add_argument("--data", default=str(DATA), help="write runs.toml, runs.json and samples/ here")
    ap.add_argument("--steps", type=int, default=5, help="timed training iterations per run")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", default="", help="measure only runs whose name contains this")
    ap.add_argument("--remeasure-above", type=float, default=None, metavar="CORES",
                    help="measure again the runs in --work during which other processes used more "
                         "than CORES cores")
    ap.add_argument("--runs", help="compare these measured runs (runs.toml or runs.json) ...")
    ap.add_argument("--platform", default="", help="... with this platform (name, dir, or a sample store)")
    ap.add_argument("--parts", default="", help="time the parts of one run's step (its name)")
    ap.add_argument("--contention", default="",
                    help="time one run's rank alone and beside a concurrent copy of it (its name)")
    ap.add_argument("--rounds", type=int, default=6, help="--contention: alternating rounds")
    ap.add_argument("--stacks", action="store_true",
                    help="train the stack family under pytorch, deepspeed and fsdp (calibrate/stacks.py)")
    ap.add_argument("--stack-list", default="", help="--stacks: only these (comma-separated)")
    ap.add_argument("--stack-family", default="mixed", choices=("mixed", "dp1", "zero2"),
                    help="--stacks: the jobs (mixed: dp 1 and 2, recompute; dp1: 14 one-rank shapes; zero2: "
                         "7 two-rank shapes of 1-8 micro-batches under DeepSpeed's ZeRO-1 and ZeRO-2)")
    ap.add_argument("--stacks-out", default=str(DATA / "stacks.toml"), help="--stacks: runs file (and .json)")
    ap.add_argument("--zero2-ratios", action="store_true",
                    help="with --runs (comma-separated files of --stack-family zero2): ZeRO-2's iteration over "
                         "ZeRO-1's, measured and predicted")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.stacks:
        return measure_stacks(args)
    if args.parts:
        return parts(args)
    if args.contention:
        return contention(args)
    if args.runs:
        if not args.platform:
            ap.error("--runs needs --platform")
        return compare(args)
    return measure_family(args)


if __name__ == "__main__":
    sys.exit(main())
