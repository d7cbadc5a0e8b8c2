"""TorchTitan's op-level selective activation checkpointing (``selective_ac_option = "op"``): its
save policy, and the bytes it keeps of a Llama-shaped layer (docs/modelling.md §2).

The policy (``torchtitan/distributed/activation_checkpoint.py``) saves the outputs of matmuls, of
fused attention and of a few other costly operators, except every second matmul of the layer in
forward order; everything else is recomputed.  Its matmul count lives in a dictionary made fresh
for each checkpointed call (:func:`op_sac_context`, a checkpoint's ``context_fn``), with separate
counts for the forward and the recomputation: torch makes a new ``SelectiveCheckpointContext`` for
every operator call, so the count cannot live on the context.

:func:`kept_bytes` runs a Llama-shaped layer (:class:`LlamaLayer`) under
``torch.utils.checkpoint`` with that policy and adds up the tensors the checkpoint's cache holds
after the forward, plus the layer's input (which the checkpoint keeps to rerun the layer):
``benchmarks/bench_op_sac_memory.py`` sets them beside ``predictor.memory.op_sac_layer_bytes``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, MutableMapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from predictor.job import Layout, ModelSpec
from predictor.memory import layer_activation_bytes, op_sac_layer_bytes


def _present(*names: str) -> frozenset:
    """The operators of ``names`` (``namespace.op.overload``) this torch build has."""
    ops = set()
    for name in names:
        namespace, op, overload = name.split(".")
        try:
            ops.add(getattr(getattr(getattr(torch.ops, namespace), op), overload))
        except (AttributeError, RuntimeError):
            continue
    return frozenset(ops)


#: Matmuls the policy counts: ``mm`` (TorchTitan's, whose linears have no bias) and ``addmm`` (a
#: linear with a bias, as the GPT-shaped layers perf-calibrate times have).
MATMUL_OPS = _present("aten.mm.default", "aten.addmm.default")
#: What the policy saves (TorchTitan's list, with the CPU's fused attention beside the CUDA ones).
SAVED_OPS = MATMUL_OPS | _present(
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "aten.max.default")

Policy = Callable[..., CheckpointPolicy]


def op_sac_policy(counts: MutableMapping[str, int], saved_ops: frozenset = SAVED_OPS,
                  matmul_ops: frozenset = MATMUL_OPS) -> Policy:
    """TorchTitan's rule as a ``create_selective_checkpoint_contexts`` policy: save each operator
    of ``saved_ops`` except every second of ``matmul_ops``, counted in ``counts`` (one fresh
    mapping per checkpointed call; ``forward`` and ``recompute`` counted apart)."""
    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:  # noqa: ANN001
        key = "recompute" if ctx.is_recompute else "forward"
        if func in matmul_ops:
            counts[key] += 1
            if counts[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in saved_ops else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def op_sac_context():  # noqa: ANN201 - torch's (forward, recompute) context managers
    """A checkpoint's ``context_fn``: the policy with its matmul count started afresh."""
    return create_selective_checkpoint_contexts(op_sac_policy(defaultdict(int)))


@dataclass(frozen=True)
class LayerShape:
    """A Llama-shaped layer and the micro-batch it runs."""

    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    activation: str        # "swiglu" or "gelu"
    seq_len: int
    micro_batch: int


#: The shapes counted (benchmarks/data/op-sac-memory/cpu.json).
SHAPES = (LayerShape(256, 4, 2, 512, "swiglu", 128, 2), LayerShape(512, 8, 8, 1536, "swiglu", 256, 1),
          LayerShape(256, 4, 4, 1024, "gelu", 128, 2))


class LlamaLayer(nn.Module):
    """RMSNorm, separate wq / wk / wv / wo, grouped K/V repeated to the query heads, causal flash
    SDPA, a SwiGLU or GELU MLP: TorchTitan's Llama block, without bias."""

    def __init__(self, shape: LayerShape):
        super().__init__()
        h, heads, kv = shape.hidden, shape.heads, shape.kv_heads
        d = h // heads
        self.heads, self.kv, self.d, self.gated = heads, kv, d, shape.activation == "swiglu"
        self.norm1, self.norm2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.wq, self.wk, self.wv = nn.Linear(h, heads * d, bias=False), nn.Linear(h, kv * d, bias=False), \
            nn.Linear(h, kv * d, bias=False)
        self.wo = nn.Linear(heads * d, h, bias=False)
        self.w1, self.w2 = nn.Linear(h, shape.ffn_hidden, bias=False), nn.Linear(shape.ffn_hidden, h, bias=False)
        self.w3 = nn.Linear(h, shape.ffn_hidden, bias=False) if self.gated else None

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


@dataclass(frozen=True)
class KeptBytes:
    """What the checkpoint keeps of one layer: all bytes, and the cached ones by operator."""

    kept_bytes: int
    by_operator: dict[str, int] = field(default_factory=dict)


def kept_bytes(shape: LayerShape) -> KeptBytes:
    """The bytes op-level SAC keeps of a bf16 :class:`LlamaLayer` of ``shape`` (its cache after the
    forward, each storage once, plus the input); the backward then runs, through the same policy."""
    torch.manual_seed(0)
    layer = LlamaLayer(shape).to(torch.bfloat16)
    x = torch.randn(shape.micro_batch, shape.seq_len, shape.hidden, dtype=torch.bfloat16, requires_grad=True)
    caching = {}

    def contexts():  # noqa: ANN202
        cache, recompute = op_sac_context()
        caching["mode"] = cache
        return cache, recompute

    out = checkpoint(layer, x, use_reentrant=False, context_fn=contexts)
    seen, kept, by_op = set(), 0, {}
    for key, entries in caching["mode"].storage.items():
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
    out.float().sum().backward()
    return KeptBytes(kept, by_op)


def modelled_bytes(shape: LayerShape) -> dict[str, float]:
    """predictor.memory's bytes for the same layer in bf16: op-level SAC (``op_sac``), no
    recomputation (``none``) and full recomputation (``full``)."""
    m = ModelSpec(layers=1, hidden=shape.hidden, heads=shape.heads, kv_heads=shape.kv_heads,
                  ffn_hidden=shape.ffn_hidden, seq_len=shape.seq_len, vocab=1024, activation=shape.activation,
                  norm="rmsnorm", attention="flash", pos_emb="rotary")
    lay = Layout(pp=1, tp=1, dp=1, micro_batch=shape.micro_batch, micro_batches=1, zero_stage=0,
                 recompute="selective")
    return {"op_sac": op_sac_layer_bytes(m, lay, "bf16"),
            "none": layer_activation_bytes(m, lay, "bf16", recompute="none"),
            "full": layer_activation_bytes(m, lay, "bf16", recompute="full")}
