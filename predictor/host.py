"""The host as a resource of its own: what the CPU spends issuing a micro-batch's work.

The operator regressors give device time.  A GPU cannot run ahead of the host that issues its
kernels (Python, the framework's module code, autograd, kernel and collective launches), so a
micro-batch on a stage takes at least as long as its host takes to issue it.  Small layers,
small micro-batches and fast GPUs make training host-bound: the time per micro-batch then barely
changes with the micro-batch size.

A platform carries the measured host costs in ``platform.toml``::

    [host]
    layer_seconds = 1.83e-3            # issue forward + backward of one transformer layer
    layer_forward_seconds = 3.2e-4     # of which the forward (what full recomputation repeats)
    micro_batch_seconds = 1.39e-3      # per micro-batch and stage: embedding/head/loss, engine entry
    launch_seconds = 9.6e-6            # one more kernel launch (FP8 casts, userbuffer chunks)
    collective_seconds = 3.2e-5        # one collective call (TP all-reduce, p2p, CP pass): autograd
                                       # function + c10d + enqueue; absent: launch_seconds
    fsdp_layer_seconds = 1.9e-3        # FSDP2's per-layer hooks, launches and stream waits, per
                                       # micro-batch (zero_stage >= 2 under an FSDP framework)
    zero3_layer_seconds = 1.0e-3       # DeepSpeed ZeRO-3's per-module hooks, per layer and
                                       # micro-batch (zero_stage 3 under a DeepSpeed framework)
    source = "perf-calibrate host on ..., torch ..., date"
    [host.checkpoint_layer_seconds]    # an activation-checkpointing wrapper's own work per layer
    megatron = 2.1e-4                  # and micro-batch, beyond the repeated forward (see
    deepspeed = 2.5e-4                 # CHECKPOINT_WRAPPERS); a wrapper not named costs nothing
    torch = 7.3e-4
    torch_op_sac = 1.8e-3
    [host.operators.linear1]           # one isolated call's host issue time, per direction
    fwd = 1.9e-5
    bwd = 1.2e-4
    [host.engines.deepspeed_pipeline]  # what a framework's engine adds (see ENGINES)
    step_seconds = 2.4e-3
    micro_batch_seconds = 1.7e-4
    layer_seconds = 4.7e-5
    source = "benchmarks/bench_engine_host.py on ..."

The operator samples were timed between CUDA events around one isolated call, so at small shapes
they measure the host's issue time, not the device's work (the device waits for the launch).
A sample is max(host issue, host lead-in + device work), the lead-in (what the host does before
the first kernel starts) lying between nothing and the whole call's host time.  With
``[host.operators]`` the predictor takes an operator's device time as its sample time less half
that call's host time, never below its roofline (the physical floor), with both ends in the
interval, and lets the host model above account for the issuing once, per micro-batch.

(``perf-calibrate host`` measures them; ``calibrate/host.py`` says how).  A platform without a
``[host]`` table has no host term: its device time stands alone, as before the table existed.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Protocol

from .errors import BundleError
from .job import DEEPSPEED_PIPELINE_FRAMEWORKS
from .recipe import FSDP1_FRAMEWORKS


class HostScales(Protocol):
    """The ``[fitted]`` host scales these costs are multiplied by (predictor.platform.FittedTerms
    has them); named here so that this module does not import the platform that imports it."""

    host_scale: float
    host_layer_scale: float
    host_micro_batch_scale: float
    host_launch_scale: float

_KEYS = ("layer_seconds", "layer_forward_seconds", "micro_batch_seconds", "launch_seconds",
         "collective_seconds", "fsdp_layer_seconds", "zero3_layer_seconds")
#: Framework engines whose own host work is measured apart (benchmarks/bench_engine_host.py):
#: DeepSpeed's PipelineEngine (its instruction loop: GPT-NeoX at any pp, DeepSpeed and
#: Megatron-DeepSpeed with pp > 1) and DeepSpeedEngine (forward / backward / step per micro-batch:
#: DeepSpeed and Megatron-DeepSpeed at pp = 1).  Megatron-core's schedules and TorchTitan's
#: loop are plain PyTorch around the model, which the per-layer and per-micro-batch costs are.
ENGINES = ("deepspeed_pipeline", "deepspeed")
_ENGINE_KEYS = ("step_seconds", "micro_batch_seconds", "layer_seconds")
_OPTIONAL = {"launch_seconds": 0.0, "layer_forward_seconds": -1.0, "collective_seconds": -1.0,
             "fsdp_layer_seconds": 0.0, "zero3_layer_seconds": 0.0}
#: Activation-checkpointing wrappers whose own host work per layer and micro-batch ``[host.
#: checkpoint_layer_seconds]`` carries (benchmarks/bench_stack_host.py --checkpoint): Megatron-
#: core's reentrant ``tensor_parallel.checkpoint`` (its RNG tracker's states copied and swapped),
#: DeepSpeed's ``deepspeed.checkpointing.checkpoint``, PyTorch's non-reentrant
#: ``checkpoint_wrapper`` (saved-tensor hooks), that wrapper with TorchTitan's op-level
#: selective policy (a dispatch mode over every op, forward and recompute), and that wrapper
#: around an FSDP-sharded block as TorchTitan's and Composer's full AC run it (``torch_fsdp``:
#: measured on a GPU node, where the recompute also passes FSDP's hooks).
CHECKPOINT_WRAPPERS = ("megatron", "deepspeed", "torch", "torch_op_sac", "torch_fsdp")
#: A wrapper a host table lacks is costed as the one it refines (a site's ``perf-calibrate host``
#: measures the CPU-side wrappers only).
CHECKPOINT_WRAPPER_FALLBACK = {"torch_fsdp": "torch"}
#: Frameworks whose ZeRO-2/3 is PyTorch FSDP (FSDP2's fully_shard per layer), whose per-layer hooks
#: ``fsdp_layer_seconds`` measures; llm-foundry's FSDP1 hooks cost 0.96-0.98 of FSDP2's
#: (benchmarks/bench_fsdp1_host.py).  DeepSpeed's ZeRO-3 hooks are another mechanism, measured
#: apart (``zero3_layer_seconds``: benchmarks/bench_stack_host.py --deepspeed).
FSDP_FRAMEWORKS = ("torchtitan", "llm-foundry")
#: A layer under ``torch.compile`` costs the host this share of the eager layer's issue time
#: (``run.compile``): the lent H100's per-layer slopes of the same module compiled and eager,
#: host-bound (benchmarks/data/h100-lent/stacks/compile.json; calibrate.stack_host.
#: gpu_compiled_layer_ratio).  That module's graph breaks at every layer, so a fully compiled
#: layer launches fewer kernels still: the ratio is an upper bound.
COMPILED_LAYER_HOST_RATIO = 0.635
#: Frameworks whose transformer layer is Megatron's own, without Transformer Engine: Megatron-
#: DeepSpeed's ParallelTransformerLayer and GPT-NeoX's (derived from it): column- and row-parallel
#: linear modules, a scale-mask-softmax module, three dropouts under an RNG tracker's fork.
#: Megatron and NeMo build their layers from Transformer Engine's modules by default, which this
#: measurement does not cover; a job that names no framework is perfcast's own reference layer.
MEGATRON_LAYER_FRAMEWORKS = ("megatron-deepspeed", "neox")
#: What such a layer adds to the reference layer's issue time (``layer_seconds``) per layer and
#: micro-batch, and in its forward (what full recomputation repeats): the medians of three runs of
#: benchmarks/bench_stack_host.py --device cuda --framework-layer on the lent H100 node's host
#: (framework-layer-h100-*.json; calibrate.framework_layer.pooled_extra).  Seconds, not a ratio:
#: the difference is Python and module dispatch, unlike the reference's kernel launches, which a
#: ratio would scale too (docs/modelling.md §2).  The 2-core VM's runs (framework-layer-[0-9].json,
#: 644 and 510 µs) are kept for reference: the GPU node's host paid 1.2 times as much.
MEGATRON_LAYER_EXTRA_SECONDS = 7.92e-4
MEGATRON_LAYER_FORWARD_EXTRA_SECONDS = 6.49e-4
#: DeepSpeed's ZeRO-1/2 optimizer puts a hook on every parameter's gradient (DeepSpeed 0.19.8 at
#: ZeRO-1 too, with ``contiguous_gradients``, its default); at ZeRO-2 each hook moves its gradient
#: into the reduction bucket every micro-batch.  What they add per layer (12 parameters) and
#: micro-batch: the medians of three runs of benchmarks/bench_stack_host.py --device cuda --zero12
#: on the lent H100 node's host (the engine on the GPU, one NCCL rank, at each stage less stage 0,
#: micro-batches inside a step: zero12-h100-*.json).  The 2-core VM's runs (zero12-[0-9].json,
#: 88.9 and 625.4 µs) are kept for reference (docs/modelling.md §2).
DEEPSPEED_ZERO_HOOK_LAYER_SECONDS = {1: 1.695e-4, 2: 9.568e-4}
#: llm-foundry's ZeRO-2 is FSDP1 SHARD_GRAD_OP: no reshard after the forward, so no unshard
#: before the backward; its hooks cost this share of FULL_SHARD's per layer (benchmarks/
#: bench_fsdp1_host.py on a fake 2-rank group: the median of the three runs that measured it,
#: benchmarks/data/fsdp1-host/cpu-{4,5,6}.json, 0.68-0.73).
FSDP1_SHARD_GRAD_OP_HOOK_RATIO = 0.699
#: FSDP1 (llm-foundry's Composer) costs the host more than FSDP2 on each micro-batch after a
#: step's first, per wrapped layer: this share of ``fsdp_layer_seconds`` (the lent H100, FSDP1 and
#: FSDP2 steps interleaved at 2/8/16 layers and 1/4 micro-batches, the same call's FSDP2 figure:
#: benchmarks/data/h100-lent/stacks/hseries.json, calibrate.stack_host.gpu_fsdp1_accumulation_ratio;
#: one rank, where FSDP1 runs NO_SHARD).
FSDP1_ACCUMULATION_HOOK_RATIO = 0.635
# Host costs are per-call overheads of microseconds to milliseconds; a value past this is a unit
# mistake (µs written as seconds), not a slow CPU.
_MAX_SECONDS = 1.0


def _seconds(v: Any, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not 0.0 <= v <= _MAX_SECONDS:
        raise BundleError(f"{where}: {key} must be a number of seconds in [0, {_MAX_SECONDS}], got {v!r}")
    return float(v)


@dataclass(frozen=True)
class EngineCosts:
    """What a framework's engine adds to the host's work, beyond the kernels and autograd the
    model's own code issues: per optimizer step, per micro-batch and stage, per layer and
    micro-batch (seconds)."""

    step_seconds: float
    micro_batch_seconds: float
    layer_seconds: float
    source: str = ""

    @classmethod
    def from_dict(cls, d: Any, where: str, name: str) -> "EngineCosts":
        key = f"host.engines.{name}"
        if not isinstance(d, Mapping):
            raise BundleError(f"{where}: [{key}] must be a table")
        unknown = set(d) - set(_ENGINE_KEYS) - {"source"}
        missing = set(_ENGINE_KEYS) - set(d)
        if unknown or missing:
            raise BundleError(f"{where}: [{key}] needs exactly {', '.join(_ENGINE_KEYS)} (and a source)"
                              + (f"; unknown {sorted(unknown)}" if unknown else "")
                              + (f"; missing {sorted(missing)}" if missing else ""))
        source = d.get("source", "")
        if not isinstance(source, str):
            raise BundleError(f"{where}: {key}.source must be a string")
        return cls(source=source, **{k: _seconds(d[k], where, f"{key}.{k}") for k in _ENGINE_KEYS})


def checkpoint_wrapper_for(framework: str, recompute: str, fsdp: bool = True) -> str:
    """The :data:`CHECKPOINT_WRAPPERS` entry that checkpoints a job's layers, once per layer and
    micro-batch, or "" without recomputation.  Full and selective recomputation wrap each layer
    once: Megatron's selective recomputation checkpoints the attention core through the same
    function as its full one (Megatron-DeepSpeed's through DeepSpeed's once configured), and
    TorchTitan's selective one is op-level SAC around the whole layer.  ``fsdp``: the job's layers
    are FSDP-sharded (TorchTitan's and llm-foundry's full AC then pays ``torch_fsdp``)."""
    if recompute not in ("full", "selective"):
        return ""
    # GPT-NeoX, DeepSpeed and Megatron-DeepSpeed configure deepspeed.checkpointing (mpu, RNG
    # tracker) and route their layers' checkpoints through it.
    if framework in DEEPSPEED_PIPELINE_FRAMEWORKS:
        return "deepspeed"
    if framework in ("megatron", "nemo"):
        return "megatron"
    if framework == "torchtitan" and recompute == "selective":
        return "torch_op_sac"
    if framework in FSDP_FRAMEWORKS and recompute == "full":
        # The GPU figure holds FSDP's hooks passed again in the recompute; without FSDP
        # (``fsdp`` False: ZeRO below 2) the block's wrapper is PyTorch's plain one.
        return "torch_fsdp" if fsdp else "torch"
    if not framework and recompute == "selective":
        # perfcast's selective recomputation is Megatron's (the attention core); PyTorch's
        # non-reentrant hooks, measured around a whole layer, would overstate a wrap of the core.
        return "megatron"
    # A job that names no framework is costed as perfcast's own training step runs full
    # recomputation (calibrate/gpt_model.py: torch.utils.checkpoint, non-reentrant).
    return "torch"


def fsdp_hook_share(framework: str, zero_stage: int, micro_batches: int = 1) -> float:
    """The share of ``fsdp_layer_seconds`` (FULL_SHARD's hooks) a layer pays per micro-batch under
    ``framework``'s FSDP at ``zero_stage``: :data:`FSDP1_SHARD_GRAD_OP_HOOK_RATIO` for an FSDP1
    framework's ZeRO-2 (llm-foundry's SHARD_GRAD_OP), and for FSDP1 beyond that
    :data:`FSDP1_ACCUMULATION_HOOK_RATIO` on each of a step's ``micro_batches`` after the first."""
    if framework not in FSDP1_FRAMEWORKS:
        return 1.0
    share = FSDP1_SHARD_GRAD_OP_HOOK_RATIO if zero_stage == 2 else 1.0
    return share + FSDP1_ACCUMULATION_HOOK_RATIO * (micro_batches - 1) / max(micro_batches, 1)


def layer_extra_seconds(framework: str) -> tuple[float, float]:
    """What ``framework``'s own transformer layer adds to the reference layer's issue time per
    layer and micro-batch, (forward + backward, forward): :data:`MEGATRON_LAYER_EXTRA_SECONDS` and
    :data:`MEGATRON_LAYER_FORWARD_EXTRA_SECONDS` for :data:`MEGATRON_LAYER_FRAMEWORKS`, else 0."""
    if framework in MEGATRON_LAYER_FRAMEWORKS:
        return MEGATRON_LAYER_EXTRA_SECONDS, MEGATRON_LAYER_FORWARD_EXTRA_SECONDS
    return 0.0, 0.0


def zero_hook_layer_seconds(framework: str, zero_stage: int) -> float:
    """:data:`DEEPSPEED_ZERO_HOOK_LAYER_SECONDS` for a layer of a job DeepSpeed's engine trains at
    ZeRO-1 or 2 (GPT-NeoX, DeepSpeed, Megatron-DeepSpeed), else 0 (ZeRO-3's hooks are
    ``zero3_layer_seconds``; a job that names no framework is not assumed to run DeepSpeed)."""
    if framework not in DEEPSPEED_PIPELINE_FRAMEWORKS:
        return 0.0
    return DEEPSPEED_ZERO_HOOK_LAYER_SECONDS.get(zero_stage, 0.0)


def engine_for(framework: str, pp: int) -> str:
    """The engine of :data:`ENGINES` that runs a job of ``framework`` with ``pp`` stages, or ""
    (a job that names no framework is not assumed to run one: the paper's runs and perfcast's own
    training steps carry no engine cost)."""
    if framework not in DEEPSPEED_PIPELINE_FRAMEWORKS:
        return ""
    # NeoX builds a PipelineModule at pipe-parallel-size 1 too; DeepSpeed and Megatron-DeepSpeed
    # jobs without pipeline parallelism train a plain module under DeepSpeedEngine.
    return "deepspeed_pipeline" if pp > 1 or framework == "neox" else "deepspeed"


@dataclass(frozen=True)
class HostCosts:
    """Measured host issue costs, in seconds (see the module docstring)."""

    layer_seconds: float
    micro_batch_seconds: float
    launch_seconds: float = 0.0
    layer_forward_seconds: float = -1.0     # < 0: not measured apart from the whole layer
    collective_seconds: float = -1.0        # < 0: a collective call costs one launch
    fsdp_layer_seconds: float = 0.0         # FSDP's hooks per layer and micro-batch
    zero3_layer_seconds: float = 0.0        # DeepSpeed ZeRO-3's hooks per layer and micro-batch
    source: str = ""
    # CHECKPOINT_WRAPPERS -> its own host work per layer and micro-batch (absent: none)
    checkpoint_layer_seconds: Mapping[str, float] = field(default_factory=dict)
    operators: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # op -> direction -> s
    engines: Mapping[str, EngineCosts] = field(default_factory=dict)          # ENGINES -> costs

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "HostCosts":
        if not isinstance(d, Mapping):
            raise BundleError(f"{where}: [host] must be a table")
        unknown = set(d) - set(_KEYS) - {"source", "operators", "engines", "checkpoint_layer_seconds"}
        if unknown:
            raise BundleError(f"{where}: unknown [host] keys {sorted(unknown)} (known: {', '.join(_KEYS)}, "
                              f"source, operators, engines, checkpoint_layer_seconds)")
        values = {}
        for key in _KEYS:
            v = d.get(key, _OPTIONAL.get(key))
            if key in _OPTIONAL and v == _OPTIONAL[key]:
                values[key] = float(v)
                continue
            values[key] = _seconds(v, where, f"host.{key}")
        source = d.get("source", "")
        if not isinstance(source, str):
            raise BundleError(f"{where}: host.source must be a string")
        ops = d.get("operators", {})
        if not isinstance(ops, Mapping):
            raise BundleError(f"{where}: [host.operators] must be a table of tables")
        per_op: dict[str, dict[str, float]] = {}
        for op, dirs in ops.items():
            if not isinstance(dirs, Mapping):
                raise BundleError(f"{where}: host.operators.{op} must be a table of directions")
            for direction, v in dirs.items():
                per_op.setdefault(str(op), {})[str(direction)] = _seconds(
                    v, where, f"host.operators.{op}.{direction}")
        engines = d.get("engines", {})
        if not isinstance(engines, Mapping):
            raise BundleError(f"{where}: [host.engines] must be a table of tables")
        bad = sorted(set(engines) - set(ENGINES))
        if bad:
            raise BundleError(f"{where}: unknown [host.engines] {bad} (known: {', '.join(ENGINES)})")
        per_engine = {name: EngineCosts.from_dict(t, where, name) for name, t in engines.items()}
        wrappers = d.get("checkpoint_layer_seconds", {})
        if not isinstance(wrappers, Mapping):
            raise BundleError(f"{where}: [host.checkpoint_layer_seconds] must be a table of seconds per wrapper")
        bad = sorted(set(wrappers) - set(CHECKPOINT_WRAPPERS))
        if bad:
            raise BundleError(f"{where}: unknown [host.checkpoint_layer_seconds] wrappers {bad} "
                              f"(known: {', '.join(CHECKPOINT_WRAPPERS)})")
        checkpoint = {w: _seconds(v, where, f"host.checkpoint_layer_seconds.{w}") for w, v in wrappers.items()}
        return cls(source=source, operators=per_op, engines=per_engine, checkpoint_layer_seconds=checkpoint,
                   **values)

    def call_seconds(self, op: str, direction: str, precision: str = "") -> float:
        """Host time of one isolated call of ``op`` (0 when not measured).  FP8 GEMM samples are
        direct calls with no autograd, measured apart as ``operators["<op>.fp8"]``."""
        key = f"{op}.fp8" if precision == "fp8" else op
        return self.operators.get(key, {}).get(direction, 0.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["operators"] = {op: dict(dirs) for op, dirs in self.operators.items()}
        d["engines"] = {name: asdict(e) for name, e in self.engines.items()}
        d["checkpoint_layer_seconds"] = dict(self.checkpoint_layer_seconds)
        return d

    @property
    def collective_call_seconds(self) -> float:
        """Host time of one collective call (``launch_seconds`` where not measured apart)."""
        return self.collective_seconds if self.collective_seconds >= 0 else self.launch_seconds

    def stage_seconds(self, layers: int, collectives: float, recompute: str,
                      fitted: "HostScales | None" = None, engine: str = "",
                      collective_calls: float = 0.0, fsdp_layers: int = 0, compiled: bool = False,
                      zero3_layers: int = 0, checkpoint: str = "", fsdp_share: float = 1.0,
                      layer_extra: tuple[float, float] = (0.0, 0.0)) -> float:
        """Host time to issue one micro-batch's forward and backward on a stage of ``layers``.

        ``collectives`` counts the kernel launches beyond a plain layer's kernels (FP8 casts,
        userbuffer chunks), ``collective_calls`` the collectives issued through c10d (TP
        all-reduces, pipeline and context-parallel sends), ``fsdp_layers`` the layers FSDP wraps
        (each paying its hooks), ``zero3_layers`` those DeepSpeed's ZeRO-3 partitions (each paying
        its hooks, ``fsdp_share`` of ``fsdp_layer_seconds`` each: :func:`fsdp_hook_share`),
        ``compiled`` a model under torch.compile (each layer's issue time
        :data:`COMPILED_LAYER_HOST_RATIO` of eager's);
        full recomputation issues every layer's forward a second time, in the backward, and so does
        op-level SAC (``torch_op_sac``: its policy serves the saved ops from a cache, but the
        layer's code runs again); ``checkpoint`` (:func:`checkpoint_wrapper_for`) is the wrapper
        around each recomputed layer, whose own work ``checkpoint_layer_seconds`` adds per layer.
        ``engine`` (:func:`engine_for`): the framework engine's own work per micro-batch and per
        layer is added where the platform measured it.
        ``layer_extra`` (:func:`layer_extra_seconds`): what the framework's own layer adds to the
        reference layer's issue time, forward + backward and in the forward a recomputation repeats.
        ``fitted``: the platform's ``[fitted]`` terms (perf-calibrate validate --fit), if any: the
        per-layer, per-micro-batch and launch costs each times its own scale, all times ``host_scale``.
        """
        extra, extra_forward = layer_extra
        layer = self.layer_seconds + extra
        if recompute == "full" or (recompute == "selective" and checkpoint == "torch_op_sac"):
            # Without a forward figure of its own, the whole layer bounds what the repeat adds.
            layer += self.layer_forward_seconds + extra_forward if self.layer_forward_seconds >= 0 \
                else self.layer_seconds + extra
        if recompute in ("full", "selective") and checkpoint:
            own = self.checkpoint_layer_seconds
            layer += own.get(checkpoint, own.get(CHECKPOINT_WRAPPER_FALLBACK.get(checkpoint, ""), 0.0))
        if compiled:
            layer *= COMPILED_LAYER_HOST_RATIO
        micro_batch = self.micro_batch_seconds
        e = self.engines.get(engine) if engine else None
        if e is not None:
            layer += e.layer_seconds
            micro_batch += e.micro_batch_seconds
        launches = collectives * self.launch_seconds + collective_calls * self.collective_call_seconds
        layer_total = layers * layer + fsdp_layers * fsdp_share * self.fsdp_layer_seconds \
            + zero3_layers * self.zero3_layer_seconds
        if fitted is None:
            return layer_total + micro_batch + launches
        # [fitted] (perf-calibrate validate --fit): each measured cost its own scale, and the one
        # host scale of files written before the costs were fitted apart over all of it.
        return fitted.host_scale * (layer_total * fitted.host_layer_scale
                                    + micro_batch * fitted.host_micro_batch_scale
                                    + launches * fitted.host_launch_scale)

    def engine_step_seconds(self, engine: str, fitted: "HostScales | None" = None) -> float:
        """The engine's own host work per optimizer step (0 without one, or unmeasured).  The step
        ends at a synchronisation (loss-scale or gradient-norm check, loss reporting), so the
        device waits through it whether the job is host-bound or not.  ``fitted``: as in
        :meth:`stage_seconds`, the host scale applies."""
        e = self.engines.get(engine) if engine else None
        if e is None:
            return 0.0
        return e.step_seconds * (fitted.host_scale if fitted is not None else 1.0)


__all__ = ["CHECKPOINT_WRAPPERS", "CHECKPOINT_WRAPPER_FALLBACK", "COMPILED_LAYER_HOST_RATIO", "ENGINES",
           "FSDP1_ACCUMULATION_HOOK_RATIO", "FSDP1_SHARD_GRAD_OP_HOOK_RATIO",
           "FSDP_FRAMEWORKS", "DEEPSPEED_ZERO_HOOK_LAYER_SECONDS", "MEGATRON_LAYER_EXTRA_SECONDS",
           "MEGATRON_LAYER_FORWARD_EXTRA_SECONDS", "MEGATRON_LAYER_FRAMEWORKS", "EngineCosts", "HostCosts",
           "checkpoint_wrapper_for", "engine_for", "fsdp_hook_share", "layer_extra_seconds", "zero_hook_layer_seconds"]
