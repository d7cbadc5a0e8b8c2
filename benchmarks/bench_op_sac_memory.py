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
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402

from predictor.job import Layout, ModelSpec  # noqa: E402
from predictor.memory import layer_activation_bytes, op_sac_layer_bytes  # noqa: E402

# (hidden, heads, kv_heads, ffn_hidden, activation, seq_len, micro_batch)
SHAPES = [(256, 4, 2, 512, "swiglu", 128, 2), (512, 8, 8, 1536, "swiglu", 256, 1), (256, 4, 4, 1024, "gelu", 128, 2)]
SAVED = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}


class Layer(nn.Module):
    def __init__(self, h: int, heads: int, kv: int, ffn: int, activation: str):
        super().__init__()
        d = h // heads
        self.heads, self.kv, self.d, self.gated = heads, kv, d, activation == "swiglu"
        self.norm1, self.norm2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.wq, self.wk, self.wv = nn.Linear(h, heads * d, bias=False), nn.Linear(h, kv * d, bias=False), \
            nn.Linear(h, kv * d, bias=False)
        self.wo = nn.Linear(heads * d, h, bias=False)
        self.w1, self.w2 = nn.Linear(h, ffn, bias=False), nn.Linear(ffn, h, bias=False)
        self.w3 = nn.Linear(h, ffn, bias=False) if self.gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.norm1(x)
        q = self.wq(y).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.wk(y).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.wv(y).view(b, s, self.kv, self.d).transpose(1, 2)
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, -1))
        y = self.norm2(x)
        up = F.silu(self.w1(y)) * self.w3(y) if self.gated else F.gelu(self.w1(y))
        return x + self.w2(up)


def _policy(counts: dict):
    def decide(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[key] += 1
        keep = func in SAVED and not (func == torch.ops.aten.mm.default and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return decide


def kept_bytes(h: int, heads: int, kv: int, ffn: int, activation: str, seq: int, b: int) -> dict:
    torch.manual_seed(0)
    layer = Layer(h, heads, kv, ffn, activation).to(torch.bfloat16)
    x = torch.randn(b, seq, h, dtype=torch.bfloat16, requires_grad=True)
    caching = {}

    def contexts():
        cache, recompute = create_selective_checkpoint_contexts(_policy(defaultdict(int)))
        caching["mode"] = cache
        return cache, recompute

    out = checkpoint(layer, x, use_reentrant=False, context_fn=contexts)
    storage = caching["mode"].storage
    seen, kept, by_op = set(), 0, {}
    for key, entries in storage.items():
        func = key[0] if isinstance(key, tuple) else key
        for leaf in tree_flatten(list(entries.values()))[0]:
            t = getattr(leaf, "val", leaf)              # the cache wraps each output with its version
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                n = t.untyped_storage().nbytes()
                kept += n
                name = str(getattr(func, "overloadpacket", func).__name__)
                by_op[name] = by_op.get(name, 0) + n
    kept += x.numel() * x.element_size()
    out.float().sum().backward()          # the recomputation runs through the same policy
    return {"kept_bytes": kept, "by_operator": by_op}


def modelled(h: int, heads: int, kv: int, ffn: int, activation: str, seq: int, b: int) -> dict:
    m = ModelSpec(layers=1, hidden=h, heads=heads, kv_heads=kv, ffn_hidden=ffn, seq_len=seq, vocab=1024,
                  activation=activation, norm="rmsnorm", attention="flash", pos_emb="rotary")
    lay = Layout(pp=1, tp=1, dp=1, micro_batch=b, micro_batches=1, zero_stage=0, recompute="selective")
    return {"op_sac": op_sac_layer_bytes(m, lay, "bf16"),
            "none": layer_activation_bytes(m, lay, "bf16", recompute="none"),
            "full": layer_activation_bytes(m, lay, "bf16", recompute="full")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the counts and their provenance here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for shape in SHAPES:
        got, model = kept_bytes(*shape), modelled(*shape)
        rows.append({"shape": dict(zip(("hidden", "heads", "kv_heads", "ffn_hidden", "activation", "seq_len",
                                        "micro_batch"), shape)), "measured": got, "memory_model": model})
        print(f"{shape}: kept {got['kept_bytes']:,} bytes, op_sac_layer_bytes {model['op_sac']:,.0f} "
              f"({100 * (model['op_sac'] / got['kept_bytes'] - 1):+.2f} %); none {model['none']:,.0f}, "
              f"full {model['full']:,.0f}; by operator {got['by_operator']}")
    if args.json:
        prov = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
                "command": "python benchmarks/bench_op_sac_memory.py --json " + str(args.json)}
        args.json.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
