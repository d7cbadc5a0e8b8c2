"""What DeepSpeed's engines add to the host's work, fitted from measured step times.

:mod:`calibrate.engine_host` times DeepSpeed's engines and a plain PyTorch loop at layers per stage
{1, 2, 4} × micro-batches {2, 4, 8}; here each is fitted as step time = step + micro-batches ×
(micro_batch + layers per stage × layer), and the engine's share is the difference of the two fits
(``benchmarks/bench_engine_host.py`` prints it; ``scripts/build_platforms.py`` ships the pooled
fit of the committed runs, :func:`engine_prior`, as every platform's ``[host.engines]`` prior).  numpy only: the fit runs
without torch or DeepSpeed.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


_COSTS = ("step_ms", "micro_batch_ms", "layer_ms")


def fit_costs(rows: list[tuple[int, int, float]]) -> dict[str, float]:
    """Least squares of ms = step + m·micro_batch + m·layers·layer over (layers, m, ms) rows."""
    a = np.array([[1.0, m, m * layers] for layers, m, _ in rows])
    b = np.array([ms for _, _, ms in rows])
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    resid = b - a @ coef
    return {"step_ms": float(coef[0]), "micro_batch_ms": float(coef[1]), "layer_ms": float(coef[2]),
            "residual_rms_ms": float(np.sqrt(np.mean(resid ** 2)))}


def pooled_costs(paths: list[Path]) -> dict[str, dict[str, float]]:
    """Per mode, what the engine adds (ms per step, micro-batch, layer), fitted over the fastest
    time of each configuration across the ``--json`` files in ``paths``: other tenants' load only
    ever adds time (calibrate/timing.py keeps the fastest quarter on a CPU for the same reason)."""
    return _pooled(_load(paths))


def _load(paths: list[Path]) -> list[dict]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in paths]


def _pooled(files: list[dict]) -> dict[str, dict[str, float]]:
    """:func:`pooled_costs` of the files' contents."""
    best: dict[str, dict[str, dict[tuple[int, int], float]]] = {}
    runs: dict[str, int] = {}
    for f in files:
        for mode, d in f["modes"].items():
            runs[mode] = runs.get(mode, 0) + 1
            for kind in ("deepspeed", "plain"):
                seen = best.setdefault(mode, {}).setdefault(kind, {})
                for layers, m, ms in d["rows"][kind]:
                    seen[(layers, m)] = min(ms, seen.get((layers, m), math.inf))
    out = {}
    for mode, by_kind in best.items():
        ds, plain = (fit_costs([(*key, ms) for key, ms in by_kind[k].items()]) for k in ("deepspeed", "plain"))
        out[mode] = {k: ds[k] - plain[k] for k in _COSTS}
        out[mode]["runs"] = runs[mode]
        out[mode]["residual_rms_ms"] = max(ds["residual_rms_ms"], plain["residual_rms_ms"])
    return out


# calibrate.engine_host's modes, as the engines of predictor.host.ENGINES: the pipeline engine as
# measured with two stages (what it is for; one stage measured within 0.1 ms of it per micro-batch).
ENGINE_MODES = {"deepspeed_pipeline": "pipe2", "deepspeed": "engine"}


#: Where a GPU node's runs of benchmarks/bench_engine_host.py --device cuda lie, under the folder of
#: the CPU runs: a mode they measured ships from them (a GPU node's host issues the engine's work to
#: the device, with its launches and NCCL), not pooled with the CPU runs.
GPU_RUNS = "h100"

#: A mode no GPU node could run, and the one it ran instead: pipe2's two ranks need two GPUs, so the
#: pipeline engine ships as the GPU node's one stage plus what the second stage adds on the CPU
#: (pipe2 less pipe1 there: the sends, the receives and the stages' barrier).
GPU_PROXY = {"pipe2": "pipe1"}


def _of_mode(files: list[dict], mode: str) -> list[dict]:
    """The runs among ``files`` that measured ``mode`` (their provenance keys), at least one."""
    runs = [d for d in files if mode in d["modes"]]
    if not runs:
        raise ValueError(f"no run of mode {mode!r} among {len(files)} files")
    return runs


def _versions(run: dict) -> str:
    return f"deepspeed {run['deepspeed'].strip()}, torch {run['torch']}"


def _gpu_node(runs: list[dict]) -> str:
    """The GPU node ``--device cuda`` runs were measured on, as a source names it: the first run's
    node and software, and when the runs were taken (the first and last date where they differ)."""
    first = runs[0]
    dates = sorted(r["date"][:16] for r in runs)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return f"the lent {first['gpu']} node's {first['cpu']} ({when}, {_versions(first)})"


def _runs(n: int) -> str:
    return f"{n} run{'s' if n > 1 else ''}"


def engine_prior(folder: Path) -> dict:
    """[host.engines]: what DeepSpeed's engines add to the host's work per step, micro-batch and
    layer, fitted over the ``benchmarks/bench_engine_host.py --json`` runs in ``folder``: a mode a
    GPU node measured (:data:`GPU_RUNS`) from its runs, one it could not from its proxy there plus
    the difference on the CPU (:data:`GPU_PROXY`), else from the CPU runs (ms; a negative cost,
    within the measurement's noise, is taken as none)."""
    cpu_files = _load(sorted(folder.glob("*.json")))
    gpu_files = _load(sorted((folder / GPU_RUNS).glob("*.json")))
    cpu, gpu = _pooled(cpu_files), _pooled(gpu_files)
    out = {}
    for engine, mode in ENGINE_MODES.items():
        proxy = GPU_PROXY.get(mode)
        if mode in gpu:
            adds = gpu[mode]
            where = f"--device cuda --pool ({mode}, {_runs(adds['runs'])}) on {_gpu_node(_of_mode(gpu_files, mode))}"
        elif proxy in gpu and proxy in cpu:
            adds = {k: gpu[proxy][k] + cpu[mode][k] - cpu[proxy][k] for k in _COSTS}
            c = _of_mode(cpu_files, mode)[0]
            where = (f"--device cuda --pool ({proxy}, {_runs(gpu[proxy]['runs'])}) on "
                     f"{_gpu_node(_of_mode(gpu_files, proxy))}, plus {mode} less {proxy} of --pool "
                     f"({_runs(cpu[mode]['runs'])}) on {c['cpu']} ({_versions(c)}; {mode} needs a GPU per rank)")
        else:
            adds = cpu[mode]
            c = _of_mode(cpu_files, mode)[0]
            where = f"--pool ({mode}, {_runs(adds['runs'])}) on {c['cpu']} ({_versions(c)})"
        out[engine] = {k.replace("_ms", "_seconds"): round(max(0.0, adds[k]) * 1e-3, 7) for k in _COSTS}
        out[engine]["source"] = (f"prior: benchmarks/bench_engine_host.py {where}: DeepSpeed less a plain PyTorch "
                                 f"loop at tiny shapes; this platform's own CPU was not measured")
    return out
