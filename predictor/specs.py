"""What a training job is made of, as plain values: the model, its layout over GPUs, the run and the
cluster, and the names each key may take.

Kept apart from :mod:`predictor.job` (which parses and validates a whole job) so that the recipe,
which validation asks for the pipeline split, can use these without importing the job module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu")
ATTENTIONS = ("fused_softmax", "flash", "unfused")
#: The kernel that runs fused (``model.attention = "flash"``) attention ("" = the framework's
#: default, predictor.recipe.attention_implementation): cuDNN's fused attention (Transformer
#: Engine, PyTorch SDPA's cuDNN backend), FlashAttention-2 / -3 (the flash_attn package), a Triton
#: kernel (llm-foundry's attn_impl "triton"), PyTorch SDPA's flash (its FlashAttention-2 copy) and
#: memory-efficient backends, and SDPA's math fallback (the unfused computation, scores in memory).
ATTENTION_IMPLS = ("", "cudnn", "flash2", "flash3", "triton", "sdpa_flash", "sdpa_efficient", "math")
POS_EMBS = ("rotary", "learned", "alibi", "none")
RECOMPUTES = ("none", "selective", "full")
PRECISIONS = ("fp16", "bf16", "fp32")
#: FP8 for the transformer layers' linear GEMMs ("" = off): "delayed" scaling takes each tensor's
#: scale from past steps' maxima (Transformer Engine's default), "current" computes it from the
#: tensor itself first, one more read of it (TE's current/tensorwise scaling, torchao's dynamic).
FP8_RECIPES = ("", "delayed", "current")
#: the precision gradients are reduced in over data parallelism ("" = the framework's default:
#: predictor.recipe.gradient_precision)
GRAD_PRECISIONS = ("", "fp32", "bf16", "fp16")
#: ZeRO-3 / FSDP: whether a layer's gathered parameters are freed after its forward (and gathered
#: again for its backward).  TorchTitan's fsdp_reshard_after_forward words: "default" is the
#: framework's (predictor.recipe.reshards_after_forward), "always" / "never" say it.
RESHARD_POLICIES = ("default", "always", "never")
#: rules for splitting layers over pipeline stages (see predictor.recipe.pipeline_split)
PIPE_SPLITS = ("neox", "deepspeed_parameters", "deepspeed_uniform", "megatron")
# The training framework, where the launch says which ("" = not said): it decides what a layout
# may combine (TorchTitan's FSDP2 shards parameters, ZeRO-3 style, under pipeline parallelism).
FRAMEWORKS = ("", "neox", "deepspeed", "megatron", "megatron-deepspeed", "nemo", "torchtitan", "llm-foundry")
#: Frameworks whose ZeRO-3 (and ZeRO-2) is FSDP2 (``fully_shard``: each parameter its own sharded
#: tensor, gathered through one flat buffer and copied out to per-parameter tensors).
FSDP2_FRAMEWORKS = ("torchtitan",)
#: Frameworks whose ZeRO-2/3 is FSDP1 (``FullyShardedDataParallel``: one FlatParameter per wrapped
#: unit, gathered in place and used through views): Composer, which runs llm-foundry.
FSDP1_FRAMEWORKS = ("llm-foundry",)
# Frameworks whose pipeline runs on DeepSpeed's PipelineEngine (predictor.recipe.pipeline_sends).
DEEPSPEED_PIPELINE_FRAMEWORKS = ("neox", "deepspeed", "megatron-deepspeed")
# The others (Megatron-core, TorchTitan) split layers evenly over the stages (pipe_split
# "megatron"); a job file that names one and no pipe_split gets that rule.
EVEN_SPLIT_FRAMEWORKS = tuple(f for f in FRAMEWORKS if f and f not in DEEPSPEED_PIPELINE_FRAMEWORKS)


@dataclass(frozen=True)
class ModelSpec:
    """The network being trained (the paper's "application")."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    kv_heads: int = 0          # 0 = same as heads
    ffn_hidden: int = 0        # 0 = 4 * hidden; for gated MLPs the real inner width
    vocab: int = 50257         # unpadded tokenizer size
    norm: str = "layernorm"
    activation: str = "gelu"
    attention: str = "fused_softmax"
    attention_impl: str = ""   # ATTENTION_IMPLS: the fused attention's kernel; "" = the framework's
    pos_emb: str = "rotary"
    parallel_residual: bool = False
    tied_embeddings: bool = True
    # Biases on the linear layers (QKV, attention out, MLP up and down); None = by the norm:
    # LayerNorm (GPT-3 / NeoX style) has them, RMSNorm (LLaMA style) does not (predictor.recipe).
    linear_bias: Optional[bool] = None
    # Sliding-window attention: the keys each query attends to, itself included (a causal window
    # of w tokens); 0 = none (full causal attention), as a window at least seq_len long is.
    attention_window: int = 0

    def __post_init__(self) -> None:
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.linear_bias is None:
            object.__setattr__(self, "linear_bias", self.norm == "layernorm")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Layout:
    """How the job is split over GPUs (the paper's "execution")."""

    pp: int = 1
    tp: int = 1
    dp: int = 1
    cp: int = 1                # context parallelism: the sequence split over cp ranks (ring attention)
    micro_batch: int = 1
    micro_batches: int = 1
    zero_stage: int = 1
    recompute: str = "full"
    sequence_parallel: bool = False
    virtual_stages: int = 1
    # The pipeline split (module docstring; predictor.recipe.pipeline_split computes it).
    pipe_split: str = "neox"
    stage_layers: tuple[int, ...] = ()       # () = by pipe_split's rule
    first_stage_layers: int = 0              # 0 = not set (megatron only)
    last_stage_layers: int = 0               # 0 = not set (megatron only)
    account_for_embedding: bool = False      # megatron only
    account_for_loss: bool = False           # megatron only
    # Megatron-core's DDP: reduce gradients bucket by bucket during the last micro-batch's
    # backward (--overlap-grad-reduce), and gather the distributed optimizer's updated parameters
    # bucket by bucket under the next step's first forward (--overlap-param-gather).
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    # Transformer Engine's userbuffers: the sequence-parallel all-gathers and reduce-scatters run
    # in chunks under the layer's GEMMs (--tp-comm-overlap; predictor/tp_overlap.py).
    tp_comm_overlap: bool = False
    # ZeRO-3 as PyTorch FSDP runs it: hybrid sharding (HSDP: each parameter sharded over dp_shard
    # data-parallel ranks, replicated dp / dp_shard times; 0 = over all of dp) and whether a
    # layer's parameters are freed after its forward (RESHARD_POLICIES).
    dp_shard: int = 0
    reshard_after_forward: str = "default"
    # DeepSpeed's activation-checkpointing options (deepspeed.checkpointing.configure), which act
    # on checkpointed layers only (recompute full or selective): keep 1/tp of each checkpoint's
    # inputs per TP rank and all-gather them before the recompute; keep them in host memory;
    # synchronise the device at each checkpoint's start and end (predictor/checkpointing.py).
    partition_activations: bool = False
    checkpoint_in_cpu: bool = False
    checkpoint_sync_each_layer: bool = False

    def __post_init__(self) -> None:
        # A list from a TOML/JSON file or a caller becomes a tuple: layouts stay hashable (the
        # split is cached on them) and immutable.
        if not isinstance(self.stage_layers, tuple):
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))

    @property
    def gpus(self) -> int:
        return self.pp * self.tp * self.cp * self.dp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.micro_batch * self.micro_batches * self.dp


@dataclass(frozen=True)
class RunSpec:
    """How long the job runs and at which precision."""

    precision: str = "fp16"
    framework: str = ""        # FRAMEWORKS; "" = not said
    fp8: str = ""              # FP8_RECIPES: the layers' linear GEMMs in FP8; "" = off
    grad_reduce_precision: str = ""   # GRAD_PRECISIONS; "" = the framework's default
    compile: bool = False      # the model runs under torch.compile (TorchTitan's compile)
    train_iters: int = 0
    train_samples: int = 0
    train_tokens: int = 0
    eval_interval: int = 0
    eval_iters: int = 0
    save_interval: int = 0


@dataclass(frozen=True)
class ClusterSpec:
    """Where it runs, as far as the job itself says."""

    gpus_per_node: int = 0      # 0 = the platform's
    platform: str = ""


def runs_deepspeed_engine(layout: Layout, framework: str = "") -> bool:
    """Whether the job trains under DeepSpeed's engine (GPT-NeoX, DeepSpeed, Megatron-DeepSpeed)
    rather than Megatron-core's (Megatron-LM, NeMo) or TorchTitan's.  A job that names no
    framework follows its split rule: ``pipe_split = "megatron"`` is Megatron's."""
    if framework:
        return framework in DEEPSPEED_PIPELINE_FRAMEWORKS
    return layout.pipe_split != "megatron"


class JobParts(Protocol):
    """What the recipe reads of a job (:class:`predictor.job.TrainingJob` has it): named here so
    that the recipe does not import the job module that imports it."""

    model: ModelSpec
    layout: Layout
    run: RunSpec
    cluster: ClusterSpec
