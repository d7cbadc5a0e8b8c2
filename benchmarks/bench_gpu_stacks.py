#!/usr/bin/env python3
"""One lease of a GPU: attention kernels at long sequences, and real training steps under stacks.

    python benchmarks/bench_gpu_stacks.py --device cuda --out DIR [--budget-s 420]
    python benchmarks/bench_gpu_stacks.py --device cpu --out DIR --quick          # smoke run
    python benchmarks/bench_gpu_stacks.py --compare [--platform dgx-h100]         # predicted vs measured
    python benchmarks/bench_gpu_stacks.py --compare --files DIR/heldout-stacks*.json  # ... on held-out steps
    python benchmarks/bench_gpu_stacks.py --device cuda --out DIR --parts stacks \
        --stacks fsdp1,fsdp+selective --largest-first --name stacks4                # chosen stacks only
    python benchmarks/bench_gpu_stacks.py --device cuda --out DIR --parts stacks --jobs host-series \
        --stacks fsdp,fsdp+full,ddp --rounds 2 --interleave --sdpa-backend flash     # other jobs, pinned SDPA

Writes, as each part ends (a killed run keeps the finished parts):

* ``attention.json``: each attention kernel the device has (calibrate/attention.py's survey, plus
  ``flex``: ``torch.nn.attention.flex_attention`` compiled by Inductor into a Triton kernel, with a
  causal block mask) timed causal, b = 1, 32 heads of 128, bf16, at 2k-32k tokens: forward and
  backward milliseconds (CUDA events, median of the repeats, fresh random inputs per length);
  ``math`` only to 8k (its score matrix grows as s²).
* ``stacks.json``: the 33 jobs of calibrate/train_family.py's family trained under each stack:
  ``pytorch`` (calibrate.gpt_model's own loop, as train-family.json measured it), ``sdpa_efficient``
  (the same loop with SDPA pinned to its memory-efficient kernel: flash-attention jobs only),
  ``ddp`` and ``fsdp`` (calibrate/stacks.py on a one-rank NCCL group), each with its step seconds
  and peak allocated bytes (``torch.cuda.max_memory_allocated``) and what earlier jobs had left
  allocated when it started (``start_allocated_bytes``); ``--stacks`` picks others, ``fsdp1``
  (Composer's FSDP1) among them, and ``STACK+RECOMPUTE`` runs every job with that
  ``layout.recompute`` (``fsdp+selective``: TorchTitan's op-level checkpointing);
* ``compile.json``: eager against ``torch.compile`` of the same module for a few small jobs.

Every file carries the device, date and software.  A benchmark: its figures depend on the machine.

``--compare`` predicts every committed step (benchmarks/data/h100-lent/stacks, each job as its
stack's launch reveals it: benchmarks/gpu_stacks_runs.py) on a platform, no site fit, and prints
each stack's error and interval coverage, and FSDP2's on its device-bound steps (models of 0.75 B
parameters or more); ``--files`` predicts those files' steps instead (the held-out ones:
``--jobs heldout``, calibrate/stack_files.HELDOUT_STEP_FILES).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

from calibrate.attention_timing import HEAD_DIM, HEADS, MATH_MAX_SEQ, SEQS, flex_kernel, time_attention
from calibrate.engine_host import cpu_name
from calibrate.errors import CalibrationError
from calibrate.stack_runs import split_label
from calibrate.stack_steps import SDPA_BACKENDS, one_stack
from calibrate.stacks import MODULE_STACKS, check_recompute
from calibrate.train_family import JOB_SETS, job_set, quick_jobs



def provenance(device: str) -> dict:
    info = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
            "python": platform.python_version(), "host_threads": os.cpu_count(), "device": device,
            # host-bound steps depend on the host CPU, and two leases may differ
            "host_cpu": cpu_name()}
    try:
        # the kernel an unpinned flash-attention job runs (torch's own choice at a small causal shape)
        from calibrate.attention import survey
        info["sdpa_default"] = survey(device, torch.bfloat16).default
    except Exception:  # noqa: BLE001 - provenance only; a survey that fails says nothing
        info["sdpa_default"] = ""
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version()
        info.update(gpu=p.name, sms=p.multi_processor_count, gpu_memory_bytes=p.total_memory,
                    cuda=torch.version.cuda,
                    nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
    return info


def write(out: Path, name: str, payload: dict) -> None:
    (out / name).write_text(json.dumps(payload, indent=1) + "\n")


class Clock:
    def __init__(self, budget_s: float):
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


def attention_part(device: str, seqs: list[int], clock: Clock, out: Path, repeats: int) -> None:
    from calibrate.attention import _sdpa, survey
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    kernels = survey(device, torch.bfloat16 if device == "cuda" else torch.float32)
    impls = dict(kernels.available)
    impls["math"] = _sdpa("MATH")
    rows: list[dict] = []
    result = {"provenance": provenance(device), "shape": {"b": 1, "heads": HEADS, "d": HEAD_DIM, "causal": True,
                                                          "dtype": str(dtype)},
              "sdpa_default": kernels.default, "missing": kernels.missing, "rows": rows}
    order = [k for k in impls if k != "math"] + ["math", "flex"]
    for impl in order:
        for seq in seqs:
            if impl == "math" and seq > MATH_MAX_SEQ:
                continue
            if clock.left() < 20:
                rows.append({"impl": impl, "seq": seq, "error": "out of time"})
                continue
            try:
                if impl == "flex":
                    impls.setdefault("flex", flex_kernel(device))
                t0 = time.perf_counter()
                fms, bms = time_attention(impls[impl], seq, device, dtype, repeats)
                rows.append({"impl": impl, "seq": seq, "fwd_ms": fms, "bwd_ms": bms,
                             "wall_s": time.perf_counter() - t0})
                print(f"attention {impl:15} {seq:6} fwd {fms:8.3f} ms bwd {bms:8.3f} ms", flush=True)
            except Exception as exc:  # noqa: BLE001 - a kernel that fails is recorded, not fatal
                rows.append({"impl": impl, "seq": seq, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                print(f"attention {impl} {seq}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
            write(out, "attention.json", result)


def stacks_part(device: str, jobs: list, stacks: list[str], clock: Clock, out: Path, name: str,
                steps: int, warmup: int, rounds: int = 1, interleave: bool = False,
                sdpa_backend: str = "") -> None:
    rows: list[dict] = []
    result = {"provenance": provenance(device), "steps": steps, "warmup": warmup, "rows": rows}
    # Interleaved (each job under every stack in turn, round after round) so that a drift of the
    # host or device across the call falls on every stack alike.
    if interleave:
        order = [(r, w, j) for r in range(rounds) for j in jobs for w in stacks]
    else:
        order = [(r, w, j) for r in range(rounds) for w in stacks for j in jobs]
    for round_index, wanted, (job_name, job) in order:
        # "fsdp+selective": the stack with every job's layout.recompute set so (the row keeps it).
        stack, recompute, preserve_rng_state = split_label(wanted)
        if stack == "sdpa_efficient" and job["model"]["attention"] != "flash":
            continue
        if recompute:
            job = {**job, "layout": {**job["layout"], "recompute": recompute}}
        tag = {"round": round_index} if rounds > 1 else {}
        if clock.left() < 15:
            rows.append({"stack": stack, "name": job_name, "job": job, **tag, "error": "out of time"})
            write(out, f"{name}.json", result)
            continue
        t0 = time.perf_counter()
        try:
            row = one_stack(stack, job, device, steps, warmup, sdpa_backend, preserve_rng_state=preserve_rng_state)
            rows.append({"stack": stack, "name": job_name, "job": job, **tag, **row,
                         "wall_s": time.perf_counter() - t0})
            print(f"{name} {wanted:15} {job_name:36} {1e3 * row['measured_iteration_seconds']:9.2f} ms "
                  f"peak {row.get('peak_allocated_bytes', 0) / 2**30:6.2f} GiB "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - recorded; the next job goes on
            rows.append({"stack": stack, "name": job_name, "job": job, **tag,
                         "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"{name} {wanted} {job_name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            traceback.print_exc(limit=3)
        write(out, f"{name}.json", result)


def compare(platform: str, files: list[Path] | None = None) -> int:
    """Each stack's committed steps (or those of ``files``) against the platform's predictions
    (no site fit)."""
    from calibrate.stack_files import step_files
    from calibrate.stack_runs import predicted_against_measured

    print(f"{'stack':<16}{'runs':>5}{'MAPE':>8}{'bias':>8}{'min':>8}{'max':>8}{'covered':>9}   ({platform}, no fit)")
    for stack, checks in predicted_against_measured(platform, files or step_files()).items():
        errs = [c.error for c in checks]
        covered = sum(c.covered for c in checks)
        print(f"{stack:<16}{len(errs):>5}{100 * statistics.mean(map(abs, errs)):>7.1f}%"
              f"{100 * statistics.mean(errs):>+7.1f}%{100 * min(errs):>+7.1f}%{100 * max(errs):>+7.1f}%"
              f"{covered:>5}/{len(checks)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", action="store_true", help="predicted vs measured steps per stack")
    ap.add_argument("--files", type=Path, nargs="+",
                    help="--compare these stacks files (held-out steps) instead of the committed family's")
    ap.add_argument("--platform", default="dgx-h100")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--parts", default="attention,stacks,compile")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a CPU smoke run)")
    ap.add_argument("--stacks", default="pytorch,sdpa_efficient,fsdp,ddp",
                    help="the stacks part's stacks, in order; STACK+RECOMPUTE sets layout.recompute "
                         "(fsdp+selective: TorchTitan's op-level checkpointing); STACK+full:norng "
                         "checkpoints without keeping RNG states (TorchTitan's full AC)")
    ap.add_argument("--name", default="stacks", help="the stacks part's file: NAME.json")
    ap.add_argument("--largest-first", action="store_true",
                    help="the stacks part runs the family's jobs largest first")
    ap.add_argument("--jobs", choices=JOB_SETS, default="family",
                    help="the stacks part's jobs: the 33-job family; host-series (hidden 1,024 at 2, 8 "
                         "and 16 layers, 1 and 4 micro-batches: per-layer and per-micro-batch host "
                         "costs); long-seq (2k-32k tokens); heldout (jobs no modelling choice saw)")
    ap.add_argument("--sdpa-backend", choices=tuple(SDPA_BACKENDS), default="",
                    help="pin SDPA to this backend for every job of the stacks part (rows say "
                         "sdpa_backend); unpinned, SDPA picks (provenance's sdpa_default)")
    ap.add_argument("--rounds", type=int, default=1, help="run every job under every stack this many times")
    ap.add_argument("--interleave", action="store_true",
                    help="each job under every stack in turn (a drift falls on all stacks alike)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1")
    wanted = [w for w in args.stacks.split(",") if w]
    for w in wanted:
        # Checked before any device time is spent: a typo would cost every job an error row.
        try:
            stack, recompute, _ = split_label(w)
        except CalibrationError as exc:
            ap.error(f"--stacks {exc}")
        if stack not in ("pytorch", "sdpa_efficient", *MODULE_STACKS):
            ap.error(f"--stacks {w}: {stack!r} is not one of pytorch, sdpa_efficient, {', '.join(MODULE_STACKS)}")
        if recompute and stack not in MODULE_STACKS:
            ap.error(f"--stacks {w}: +RECOMPUTE runs on the module stacks ({', '.join(MODULE_STACKS)}) only")
        try:
            check_recompute(stack, recompute or "none")
        except CalibrationError as exc:
            ap.error(f"--stacks {w}: {exc}")
    if args.compare:
        return compare(args.platform, args.files)
    if args.out is None:
        ap.error("--out DIR is needed to measure")
    args.out.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.budget_s)
    import warnings
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)

    parts = args.parts.split(",")
    if args.quick:
        seqs = [128, 256]
        jobs = quick_jobs()
    else:
        seqs = list(SEQS)
        jobs = job_set(args.jobs, args.device)
    if "stacks" in parts or "compile" in parts:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        from calibrate.collectives import free_port
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        if args.device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    if "attention" in parts:
        attention_part(args.device, seqs, Clock(min(clock.left(), 0.30 * args.budget_s)), args.out,
                       repeats=3 if args.quick else 10)
    if "stacks" in parts:
        if args.largest_first:
            from predictor import TrainingJob
            from predictor.recipe import total_parameters

            def parameter_tokens(item: tuple) -> float:
                # parameters x tokens per step: what a step's work grows with
                m = TrainingJob.from_dict(item[1]).model
                lay = item[1]["layout"]
                return total_parameters(m) * m.seq_len * lay["micro_batch"] * lay["micro_batches"]
            jobs = sorted(jobs, key=parameter_tokens, reverse=True)
        stacks_part(args.device, jobs, wanted,
                    Clock(clock.left() - (0.2 * args.budget_s if "compile" in parts else 0)),
                    args.out, args.name, steps=4, warmup=2, rounds=args.rounds, interleave=args.interleave,
                    sdpa_backend=args.sdpa_backend)
    if "compile" in parts:
        small = [j for j in jobs if j[0] in ("L2 h1024 s1024 mb1 flash", "h1024 s2048 mb4 flash",
                                             "h2048 s2048 mb4 flash", "L8 h1024 s1024 mb1 flash")] or jobs[:1]
        stacks_part(args.device, small, ["ddp", "compile"], clock, args.out, "compile", steps=4, warmup=2)
    print(f"done with {clock.left():.0f} s of the budget left", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
