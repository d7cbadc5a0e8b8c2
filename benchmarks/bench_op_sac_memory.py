#!/usr/bin/env python3
"""What TorchTitan's op-level selective checkpointing keeps of a Llama layer, counted on this CPU
against predictor.memory.op_sac_layer_bytes.

    python benchmarks/bench_op_sac_memory.py [--json OUT]

A Llama-shaped layer in bf16 (RMSNorm, separate wq / wk / wv / wo, grouped K/V repeated to the
query heads, causal SDPA, a SwiGLU or GELU MLP) runs its forward under ``torch.utils.checkpoint``
with the save policy of ``torchtitan/distributed/activation_checkpoint.py`` (``selective_ac_option
= "op"``): save the outputs of matmuls and of fused attention, except every second matmul of the
layer; recompute the rest.  On the CPU the fused attention operator is
``_scaled_dot_product_flash_attention_for_cpu`` (the CUDA names are in TorchTitan's list).  The
bytes kept are the tensors in the checkpoint's cache after the forward (its
``create_selective_checkpoint_contexts`` storage), plus the layer's input, which the checkpoint
holds to rerun the layer.  Deterministic: it counts bytes, not time.

Measurement code: calibrate/op_sac.py (the policy is the one the checkpoint wrappers' host cost is
timed with, calibrate/stack_host.py).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, astuple
from pathlib import Path

import torch

from calibrate.op_sac import SHAPES, kept_bytes, modelled_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the counts and their provenance here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for shape in SHAPES:
        got, model = asdict(kept_bytes(shape)), modelled_bytes(shape)
        rows.append({"shape": asdict(shape), "measured": got, "memory_model": model})
        print(f"{astuple(shape)}: kept {got['kept_bytes']:,} bytes, op_sac_layer_bytes {model['op_sac']:,.0f} "
              f"({100 * (model['op_sac'] / got['kept_bytes'] - 1):+.2f} %); none {model['none']:,.0f}, "
              f"full {model['full']:,.0f}; by operator {got['by_operator']}")
    if args.json:
        prov = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
                "command": "python benchmarks/bench_op_sac_memory.py --json " + str(args.json)}
        args.json.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
