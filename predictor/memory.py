"""Per-GPU memory of a training layout: does it fit on the platform's GPU?

The estimate is the worst pipeline stage's peak, in bytes, as the sum of

* **model states** (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", SC 2020, Sec. 3.1 and 5): with mixed-precision Adam each parameter costs
  2 bytes (fp16/bf16 weight) + 2 (fp16/bf16 gradient) + K = 12 (fp32 master weight, momentum,
  variance): 16 Ψ bytes for Ψ parameters.  ZeRO shards over the Nd data-parallel ranks:

  ====== ====================== =================================
  stage  bytes per GPU          7.5 B model, Nd = 64 (paper Fig 1)
  ====== ====================== =================================
  0      (2 + 2 + K) Ψ          120 GB
  1      (2 + 2) Ψ + K Ψ / Nd   31.4 GB
  2      2 Ψ + (2 + K) Ψ / Nd   16.6 GB
  3      (2 + 2 + K) Ψ / Nd     1.9 GB
  ====== ====================== =================================

  Pure fp32 training keeps no master copy: 4 (weight) + 4 (gradient) + 8 (momentum, variance),
  still 16 Ψ.  Where the framework keeps gradients in fp32 for reduction (Megatron-core, NeMo
  and TorchTitan bf16 training: :func:`predictor.recipe.gradient_precision`) they cost 4 bytes,
  18 Ψ in all.  Ψ here is the parameters *this GPU's stage and tensor-parallel rank* holds (see
  :func:`stage_parameters`); ZeRO-3 also keeps the gathered parameters of the layers in flight.

* **activations** (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", MLSys 2023, arXiv:2205.05198, Sec. 4, Table 2), for s = sequence, b = micro-batch,
  h = hidden, a = heads, t = tensor parallel, 16-bit tensors and 1-byte dropout masks, per layer
  and micro-batch:

  ===================================== =====================================
  no parallelism                        s·b·h·(34 + 5·a·s/h)
  tensor parallel                       s·b·h·(10 + 24/t + 5·a·s/(h·t))
  tensor + sequence parallel            s·b·h/t·(34 + 5·a·s/h)
  tensor parallel + selective recompute s·b·h·(10 + 24/t)
  tensor + sequence + selective         s·b·h·34/t
  full recompute                        2·s·b·h (÷t with sequence parallelism): the layer input
  ===================================== =====================================

  The 34 is built from named tensors (see :func:`layer_activation_bytes`), which is how this
  module generalises it to GQA (narrower K, V), SwiGLU and any ``ffn_hidden`` (wider MLP
  tensors), fp32 (4-byte tensors, masks stay 1 byte) and flash attention (no s² scores are
  kept, so selective recompute has nothing left to save).  With full recompute one layer's full
  activations are rebuilt during its backward pass: that working set is added once.  TorchTitan's
  op-level selective checkpointing keeps the layer's input and the outputs its save policy names
  (:func:`op_sac_layer_bytes`), and rebuilds the rest of one layer during its backward.
  DeepSpeed's checkpoint function keeps 1/t of its inputs per GPU with partitioned activations
  and none of them with CPU checkpointing (:func:`predictor.checkpointing.kept_share`).

* **in-flight micro-batches** (Korthikanti Sec. 4.2.3; Narayanan et al. SC 2021 for the
  schedules): under 1F1B stage r holds min(p − r, m) micro-batches' activations, so the first
  stage holds p micro-batches of L/p layers = L layers' worth; the interleaved schedule with v
  model chunks per stage holds (p − r − 1)·2 + (v − 1)·p + 1 chunk-micro-batches of L/(p·v)
  layers, i.e. L·(1 + (p − 1)/(p·v)) on the first stage.  pp = 1 with gradient accumulation
  holds one.

* **embedding and LM head**: the first stage holds the (tensor-parallel) word embedding plus a
  learned position embedding, and the embedding dropout mask s·b·h bytes per micro-batch in
  flight; the last stage holds the LM head (a second copy of the tied embedding when pp > 1, as
  Megatron and GPT-NeoX do), Korthikanti's final-norm and head inputs (2·e·s·b·h, ÷t with
  sequence parallelism) and, for its one micro-batch, the loss's peak over the logits
  (:func:`loss_bytes`).  Korthikanti count the fp32 logits the loss keeps (4·s·b·v/t); at the
  loss's peak the head's 16-bit logits are alive beside their fp32 copy, and PyTorch's own
  cross entropy writes its log-softmax into a second fp32 buffer.  The vocabulary is padded as
  GPT-NeoX pads it: to a multiple of 128 × t (Zhang et al. 2025, Eq. 1–2).

* **the optimizer step**: a trainer whose gradients are 16-bit steps on an fp32 copy of its
  gradient shard (DeepSpeed's ZeRO-1/2 optimizer builds it in ``step()`` and drops it after;
  Megatron's distributed optimizer counts it as the 4 of "4 + 16/d" bytes per parameter for fp16
  gradients).  No activation is held then, so the peak is the model states plus the larger of
  the activations and that copy (:attr:`MemoryEstimate.optimizer_step`).  Trainers that keep fp32
  gradients (Megatron's bf16 default, TorchTitan's fp32 reduction) step on them directly.
  DeepSpeed's bf16 training without ZeRO, or ZeRO-1 with fp32 gradients, runs its BF16_Optimizer
  (:func:`deepspeed_bf16_optimizer`): 2 + 2 + 4 bytes per parameter of bf16 weights, bf16 and
  fp32 gradients, and 12 / Nd of master weights and moments.

* **framework reserve**: the CUDA context, cuBLAS workspaces, NCCL and DeepSpeed communication
  buckets, and allocator fragmentation that no formula above sees: 2 GiB plus 5 % of the rest.
  A layout predicted to fit within a few percent of the card is therefore a layout that is
  likely to run, not one that needs luck.

The layers of each stage are :func:`predictor.recipe.stage_layers`, the split timing uses too
(the framework's rule, ``layout.pipe_split``, or an explicit ``layout.stage_layers``).  The
worst stage is searched among the first, the last, and the middle stages that hold more layers
than the first and every middle stage before them: a middle stage has neither embedding nor head,
holds no more micro-batches than an earlier stage, and its bytes grow with both, so any other
middle stage is outdone by one of those.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from .checkpointing import kept_share
from .job import Layout, ModelSpec
from .specs import runs_deepspeed_engine
from .recipe import (FSDP1_FRAMEWORKS, checkpoint_input_entries, fused_attention, gradient_precision,
                     layer_parameters, micro_batch_recipe, mlp_up_width, op_sac_recompute_share, padded_vocab,
                     reshards_after_forward, runs_op_sac, shard_ranks, stage_layers, stage_parameters)

if TYPE_CHECKING:  # only for the type hint of estimate_job
    from .job import TrainingJob

GIB = float(1 << 30)

#: bytes of one activation / weight element at each training precision
ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
#: optimizer bytes per parameter beyond weight and gradient (K of the ZeRO paper): Adam's fp32
#: master copy, momentum and variance under mixed precision; momentum and variance in fp32
OPTIMIZER_BYTES = {"fp16": 12, "bf16": 12, "fp32": 8}

#: Frameworks whose cross entropy computes the softmax in place in its fp32 copy of the logits
#: (Megatron-core ``tensor_parallel/cross_entropy.py`` and GPT-NeoX ``megatron/mpu/cross_entropy.py``:
#: ``exp(..., out=...)`` and ``div_`` on the upcast logits, kept for the backward, which edits
#: them in place).  The others (TorchTitan's and llm-foundry's ``F.cross_entropy`` on
#: ``logits.float()``, a job that names no framework) write the log-softmax to a new fp32 buffer
#: while the upcast copy is still referenced.
IN_PLACE_LOSS_FRAMEWORKS = ("megatron", "nemo", "neox", "deepspeed", "megatron-deepspeed")

# The framework reserve (module docstring): an allowance, not a measurement, for what the formulas
# do not count.  No published figure covers it as a whole (docs/modelling.md §7); it decides which
# layouts perf-advise calls fitting.
RESERVE_FIXED_BYTES = 2.0 * GIB
RESERVE_FRACTION = 0.05


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes per GPU on the worst pipeline stage, by component."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    reserve: float
    stage: int                 # the pipeline stage the figures are for (0 = first)
    parameters: int            # parameters this GPU's stage/TP rank holds (before ZeRO sharding)
    # The fp32 gradient copy the optimizer step adds once the activations are freed (module
    # docstring); the peak holds the larger of the two.
    optimizer_step: float = 0.0

    @property
    def transient(self) -> float:
        """Bytes beyond the model states at the peak: activations or the step's gradient copy."""
        return max(self.activations, self.optimizer_step)

    @property
    def formula_bytes(self) -> float:
        """The peak the formulas count, without the framework reserve."""
        return self.model_states + self.transient

    @property
    def total(self) -> float:
        return self.formula_bytes + self.reserve

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    @property
    def model_states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    def fits(self, memory_gib: float) -> bool:
        return self.total <= memory_gib * GIB

    def to_dict(self) -> dict[str, float]:
        return {
            "total_gib": round(self.total_gib, 3),
            "weights_gib": round(self.weights / GIB, 3),
            "gradients_gib": round(self.gradients / GIB, 3),
            "optimizer_gib": round(self.optimizer / GIB, 3),
            "activations_gib": round(self.activations / GIB, 3),
            "optimizer_step_gib": round(self.optimizer_step / GIB, 3),
            "reserve_gib": round(self.reserve / GIB, 3),
            "stage": self.stage,
            "parameters": self.parameters,
        }


# Parameter counts, the vocabulary padding and the stage split are the recipe's
# (predictor.recipe): memory sizes the same stages and parameters that timing costs.
# --------------------------------------------------------------------------------- activations
def layer_activation_bytes(model: ModelSpec, layout: Layout, precision: str,
                           recompute: str | None = None, framework: str = "") -> float:
    """Bytes one transformer layer keeps for one micro-batch until its backward pass.

    Korthikanti et al. Sec. 4.1, tensor by tensor (e = bytes per element, T = s·b tokens,
    k = K/V width, f = MLP inner width), replicated over TP ranks unless sequence parallel:
    norm-1 input e·T·h, QKV input e·T·h, attention dropout mask T·h, norm-2 input e·T·h (shared
    with norm-1's under parallel residual), MLP input e·T·h, MLP dropout mask T·h — the "10";
    split over TP ranks: Q e·T·h, K and V e·T·k each, attention-out input e·T·h, activation input
    e·T·f (2f for SwiGLU's gate+up), MLP-down input e·T·f — the "24" for k = h, f = 4h; attention
    scores: softmax output e·b·a·s², its dropout mask b·a·s², dropout output e·b·a·s² — the
    "5·a·s/h" (flash attention keeps none of these, only an fp32 log-sum-exp per row).

    TorchTitan's op-level selective checkpointing (``framework``) keeps what
    :func:`op_sac_layer_bytes` counts instead.
    """
    recompute = recompute or layout.recompute
    if recompute == "selective" and runs_op_sac(layout, framework):
        return op_sac_layer_bytes(model, layout, precision)
    e = ELEMENT_BYTES[precision]
    # Context parallelism: each rank holds s / cp of every sequence (attention's K/V of the other
    # chunks stream through and are not kept).
    s, b, h, a = model.seq_len // layout.cp, layout.micro_batch, model.hidden, model.heads
    t = layout.tp
    sp = layout.sequence_parallel and t > 1
    T = s * b
    # DeepSpeed's partitioned / CPU checkpointing keeps this share of the checkpoint's inputs on
    # the GPU (predictor/checkpointing.py).
    kept = kept_share(layout, recompute, framework)
    if recompute == "full":
        # Only the layer's input survives the forward pass.
        return kept * e * T * h / (t if sp else 1)
    k = model.kv_heads * model.head_dim
    f = model.ffn_hidden
    act_in = mlp_up_width(model)
    replicated = (e * T * h * (4 if not model.parallel_residual else 3)   # norm1 in, qkv in, norm2 in, mlp in
                  + 2 * T * h)                                            # two dropout masks
    sharded = e * T * (h + 2 * k + h + act_in + f)
    if fused_attention(model):
        sharded += 4 * b * a * s                                          # fp32 log-sum-exp
    elif recompute != "selective":
        sharded += (2 * e + 1) * b * a * s * s                            # softmax out, mask, dropout out
    total = (replicated + sharded) / t if sp else replicated + sharded / t
    if recompute == "selective" and kept < 1.0:
        # The attention core's checkpoint keeps Q, K and V, partitioned or in host memory.
        total -= (1.0 - kept) * e * checkpoint_input_entries(model, dataclasses.replace(layout, recompute=recompute))
    return total


def op_sac_layer_bytes(model: ModelSpec, layout: Layout, precision: str) -> float:
    """Bytes one layer keeps for one micro-batch under TorchTitan's op-level selective
    checkpointing: the layer's input (the checkpoint's argument) and the outputs its policy saves,
    the same policy :func:`predictor.recipe.op_sac_recompute_share` costs the recomputation of
    (``torchtitan/distributed/activation_checkpoint.py``): each matmul's output but every second
    one's (a saved share 1 − recomputed share of its output columns: wq's and wv's of the QKV, none
    of wo's, w1's half of a gated MLP's up projection or a GELU MLP's up projection, w2's or none),
    each fused attention call's output and its fp32 log-sum-exp, and with sequence parallelism the
    two reduce-scatters' outputs.  Norms, rotary, activations and residual adds are recomputed."""
    e = ELEMENT_BYTES[precision]
    recipe = micro_batch_recipe(model, layout)
    t = layout.tp
    sp = layout.sequence_parallel and t > 1
    saved = e * recipe.tokens * model.hidden / (t if sp else 1)                    # the layer's input
    for c in recipe.layer:
        kept = 1.0 - op_sac_recompute_share(c.name, model)
        if c.name.startswith("linear"):
            saved += kept * c.count * e * c.shape["m"] * c.shape["n"]
        elif c.name == "flash_atten" and kept:
            rows = c.shape["b"] * c.shape["heads"] * c.shape["l"]
            saved += c.count * rows * (e * c.shape["d"] + ELEMENT_BYTES["fp32"])   # output, log-sum-exp
    if sp:
        saved += 2 * e * recipe.tokens * model.hidden / t                          # reduce-scatter outputs
    return saved


def in_flight(layout: Layout, stage: int) -> float:
    """Micro-batches whose activations ``stage`` holds at its peak, in units of whole stages
    (for the interleaved schedule: chunk-micro-batches ÷ v, since a chunk is 1/v of the stage)."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    if p == 1:
        return 1.0
    if v == 1:
        return float(min(p - stage, m))
    chunks = min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
    return chunks / v


def loss_bytes(model: ModelSpec, layout: Layout, precision: str, framework: str = "") -> float:
    """Peak bytes of the logits and the cross entropy over them, for the last stage's one
    micro-batch: the head's logits (e bytes each, the vocabulary split over TP ranks), their fp32
    copy (none when training in fp32: the logits are fp32 already), and a second fp32 buffer for
    frameworks outside :data:`IN_PLACE_LOSS_FRAMEWORKS`."""
    e, f32 = ELEMENT_BYTES[precision], ELEMENT_BYTES["fp32"]
    tokens = model.seq_len // layout.cp * layout.micro_batch
    vp = padded_vocab(model.vocab, layout.tp)
    per_logit = e + (f32 if e != f32 else 0) + (0 if framework in IN_PLACE_LOSS_FRAMEWORKS else f32)
    return per_logit * tokens * vp / layout.tp


def stage_activation_bytes(model: ModelSpec, layout: Layout, precision: str, stage: int,
                           layers: Optional[int] = None, framework: str = "") -> float:
    """Activations ``stage`` holds at its peak: in-flight micro-batches of its layers, plus the
    embedding mask on the first stage and the head and loss (:func:`loss_bytes`) on the last."""
    e = ELEMENT_BYTES[precision]
    s, b, h, t = model.seq_len // layout.cp, layout.micro_batch, model.hidden, layout.tp
    sp = layout.sequence_parallel and t > 1
    T = s * b
    if layers is None:
        layers = stage_layers(model, layout)[stage]
    flight = in_flight(layout, stage)
    kept = layer_activation_bytes(model, layout, precision, framework=framework)
    total = flight * layers * kept
    if layout.recompute == "full":
        # During a layer's backward its activations are rebuilt in full: one layer, one batch.
        total += layer_activation_bytes(model, layout, precision, recompute="none")
    elif layout.recompute == "selective" and runs_op_sac(layout, framework):
        # Op-level checkpointing rebuilds, during a layer's backward, what that layer did not keep.
        total += max(0.0, layer_activation_bytes(model, layout, precision, recompute="none") - kept)
    if stage == 0:
        total += flight * T * h / (t if sp else 1)                      # embedding dropout mask
    if stage == layout.pp - 1:
        # Korthikanti's final-norm input and head input (e bytes each, split only with sequence
        # parallelism); the logits and the loss over them in place of their 4·s·b·v/t.
        total += 2 * e * T * h / (t if sp else 1) + loss_bytes(model, layout, precision, framework)
    return total


# --------------------------------------------------------------------------------- total
def _stage_estimate(model: ModelSpec, layout: Layout, precision: str, stage: int,
                    layers: Optional[int] = None, gradient_precision: str = "",
                    framework: str = "") -> MemoryEstimate:
    psi = stage_parameters(model, layout, stage, layers)
    e = ELEMENT_BYTES[precision]
    k = OPTIMIZER_BYTES[precision]
    # Gradients are kept in the precision they are reduced in: Megatron-core's bf16 training
    # accumulates them in an fp32 buffer (predictor.recipe.gradient_precision), 18 Ψ in all.
    # Composer keeps fp32 parameters (under autocast, or as FSDP1's flat parameters, whose reduced
    # gradient FSDP1 casts back to them: _cast_grad_to_param_dtype): fp32 gradients, reduced in any.
    g = ELEMENT_BYTES["fp32" if framework in FSDP1_FRAMEWORKS else gradient_precision or precision]
    # Gradients are reduced, and ZeRO shards, over dp × cp ranks (Megatron's data-parallel group
    # with context parallelism).
    nd, z = layout.dp * layout.cp, layout.zero_stage
    if z >= 2:
        nd = shard_ranks(layout)        # hybrid sharding (FSDP's ZeRO-2 and 3): over the shard group only
    weights = e * psi / (nd if z >= 3 else 1)
    gradients = g * psi / (nd if z >= 2 else 1)
    optimizer = k * psi / (nd if z >= 1 else 1)
    if z >= 3 and nd > 1:
        # ZeRO-3 gathers a layer's full parameters before using it and prefetches the next:
        # two layers' worth of 16-bit parameters are resident beyond the shard; without a
        # reshard after forward every layer's stay gathered from its forward to its backward.
        n_layers = layers if layers is not None else stage_layers(model, layout)[stage]
        held = 2 if reshards_after_forward(layout, framework) else max(2, n_layers)
        weights += held * e * layer_parameters(model, layout.tp)
    activations = stage_activation_bytes(model, layout, precision, stage, layers, framework)
    # A 16-bit gradient is stepped on as an fp32 copy of the shard the optimizer owns.
    f32 = ELEMENT_BYTES["fp32"]
    step = f32 * psi / (nd if z >= 1 else 1) if g < f32 else 0.0
    if deepspeed_bf16_optimizer(precision, layout, framework, gradient_precision):
        # DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py): the bf16 gradients the backward
        # writes are added into an fp32 buffer of the whole model, and the fp32 master weights
        # and Adam moments cover this rank's data-parallel partition, even without ZeRO.
        gradients = (e + f32) * psi
        optimizer = k * psi / nd
        step = 0.0
    rest = weights + gradients + optimizer + max(activations, step)
    reserve = RESERVE_FIXED_BYTES + RESERVE_FRACTION * rest
    return MemoryEstimate(weights, gradients, optimizer, activations, reserve, stage, int(psi), step)


def deepspeed_bf16_optimizer(precision: str, layout: Layout, framework: str = "",
                             gradient_precision: str = "") -> bool:
    """Whether DeepSpeed's engine trains the job with its BF16_Optimizer: bf16 with ZeRO off (the
    engine then accumulates gradients in fp32, ``engine.get_data_types``) or ZeRO-1 with fp32
    gradients (``engine._do_optimizer_sanity_check``); other ZeRO stages use its ZeRO optimizer."""
    if precision != "bf16" or not runs_deepspeed_engine(layout, framework):
        return False
    return layout.zero_stage == 0 or (layout.zero_stage == 1 and gradient_precision == "fp32")


def worst_stage_candidates(sizes: Sequence[int]) -> list[int]:
    """The stages that can hold the peak, given the layers per stage: the first, the last, and
    each middle stage with more layers than the first and every middle stage before it (see the
    module docstring)."""
    pp = len(sizes)
    if pp == 1:
        return [0]
    out = [0]
    most = sizes[0]
    for r in range(1, pp - 1):
        if sizes[r] > most:
            most = sizes[r]
            out.append(r)
    out.append(pp - 1)
    return out


def stage_estimates(model: ModelSpec, layout: Layout, precision: str = "fp16",
                    gradient_precision: str = "", framework: str = "") -> list[MemoryEstimate]:
    """Peak memory per GPU of every pipeline stage (:func:`estimate` is their maximum)."""
    sizes = stage_layers(model, layout)
    return [_stage_estimate(model, layout, precision, stage, n, gradient_precision, framework)
            for stage, n in enumerate(sizes)]


def estimate(model: ModelSpec, layout: Layout, precision: str = "fp16",
             gradient_precision: str = "", framework: str = "") -> MemoryEstimate:
    """Peak memory per GPU for ``layout``: its worst pipeline stage (the earliest on a tie).
    ``gradient_precision``: what gradients are kept in ("" = ``precision``; a job's is
    :func:`predictor.recipe.gradient_precision`, as :func:`estimate_job` takes it);
    ``framework``: the job's ``run.framework`` (its loss and ZeRO-3 resharding).

    Raises :class:`~predictor.errors.JobError` when the framework's split rule refuses the layout.
    """
    sizes = stage_layers(model, layout)
    worst: Optional[MemoryEstimate] = None
    for stage in worst_stage_candidates(sizes):
        est = _stage_estimate(model, layout, precision, stage, sizes[stage], gradient_precision, framework)
        if worst is None or est.total > worst.total:
            worst = est
    assert worst is not None
    return worst


def estimate_job(job: "TrainingJob") -> MemoryEstimate:
    """:func:`estimate` for a whole :class:`~predictor.job.TrainingJob`."""
    return estimate(job.model, job.layout, job.run.precision, job_gradient_precision(job), job.run.framework)


def job_gradient_precision(job: "TrainingJob", layout: Optional[Layout] = None) -> str:
    """The precision ``job`` keeps its gradients in, on its own layout or on ``layout``."""
    run = job.run
    return gradient_precision(run.precision, layout or job.layout, run.framework, run.grad_reduce_precision)


def model_states_bytes(parameters: float, dp: int, zero_stage: int, precision: str = "fp16") -> float:
    """The ZeRO paper's model-state bytes per GPU for ``parameters`` (its Fig. 1 / Table 1)."""
    e = ELEMENT_BYTES[precision]
    k = OPTIMIZER_BYTES[precision]
    return (e * parameters / (dp if zero_stage >= 3 else 1)
            + e * parameters / (dp if zero_stage >= 2 else 1)
            + k * parameters / (dp if zero_stage >= 1 else 1))
