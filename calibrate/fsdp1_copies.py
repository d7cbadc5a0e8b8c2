"""FSDP1's own device copies (llm-foundry / Composer), counted operator by operator on the CPU, and
what predictor.recipe.fsdp1_shard_copies gives for the same layout.

:func:`count` runs a few blocks of two linears wrapped as Composer wraps MPT
(``FullyShardedDataParallel``, one unit per block, ``use_orig_params``, ``device_id=cpu``) on
torch's fake process group (collectives return at once; one rank is a real one-rank gloo group,
where FSDP1 runs NO_SHARD), two micro-batches of forward and backward under bf16 autocast, no
optimizer step.  A ``TorchDispatchMode`` sees every aten operator, the autograd engine's included;
an operator that reads or writes a tensor the size of a block's flat parameter or of its shard,
other than a view or a collective, is one of FSDP's copies (the blocks' sizes are chosen so that no
activation and no single weight has either size).  Its bytes are what it reads (every tensor input
but ``copy_``'s destination) and what it writes (its outputs), divided by the blocks' parameters
and the micro-batches.  ``benchmarks/bench_fsdp1_copies.py`` prints and records them.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

IN, OUT, TOKENS, BLOCKS, MICRO_BATCHES = 96, 160, 40, 3, 2
# per block: Linear(IN, OUT) with bias + Linear(OUT, IN) without: 30,880 parameters, a multiple of
# 8 (bf16 alignment) and of every rank count below, so FSDP pads nothing
PARAMS_PER_BLOCK = IN * OUT + OUT + OUT * IN
#: (Composer's mixed_precision word, sharding strategy, ranks): one rank runs NO_SHARD whatever the
#: strategy, so it is counted once.
CONFIGS = [(mp, strategy, ranks) for ranks in (1, 2, 8) for strategy in ("FULL_SHARD", "SHARD_GRAD_OP")
           for mp in ("DEFAULT", "PURE", "FULL") if not (ranks == 1 and strategy == "SHARD_GRAD_OP")]
# Operators that touch a flat parameter without moving its bytes.
_NOT_COPIES = ("empty", "empty_like", "new_empty", "set_", "resize_", "detach", "alias", "record_stream")


@dataclass(frozen=True)
class Fsdp1Copies:
    """Bytes FSDP1's copies move per parameter per micro-batch, in all and by operator, and the
    operators that touched a flat parameter but were not counted (views, collectives)."""

    forward_bytes: float
    backward_bytes: float
    forward_ops: dict[str, float]
    backward_ops: dict[str, float]
    skipped_ops: list[str]


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(IN, OUT), nn.Linear(OUT, IN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class _Copies(TorchDispatchMode):
    """Adds up the bytes of every operator that touches a tensor of one of ``sizes`` elements."""

    def __init__(self, sizes: set[int]):
        super().__init__()
        self.sizes = sizes
        self.bytes: dict[str, float] = {}
        self.views: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not any(t.numel() in self.sizes for t in ins + outs):
            return out
        name = str(func.overloadpacket.__name__)
        if func.is_view or name.startswith(("_c10d", "c10d", "allgather", "reduce_scatter", "allreduce")) \
                or "c10d" in str(func.namespace) or name in _NOT_COPIES:
            self.views.add(name)
            return out
        reads = ins[1:] if name == "copy_" else ins
        moved = sum(t.numel() * t.element_size() for t in reads + outs)
        self.bytes[name] = self.bytes.get(name, 0.0) + moved
        return out


def _mixed_precision(mixed: str):  # noqa: ANN202 - torch's MixedPrecision
    """Composer's mixed_precision words (composer/distributed/mosaic_parallelism.py)."""
    from torch.distributed.fsdp import MixedPrecision
    bf16 = torch.bfloat16
    policies = {"DEFAULT": lambda: MixedPrecision(param_dtype=bf16, reduce_dtype=torch.float32, buffer_dtype=bf16),
                "PURE": lambda: MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16),
                "FULL": MixedPrecision}
    if mixed not in policies:
        raise ValueError(f"unknown mixed_precision {mixed!r} (known: {', '.join(policies)})")
    return policies[mixed]()


def count(mixed: str, strategy: str, ranks: int) -> Fsdp1Copies:
    """FSDP1's copies under Composer's ``mixed`` precision word, ``strategy`` (FULL_SHARD or
    SHARD_GRAD_OP) and ``ranks``; brings up (and tears down) its own process group, so none may
    be up."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    if dist.is_initialized():
        raise RuntimeError("counting FSDP1's copies brings up its own process group; one is already up")
    policy = _mixed_precision(mixed)
    if ranks == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(*[_Block() for _ in range(BLOCKS)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = FSDP(model, auto_wrap_policy=lambda module, recurse, nonwrapped_numel:
                         recurse or isinstance(module, _Block),
                         device_id=torch.device("cpu"), sharding_strategy=ShardingStrategy[strategy],
                         mixed_precision=policy, limit_all_gathers=True, use_orig_params=True)
        sizes = {PARAMS_PER_BLOCK, PARAMS_PER_BLOCK // ranks}
        x = torch.randn(TOKENS, IN)
        forward, backward = _Copies(sizes), _Copies(sizes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(MICRO_BATCHES):
                with forward, torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(x).float().square().mean()
                with backward:
                    loss.backward()
    finally:
        dist.destroy_process_group()
    params = BLOCKS * PARAMS_PER_BLOCK * MICRO_BATCHES
    return Fsdp1Copies(forward_bytes=sum(forward.bytes.values()) / params,
                       backward_bytes=sum(backward.bytes.values()) / params,
                       forward_ops={k: v / params for k, v in forward.bytes.items()},
                       backward_ops={k: v / params for k, v in backward.bytes.items()},
                       skipped_ops=sorted(forward.views | backward.views))


def modelled(mixed: str, strategy: str, ranks: int) -> dict[str, float]:
    """What predictor.recipe.fsdp1_shard_copies gives for the same job (bytes per parameter per
    micro-batch, ``forward_bytes`` and ``backward_bytes``)."""
    from predictor import TrainingJob
    from predictor.operators import BYTES_PER_ELEMENT
    from predictor.recipe import fsdp1_shard_copies
    job = TrainingJob.from_dict({"model": {"layers": BLOCKS, "hidden": IN, "heads": 1, "seq_len": TOKENS},
                                 "layout": {"dp": ranks, "micro_batches": MICRO_BATCHES,
                                            "zero_stage": 3 if strategy == "FULL_SHARD" else 2},
                                 "run": {"precision": "bf16", "framework": "llm-foundry"}})
    reduce = "bf16" if mixed == "PURE" else "fp32"
    c = fsdp1_shard_copies(job.layout, "llm-foundry", "bf16", reduce, BYTES_PER_ELEMENT,
                           "fp32" if mixed == "FULL" else "")
    return {"forward_bytes": c.forward_bytes, "backward_bytes": c.backward_bytes}
