#!/usr/bin/env python3
"""What DeepSpeed's engines cost the host beyond the work they issue, measured on this CPU.

    pip install deepspeed          # DS_BUILD_OPS=0: no compiled ops are needed
    python benchmarks/bench_engine_host.py [--steps 40] [--json OUT]
    python benchmarks/bench_engine_host.py --pool benchmarks/data/engine-host/*.json   # fit only

For each mode (``pipe1``: DeepSpeed's PipelineEngine on one stage; ``pipe2``: on two gloo ranks;
``engine``: DeepSpeedEngine at pp = 1) it times the same tiny blocks under DeepSpeed and under a
plain PyTorch loop, fits step time = step + micro-batches × (micro_batch + layers per stage ×
layer) to each, and prints the three costs and their difference: what the engine adds.  One run's
split between the per-layer and per-micro-batch costs moves by ~0.1 ms from run to run on a shared
machine; ``--pool`` fits several runs together, each configuration at its fastest (what
scripts/build_platforms.py ships as every platform's ``[host.engines]`` prior).

Measurement code: calibrate/engine_host.py (the fit: calibrate/engine_costs.py).  Committed runs:
benchmarks/data/engine-host/*.json.  A benchmark, not a test: the figures depend on this machine
and on what else runs on it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from calibrate.engine_costs import pooled_costs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--modes", default="pipe1,pipe2,engine", help="comma-separated, of pipe1, pipe2, engine")
    ap.add_argument("--json", type=Path, help="also write the measurements and fits here")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the engines and the plain loop on a GPU node's GPU (NCCL; pipe2 needs two "
                         "GPUs), each step waited for")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="JSON",
                    help="measure nothing: fit the rows of these --json files together and print them")
    args = ap.parse_args(argv)
    if args.pool:
        print("what the engine adds, ms: per step / micro-batch / layer")
        for mode, c in pooled_costs(args.pool).items():
            print(f"  {mode:<7} {c['step_ms']:7.3f} {c['micro_batch_ms']:7.3f} {c['layer_ms']:7.3f}"
                  f"   (fastest of {c['runs']} runs per configuration; fit residual rms "
                  f"{c['residual_rms_ms']:.3f})")
        return 0
    # DeepSpeed picks its accelerator once, at import: the device asked for, unless set already.
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    try:
        import deepspeed
        import torch
    except ImportError:
        print("bench_engine_host: needs torch and DeepSpeed (pip install deepspeed; DS_BUILD_OPS=0 "
              "builds nothing)", file=sys.stderr)
        return 2
    # torch's: --pool runs without it
    from calibrate.engine_host import MODES, check_device, cpu_name, measure_mode
    modes = [s.strip() for s in args.modes.split(",") if s.strip()]
    bad = [s for s in modes if s not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}; known: {', '.join(MODES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch sees no CUDA device")
    for mode in modes:
        try:
            check_device(mode, args.device)
        except ValueError as e:
            ap.error(f"--device {args.device}: {e}")
    out: dict = {"cpu": cpu_name(), "torch": torch.__version__,
                 "deepspeed": deepspeed.__version__, "modes": {}}
    if args.device == "cuda":
        out.update(device="cuda", gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    print(f"{out['cpu']}, torch {out['torch']}, deepspeed {out['deepspeed']}; ms per step, "
          f"fastest quarter of {args.steps}")
    for mode in modes:
        def row(layers: int, m: int, ds_ms: float, plain_ms: float, mode: str = mode) -> None:
            print(f"  {mode:<7} layers/stage {layers}  micro-batches {m}:  deepspeed {ds_ms:7.3f}"
                  f"  plain {plain_ms:7.3f}", flush=True)
        r = out["modes"][mode] = measure_mode(mode, args.steps, args.warmup, row, args.device)
        fits, added = r["fits"], r["engine_adds"]
        print(f"{mode}: per step / micro-batch / layer (ms)")
        for k in ("deepspeed", "plain"):
            f = fits[k]
            print(f"  {k:<10} {f['step_ms']:7.3f} {f['micro_batch_ms']:7.3f} {f['layer_ms']:7.3f}"
                  f"   (fit residual rms {f['residual_rms_ms']:.3f})")
        print(f"  {'adds':<10} {added['step_ms']:7.3f} {added['micro_batch_ms']:7.3f} {added['layer_ms']:7.3f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
