#!/usr/bin/env python3
"""Replay a trace of jobs with and without ``perf-calibrate watch``: kills, tail waste, reservation.

    python benchmarks/bench_watch_replay.py            # the three traces below, fixed seed
    python benchmarks/bench_watch_replay.py --json
    python benchmarks/bench_watch_replay.py --every-minutes 15 --seed 2

Each job has a predicted rate (what perf-predictd answered) and a true one.  Without the watch
its limit is the default fill (``slurm_plugin.policy``: predicted total x 1.15 + 5 min start-up,
rounded up to 5 min, at most the partition's 48 h MaxTime) and it is killed at that limit,
losing the work since its last checkpoint.  With the watch, every ``--every-minutes`` after
start-up the job's log gives its current iteration and its median time per iteration (the true
rate with a log-normal error of 0.03 / sqrt(samples): 0.03 is the mean standard deviation of log
step time of the shipped H100 runs, docs/harvest.md section 4), and the real decision rule
(:func:`calibrate.watch.decide`, the default ``[watch]`` policy with ``extend_user_limits``
irrelevant: every limit here is perfcast's) extends or shrinks it, within MaxTime and the
default ``max_growth`` (a limit may double).  No other jobs compete (the fairness cap is not
exercised), and a job takes its true rate from its first iteration.

The traces (where each ratio measured / predicted comes from):

1. ``h100-recorded``: the 33 runs recorded in ``predictor/platforms/dgx-h100/platform.toml``
   ``[[validation]]`` (perfcast GPT steps measured on one NVIDIA H100 by
   ``benchmarks/bench_train_family.py``, with the prediction each got held out), each replayed as
   8 jobs of lengths drawn below: measured / predicted of a calibrated partition.
2. ``synthetic-spread``: 264 jobs with log(measured / predicted) ~ Normal(0, 0.153): the spread at
   which the default fill's 15 % margin kills 18 % of jobs, the share issue 29 reports for real
   published runs of several stacks (those runs are not in this repository; this distribution is
   a stand-in with that one property, not a fit to them).
3. ``synthetic-unseen-stack``: 264 jobs with log(measured / predicted) ~ Normal(ln 1.3, 0.15): a
   stack the partition never ran, systematically 30 % slower than predicted (issue 29: 16-54 %
   of Megatron-DeepSpeed jobs killed on A100).

Job lengths (predicted training time) are log-uniform between 1 h and 40 h, checkpoints every
hour of predicted time (``save_interval``), start-up 3 min.  All synthetic: they set how much
there is to lose, not whether the watch helps.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from calibrate.watch import Limits, Progress, decide
from slurm_plugin.records import PredictionRecord
from slurm_plugin.siteconfig import WatchPolicy

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_TIME_S = 48 * 3600.0
STARTUP_S = 180.0
FILL_MARGIN = 0.15
FILL_STARTUP_MIN = 5.0
FILL_ROUND_MIN = 5
STEP_LOG_STD = 0.03


@dataclass(frozen=True)
class TraceJob:
    name: str
    predicted_s: float          # per iteration
    measured_s: float
    iterations: int
    save_interval: int


@dataclass
class Outcome:
    completed: bool
    elapsed_s: float
    limit_s: float
    lost_s: float               # work since the last checkpoint of a killed job
    extended: bool = False
    shrunk: bool = False


def fill_limit_s(job: TraceJob) -> float:
    minutes = job.predicted_s * job.iterations * (1 + FILL_MARGIN) / 60.0 + FILL_STARTUP_MIN
    minutes = FILL_ROUND_MIN * math.ceil(minutes / FILL_ROUND_MIN)
    return min(60.0 * minutes, MAX_TIME_S)


def run_job(job: TraceJob, *, watch: Optional[WatchPolicy], every_s: float, rng: random.Random) -> Outcome:
    limit = fill_limit_s(job)
    first = limit
    true_total = STARTUP_S + job.iterations * job.measured_s
    extended = shrunk = False
    if watch is not None:
        record = PredictionRecord(partition="p", platform="x", bundle="b",
                                  job={"run": {"save_interval": job.save_interval}},
                                  iteration_seconds=job.predicted_s, iterations=job.iterations,
                                  total_seconds=job.predicted_s * job.iterations, action="set")
        t = every_s
        while t < min(limit, true_total):
            done = int((t - STARTUP_S) / job.measured_s) if t > STARTUP_S else 0
            samples = min(done // 10, 200)          # a log line every 10 iterations, the tail read
            if done >= 1 and samples >= 1:
                err = rng.gauss(0.0, STEP_LOG_STD / math.sqrt(samples))
                prog = Progress(iteration=min(done, job.iterations), iteration_seconds=job.measured_s * math.exp(err),
                                samples=samples, log_format="megatron", planned_iterations=job.iterations,
                                iterations_spanned=done)
                d = decide(now=t, start=0.0, limit_seconds=limit, record=record, progress=prog, policy=watch,
                           limits=Limits(max_time_seconds=MAX_TIME_S,
                                         growth_seconds=first * (1.0 + watch.max_growth)),
                           perfcast_limit=True)
                if d.action != "none" and d.to_seconds is not None:
                    extended |= d.action == "extend"
                    shrunk |= d.action == "shrink"
                    limit = d.to_seconds
            t += every_s
    if true_total <= limit:
        return Outcome(True, true_total, limit, 0.0, extended, shrunk)
    done = max(0, int((limit - STARTUP_S) / job.measured_s))
    last_ckpt = (done // job.save_interval) * job.save_interval if job.save_interval else 0
    lost = (done - last_ckpt) * job.measured_s + min(limit, STARTUP_S)
    return Outcome(False, limit, limit, lost, extended, shrunk)


def h100_ratios() -> list[tuple[str, float]]:
    data = tomllib.loads((ROOT / "predictor" / "platforms" / "dgx-h100" / "platform.toml").read_text())
    out = []
    for v in data.get("validation", []):
        m, p = v.get("measured_iteration_seconds"), v.get("predicted_iteration_seconds")
        if m and p:
            out.append((v["name"], m / p))
    return out


def make_jobs(ratios: list[tuple[str, float]], rng: random.Random) -> list[TraceJob]:
    jobs = []
    for name, ratio in ratios:
        hours = math.exp(rng.uniform(math.log(1.0), math.log(40.0)))
        predicted_s = 1.0 * math.exp(rng.uniform(math.log(0.5), math.log(20.0)))  # s/iter: small to large models
        iterations = max(10, int(hours * 3600 / predicted_s))
        save = max(1, int(3600 / predicted_s))
        jobs.append(TraceJob(name, predicted_s, predicted_s * ratio, iterations, save))
    return jobs


def traces(rng: random.Random) -> dict[str, list[TraceJob]]:
    h100 = h100_ratios()
    return {
        "h100-recorded": make_jobs([(n, r) for n, r in h100 for _ in range(8)], rng),
        "synthetic-spread": make_jobs([(f"s{i}", math.exp(rng.gauss(0.0, 0.153))) for i in range(264)], rng),
        "synthetic-unseen-stack": make_jobs([(f"u{i}", math.exp(rng.gauss(math.log(1.3), 0.15)))
                                             for i in range(264)], rng),
    }


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    kills = [o for o in outcomes if not o.completed]
    done = [o for o in outcomes if o.completed]
    ratio = sorted(o.limit_s / o.elapsed_s for o in done)
    return {"jobs": len(outcomes), "kills": len(kills), "kill_share": len(kills) / len(outcomes),
            "tail_waste_hours": sum(o.lost_s for o in kills) / 3600.0,
            "killed_hours": sum(o.elapsed_s for o in kills) / 3600.0,
            "median_reserved_over_actual": statistics.median(ratio) if ratio else None,
            "p90_reserved_over_actual": ratio[int(0.9 * (len(ratio) - 1))] if ratio else None,
            "idle_reserved_hours": sum(o.limit_s - o.elapsed_s for o in done) / 3600.0,
            "extended": sum(o.extended for o in outcomes), "shrunk": sum(o.shrunk for o in outcomes)}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every-minutes", type=float, default=5.0, help="watch pass interval (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    policy = WatchPolicy(enabled=True)
    result = {}
    for name, jobs in traces(rng).items():
        base = [run_job(j, watch=None, every_s=60 * args.every_minutes, rng=rng) for j in jobs]
        watched = [run_job(j, watch=policy, every_s=60 * args.every_minutes, rng=rng) for j in jobs]
        result[name] = {"without_watch": summarize(base), "with_watch": summarize(watched)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"watch replay: pass every {args.every_minutes:g} min, default [watch] policy "
          f"(margin {policy.margin:.0%} + {policy.margin_minutes:g} min, max_growth {policy.max_growth:g}, "
          f"shrink when >= {policy.shrink_min_minutes:g} min returns), MaxTime 48 h, seed {args.seed}")
    head = (f"{'trace':<24} {'watch':<5} {'jobs':>5} {'kills':>6} {'kill %':>7} {'tail waste h':>13} "
            f"{'killed h':>9} {'res/act med':>12} {'p90':>6} {'idle res h':>11} {'ext':>5} {'shr':>5}")
    print(head)
    for name, r in result.items():
        for label, key in (("no", "without_watch"), ("yes", "with_watch")):
            s = r[key]
            print(f"{name:<24} {label:<5} {s['jobs']:>5} {s['kills']:>6} {100 * s['kill_share']:>6.1f}% "
                  f"{s['tail_waste_hours']:>13.1f} {s['killed_hours']:>9.1f} "
                  f"{s['median_reserved_over_actual']:>12.3f} {s['p90_reserved_over_actual']:>6.3f} "
                  f"{s['idle_reserved_hours']:>11.1f} {s['extended']:>5} {s['shrunk']:>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
