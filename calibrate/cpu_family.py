"""The CPU ground-truth family: small GPT jobs trained for real on this CPU, their runs files, and
their comparison with predictions.

``benchmarks/bench_cpu_family.py`` measures these jobs (:mod:`calibrate.gpt_model`, and the stacks
of :func:`calibrate.stacks.measure_stack`) and writes what it measured with :func:`write_runs`; the
``[[run]]`` files it writes are what ``perf-calibrate validate --runs`` reads.  pp and tp are not
in the family: calibrate/gpt_model.py runs pp = tp = 1 only.  Torch-free.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from . import stack_runs
from .errors import CalibrationError

# The calibration measures a "GPU" of this CPU as one rank's share of the cores (calibrate/runner.py:
# cores / 2 local ranks), so every run, dp 1 included, gives each rank that share.
THREADS_PER_RANK = max(1, (os.cpu_count() or 2) // 2)

#: The software stacks the family trains under (:func:`calibrate.stacks.measure_stack`).
#: The stacks the CPU family is trained under; each job is predicted as its launch reveals it
#: (calibrate/stack_runs.py: TorchTitan's data parallelism is FSDP2, ZeRO-3).
STACKS = ("pytorch", "deepspeed", "fsdp")
#: The stacks :func:`stack_family_zero2` is trained under: DeepSpeed's engine at ZeRO-1 and ZeRO-2.
ZERO2_STACKS = ("deepspeed", "deepspeed_zero2")


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
    """The run's name in the runs files, e.g. ``dp2 L4 h256 mb2`` (`` full`` when recomputed)."""
    m, lay = j["model"], j["layout"]
    rc = " full" if lay["recompute"] == "full" else ""
    # The families' jobs run 2 micro-batches unless they say otherwise.
    acc = f" m{lay['micro_batches']}" if lay["micro_batches"] != 2 else ""
    return f"dp{lay['dp']} L{m['layers']} h{m['hidden']} mb{lay['micro_batch']}{acc}{rc}"


def family() -> list[dict]:
    """dp 1 and 2, micro-batch 1–8, hidden 128–1024, recompute none and full (seconds per step
    at most ~1 s on two cores, so the whole family measures in a few minutes)."""
    return [
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


def stack_family() -> list[dict]:
    """The jobs trained under each of :data:`STACKS`: dp 1 and 2, micro-batch 1-8, hidden 128-512,
    2 and 4 layers, recompute none and full (a few seconds each)."""
    return [
        job(2, 128, 1), job(2, 128, 8), job(2, 256, 2), job(2, 256, 4), job(4, 256, 2), job(2, 512, 1),
        job(2, 512, 4), job(4, 128, 4), job(2, 256, 4, recompute="full"),
        job(2, 128, 1, dp=2), job(2, 128, 4, dp=2), job(2, 256, 8, dp=2), job(4, 256, 2, dp=2),
        job(2, 512, 2, dp=2), job(4, 128, 2, dp=2), job(2, 512, 2, dp=2, recompute="full"),
    ]


def stack_family_dp1() -> list[dict]:
    """One rank only (no two ranks slowing each other on the shared cores), 14 shapes, so that a
    kind has 10-20 runs of one data-parallel size."""
    return [job(2, 128, 1), job(2, 128, 2), job(2, 128, 4), job(2, 128, 8), job(2, 256, 1), job(2, 256, 2),
            job(2, 256, 4), job(4, 128, 2), job(4, 128, 4), job(4, 256, 1), job(4, 256, 2), job(2, 512, 1),
            job(2, 512, 2), job(3, 384, 2)]


def stack_family_zero2() -> list[dict]:
    """Two ranks, 1 to 8 micro-batches of a micro-batch each (or two), so that the gradient
    reduction is a large share of a step: DeepSpeed's ZeRO-1 reduces once per step, its ZeRO-2 once
    per micro-batch (trained under "deepspeed" and "deepspeed_zero2")."""
    return [job(2, 512, 1, dp=2, m=1), job(2, 512, 1, dp=2, m=4), job(2, 512, 1, dp=2, m=8),
            job(2, 256, 2, dp=2, m=4), job(2, 256, 2, dp=2, m=8), job(2, 1024, 1, dp=2, m=4),
            job(4, 256, 1, dp=2, m=8)]


def job_named(name: str) -> dict:
    """The :func:`family` job called ``name``; an error listing the names if there is none."""
    jobs = {name_of(j): j for j in family()}
    if name not in jobs:
        raise CalibrationError(f"unknown job {name!r}; one of: {', '.join(jobs)}")
    return jobs[name]


def stack_job(j: dict, stack: str) -> dict:
    """The job dict ``j`` as ``stack`` (one of :data:`STACKS` or :data:`ZERO2_STACKS`) runs it,
    and is predicted."""
    if stack not in STACKS + ZERO2_STACKS:
        raise CalibrationError(f"stack {stack!r}: one of {', '.join(STACKS + ZERO2_STACKS[1:])}")
    return stack_runs.stack_job(j, stack)


# ----------------------------------------------------------------------------- runs files

def runs_toml(runs: list[dict], header: str) -> str:
    """``runs`` as a ``[[run]]`` file (name, source, measured seconds, job), after ``header``."""
    from predictor.samples import dump_toml

    toml_runs = [{"name": r["name"], "source": r["source"],
                  "measured_iteration_seconds": r["measured_iteration_seconds"], "job": r["job"]}
                 for r in runs]
    return header + dump_toml({"run": toml_runs})


def write_runs(runs: list[dict], data: Path) -> None:
    """``data``/runs.toml (the validate format) and ``data``/runs.json (everything recorded)."""
    data.mkdir(parents=True, exist_ok=True)
    (data / "runs.toml").write_text(
        runs_toml(runs, "# Real CPU training steps measured by benchmarks/bench_cpu_family.py "
                        "(perf-calibrate validate --runs reads this)\n"), encoding="utf-8")
    (data / "runs.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")


def read_runs(path: Path) -> list[dict]:
    """Runs from runs.toml (via the validate parser) or runs.json; load averages from runs.json."""
    if path.suffix == ".json":
        return json.loads(path.read_text())
    from .validate import load_runs

    loads = {}
    side = path.with_suffix(".json")
    if side.exists():
        loads = {d["name"]: (d.get("load"), d.get("others_cores")) for d in json.loads(side.read_text())}
    return [{"name": r.name, "job": r.job.to_dict(), "measured_iteration_seconds": r.measured_iteration_seconds,
             "load": loads.get(r.name, (None, None))[0], "others_cores": loads.get(r.name, (None, None))[1]}
            for r in load_runs(path)]


# ----------------------------------------------------------------------------- predictions

def resolve_platform(where: str, keep: list) -> Any:
    """A platform directory or name; a sample store (samples.toml) is fitted into a temporary
    directory, which lives as long as ``keep`` holds it."""
    from predictor import load_platform

    p = Path(where)
    if (p / "samples.toml").exists():
        from .fitting import fit_platform

        tmp = tempfile.TemporaryDirectory(prefix="perfcast-cpufam-")
        keep.append(tmp)
        fit_platform(p, Path(tmp.name) / "platform", name="cpu-family", overwrite=True)
        return load_platform(Path(tmp.name) / "platform", reload=True)
    return load_platform(where, reload=True)


def zero2_ratio_rows(runs: list[dict], plat: Any) -> list[dict]:
    """For each job of :func:`stack_family_zero2` measured under both :data:`ZERO2_STACKS`, ZeRO-2's
    iteration over ZeRO-1's, measured (each run's fastest, where ``runs`` holds several passes) and
    predicted: what DeepSpeed's per-micro-batch reduction and gradient hooks add, whatever the
    kind's offset the two share."""
    from predictor import Predictor, TrainingJob

    fastest: dict[str, float] = {}
    jobs: dict[str, dict] = {}
    for r in runs:
        name = r["name"]
        fastest[name] = min(fastest.get(name, math.inf), float(r["measured_iteration_seconds"]))
        jobs.setdefault(name, r["job"])
    one, two = (f"{stack} " for stack in ZERO2_STACKS)
    predictor = Predictor(plat)
    rows = []
    for name in jobs:
        if not name.startswith(two) or one + name[len(two):] not in jobs:
            continue
        base = one + name[len(two):]
        pred = [predictor.predict(TrainingJob.from_dict(jobs[n])).iteration_seconds for n in (name, base)]
        measured, predicted = fastest[name] / fastest[base], pred[0] / pred[1]
        rows.append({"name": name[len(two):], "measured_ratio": measured, "predicted_ratio": predicted,
                     "error": predicted / measured - 1.0})
    return rows


def compare_rows(runs: list[dict], plat: Any) -> list[dict]:
    """Each run's prediction next to its measurement: error, interval, coverage, breakdown."""
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
