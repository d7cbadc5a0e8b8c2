#!/usr/bin/env python3
"""A family of real CPU training steps, each measured against its prediction, on this machine.

    python benchmarks/bench_cpu_family.py [--work DIR] [--data DIR] [--steps 5]      # measure all
    python benchmarks/bench_cpu_family.py --runs benchmarks/data/cpu-family/runs.toml \\
        --platform benchmarks/data/cpu-family/samples [--json]                       # compare only
    python benchmarks/bench_cpu_family.py --parts "dp2 L4 h256 mb2" [--platform DIR]  # time a step's parts
    python benchmarks/bench_cpu_family.py --contention "dp2 L4 h256 mb2" [--rounds 6]  # rank alone vs concurrent
    python benchmarks/bench_cpu_family.py --stacks [--stacks-out benchmarks/data/cpu-family/stacks.toml]
                                                     # the stack family under pytorch, deepspeed, fsdp

Measuring does, in order:

1. ``perf-calibrate run --device cpu --plan benchmarks/data/cpu-family/plan.toml`` (the smoke
   plan's space at mp = 1, widened to micro-batch 8 and hidden 1024 so that no run of the family
   extrapolates), resumable in ``--work``/samples;
2. ``perf-calibrate fit`` into ``--work``/platform;
3. trains every job of :func:`family` for real (calibrate/gpt_model.py: pp = tp = 1, dp 1 or 2
   gloo ranks, each rank on its share of the cores), predicts it, and prints per run predicted,
   measured, error and whether the interval covers it, then the MAPE;
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

A benchmark, not a test: measured times depend on the machine and on what else runs on it, so
the 1-minute load average is recorded with every run (the ranks themselves add up to 2).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform as _platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Before xgboost/lightgbm load: their two OpenMP runtimes must not spin against each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "benchmarks" / "data" / "cpu-family"
# Threads per rank.  The calibration measures a "GPU" of this CPU as one rank's share of the cores
# (calibrate/runner.py: cores / 2 local ranks = 1 on this machine), so every run, dp 1 included,
# gives each rank that share: a dp 1 job runs on one such "GPU", the other core idle.
THREADS = max(1, (os.cpu_count() or 2) // 2)
PLAN = DATA / "plan.toml"


def job(layers: int, hidden: int, mb: int, *, dp: int = 1, m: int = 2, recompute: str = "none",
        seq: int = 128, vocab: int = 2048) -> dict:
    """A small GPT job as the CPU trains it: fp32, fused softmax, head dim 64, ZeRO-1."""
    return {
        "model": {"layers": layers, "hidden": hidden, "heads": max(1, hidden // 64), "seq_len": seq,
                  "vocab": vocab, "attention": "fused_softmax", "activation": "gelu", "norm": "layernorm",
                  "pos_emb": "rotary", "tied_embeddings": True},
        "layout": {"pp": 1, "tp": 1, "dp": dp, "micro_batch": mb, "micro_batches": m, "zero_stage": 1,
                   "recompute": recompute},
        "run": {"precision": "fp32", "train_iters": 0},
        "cluster": {"gpus_per_node": 2},
    }


def name_of(j: dict) -> str:
    m, lay = j["model"], j["layout"]
    rc = " full" if lay["recompute"] == "full" else ""
    return f"dp{lay['dp']} L{m['layers']} h{m['hidden']} mb{lay['micro_batch']}{rc}"


def family() -> list[dict]:
    """dp 1 and 2, micro-batch 1–8, hidden 128–1024, recompute none and full (seconds per step
    at most ~1 s on two cores, so the whole family measures in a few minutes)."""
    jobs = [
        # The job bench_calibrate_e2e.py predicts (4 layers).
        job(4, 256, 2, dp=2),
        # dp 1: one rank on both cores.
        job(2, 128, 1), job(2, 128, 8), job(2, 256, 2), job(2, 256, 4), job(2, 512, 1), job(2, 512, 4),
        job(2, 1024, 1), job(2, 1024, 2),
        # dp 2: two gloo ranks, one core each.
        job(2, 128, 1, dp=2), job(2, 128, 4, dp=2), job(2, 256, 8, dp=2), job(2, 512, 2, dp=2),
        job(2, 1024, 1, dp=2),
        # Full recomputation.
        job(2, 256, 4, recompute="full"), job(2, 1024, 1, recompute="full"),
        job(2, 128, 8, dp=2, recompute="full"), job(2, 512, 2, dp=2, recompute="full"),
    ]
    return jobs


def stack_family() -> list[dict]:
    """The jobs ``--stacks`` trains under each stack of ``benchmarks/cpu_stacks.py``: dp 1 and 2,
    micro-batch 1-8, hidden 128-512, 2 and 4 layers, recompute none and full (a few seconds each)."""
    return [
        job(2, 128, 1), job(2, 128, 8), job(2, 256, 2), job(2, 256, 4), job(4, 256, 2), job(2, 512, 1),
        job(2, 512, 4), job(4, 128, 4), job(2, 256, 4, recompute="full"),
        job(2, 128, 1, dp=2), job(2, 128, 4, dp=2), job(2, 256, 8, dp=2), job(4, 256, 2, dp=2),
        job(2, 512, 2, dp=2), job(4, 128, 2, dp=2), job(2, 512, 2, dp=2, recompute="full"),
    ]


def stack_family_dp1() -> list[dict]:
    """``--stack-family dp1``: one rank only (no two ranks slowing each other on the shared cores),
    14 shapes, so that a kind has 10-20 runs of one data-parallel size."""
    return [job(2, 128, 1), job(2, 128, 2), job(2, 128, 4), job(2, 128, 8), job(2, 256, 1), job(2, 256, 2),
            job(2, 256, 4), job(4, 128, 2), job(4, 128, 4), job(4, 256, 1), job(4, 256, 2), job(2, 512, 1),
            job(2, 512, 2), job(3, 384, 2)]


def measure_stacks(args) -> int:
    """Train :func:`stack_family` under every stack, interleaved job by job (A, B, C, A, B, C ...),
    so that the machine's changing load falls on all stacks alike; resumable (``--stacks-out``
    keeps what was measured)."""
    import torch

    from cpu_stacks import STACKS, measure_stack, stack_job

    out = Path(args.stacks_out)
    side = out.with_suffix(".json")
    runs: list[dict] = json.loads(side.read_text()) if side.exists() else []
    seen = {r["name"] for r in runs}
    stacks = [s for s in args.stack_list.split(",") if s] or list(STACKS)
    try:
        import deepspeed
        ds_version = deepspeed.__version__
    except ImportError:
        ds_version = ""
        if "deepspeed" in stacks:
            print("deepspeed is not installed (pip install deepspeed): its runs are skipped", file=sys.stderr)
            stacks.remove("deepspeed")
    cpu = _platform.processor() or _platform.machine()
    for j in (stack_family_dp1() if args.stack_family == "dp1" else stack_family()):
        for stack in stacks:
            sj = stack_job(j, stack)
            name = f"{stack} {name_of(sj)}"
            if name in seen:
                continue
            before = loadavg()
            c0 = _cpu_seconds()
            t0 = time.monotonic()
            secs, steps, params = measure_stack(sj, stack, threads=THREADS, steps=args.steps, warmup=args.warmup)
            others = others_cores(c0, _cpu_seconds(), time.monotonic() - t0)
            load = max(before, loadavg())
            src = (f"benchmarks/bench_cpu_family.py --stacks ({stack}), {os.cpu_count()} CPUs ({cpu}), "
                   f"torch {torch.__version__}" + (f", deepspeed {ds_version}" if stack == "deepspeed" else "")
                   + f", gloo, {THREADS} thread(s) per rank, fastest-quarter mean of {len(steps)} steps, "
                   f"1-min load {load:.2f}, other processes {others:.2f} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
            runs.append({"name": name, "stack": stack, "job": sj, "measured_iteration_seconds": secs,
                         "steps": steps, "params": params, "threads": THREADS, "load": load,
                         "others_cores": others, "source": src})
            side.write_text(json.dumps(runs, indent=1))
            print(f"{name}: {1e3 * secs:.1f} ms/iteration ({time.monotonic() - t0:.0f} s, load {load:.2f}, "
                  f"other processes {others:.2f} cores)", flush=True)
    from predictor.samples import dump_toml
    toml_runs = [{"name": r["name"], "source": r["source"], "measured_iteration_seconds": r["measured_iteration_seconds"],
                  "job": r["job"]} for r in runs]
    out.write_text("# Real CPU training steps of one model family under three software stacks, measured by\n"
                   "# benchmarks/bench_cpu_family.py --stacks (perf-calibrate validate --runs reads this)\n"
                   + dump_toml({"run": toml_runs}), encoding="utf-8")
    print(f"{len(runs)} runs: {out}")
    return 0


def loadavg() -> float:
    return os.getloadavg()[0]


def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds every process of the machine has used, of which this process and its
    finished children), from /proc/stat and getrusage."""
    own = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
    try:
        with open("/proc/stat") as f:
            v = [float(x) for x in f.readline().split()[1:]]
        busy = (sum(v) - v[3] - (v[4] if len(v) > 4 else 0.0)) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = float("nan")
    return busy, own


def others_cores(before: tuple[float, float], after: tuple[float, float], wall: float) -> float:
    """Cores' worth of CPU that *other* processes used between two :func:`_cpu_seconds` readings:
    what competed with a run (the load average also counts the run's own ranks, and lags)."""
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / max(wall, 1e-9))


# ----------------------------------------------------------------------------- platform

def resolve_platform(where: str, keep: list):
    """A platform directory or name; a sample store (samples.toml) is fitted into a temp dir."""
    from predictor import load_platform

    p = Path(where)
    if (p / "samples.toml").exists():
        from calibrate.fitting import fit_platform

        tmp = tempfile.TemporaryDirectory(prefix="perfcast-cpufam-")
        keep.append(tmp)
        fit_platform(p, Path(tmp.name) / "platform", name="cpu-family", overwrite=True)
        return load_platform(Path(tmp.name) / "platform", reload=True)
    return load_platform(where, reload=True)


def compare_rows(runs: list[dict], plat) -> list[dict]:
    from predictor import TrainingJob, predict

    rows = []
    for r in runs:
        pred = predict(TrainingJob.from_dict(r["job"]), plat)
        meas = float(r["measured_iteration_seconds"])
        lo, hi = pred.interval_seconds
        rows.append({"name": r["name"], "measured_seconds": meas, "predicted_seconds": pred.iteration_seconds,
                     "interval_seconds": [lo, hi], "error": pred.iteration_seconds / meas - 1.0,
                     "covered": lo <= meas <= hi, "load": r.get("load"), "others_cores": r.get("others_cores"),
                     "breakdown_s": pred.breakdown.to_dict()})
    return rows


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


# ----------------------------------------------------------------------------- runs files

def write_runs(runs: list[dict], data: Path) -> None:
    from predictor.samples import dump_toml

    data.mkdir(parents=True, exist_ok=True)
    toml_runs = [{"name": r["name"], "source": r["source"],
                  "measured_iteration_seconds": r["measured_iteration_seconds"], "job": r["job"]}
                 for r in runs]
    (data / "runs.toml").write_text(
        "# Real CPU training steps measured by benchmarks/bench_cpu_family.py "
        "(perf-calibrate validate --runs reads this)\n" + dump_toml({"run": toml_runs}), encoding="utf-8")
    (data / "runs.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")


def read_runs(path: Path) -> list[dict]:
    """Runs from runs.toml (via the validate parser) or runs.json; load averages from runs.json."""
    if path.suffix == ".json":
        return json.loads(path.read_text())
    from calibrate.validate import load_runs

    loads = {}
    side = path.with_suffix(".json")
    if side.exists():
        loads = {d["name"]: (d.get("load"), d.get("others_cores")) for d in json.loads(side.read_text())}
    return [{"name": r.name, "job": r.job.to_dict(), "measured_iteration_seconds": r.measured_iteration_seconds,
             "load": loads.get(r.name, (None, None))[0], "others_cores": loads.get(r.name, (None, None))[1]}
            for r in load_runs(path)]


# ----------------------------------------------------------------------------- measuring

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
        before = loadavg()
        c0 = _cpu_seconds()
        t0 = time.monotonic()
        m = measure_training(TrainingJob.from_dict(j), device="cpu", steps=args.steps, warmup=args.warmup,
                             threads=THREADS)
        others = others_cores(c0, _cpu_seconds(), time.monotonic() - t0)
        load = max(before, loadavg())
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


def compare(args) -> int:
    keep: list = []
    plat = resolve_platform(args.platform, keep)
    rows = compare_rows(read_runs(Path(args.runs)), plat)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows)
    return 0


# ----------------------------------------------------------------------------- parts of a step

def _isolated_sum(j, shard: int) -> dict:
    """The same micro-batch as the calibration sees it: every operator of the predictor's recipe
    (predictor/recipe.py) built and timed on its own, as ``perf-calibrate run`` times a sample
    (calibrate/kernels.py + calibrate/timing.py: warm-up 2, fastest-quarter mean of 8), in this
    process, now; summed with the recipe's counts.  Seconds per micro-batch (optimizer: per step)."""
    from calibrate.kernels import build_kernel
    from predictor.recipe import micro_batch_recipe

    r = micro_batch_recipe(j.model, j.layout)
    calls = [(c, j.model.layers, True) for c in r.layer] + [(c, 1, False) for c in r.embedding + r.head]
    out = {"forward": 0.0, "backward": 0.0, "ops": {}}
    full = j.layout.recompute == "full"
    for c, n, in_layer in calls:
        shape = {k: int(round(v)) for k, v in c.shape.items()}
        t = build_kernel(c.name, shape, "fp32", "cpu").time(warmup=2, repeats=8)
        f, b = t["fwd"].seconds * c.count * n, t["bwd"].seconds * c.count * n
        out["forward"] += f
        out["backward"] += b + (f if full and in_layer else 0.0)     # full recomputation
        f0, b0 = out["ops"].get(c.name, (0.0, 0.0))
        out["ops"][c.name] = (f0 + f, b0 + b)
    out["optimizer"] = build_kernel("optimizer", {"params": shard}, "fp32", "cpu").time(
        warmup=2, repeats=8)["step"].seconds
    return out


def _parts_worker(rank: int, world: int, port: int, job_dict: dict, threads: int, steps: int,
                  warmup: int, results, isolated_too: bool = False) -> None:
    """gpt_model._train_worker's step, each part timed on its own (CPU: no asynchrony).

    With dp > 1 a barrier before the gradient all-reduce and one before the ZeRO all-gather are
    timed as ``wait``: the time this rank waits for the slowest rank to reach the collective.
    Training has no such barrier, so there that wait is spent inside the collective call; without
    the barrier ``all_reduce`` would be the collective plus the ranks' skew (on the CPU family
    tens of ms, more than the collective itself).  Every rank's rows go to rank 0."""
    import warnings

    import torch
    import torch.distributed as dist

    from calibrate.gpt_model import rank_state
    from predictor import TrainingJob

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    j = TrainingJob.from_dict(job_dict)
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        st = rank_state(j, "cpu", world, rank)
        model, opt, batches, zero, lo, hi = st.model, st.optimizer, st.batches, st.zero, st.lo, st.hi
        rows = []
        for step in range(warmup + steps):
            if world > 1:
                dist.barrier()
            t = {"forward": 0.0, "backward": 0.0}
            c0 = time.perf_counter()
            model.flat_grad.zero_()
            c1 = time.perf_counter()
            t["zero_grad"] = c1 - c0
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for ids, tgt in batches:
                a = time.perf_counter()
                loss = model.loss(ids, tgt)
                b = time.perf_counter()
                loss.backward()
                c = time.perf_counter()
                t["forward"] += b - a
                t["backward"] += c - b
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            # Page faults and kernel time of the micro-batches (first-touch of fresh memory).
            t["minor_faults"] = float(r1.ru_minflt - r0.ru_minflt)
            t["sys_s"] = r1.ru_stime - r0.ru_stime
            w0 = time.perf_counter()
            if world > 1:
                dist.barrier()
            a = time.perf_counter()
            if world > 1:
                dist.all_reduce(model.flat_grad)
                model.flat_grad.div_(world)
            b = time.perf_counter()
            opt.step()
            c = time.perf_counter()
            if zero:
                dist.barrier()
            c2 = time.perf_counter()
            if zero:
                dist.all_gather_into_tensor(model.flat, model.flat[lo:hi].clone())
            d = time.perf_counter()
            t.update(wait=(a - w0) + (c2 - c), all_reduce=b - a, optimizer=c - b, all_gather=d - c2,
                     step=d - c0)
            if step >= warmup:
                rows.append(t)
        every = [rows]
        if world > 1:
            every = [None] * world
            dist.all_gather_object(every, rows)
        isolated = _isolated_sum(j, model.padded // (world if zero else 1)) if rank == 0 and isolated_too else None
        if rank == 0:
            results.put((every, isolated))
        if world > 1:
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()


def _predicted_ops(j, plat) -> dict:
    """The platform's seconds per operator of the recipe (one micro-batch, counts applied)."""
    from predictor.estimate import QuerySet
    from predictor.recipe import micro_batch_recipe

    q = QuerySet(plat)
    r = micro_batch_recipe(j.model, j.layout)
    rows = [(c, j.model.layers * c.count, q.op(c.name, "fwd", "fp32", c.shape), q.op(c.name, "bwd", "fp32", c.shape))
            for c in r.layer] + [(c, c.count, q.op(c.name, "fwd", "fp32", c.shape), q.op(c.name, "bwd", "fp32", c.shape))
                                 for c in r.embedding + r.head]
    secs = q.evaluate()[0]
    out: dict = {}
    for c, n, hf, hb in rows:
        f0, b0 = out.get(c.name, (0.0, 0.0))
        out[c.name] = (f0 + n * secs[hf], b0 + n * secs[hb])
    return out


def job_named(name: str) -> "dict | None":
    """The family's job called ``name``; None, having said which names there are, if none is."""
    jobs = {name_of(j): j for j in family()}
    if name not in jobs:
        print(f"unknown job {name!r}; one of: {', '.join(jobs)}", file=sys.stderr)
    return jobs.get(name)


def parts(args) -> int:
    import torch.multiprocessing as mp

    from calibrate.collectives import free_port, spawn_until_result
    from predictor import TrainingJob, predict

    j = job_named(args.parts)
    if j is None:
        return 2
    world = j["layout"]["dp"]
    threads = THREADS
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    a = (world, free_port(), j, threads, args.steps, args.warmup, results, True)
    if world == 1:
        _parts_worker(0, *a)
    else:
        spawn_until_result(_parts_worker, a, world, results, timeout_s=900.0, what="training rank")
    every, iso = results.get()
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
    pmap = {"forward": bd.get("stage_fwd_max"), "backward": bd.get("stage_bwd_max"),
            "all_reduce": bd.get("dp_allreduce"), "optimizer": bd.get("max_update"),
            "step": pred.iteration_seconds if pred else None}
    m = j["layout"]["micro_batches"]
    imap = {"forward": iso["forward"] * m, "backward": iso["backward"] * m, "optimizer": iso["optimizer"]}
    print(f"{'part':<11} {'rank 0 ms':>10} {'slowest ms':>11} {'predicted ms':>13} {'isolated-op sum ms':>19}")
    for k in ("zero_grad", "forward", "backward", "wait", "all_reduce", "optimizer", "all_gather", "step"):
        p, i = pmap.get(k), imap.get(k)
        print(f"{k:<11} {1e3 * med[k]:>10.2f} {1e3 * slow[k]:>11.2f} {'' if p is None else f'{1e3 * p:13.2f}'} "
              f"{'' if i is None else f'{1e3 * i:19.2f}'}")
    print(f"micro-batches of one step: {med['minor_faults']:.0f} minor page faults, "
          f"{1e3 * med['sys_s']:.1f} ms in the kernel (rank 0, median)")
    per_op = _predicted_ops(TrainingJob.from_dict(j), plat) if pred is not None else {}
    print(f"per operator, one step ({m} micro-batches), ms: isolated now fwd/bwd"
          + (" | predicted fwd/bwd" if per_op else ""))
    for op, (f, b) in iso["ops"].items():
        pf, pb = per_op.get(op, (None, None))
        print(f"  {op:<22} {1e3 * m * f:8.2f} {1e3 * m * b:8.2f}"
              + ("" if pf is None else f" | {1e3 * m * pf:8.2f} {1e3 * m * pb:8.2f}"))
    if pred is not None:
        print("predicted optimizer (max_update) includes the ZeRO all-gather; breakdown (ms): "
              + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in bd.items() if v))
    return 0


# ----------------------------------------------------------------------------- concurrent ranks

def _proc_cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (its threads included), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
        return (float(v[11]) + float(v[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def _loader(job_dict: dict, threads: int, running, idle, stop) -> None:
    """Another rank's compute without gloo: the same micro-batches' forward + backward, in a loop
    while ``running`` is set (``idle`` acknowledges a pause)."""
    import warnings

    import torch

    from calibrate.gpt_model import rank_state
    from predictor import TrainingJob

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    st = rank_state(TrainingJob.from_dict(job_dict), "cpu", 1, 0)
    while not stop.is_set():
        if running.is_set():
            idle.clear()
            for ids, tgt in st.batches:
                st.model.loss(ids, tgt).backward()
        else:
            idle.set()
            time.sleep(0.002)


def concurrent_slowdown(job_dict: dict, *, rounds: int = 6, per_phase: int = 3, threads: int = THREADS,
                        max_others: float = 0.15) -> dict:
    """One rank's forward + backward of its micro-batches timed alone (the other cores idle, as
    ``perf-calibrate run`` times operators) and while another process runs the same rank's
    micro-batches (as the other dp rank does during training), in alternating phases.  Repetitions
    during which other processes used more than ``max_others`` cores are dropped.  Returns
    fastest-quarter means (calibrate.timing) and their ratio."""
    import multiprocessing as mpp

    import torch

    from calibrate.gpt_model import rank_state
    from calibrate.timing import fastest_quarter_mean
    from predictor import TrainingJob

    torch.set_num_threads(threads)
    st = rank_state(TrainingJob.from_dict(job_dict), "cpu", 1, 0)

    def fb() -> None:
        for ids, tgt in st.batches:
            st.model.loss(ids, tgt).backward()

    ctx = mpp.get_context("spawn")
    running, idle, stop = ctx.Event(), ctx.Event(), ctx.Event()
    child = ctx.Process(target=_loader, args=(job_dict, threads, running, idle, stop), daemon=True)
    child.start()
    out: dict = {"alone": [], "concurrent": [], "dropped": 0, "others_cores": []}
    try:
        idle.wait(300)
        fb()
        for _ in range(rounds):
            for phase in ("alone", "concurrent"):
                if phase == "concurrent":
                    running.set()
                    time.sleep(0.2)
                else:
                    running.clear()
                    idle.clear()
                    idle.wait(300)
                for _ in range(per_phase):
                    c0 = _cpu_seconds()[0]
                    o0 = _proc_cpu_seconds(os.getpid()) + _proc_cpu_seconds(child.pid)
                    t0 = time.perf_counter()
                    fb()
                    dt = time.perf_counter() - t0
                    others = (_cpu_seconds()[0] - c0
                              - (_proc_cpu_seconds(os.getpid()) + _proc_cpu_seconds(child.pid) - o0)) / dt
                    out["others_cores"].append(round(others, 3))
                    if others <= max_others:
                        out[phase].append(dt)
                    else:
                        out["dropped"] += 1
    finally:
        stop.set()
        running.clear()
        child.join(10)
        if child.is_alive():
            child.terminate()
    for k in ("alone", "concurrent"):
        out[f"{k}_seconds"] = fastest_quarter_mean(out[k]) if out[k] else float("nan")
    out["ratio"] = out["concurrent_seconds"] / out["alone_seconds"]
    return out


def contention(args) -> int:
    j = job_named(args.contention)
    if j is None:
        return 2
    r = concurrent_slowdown(j, rounds=args.rounds)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{args.contention}: one rank's forward + backward ({THREADS} thread(s)), fastest quarter; "
          f"{r['dropped']} repetitions dropped for other processes' load")
    for k in ("alone", "concurrent"):
        xs = sorted(r[k])
        print(f"  {k:<11} {1e3 * r[k + '_seconds']:8.1f} ms  (n = {len(xs)}"
              + (f", median {1e3 * statistics.median(xs):.1f} ms)" if xs else ")"))
    print(f"  concurrent / alone = {r['ratio']:.2f}")
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
                    help="train the stack family under pytorch, deepspeed and fsdp (benchmarks/cpu_stacks.py)")
    ap.add_argument("--stack-list", default="", help="--stacks: only these (comma-separated)")
    ap.add_argument("--stack-family", default="mixed", choices=("mixed", "dp1"),
                    help="--stacks: the jobs (mixed: dp 1 and 2, recompute; dp1: 14 one-rank shapes)")
    ap.add_argument("--stacks-out", default=str(DATA / "stacks.toml"), help="--stacks: runs file (and .json)")
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
