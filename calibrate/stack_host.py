"""Host costs a framework adds per layer: tensor-parallel collectives, FSDP / ZeRO-3 hooks and
activation-checkpointing wrappers.

Measured in one process on a one-rank gloo group at tiny shapes (the work itself microseconds,
and no peer to wait for), so that what grows with the layer count is the host's issuing, the part
a GPU node's CPU pays too (``benchmarks/bench_stack_host.py`` prints and records them;
docs/modelling.md §2).  On two or more gloo ranks the figures would hold gloo's own transfer and
its wait for the slower rank (on this shared 2-core machine ~0.6 ms per all-reduce), which NCCL on
a GPU spends on the device, not the host:

* **TP collectives** (:func:`tp_collective_task`): a Megatron-style tensor-parallel layer (column-
  then row-parallel linears) issues one all-reduce after each row-parallel linear in forward and
  one for each column-parallel input's gradient in backward (``reduce_from`` / ``copy_to`` the
  model-parallel region, autograd functions around ``all_reduce``): 4 per layer per micro-batch.
  The same layers are timed with those collectives and without; the difference of the per-layer
  slopes over 4 is one collective's host cost (the autograd function, c10d's call, the backend's
  enqueue).  The issue of a bare ``all_reduce(async_op=True)`` is timed apart for comparison.
* **FSDP** (:func:`fsdp_task`): the same blocks under FSDP2 ``fully_shard`` (one unit per block
  and the root, ``reshard_after_forward=True``) against DDP; the difference of the per-layer
  slopes is what FSDP's per-layer pre/post forward and backward hooks (unshard, reshard,
  reduce-scatter) add to a micro-batch's forward + backward.  FSDP1 (Composer's, FULL_SHARD and
  SHARD_GRAD_OP) against FSDP2 on a fake 2-rank group: :func:`fsdp1_costs`.
* **Checkpoint wrappers** (:func:`checkpoint_costs`): each framework's activation-checkpointing
  wrapper around every layer against the bare layers; the difference of the per-layer slopes,
  less one forward's (full recomputation's repeat, costed apart), is the wrapper's own work.

The statistic is the fastest quarter of the repeats (a shared CPU), each configuration interleaved.
"""
from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .stack_runs import row_label

HIDDEN, TOKENS = 64, 32
COLLECTIVES_PER_LAYER = 4      # Megatron's TP layer: 2 all-reduces in forward, 2 in backward


class _ReduceFrom(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:      # type: ignore[override]
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:     # type: ignore[override]
        return g


class _CopyTo(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:      # type: ignore[override]
        return x

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:     # type: ignore[override]
        g = g.contiguous()
        dist.all_reduce(g)
        return g


class TpBlock(nn.Module):
    """Two column/row-parallel pairs (attention's QKV/projection, the MLP's up/down), tiny."""

    def __init__(self, collectives: bool):
        super().__init__()
        self.collectives = collectives
        self.up1, self.down1 = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.up2, self.down2 = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)

    def _pair(self, x: torch.Tensor, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
        y = _CopyTo.apply(x) if self.collectives else x
        y = down(torch.relu(up(y)))
        return x + (_ReduceFrom.apply(y) if self.collectives else y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._pair(self._pair(x, self.up1, self.down1), self.up2, self.down2)


def fastest_quarter(values: Sequence[float]) -> float:
    s = sorted(values)
    return statistics.fmean(s[:max(1, len(s) // 4)])


def _time_micro_batches(model: nn.Module, repeats: int, device: str = "cpu") -> list[float]:
    """Seconds of one forward + backward, ``repeats`` times, after warm-up: a DeepSpeed engine's
    own backward (it keeps its gradients), else autograd's with the gradients dropped; a
    ``forward_only`` model's forward alone (autograd recording).  On ``cuda`` the host's issue
    time: the device is waited for after each, outside the timed span, so each starts empty."""
    engine = model.engine if isinstance(model, _Engine) else None
    forward_only = getattr(model, "forward_only", False)
    # A layer's input inside a model requires grad (a reentrant checkpoint's backward needs it).
    x = torch.randn(TOKENS, getattr(model, "width", HIDDEN), device=device,
                    requires_grad=getattr(model, "input_requires_grad", False))
    out = []
    for i in range(repeats + 3):
        t0 = time.perf_counter()
        if engine is not None:
            engine.backward(model(x).float().sum())
        elif forward_only:
            model(x).sum()
        else:
            model(x).sum().backward()
        dt = time.perf_counter() - t0
        if device == "cuda":
            torch.cuda.synchronize()
        if engine is None:
            x.grad = None
            for p in model.parameters():
                p.grad = None
        if i >= 3:
            out.append(dt)
    return out


def _interleaved(models: dict, repeats: int, rounds: int, device: str = "cpu") -> dict:
    """Each model's fastest-quarter forward + backward seconds, the models timed in turn round
    after round, so that the machine's load falls on every configuration alike."""
    times: dict = {k: [] for k in models}
    for _ in range(rounds):
        for key, model in models.items():
            times[key] += _time_micro_batches(model, repeats, device)
    return {key: fastest_quarter(v) for key, v in times.items()}


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def one_rank_group(device: str = "cpu") -> None:
    """A one-process group (nothing to wait for), gloo, or NCCL on ``cuda``, unless one is up."""
    if not dist.is_initialized():
        if device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)


def tp_collective_costs(layers: Sequence[int], repeats: int, rounds: int, device: str = "cpu") -> dict:
    """Per collective: the layer-slope difference (with − without collectives) / 4, and the issue
    time of one ``all_reduce(async_op=True)`` (seconds; a process group must be up, NCCL's for
    ``cuda``)."""
    torch.manual_seed(0)
    models = {(c, n): nn.Sequential(*[TpBlock(c) for _ in range(n)]).to(device) for c in (False, True)
              for n in layers}
    per = _interleaved(models, repeats, rounds, device)
    ns = list(layers)
    with_c = _slope(ns, [per[(True, n)] for n in ns])
    without = _slope(ns, [per[(False, n)] for n in ns])
    t = torch.randn(TOKENS, HIDDEN, device=device)
    issue = []
    for _ in range(rounds):
        works, stamps = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            works.append(dist.all_reduce(t, async_op=True))
            stamps.append(time.perf_counter() - t0)
        for w in works:
            w.wait()
        if device == "cuda":
            torch.cuda.synchronize()
        issue += stamps
    return {"layer_seconds_with": with_c, "layer_seconds_without": without,
            "collective_seconds": (with_c - without) / COLLECTIVES_PER_LAYER,
            "issue_seconds": fastest_quarter(issue),
            "per_config": {f"{'tp' if c else 'plain'}_{n}": s for (c, n), s in per.items()}}


class Block(nn.Module):
    """LayerNorm, two linears, a residual: the tiny layer FSDP wraps as one unit."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up, self.down = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TransformerBlock(nn.Module):
    """A pre-norm transformer layer's modules as Megatron-DeepSpeed and GPT-NeoX hold them: two
    LayerNorms, the fused QKV and output projections and the MLP's two linears (6 modules with 12
    parameters, where :class:`Block` has 3 with 6), causal attention over 2 heads between them, at
    :class:`Block`'s tiny width: what DeepSpeed ZeRO-3's per-module hooks see in a real layer."""

    HEADS = 2

    def __init__(self):
        super().__init__()
        # Registered in the order the layer runs them (as the committed runs measured it).
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(t, 3, self.HEADS, HIDDEN // self.HEADS).permute(1, 2, 0, 3)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.permute(1, 0, 2).reshape(t, HIDDEN))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


#: The layers DeepSpeed's ZeRO-3 is measured around (:func:`deepspeed_zero3_costs`).
ZERO3_LAYERS = {"block": Block, "transformer": TransformerBlock}


def _fsdp_model(n: int) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    model = nn.Sequential(*[Block() for _ in range(n)])
    for block in model:
        fully_shard(block, reshard_after_forward=True)
    fully_shard(model)
    return model


def fsdp_costs(layers: Sequence[int], repeats: int, rounds: int) -> dict:
    """Per-layer forward + backward seconds under FSDP2 and under DDP, and their difference (what
    FSDP's hooks add per layer and micro-batch; a process group must be up)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    models: dict[tuple[str, int], nn.Module] = {}
    for n in layers:
        models[("ddp", n)] = DDP(nn.Sequential(*[Block() for _ in range(n)]))
        models[("fsdp", n)] = _fsdp_model(n)
    per = _interleaved(models, repeats, rounds)
    ns = list(layers)
    fsdp = _slope(ns, [per[("fsdp", n)] for n in ns])
    ddp = _slope(ns, [per[("ddp", n)] for n in ns])
    return {"fsdp_layer_seconds": fsdp, "ddp_layer_seconds": ddp, "fsdp_hook_layer_seconds": fsdp - ddp,
            "per_config": {f"{k}_{n}": s for (k, n), s in per.items()}}


# --- DeepSpeed's ZeRO-3 against its engine without ZeRO, on the one-rank gloo group ----------------

class _Engine(nn.Module):
    """A DeepSpeed engine timed like the other models (:func:`_time_micro_batches`)."""

    def __init__(self, engine):
        super().__init__()
        self.engine = engine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.engine(x)


def _import_deepspeed(device: str = "cpu"):  # noqa: ANN202 - the deepspeed module
    """``deepspeed``, its accelerator chosen as ``device`` (``cpu`` or ``cuda``) while it is first
    imported (the variable is set back afterwards) and its logger quietened.  DeepSpeed is no
    dependency of perfcast: only these measurements need it."""
    import os
    before = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = device if before is None else before
    try:
        import deepspeed
    finally:
        if before is None:
            os.environ.pop("DS_ACCELERATOR", None)
    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.ERROR)
    return deepspeed


#: gradient_accumulation_steps that no timed run reaches (the micro-batches stay inside a step).
ACCUMULATE_FOREVER = 1 << 30


def _deepspeed_model(n: int, stage: int, device: str = "cpu", layer: str = "block",
                     persistence_threshold: int | None = None, accumulate: bool = False) -> nn.Module:
    deepspeed = _import_deepspeed(device)
    model = nn.Sequential(*[ZERO3_LAYERS[layer]() for _ in range(n)])
    zero: dict = {"stage": stage}
    if stage == 3 and persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = persistence_threshold
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero,
           "steps_per_print": 10 ** 9, "zero_allow_untested_optimizer": True}
    if accumulate:
        # Every timed backward a micro-batch inside a step (none reaches the accumulation
        # boundary, where the step's own reduction would run).
        cfg["gradient_accumulation_steps"] = ACCUMULATE_FOREVER
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3),
                                      config=cfg)
    return _Engine(engine)


class _LauncherEnv:
    """DeepSpeed's engine reads the launcher's variables of the one rank that is up, while it runs;
    the process's environment is restored afterwards, and so is F.linear, which ZeRO-3's engine
    replaces for the whole process."""

    _VARS = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}

    def __enter__(self) -> None:
        import os
        self.unset = [k for k in self._VARS if k not in os.environ]
        os.environ.update({k: self._VARS[k] for k in self.unset})
        self.linear = torch.nn.functional.linear

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        import os
        torch.nn.functional.linear = self.linear
        for k in self.unset:
            os.environ.pop(k, None)


def _deepspeed_stage_slopes(layers: Sequence[int], stages: Sequence[int], repeats: int, rounds: int,
                            device: str, **model: Any) -> tuple[dict[int, float], dict]:
    """Per-layer slopes of DeepSpeed's engine at each of ``stages`` over ``layers`` (the models
    built by :func:`_deepspeed_model` with ``model``, timed interleaved), and each configuration's
    seconds per micro-batch."""
    import warnings

    torch.manual_seed(0)
    with _LauncherEnv(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = {(stage, n): _deepspeed_model(n, stage, device, **model) for n in layers for stage in stages}
        per = _interleaved(models, repeats, rounds, device)
    ns = list(layers)
    return {stage: _slope(ns, [per[(stage, n)] for n in ns]) for stage in stages}, per


def deepspeed_zero12_costs(layers: Sequence[int], repeats: int, rounds: int, device: str = "cpu") -> dict:
    """Per-layer forward + backward seconds of DeepSpeed's engine at ZeRO stages 0, 1 and 2 around
    :class:`TransformerBlock` (12 parameters, as a real layer has), on micro-batches inside a step
    (no accumulation boundary reached), and stages 1 and 2 less stage 0: the gradient hooks
    DeepSpeed's ZeRO-1/2 optimizer puts on every parameter (with ``contiguous_gradients``, its
    default, at ZeRO-1 too), which at ZeRO-2 move each gradient into the reduction bucket every
    micro-batch (one rank's group up, gloo or NCCL on ``cuda``; needs the deepspeed package)."""
    slope, per = _deepspeed_stage_slopes(layers, (0, 1, 2), repeats, rounds, device, layer="transformer",
                                         accumulate=True)
    return {"layer": "transformer", "layer_seconds": {f"zero{k}": v for k, v in slope.items()},
            "zero1_hook_layer_seconds": slope[1] - slope[0], "zero2_hook_layer_seconds": slope[2] - slope[0],
            "per_config": {f"zero{k}_{n}": s for (k, n), s in per.items()}}


def deepspeed_zero3_costs(layers: Sequence[int], repeats: int, rounds: int, device: str = "cpu",
                         layer: str = "block", persistence_threshold: int | None = None) -> dict:
    """Per-layer forward + backward seconds of DeepSpeed's engine at ZeRO stage 3 and at stage 0,
    and their difference: what ZeRO-3's per-module hooks (fetch and release the partitioned
    parameters, the gradients' reduce-and-partition) add per layer and micro-batch, around
    ``layer`` (:data:`ZERO3_LAYERS`) (one rank's group up, gloo or NCCL on ``cuda``, where the
    engine places the model; needs the deepspeed package).  ``persistence_threshold``: ZeRO-3's
    ``stage3_param_persistence_threshold`` (DeepSpeed's default, 10⁵ elements, keeps every
    parameter of these tiny layers whole: none is partitioned or gathered)."""
    if layer not in ZERO3_LAYERS:
        raise ValueError(f"unknown layer {layer!r} (known: {', '.join(ZERO3_LAYERS)})")
    slope, per = _deepspeed_stage_slopes(layers, (0, 3), repeats, rounds, device, layer=layer,
                                         persistence_threshold=persistence_threshold)
    return {"layer": layer, "persistence_threshold": persistence_threshold,
            "zero3_layer_seconds": slope[3], "zero0_layer_seconds": slope[0],
            "zero3_hook_layer_seconds": slope[3] - slope[0],
            "per_config": {f"zero{k}_{n}": s for (k, n), s in per.items()}}


# --- FSDP1 (llm-foundry / Composer) against FSDP2, on a fake group --------------------------------

FAKE_RANKS = 2


def fake_group() -> None:
    """A fake process group of 2 ranks (``torch.testing``'s ``fake`` backend: collectives return at
    once). On one real rank FSDP1 replaces FULL_SHARD by NO_SHARD and skips the hooks measured
    here; two real gloo ranks would add gloo's transfer and the wait for the slower rank."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=FAKE_RANKS)


def _fsdp1_model(n: int, strategy: str = "FULL_SHARD") -> nn.Module:
    """Composer's defaults: one unit per block, ``strategy`` (FULL_SHARD; SHARD_GRAD_OP is
    llm-foundry's ZeRO-2), BACKWARD_POST prefetch, ``limit_all_gathers``, ``use_orig_params``."""
    import warnings

    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = nn.Sequential(*[Block() for _ in range(n)])

    def per_block(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return recurse or isinstance(module, Block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FSDP(model, auto_wrap_policy=per_block, device_id=torch.device("cpu"),
                    sharding_strategy=ShardingStrategy[strategy], backward_prefetch=BackwardPrefetch.BACKWARD_POST,
                    limit_all_gathers=True, use_orig_params=True)


def _return_bucket(state, bucket):  # noqa: ANN001 - DDP checks the annotations, which must be absent or real
    """A DDP communication hook that returns the bucket as it is (the fake group's all-reduce
    returns nothing, which DDP refuses)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _ddp_no_comm(n: int) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(nn.Sequential(*[Block() for _ in range(n)]))
    model.register_comm_hook(None, _return_bucket)
    return model


def fsdp1_costs(layers: Sequence[int], repeats: int, rounds: int) -> dict:
    """Per-layer forward + backward seconds under DDP, FSDP1 (FULL_SHARD), FSDP1 SHARD_GRAD_OP
    (``fsdp1_zero2``: no reshard after the forward, so no unshard before the backward) and FSDP2,
    each FSDP's hooks per layer and micro-batch (its slope less DDP's) and their ratios
    (:func:`fake_group` must be up)."""
    import warnings
    from functools import partial

    torch.manual_seed(0)
    build = {"ddp": _ddp_no_comm, "fsdp1": _fsdp1_model,
             "fsdp1_zero2": partial(_fsdp1_model, strategy="SHARD_GRAD_OP"), "fsdp2": _fsdp_model}
    models = {(kind, n): make(n) for n in layers for kind, make in build.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per = _interleaved(models, repeats, rounds)
    ns = list(layers)
    slope = {kind: _slope(ns, [per[(kind, n)] for n in ns]) for kind in build}
    hooks = {k: slope[k] - slope["ddp"] for k in build if k != "ddp"}
    return {"layer_seconds": slope, "hook_layer_seconds": hooks,
            "fsdp1_over_fsdp2": hooks["fsdp1"] / hooks["fsdp2"],
            "fsdp1_zero2_over_fsdp1": hooks["fsdp1_zero2"] / hooks["fsdp1"],
            "per_config": {f"{k}_{n}": s for (k, n), s in per.items()}}


def _job_key(job: dict, drop_model_key: str = "") -> str:
    """A job dict's shape as a hashable key (sections and keys sorted), ``drop_model_key`` left out."""
    rest = {k: dict(v) for k, v in job.items()}
    rest.get("model", {}).pop(drop_model_key, None)
    return repr(sorted((k, sorted(v.items())) for k, v in rest.items()))


def _depth_series(rows: Sequence[dict], stacks: tuple[str, str]) -> tuple[dict, list[int], dict[str, float]]:
    """The widest set of rows of both ``stacks`` that differ in ``model.layers`` only: its job,
    the depths both measured, and each stack's seconds per layer (the slope over those depths).
    A step measured more than once counts at its fastest (what a repeat adds is the machine's);
    between series of as many depths, the one of more micro-batches (more host work per step).
    Raises ValueError without two depths of each."""
    series: dict[str, dict[str, dict[int, float]]] = {}
    jobs: dict[str, dict] = {}
    for r in rows:
        if "error" in r or r.get("stack") not in stacks:
            continue
        key = _job_key(r["job"], "layers")
        jobs[key] = r["job"]
        depth = series.setdefault(key, {}).setdefault(r["stack"], {})
        layers, seconds = int(r["job"]["model"]["layers"]), float(r["measured_iteration_seconds"])
        depth[layers] = min(seconds, depth.get(layers, seconds))
    usable = {k: v for k, v in series.items() if all(len(v.get(s, {})) >= 2 for s in stacks)}
    if not usable:
        raise ValueError(f"no model measured at two or more depths under both {stacks[0]} and {stacks[1]}")
    key = max(usable, key=lambda k: (min(len(usable[k][s]) for s in stacks),
                                     int(jobs[k]["layout"].get("micro_batches", 1))))
    depths = sorted(set(usable[key][stacks[0]]) & set(usable[key][stacks[1]]))
    return jobs[key], depths, {s: _slope(depths, [usable[key][s][n] for n in depths]) for s in stacks}


def gpu_fsdp_layer_seconds(rows: Sequence[dict], bytes_per_second: float) -> dict:
    """FSDP2's per-layer, per-micro-batch cost on a GPU node, from real training steps
    (benchmarks/bench_gpu_stacks.py's rows): the same model at several depths under FSDP2 and under
    DDP (:func:`_depth_series`); the difference of the per-layer slopes, over the micro-batches,
    less FSDP2's own copies (predictor.recipe.fsdp2_shard_copies, at ``bytes_per_second``), is what
    its hooks, kernel launches and stream waits add per layer."""
    from predictor.job import TrainingJob
    from predictor.operators import BYTES_PER_ELEMENT
    from predictor.recipe import fsdp2_shard_copies, layer_parameters

    job_dict, depths, slope = _depth_series(rows, ("fsdp", "ddp"))
    job = TrainingJob.from_dict(job_dict).replace(layout={"zero_stage": 3}, run={"framework": "torchtitan"})
    micro_batches = job.layout.micro_batches
    copies = fsdp2_shard_copies(job.layout, "torchtitan", job.run.precision, "fp32", BYTES_PER_ELEMENT)
    copy_seconds = layer_parameters(job.model, 1) * (copies.forward_bytes + copies.backward_bytes) / bytes_per_second
    per_micro_batch = (slope["fsdp"] - slope["ddp"]) / micro_batches
    return {"fsdp_layer_seconds": per_micro_batch - copy_seconds, "slope_seconds": slope,
            "copies_seconds": copy_seconds, "depths": depths, "micro_batches": micro_batches}


def gpu_fsdp1_accumulation_ratio(rows: Sequence[dict], bytes_per_second: float) -> dict:
    """What FSDP1 (Composer's ``fsdp1`` stack) costs the host beyond FSDP2 per wrapped layer on each
    micro-batch after a step's first, as a share of FSDP2's per-layer figure measured in the same
    rows (:func:`gpu_fsdp_layer_seconds`): from interleaved steps of one model at several depths and
    micro-batch counts under both, the least-squares slope through the origin of the step-time
    difference against layers x (micro-batches - 1).  A step measured more than once counts at its
    fastest.  Raises ValueError without a job measured under both at 2+ micro-batches."""
    fastest: dict[tuple[str, str], tuple[float, dict]] = {}
    for r in rows:
        if "error" in r or r.get("stack") not in ("fsdp", "fsdp1") or row_label(r) != r["stack"]:
            continue
        key = (r["stack"], _job_key(r["job"]))
        seconds = float(r["measured_iteration_seconds"])
        if key not in fastest or seconds < fastest[key][0]:
            fastest[key] = (seconds, r["job"])
    xs, ys = [], []
    for (stack, shape), (seconds, job) in fastest.items():
        if stack == "fsdp1" and ("fsdp", shape) in fastest:
            xs.append(int(job["model"]["layers"]) * (int(job["layout"]["micro_batches"]) - 1))
            ys.append(seconds - fastest[("fsdp", shape)][0])
    if not any(xs):
        raise ValueError("no job measured under both fsdp and fsdp1 with 2 or more micro-batches")
    per_layer = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    fsdp = gpu_fsdp_layer_seconds(rows, bytes_per_second)["fsdp_layer_seconds"]
    return {"ratio": per_layer / fsdp, "accumulation_layer_seconds": per_layer, "fsdp_layer_seconds": fsdp,
            "pairs": len(xs)}


#: layout.recompute -> the checkpoint wrapper (predictor.host) FSDP2's stack runs it with.
GPU_CHECKPOINT_WRAPPERS = {"selective": "torch_op_sac", "full": "torch_fsdp"}


def gpu_checkpoint_layer_seconds(rows: Sequence[dict], recompute: str, layer_forward_seconds: float) -> dict:
    """An activation-checkpointing wrapper's own host work per layer and micro-batch on a GPU node,
    from real training steps (benchmarks/bench_gpu_stacks.py's rows): the same model at several
    depths under FSDP2 with ``layout.recompute = recompute`` and without (:func:`_depth_series`); the
    difference of the per-layer slopes, over the micro-batches, less the repeated forward's issue
    (``layer_forward_seconds``, which predictor.host adds apart), is the wrapper's: for TorchTitan's
    op-level SAC (``selective``) its policy called on every operator and its cache, for the
    non-reentrant ``checkpoint_wrapper`` (``full``) its saved-tensor hooks and the recompute's
    bookkeeping.  Keyed by the wrapper's name (:data:`GPU_CHECKPOINT_WRAPPERS`)."""
    if recompute not in GPU_CHECKPOINT_WRAPPERS:
        raise ValueError(f"recompute {recompute!r}: one of {', '.join(GPU_CHECKPOINT_WRAPPERS)}")
    label = f"fsdp+{recompute}"

    def relabel(r: dict) -> dict:
        # Named by its recomputation ("fsdp+selective"), which leaves the job's shape for the series.
        job = r["job"]
        return {**r, "stack": row_label(r), "job": {**job, "layout": {**job["layout"], "recompute": "none"}}}

    job_dict, depths, slope = _depth_series([relabel(r) for r in rows if "error" not in r], (label, "fsdp"))
    micro_batches = int(job_dict["layout"]["micro_batches"])
    per_micro_batch = (slope[label] - slope["fsdp"]) / micro_batches
    return {GPU_CHECKPOINT_WRAPPERS[recompute]: per_micro_batch - layer_forward_seconds, "slope_seconds": slope,
            "depths": depths, "micro_batches": micro_batches}


def gpu_paired_checkpoint_layer_seconds(files: Sequence[Sequence[dict]], base: str,
                                        layer_forward_seconds: float) -> dict:
    """Full recomputation's wrapper cost per layer and micro-batch on a GPU node, from interleaved
    steps (``bench_gpu_stacks.py --interleave``: each job under every stack in turn): each job's
    step under ``base+full`` or ``base+full:norng`` less the same job's step under ``base`` in the
    same file and round, over the job's layers and micro-batches; the median over those pairs,
    less one forward's issue (``layer_forward_seconds``, which predictor.host adds apart).  Pairs
    taken within a round cancel the host's drift across a call, which a slope over the fastest
    steps (:func:`_depth_series`) does not where the host drifts between rounds (rngseries*.json:
    by a median 23 %).
    ``files``: each file's rows.  ``rng_seconds`` is the median paired difference of the wrapper
    without RNG-state preservation (TorchTitan's) less with it (PyTorch's default, Composer's)."""
    steps: dict[tuple, dict[str, dict]] = {}
    for index, rows in enumerate(files):
        for r in rows:
            if "error" not in r:
                steps.setdefault((index, r.get("round", 0), r["name"]), {})[row_label(r)] = r

    def per_layer(r: dict, minus: dict) -> float:
        scale = int(r["job"]["model"]["layers"]) * int(r["job"]["layout"]["micro_batches"])
        return (float(r["measured_iteration_seconds"]) - float(minus["measured_iteration_seconds"])) / scale

    full = [per_layer(v[w], v[base]) for v in steps.values() if base in v
            for w in (f"{base}+full", f"{base}+full:norng") if w in v]
    rng = [per_layer(v[f"{base}+full:norng"], v[f"{base}+full"]) for v in steps.values()
           if f"{base}+full" in v and f"{base}+full:norng" in v]
    if not full:
        raise ValueError(f"no job measured under both {base} and {base}+full in one round")
    return {"seconds": statistics.median(full) - layer_forward_seconds, "pairs": len(full),
            "rng_seconds": statistics.median(rng) if rng else None, "rng_pairs": len(rng)}


def gpu_compiled_layer_ratio(rows: Sequence[dict]) -> dict:
    """A compiled layer's cost over an eager one's when the host issues the step (``torch.compile``
    of the module against the same module eager, :func:`_depth_series` of ``compile`` and ``ddp``
    rows): the ratio of the per-layer slopes, on a model small enough that the host is the slower."""
    job_dict, depths, slope = _depth_series(rows, ("compile", "ddp"))
    return {"ratio": slope["compile"] / slope["ddp"], "slope_seconds": slope, "depths": depths,
            "micro_batches": int(job_dict["layout"]["micro_batches"])}


# --- Activation checkpointing wrappers: their own host work per layer ------------------------------

#: The checkpoint wrappers measured (predictor.host.CHECKPOINT_WRAPPERS names the shipped ones):
#: Megatron-core's reentrant CheckpointFunction with its RNG tracker (:class:`_TrackedCheckpoint`, a
#: stand-in written for this CPU), DeepSpeed's ``deepspeed.checkpointing.checkpoint``, PyTorch's
#: non-reentrant ``checkpoint_wrapper`` (TorchTitan's and Composer's), the same with TorchTitan's
#: op-level selective policy, and plain reentrant ``torch.utils.checkpoint`` for reference.
CHECKPOINT_WRAPPERS = ("megatron", "deepspeed", "torch", "torch_op_sac", "torch_reentrant")
#: Generator states Megatron-core's tracker keeps (data-parallel, tensor-parallel, expert-parallel).
TRACKED_RNG_STATES = 3


class _RngTracker:
    """Megatron-core's CUDA RNG tracker: named generator states (tensors) the checkpoint keeps
    references to, with copies of the process's own CPU and device generator states, set back
    around the recompute (Megatron's ``get_states`` copies the dictionary, not the states).  On a
    CPU the device generator is the CPU's."""

    def __init__(self, states: int = TRACKED_RNG_STATES, device: str = "cpu"):
        self.cuda = device == "cuda"
        self.states = {f"rng-{i}": torch.Generator().manual_seed(1234 + i).get_state() for i in range(states)}

    def snapshot(self) -> tuple:
        device = torch.cuda.get_rng_state() if self.cuda else torch.get_rng_state()
        return torch.get_rng_state(), device, dict(self.states)

    def restore(self, states: tuple) -> None:
        cpu, device, tracked = states
        torch.set_rng_state(cpu)
        if self.cuda:
            torch.cuda.set_rng_state(device)
        else:
            torch.set_rng_state(device)
        self.states = tracked


class _TrackedCheckpoint(torch.autograd.Function):
    """A reentrant checkpoint as Megatron-core's ``tensor_parallel.checkpoint`` runs one: the RNG
    states copied before a no-grad forward, the inputs saved; in the backward the states swapped
    in, the inputs detached, the forward run again with grad and back-propagated inside this
    function's backward, the states swapped back."""

    @staticmethod
    def forward(ctx, run, tracker: _RngTracker, *args):      # type: ignore[override]
        ctx.run, ctx.tracker = run, tracker
        ctx.states = tracker.snapshot()
        with torch.no_grad():
            out = run(*args)
        ctx.save_for_backward(*args)
        return out

    @staticmethod
    def backward(ctx, *grads):                                # type: ignore[override]
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("a reentrant checkpoint needs .backward(), not .grad()")
        inputs = ctx.saved_tensors
        now = ctx.tracker.snapshot()
        ctx.tracker.restore(ctx.states)
        detached = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)
        with torch.enable_grad():
            out = ctx.run(*detached)
        ctx.tracker.restore(now)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        torch.autograd.backward(outs, grads)
        return (None, None) + tuple(x.grad for x in detached)


class _OneRankMpu:
    """The model-parallel unit deepspeed.checkpointing.configure asks for: one rank, no TP."""

    def get_model_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_group(self):  # noqa: ANN201
        return dist.group.WORLD

    get_data_parallel_rank = get_model_parallel_rank


def _deepspeed_checkpoint(device: str = "cpu"):
    """``deepspeed.checkpointing.checkpoint``, configured as GPT-NeoX and Megatron-DeepSpeed do at
    one model-parallel rank (no activation partitioning), its RNG tracker seeded on ``device``'s
    generator (a group must be up: gloo, or NCCL on ``cuda``; needs the deepspeed package)."""
    deepspeed = _import_deepspeed(device)
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    deepspeed.checkpointing.configure(_OneRankMpu(), partition_activations=False)
    tracker = deepspeed.checkpointing.get_cuda_rng_tracker()
    if not tracker.get_states():
        deepspeed.checkpointing.model_parallel_cuda_manual_seed(1234)
    return deepspeed.checkpointing.checkpoint


class _GptLayer(nn.Module):
    """Layer ``i`` of a :class:`calibrate.gpt_model.FlatGPT` as a module (what a wrapper wraps)."""

    def __init__(self, gpt, i: int):  # noqa: ANN001
        super().__init__()
        self.gpt, self.i = gpt, i

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gpt._layer(self.i, x)


def gpt_layers(n: int, device: str = "cpu") -> list[nn.Module]:
    """``n`` layers of the GPT-shaped model at the tiny shape ``perf-calibrate host`` times
    ``layer_seconds`` and ``layer_forward_seconds`` at (calibrate/host.py), fp32 on ``device``."""
    from predictor.job import TrainingJob

    from .gpt_model import FlatGPT
    from .host import _TINY
    job = TrainingJob.from_dict({
        "model": {"layers": n, "hidden": _TINY.hidden, "heads": _TINY.heads, "seq_len": _TINY.seq,
                  "vocab": _TINY.vocab, "attention": "flash", "pos_emb": "rotary"},
        "layout": {"micro_batch": 1, "micro_batches": 1, "zero_stage": 0, "recompute": "none"},
        "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 1}})
    gpt = FlatGPT(job, device, 1)
    return [_GptLayer(gpt, i) for i in range(n)]


#: The layers a checkpoint wrapper is measured around: the GPT-shaped layer (what ships: the
#: non-reentrant wrappers' hooks act per saved tensor and per op, so the layer's op count matters)
#: and the tiny LayerNorm + MLP :class:`Block`.
CHECKPOINT_LAYERS = ("gpt", "block")


class _Wrapped(nn.Module):
    """``n`` layers (``layer``: :data:`CHECKPOINT_LAYERS`), each called through ``wrapper`` (none:
    as they are); ``forward_only``: timed without the backward (:func:`_time_micro_batches`)."""

    input_requires_grad = True     # as a layer's input inside a model (_time_micro_batches)

    def __init__(self, n: int, wrapper: str, forward_only: bool = False, layer: str = "gpt", device: str = "cpu"):
        super().__init__()
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl,
                                                                                  checkpoint_wrapper)
        from torch.utils.checkpoint import checkpoint

        from .op_sac import op_sac_context
        self.forward_only = forward_only
        if layer not in CHECKPOINT_LAYERS:
            raise ValueError(f"unknown layer {layer!r} (known: {', '.join(CHECKPOINT_LAYERS)})")
        blocks = gpt_layers(n, device) if layer == "gpt" else [Block().to(device) for _ in range(n)]
        # The GPT layers take (seq · micro-batch, hidden) = (TOKENS, their hidden), as the blocks do.
        self.width = blocks[0].gpt.h if layer == "gpt" else HIDDEN
        self.calls = None
        if wrapper == "torch":
            blocks = [checkpoint_wrapper(b, checkpoint_impl=CheckpointImpl.NO_REENTRANT) for b in blocks]
        elif wrapper == "torch_op_sac":
            # TorchTitan's op-level SAC: its policy, counted afresh per call, and no RNG state kept.
            blocks = [checkpoint_wrapper(b, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=op_sac_context,
                                         preserve_rng_state=False) for b in blocks]
        elif wrapper == "torch_reentrant":
            self.calls = lambda b, x: checkpoint(b, x, use_reentrant=True)
        elif wrapper == "megatron":
            tracker = _RngTracker(device=device)
            self.calls = lambda b, x: _TrackedCheckpoint.apply(b, tracker, x)
        elif wrapper == "deepspeed":
            ds_checkpoint = _deepspeed_checkpoint(device)
            self.calls = lambda b, x: ds_checkpoint(b, x)
        elif wrapper != "none":
            raise ValueError(f"unknown checkpoint wrapper {wrapper!r} "
                             f"(known: none, {', '.join(CHECKPOINT_WRAPPERS)})")
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x) if self.calls is None else self.calls(b, x)
        return x


def checkpoint_costs(layers: Sequence[int], repeats: int, rounds: int,
                     wrappers: Sequence[str] = CHECKPOINT_WRAPPERS, layer: str = "gpt", device: str = "cpu") -> dict:
    """Each checkpoint wrapper's own host work per layer and micro-batch: the per-layer slope of
    forward + backward with every block wrapped, less the slope without a wrapper, less the slope
    of one forward with autograd recording (what a full recomputation's repeat is charged apart as
    ``layer_forward_seconds``), around ``layer`` (:data:`CHECKPOINT_LAYERS`).  The input requires
    grad, as a layer's input inside a model does (a reentrant checkpoint's backward runs only
    then).  A group must be up for ``deepspeed`` (gloo, or NCCL on ``cuda``).  On ``cuda`` the
    host's issue time (:func:`_time_micro_batches`)."""
    torch.manual_seed(0)
    models: dict[tuple[str, int], nn.Module] = {}
    for n in layers:
        models[("none", n)] = _Wrapped(n, "none", layer=layer, device=device)
        models[("forward", n)] = _Wrapped(n, "none", forward_only=True, layer=layer, device=device)
        for w in wrappers:
            models[(w, n)] = _Wrapped(n, w, layer=layer, device=device)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per = _interleaved(models, repeats, rounds, device)
    ns = list(layers)
    slope = {k: _slope(ns, [per[(k, n)] for n in ns]) for k in ("none", "forward", *wrappers)}
    return {"layer": layer, "layer_seconds": slope,
            "checkpoint_layer_seconds": {w: slope[w] - slope["none"] - slope["forward"] for w in wrappers},
            "per_config": {f"{k}_{n}": s for (k, n), s in per.items()}}
