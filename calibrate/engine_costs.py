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
    best: dict[str, dict[str, dict[tuple[int, int], float]]] = {}
    runs: dict[str, int] = {}
    for path in paths:
        for mode, d in json.loads(path.read_text(encoding="utf-8"))["modes"].items():
            runs[mode] = runs.get(mode, 0) + 1
            for kind in ("deepspeed", "plain"):
                seen = best.setdefault(mode, {}).setdefault(kind, {})
                for layers, m, ms in d["rows"][kind]:
                    seen[(layers, m)] = min(ms, seen.get((layers, m), math.inf))
    out = {}
    for mode, by_kind in best.items():
        ds, plain = (fit_costs([(*key, ms) for key, ms in by_kind[k].items()]) for k in ("deepspeed", "plain"))
        out[mode] = {k: ds[k] - plain[k] for k in ("step_ms", "micro_batch_ms", "layer_ms")}
        out[mode]["runs"] = runs[mode]
        out[mode]["residual_rms_ms"] = max(ds["residual_rms_ms"], plain["residual_rms_ms"])
    return out


# calibrate.engine_host's modes, as the engines of predictor.host.ENGINES: the pipeline engine as
# measured with two stages (what it is for; one stage measured within 0.1 ms of it per micro-batch).
ENGINE_MODES = {"deepspeed_pipeline": "pipe2", "deepspeed": "engine"}


#: Where a GPU node's runs of benchmarks/bench_engine_host.py --device cuda lie, under the folder of
#: the CPU runs: a mode they measured ships from them (a GPU node's host issues the engine's work to
#: the device, with its launches and NCCL), the others from the CPU runs (pipe2's two ranks need two
#: GPUs, which no lease has had).
GPU_RUNS = "h100"


def engine_prior(folder: Path) -> dict:
    """[host.engines]: what DeepSpeed's engines add to the host's work per step, micro-batch and
    layer, fitted over the ``benchmarks/bench_engine_host.py --json`` runs in ``folder`` (those of a
    GPU node, :data:`GPU_RUNS`, for the modes they measured; ms; a negative difference, within the
    measurement's noise, is taken as none)."""
    cpu_paths = sorted(folder.glob("*.json"))
    gpu_paths = sorted((folder / GPU_RUNS).glob("*.json"))
    cpu, gpu = pooled_costs(cpu_paths), pooled_costs(gpu_paths)
    out = {}
    for engine, mode in ENGINE_MODES.items():
        on_gpu = mode in gpu
        adds = gpu[mode] if on_gpu else cpu[mode]
        meta = json.loads(next(p for p in (gpu_paths if on_gpu else cpu_paths)
                               if mode in json.loads(p.read_text(encoding="utf-8"))["modes"]).read_text(encoding="utf-8"))
        out[engine] = {k: round(max(0.0, adds[k.replace("_seconds", "_ms")]) * 1e-3, 7)
                       for k in ("step_seconds", "micro_batch_seconds", "layer_seconds")}
        where = (f"--device cuda --pool ({mode}, {adds['runs']} run{'s' if adds['runs'] > 1 else ''}) on the lent "
                 f"{meta['gpu']} node's {meta['cpu']} ({meta['date'][:16]}, " if on_gpu else
                 f"--pool ({mode}, {adds['runs']} runs) on {meta['cpu']} (")
        out[engine]["source"] = (f"prior: benchmarks/bench_engine_host.py {where}deepspeed {meta['deepspeed'].strip()}, "
                                 f"torch {meta['torch']}): DeepSpeed less a plain PyTorch loop at tiny shapes; this "
                                 f"platform's own CPU was not measured")
    return out
