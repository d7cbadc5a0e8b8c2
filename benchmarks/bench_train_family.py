#!/usr/bin/env python3
"""Real training steps of a family of small GPT jobs, measured, and (optionally) predicted.

    python benchmarks/bench_train_family.py --device cuda --out runs.json            # measure
    python benchmarks/bench_train_family.py --runs runs.json --platform NAME [--json] # compare

Measuring trains each job of the family (``family(device)``) for a few steps with the GPT-shaped
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _job(layers: int, hidden: int, heads: int, seq: int, mb: int, m: int, *, vocab: int = 32000,
         attention: str = "flash", activation: str = "gelu", norm: str = "layernorm",
         precision: str = "bf16", dp: int = 1, fp8: str = "") -> dict:
    return {
        "model": {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq, "vocab": vocab,
                  "attention": attention, "activation": activation, "norm": norm, "pos_emb": "rotary",
                  "tied_embeddings": True},
        "layout": {"pp": 1, "tp": 1, "dp": dp, "micro_batch": mb, "micro_batches": m, "zero_stage": 1,
                   "recompute": "none"},
        "run": {"precision": precision, "train_iters": 0, "fp8": fp8},
        "cluster": {"gpus_per_node": dp},
    }


def heldout(device: str) -> list[tuple[str, dict]]:
    """Jobs kept out of every modelling decision: measured once, after the host model was built."""
    if device != "cuda":
        return [("h384 s128 mb2 L3", _job(3, 384, 6, 128, 2, 3, vocab=2048, attention="fused_softmax",
                                            precision="fp32"))]
    return [
        ("L6 h1536 s1024 mb2 m4 flash", _job(6, 1536, 12, 1024, 2, 4)),
        ("L3 h768 s2048 mb1 m8 fused_softmax", _job(3, 768, 12, 2048, 1, 8, attention="fused_softmax")),
        ("L12 h768 s1024 mb4 m2 flash", _job(12, 768, 12, 1024, 4, 2)),
        ("L4 h2560 s2048 mb2 m2 swiglu rmsnorm", _job(4, 2560, 20, 2048, 2, 2, activation="swiglu",
                                                      norm="rmsnorm")),
        ("L2 h5120 s2048 mb2 m4 flash", _job(2, 5120, 40, 2048, 2, 4)),
        ("L24 h512 s512 mb1 m2 flash", _job(24, 512, 8, 512, 1, 2)),
        ("L4 h3072 s4096 mb1 m2 flash", _job(4, 3072, 24, 4096, 1, 2)),
        ("L10 h1024 s2048 mb2 m2 unfused", _job(10, 1024, 8, 2048, 2, 2, attention="unfused")),
        ("L6 h4096 s2048 mb1 m6 flash v50k", _job(6, 4096, 32, 2048, 1, 6, vocab=50257)),
    ]


def fp8_pairs(device: str) -> list[tuple[str, dict]]:
    """Jobs whose linear GEMMs run in FP8 (delayed scaling, calibrate.kernels.Fp8Linear), each
    with its 16-bit twin measured beside it: the FP8 GEMM samples and cast costs checked on real
    steps.  Measured after the FP8 samples were fitted; no modelling choice looked at them."""
    shapes = [("L4 h2048 s2048 mb2", (4, 2048, 16, 2048, 2, 2), {}),
              ("L4 h4096 s2048 mb1 swiglu rmsnorm", (4, 4096, 32, 2048, 1, 2),
               {"activation": "swiglu", "norm": "rmsnorm"}),
              ("L4 h4096 s4096 mb2", (4, 4096, 32, 4096, 2, 2), {}),
              ("L4 h6144 s2048 mb2", (4, 6144, 48, 2048, 2, 2), {}),
              ("L2 h8192 s2048 mb2 m4", (2, 8192, 64, 2048, 2, 4), {}),
              ("L8 h1024 s1024 mb1 m4", (8, 1024, 16, 1024, 1, 4), {})]
    if device != "cuda":
        shapes = [("L2 h256 s64 mb2", (2, 256, 4, 64, 2, 2), {"vocab": 1024})]
    out = []
    for name, args, kw in shapes:
        out.append((f"{name} fp8", _job(*args, fp8="delayed", **kw)))
        out.append((f"{name} bf16", _job(*args, **kw)))
    return out


def family(device: str) -> list[tuple[str, dict]]:
    """The jobs measured on ``device``: host-bound to device-bound, both attention kinds."""
    out: list[tuple[str, dict]] = []
    if device == "cuda":
        for hidden, heads in ((512, 8), (1024, 16), (2048, 16), (4096, 32)):
            for mb in (1, 4):
                for seq in (1024, 2048):
                    out.append((f"h{hidden} s{seq} mb{mb} flash",
                                _job(4, hidden, heads, seq, mb, 2)))
        for hidden, heads in ((1024, 16), (2048, 16)):
            for mb in (1, 2):
                out.append((f"h{hidden} s1024 mb{mb} fused_softmax",
                            _job(4, hidden, heads, 1024, mb, 2, attention="fused_softmax")))
        for hidden, heads in ((1024, 8), (2048, 16), (4096, 32)):
            out.append((f"h{hidden} s2048 mb2 swiglu rmsnorm",
                        _job(4, hidden, heads, 2048, 2, 2, activation="swiglu", norm="rmsnorm")))
        for layers in (2, 8, 16):
            out.append((f"L{layers} h1024 s1024 mb1 flash", _job(layers, 1024, 16, 1024, 1, 4)))
        # Device-bound shapes nearer production: wider layers, more accumulation, longer sequences.
        out += [("L2 h8192 s2048 mb1 flash", _job(2, 8192, 64, 2048, 1, 2)),
                ("L4 h6144 s2048 mb2 flash", _job(4, 6144, 48, 2048, 2, 2)),
                ("L8 h4096 s4096 mb1 flash m4", _job(8, 4096, 32, 4096, 1, 4)),
                ("L8 h2048 s2048 mb8 flash", _job(8, 2048, 16, 2048, 8, 2)),
                ("L6 h3072 s2048 mb2 fused_softmax", _job(6, 3072, 24, 2048, 2, 2, attention="fused_softmax")),
                ("L4 h5120 s4096 mb1 swiglu rmsnorm", _job(4, 5120, 40, 4096, 1, 2, activation="swiglu",
                                                          norm="rmsnorm")),
                ("L8 h4096 s2048 mb4 swiglu rmsnorm m8", _job(8, 4096, 32, 2048, 4, 8, activation="swiglu",
                                                            norm="rmsnorm"))]
        return out
    # CPU: fp32, small enough to run in seconds on two cores.
    for hidden, heads in ((128, 2), (256, 4), (512, 8)):
        for mb in (1, 4):
            out.append((f"h{hidden} s128 mb{mb}", _job(2, hidden, heads, 128, mb, 2, vocab=2048,
                                                         attention="fused_softmax", precision="fp32")))
    return out


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
