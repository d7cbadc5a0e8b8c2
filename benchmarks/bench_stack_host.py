#!/usr/bin/env python3
"""Host costs of a framework's parallelism per layer, on this CPU (one gloo rank, one thread).

    python benchmarks/bench_stack_host.py [--deepspeed | --zero12 | --checkpoint [--checkpoint-layer gpt|block]
                                           | --framework-layer [--dropout P]]
                                          [--device cuda] [--repeats 40] [--rounds 3] [--json OUT]

* per tensor-parallel collective: Megatron-style layers timed with their 4 all-reduces per layer
  and micro-batch (autograd functions around ``all_reduce``) and without; the difference of the
  per-layer slopes / 4 (the function, c10d's call, the backend's enqueue), and the issue time of a
  bare ``all_reduce(async_op=True)``;
* per FSDP layer: FSDP2 ``fully_shard`` per block (reshard after forward) against DDP, the
  difference of the per-layer slopes of forward + backward: FSDP's unshard / reshard /
  reduce-scatter hooks;
* with ``--deepspeed`` (needs the deepspeed package) only: DeepSpeed's engine at ZeRO stage 3
  against stage 0, the difference of the per-layer slopes: ZeRO-3's per-module hooks, around the
  tiny block or, with ``--zero3-layer transformer``, a transformer layer's six modules
  (``--zero3-persistence N``: partition every parameter above N elements);
* with ``--zero12`` (needs the deepspeed package) only: DeepSpeed's engine at ZeRO stages 1 and 2
  against stage 0 around the transformer layer, on micro-batches inside a step: the gradient hooks
  of its ZeRO-1/2 optimizer on every parameter;
* with ``--checkpoint`` only: each activation-checkpointing wrapper's own host work per layer
  (Megatron-core's reentrant function with its RNG tracker, DeepSpeed's
  ``deepspeed.checkpointing.checkpoint``, PyTorch's non-reentrant ``checkpoint_wrapper`` plain and
  with TorchTitan's op-level selective policy, reentrant ``torch.utils.checkpoint`` for
  reference): the per-layer slope of forward + backward with every layer wrapped, less the slope
  without a wrapper, less the slope of one forward (charged apart as ``layer_forward_seconds``),
  over 2, 8 and 16 layers of the GPT-shaped layer ``perf-calibrate host`` times (what ships), or
  with ``--checkpoint-layer block`` of the tiny LayerNorm + MLP block above;
* with ``--framework-layer`` only (needs the megatron-core package): Megatron-core's own
  transformer layer (the local, non-Transformer-Engine spec: Megatron-DeepSpeed's and GPT-NeoX's
  design) against the GPT-shaped reference layer, the difference (and ratio) of their per-layer
  slopes, forward + backward and forward alone, at Megatron's default dropouts (``--dropout``), with the ATen
  operators each dispatches per layer (calibrate/framework_layer.py).

One rank, so that no collective waits for a peer: what is left is the host's issuing, which a GPU
node's CPU pays too (NCCL spends the transfers on the device).  ``--device cuda`` (a GPU node)
times the TP collectives on the GPU through a one-rank NCCL group (c10d's NCCL path as a GPU
node's host issues it), or with ``--checkpoint`` the wrappers around the GPT-shaped layer on the
GPU (DeepSpeed's where the package is installed), or with ``--deepspeed`` / ``--zero12`` the
DeepSpeed engine on the GPU, or with ``--framework-layer`` both layers on the GPU; the device is
waited for between micro-batches, outside the timed span.

Measurement code: calibrate/stack_host.py.  Committed runs: benchmarks/data/stack-host/*.json
(what scripts/build_platforms.py ships as the [host] prior: collective_seconds,
zero3_layer_seconds, checkpoint_layer_seconds); framework-layer-h100-*.json and zero12-h100-*.json:
what predictor.host.MEGATRON_LAYER_EXTRA_SECONDS and DEEPSPEED_ZERO_HOOK_LAYER_SECONDS are the
medians of (the 2-core VM's framework-layer-[0-9].json and zero12-[0-9].json are kept for reference).
A benchmark, not a test: the figures depend on this machine and on what else runs on it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from calibrate.stack_host import (CHECKPOINT_WRAPPERS, checkpoint_costs, deepspeed_zero3_costs,  # noqa: E402
                                  deepspeed_zero12_costs, fsdp_costs, one_rank_group, tp_collective_costs)

LAYERS = (1, 2, 4, 8)
CHECKPOINT_LAYERS = (2, 8, 16)
FRAMEWORK_LAYERS = (1, 2, 4, 8)


def measure(repeats: int, rounds: int, deepspeed: bool = False, checkpoint: bool = False,
            checkpoint_layer: str = "gpt", device: str = "cpu", zero3_layer: str = "block",
            zero3_persistence: int | None = None) -> dict:
    torch.set_num_threads(1)
    one_rank_group(device)
    if checkpoint:
        wrappers = [w for w in CHECKPOINT_WRAPPERS if w != "deepspeed" or _has_deepspeed()]
        return {"checkpoint": checkpoint_costs(CHECKPOINT_LAYERS, repeats, rounds, wrappers, checkpoint_layer,
                                               device)}
    if deepspeed:
        return {"deepspeed_zero3": deepspeed_zero3_costs(LAYERS, repeats, rounds, device, zero3_layer,
                                                         zero3_persistence)}
    if device == "cuda":
        return {"tp": tp_collective_costs(LAYERS, repeats, rounds, device)}
    return {"tp": tp_collective_costs(LAYERS, repeats, rounds), "fsdp": fsdp_costs(LAYERS, repeats, rounds)}


def _has_deepspeed() -> bool:
    import importlib.util
    return importlib.util.find_spec("deepspeed") is not None


def report(r: dict) -> None:
    tp = r["tp"]
    print(f"TP collective: {1e6 * tp['collective_seconds']:.1f} µs per collective (layer slope "
          f"{1e6 * tp['layer_seconds_with']:.0f} µs with, {1e6 * tp['layer_seconds_without']:.0f} µs without "
          f"4 collectives); all_reduce issue alone {1e6 * tp['issue_seconds']:.1f} µs")
    if "fsdp" not in r:
        return
    fs = r["fsdp"]
    print(f"FSDP2 hooks: {1e6 * fs['fsdp_hook_layer_seconds']:.1f} µs per layer and micro-batch (layer slope "
          f"{1e6 * fs['fsdp_layer_seconds']:.0f} µs FSDP2, {1e6 * fs['ddp_layer_seconds']:.0f} µs DDP)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--deepspeed", action="store_true", help="DeepSpeed's ZeRO-3 hooks (only)")
    which.add_argument("--checkpoint", action="store_true",
                       help="the activation-checkpointing wrappers' own host work per layer (only)")
    which.add_argument("--zero12", action="store_true",
                       help="DeepSpeed's ZeRO-1 and ZeRO-2 gradient hooks against stage 0 (only)")
    which.add_argument("--framework-layer", action="store_true",
                       help="Megatron-core's layer against the reference layer (only; needs megatron-core)")
    ap.add_argument("--dropout", type=float, default=None,
                    help="with --framework-layer: Megatron's hidden and attention dropout (default 0.1, its own)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the TP collectives (through a one-rank NCCL group) or, with --checkpoint, "
                         "the wrappers (DeepSpeed's where importable), with --deepspeed / --zero12 DeepSpeed's "
                         "hooks, or with --framework-layer both layers, on the GPU")
    ap.add_argument("--load-note", default="shared 2-core VM; other sessions' work running",
                    help="what else ran on the machine, for the JSON's provenance")
    ap.add_argument("--checkpoint-layer", choices=("gpt", "block"), default="gpt",
                    help="with --checkpoint: the layer wrapped (default: the GPT-shaped layer, what ships)")
    ap.add_argument("--zero3-layer", choices=("block", "transformer"), default="block",
                    help="with --deepspeed: the layer ZeRO-3 partitions (default: the tiny block, what ships; "
                         "transformer: a pre-norm layer's six modules)")
    ap.add_argument("--zero3-persistence", type=int, metavar="ELEMENTS",
                    help="with --deepspeed: stage3_param_persistence_threshold (default: DeepSpeed's, 1e5, "
                         "under which every parameter of these tiny layers stays whole)")
    args = ap.parse_args()
    if args.zero3_persistence is not None and (not args.deepspeed or args.zero3_persistence < 0):
        ap.error("--zero3-persistence: a number of elements >= 0, with --deepspeed")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch sees no CUDA device")
    if args.dropout is not None and (not args.framework_layer or not 0.0 <= args.dropout < 1.0):
        ap.error("--dropout: a probability in [0, 1), with --framework-layer")
    load_at_start = os.getloadavg()[0]
    if args.framework_layer:
        from calibrate.framework_layer import megatron_modules
        try:
            megatron_modules()
        except RuntimeError as e:
            ap.error(f"--framework-layer: {e}")
        r = _framework_layer(args)
        if args.json:
            import megatron.core
            r["provenance"] = _provenance(args, load_at_start, list(FRAMEWORK_LAYERS))
            r["provenance"]["megatron_core"] = megatron.core.__version__
            _write(args.json, r)
        return 0
    if args.zero12:
        if not _has_deepspeed():
            ap.error("--zero12: the deepspeed package is not installed (pip install deepspeed): its ZeRO "
                     "optimizer is what is measured")
        torch.set_num_threads(1)
        one_rank_group(args.device)
        z = deepspeed_zero12_costs(LAYERS, args.repeats, args.rounds, args.device)
        slopes = ", ".join(f"{k} {1e6 * v:.0f}" for k, v in z["layer_seconds"].items())
        print(f"DeepSpeed ZeRO-1 hooks: {1e6 * z['zero1_hook_layer_seconds']:.1f} µs, ZeRO-2 hooks: "
              f"{1e6 * z['zero2_hook_layer_seconds']:.1f} µs per layer and micro-batch "
              f"(layer slopes µs: {slopes})")
        if args.json:
            import deepspeed
            r = {"deepspeed_zero12": z, "provenance": _provenance(args, load_at_start, list(LAYERS))}
            r["provenance"]["deepspeed"] = deepspeed.__version__
            _write(args.json, r)
        return 0
    r = measure(args.repeats, args.rounds, args.deepspeed, args.checkpoint, args.checkpoint_layer, args.device,
                args.zero3_layer, args.zero3_persistence)
    if args.checkpoint:
        c = r["checkpoint"]
        slopes = ", ".join(f"{k} {1e6 * v:.0f}" for k, v in c["layer_seconds"].items())
        for wrapper, seconds in c["checkpoint_layer_seconds"].items():
            print(f"checkpoint wrapper {wrapper}: {1e6 * seconds:.1f} µs per layer and micro-batch")
        print(f"(layer slopes µs: {slopes})")
    elif args.deepspeed:
        z = r["deepspeed_zero3"]
        print(f"DeepSpeed ZeRO-3 hooks: {1e6 * z['zero3_hook_layer_seconds']:.1f} µs per layer and micro-batch "
              f"(layer slope {1e6 * z['zero3_layer_seconds']:.0f} µs stage 3, {1e6 * z['zero0_layer_seconds']:.0f} µs "
              "stage 0)")
    else:
        report(r)
    if args.json:
        r["provenance"] = _provenance(args, load_at_start, list(CHECKPOINT_LAYERS if args.checkpoint else LAYERS))
        if args.deepspeed or (args.checkpoint and _has_deepspeed()):
            import deepspeed
            r["provenance"]["deepspeed"] = deepspeed.__version__
        _write(args.json, r)
    return 0


def _framework_layer(args: argparse.Namespace) -> dict:
    from calibrate.framework_layer import MEGATRON_DROPOUT, framework_layer_costs, operator_counts
    torch.set_num_threads(1)
    dropout = MEGATRON_DROPOUT if args.dropout is None else args.dropout
    r = framework_layer_costs(FRAMEWORK_LAYERS, args.repeats, args.rounds, args.device, dropout)
    r["aten_operators_per_layer"] = operator_counts(args.device, dropout)
    s = r["layer_seconds"]
    print(f"Megatron-core layer (local spec, dropout {dropout}) against the reference layer, per layer and "
          f"micro-batch: forward + backward {1e6 * s['megatron']:.0f} µs against {1e6 * s['reference']:.0f} µs, "
          f"x{r['ratio']:.3f}; forward {1e6 * s['megatron_forward']:.0f} µs against "
          f"{1e6 * s['reference_forward']:.0f} µs, x{r['forward_ratio']:.3f}")
    ops = r["aten_operators_per_layer"]
    print(f"ATen operators per layer, forward + backward: {ops['megatron']} against {ops['reference']}")
    return {"framework_layer": r}


def _provenance(args: argparse.Namespace, load_at_start: float, layers: list[int]) -> dict:
    out = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
        "ranks": 1, "threads_per_rank": 1, "backend": "nccl" if args.device == "cuda" else "gloo",
        "repeats": args.repeats, "rounds": args.rounds, "layers": layers,
        "load": f"{args.load_note}; fastest quarter of interleaved repeats",
        "load_average_1m": {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)}}
    if args.device == "cuda":
        out.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    return out


def _write(path: Path, r: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(r, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
