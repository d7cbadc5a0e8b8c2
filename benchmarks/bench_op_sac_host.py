#!/usr/bin/env python3
"""TorchTitan's op-level SAC under FSDP2 against FSDP2 alone, on this CPU: its cost per step, per
micro-batch and per layer and micro-batch (least squares over depths and micro-batch counts).

    python benchmarks/bench_op_sac_host.py [--rounds 3] [--steps 7]

One gloo rank, one thread, the calibration's GPT-shaped module (calibrate/stacks.py) at a tiny
shape, so that the host's work is what is timed.  Configurations are interleaved round by round and
each keeps its fastest round's median step.  On the lent H100 the host-bound op-SAC steps paid a
cost per micro-batch that no layer count explained (docs/modelling.md §2); this says whether the
CPU sees one.  A benchmark: its figures depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist

from calibrate.collectives import free_port
from calibrate.engine_host import cpu_name
from calibrate.gpt_model import token_batches
from calibrate.stacks import stack_step
from calibrate.train_family import job_dict
from predictor.job import TrainingJob

DEPTHS = (2, 8)
MICRO_BATCHES = (1, 4)


def step_seconds(layers: int, micro_batches: int, recompute: str, steps: int) -> float:
    """Median step time of FSDP2 (with ``recompute``) over ``steps`` steps after two warm-ups."""
    jd = job_dict(layers, 128, 4, 64, 1, micro_batches, vocab=512, precision="fp32")
    jd["layout"]["recompute"] = recompute
    job = TrainingJob.from_dict(jd)
    st = stack_step("fsdp", job, token_batches(job, "cpu"), device="cpu")
    for _ in range(2):
        st.gpt.begin_step()
        st.run()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        st.gpt.begin_step()
        st.run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    configs = [(n, m, r) for n in DEPTHS for m in MICRO_BATCHES for r in ("none", "selective")]
    best: dict[tuple, float] = {}
    for _ in range(args.rounds):
        for c in configs:
            s = step_seconds(*c, steps=args.steps)
            best[c] = min(best.get(c, s), s)
    print(f"FSDP2 with and without op-level SAC, one gloo rank, {cpu_name()}, torch {torch.__version__}, "
          f"fastest of {args.rounds} interleaved rounds")
    for (n, m, r), s in sorted(best.items()):
        print(f"  layers {n:2}  micro-batches {m}  recompute {r:9}  {1e3 * s:8.2f} ms")
    fits = {}
    for r in ("none", "selective"):
        rows = [(n, m, s) for (n, m, rr), s in best.items() if rr == r]
        x = np.array([[1.0, m, n * m] for n, m, _ in rows])
        fits[r] = np.linalg.lstsq(x, np.array([s for _, _, s in rows]), rcond=None)[0]
    for name, j in (("per step", 0), ("per micro-batch", 1), ("per layer and micro-batch", 2)):
        print(f"op-SAC adds {1e3 * (fits['selective'][j] - fits['none'][j]):+7.3f} ms {name}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
