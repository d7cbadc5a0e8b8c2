"""The transformer recipe: what one training job *is*, computed once for every part of perfcast.

From a model and its layout this module gives the widths each rank sees, the operators one
micro-batch runs (with their shapes), the parameters each GPU holds, the model's FLOPs, and the
pipeline split.  Timing (:mod:`predictor.estimate`), memory (:mod:`predictor.memory`),
perf-advise (:mod:`predictor.advise`) and calibration's plans (which shapes to measure) all read
it; nothing else computes a width, a parameter count or a split.

Paper references are to Zhang et al., arXiv:2509.22832: Eq. 1–2 vocabulary padding, Eq. 3–5
stage split, Eq. 6 / Table III parameter counts.  Where their code goes wrong, the comments say
what we do instead.  The counts reproduce the published closed forms: a GPT-3-style model
(LayerNorm, GeLU, biases, learned positions, tied embeddings) has
12·L·h² + 13·L·h + V·h + s·h + 2·h parameters (Narayanan et al., SC 2021, with V the padded
vocabulary), LLaMA-7B 6,738,415,616 (Touvron et al. 2023); tests/predictor/test_recipe.py checks
both and that the operators' FLOPs sum to the closed form of Narayanan et al.

**Linear biases.**  GPT-NeoX- and GPT-3-style models (LayerNorm) carry biases on every linear
layer; LLaMA-style models (RMSNorm; Megatron's ``--disable-bias-linear``, NeoX's LLaMA configs)
carry none.  ``model.linear_bias`` says which; left out, the norm decides (:func:`linear_bias`).

**The pipeline split** (:func:`pipeline_split`, the one place it is computed; timing, memory and
perf-advise all read it) follows the rule the framework itself applies, named by
``layout.pipe_split``:

* ``"neox"`` (default) — GPT-NeoX's default ``pipe_partition_method: "type:transformer|mlp"``.
  NeoX hands DeepSpeed's ``PipelineModule`` a list of L + 5 items: the embedding and the
  ``_pre_transformer_block`` hook, the L transformer layers, the ``_post_transformer_block`` hook,
  the final norm and the output layer.  ``type:REGEX`` gives weight 1 to every item whose class or
  function name matches the regex (so the two hooks count as well as the layers) and 0 to the
  rest, and ``ds_utils.partition_balanced`` splits those weights into pp contiguous parts.
* ``"deepspeed_parameters"`` — ``pipe_partition_method: "parameters"`` (DeepSpeed's own default):
  the same items weighted by their trainable parameters on one tensor-parallel rank (embedding and
  output layer included, the hooks 0), split by ``partition_balanced``.
* ``"deepspeed_uniform"`` — ``"uniform"``: ``ds_utils.partition_uniform`` over the L + 5 items
  (the paper's Eq. 3–5, for which the embedding, hook, norm and head count as layers).
* ``"megatron"`` — Megatron-LM / NeMo (``get_num_layers_to_build``): layers split evenly, and
  Megatron refuses a pp that does not divide them; ``layout.first_stage_layers`` /
  ``last_stage_layers`` (``--decoder-first/last-pipeline-num-layers``) fix the first / last stage
  and split the rest evenly; ``layout.account_for_embedding`` / ``account_for_loss``
  (``--account-for-embedding/loss-in-pipeline-split``) count the embedding / loss as one more
  layer of the first / last stage.
* ``layout.stage_layers`` — an explicit split, which overrides the rule for its own pp × v.

Which DeepSpeed: the arithmetic is that of current DeepSpeed (≥ 0.13.1; GPT-NeoX's DeeperSpeed v3.0
is DeepSpeed 0.16.5).  ``partition_uniform`` gives the remainder one item each to the first parts
(since 0.10.1, PR 4053; before, the last part took all of it); ``partition_balanced`` is a dynamic
programme over contiguous splits that minimises the spread (heaviest − lightest part) and, on
ties, keeps the last cut point it tried (since 0.13.1, PR 4312; before, a bisection on the heaviest
part's weight with greedy packing from the front, which for 44 layers over 4 stages gives
[11, 12, 12, 9] where the current code gives [11, 12, 11, 10]).  DeepSpeed's programme is
O(items² × stages); past ``_DP_LIMIT`` cells (hundreds of stages of thousands of layers, where
DeepSpeed itself would need minutes to start) we use the older bisection and log that we did.

Interleaved schedules (``virtual_stages`` v > 1) exist only in Megatron: the layers are split
evenly over pp × v model chunks (and with ``pipe_split = "megatron"`` its first/last and
embedding/loss options apply per chunk as Megatron applies them).  A DeepSpeed rule with v > 1
keeps that even split: DeepSpeed has no interleaving of its own to model.
"""
from __future__ import annotations

import functools
import logging
import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional, Sequence, Union

from .errors import JobError
from .specs import (FSDP1_FRAMEWORKS, FSDP2_FRAMEWORKS, PIPE_SPLITS, JobParts, Layout,  # noqa: F401
                    ModelSpec, runs_deepspeed_engine)                                       # (re-exported)

log = logging.getLogger(__name__)

# GPT-NeoX pads the vocabulary to a multiple of 128 × tp (make_vocab_size_divisible_by = 128).
VOCAB_MULTIPLE = 128
# GPT-NeoX's pipeline items around the L transformer layers: the embedding and the pre-block hook
# on the first stage; the post-block hook, the final norm and the output layer at the end.
FIRST_STAGE_ITEMS = 2
LAST_STAGE_ITEMS = 3
# Cells (stages × candidate cut pairs) up to which DeepSpeed's partition_balanced programme is
# replayed exactly; beyond, its older bisection (see the module docstring).
_DP_LIMIT = 40_000_000


def padded_vocab(vocab: int, tp: int) -> int:
    """Eq. 1: the whole padded vocabulary."""
    unit = VOCAB_MULTIPLE * tp
    return math.ceil(vocab / unit) * unit


def vocab_per_rank(vocab: int, tp: int) -> int:
    """Eq. 2: the vocabulary rows one tensor-parallel rank holds."""
    return padded_vocab(vocab, tp) // tp


# ------------------------------------------------------------------------------ widths
def is_gated(model: ModelSpec) -> bool:
    """A gated MLP (SwiGLU; GeGLU and ReGLU have the same shapes): the up projection makes gate
    and up together."""
    return model.activation == "swiglu"


def linear_bias(model: ModelSpec) -> bool:
    """Whether the linear layers carry biases (``model.linear_bias``; by default the norm decides:
    module docstring)."""
    return bool(model.linear_bias)


def norm_parameters(model: ModelSpec) -> int:
    """One norm's parameters: LayerNorm has a weight and a bias, RMSNorm a weight."""
    return (2 if model.norm == "layernorm" else 1) * model.hidden


def qkv_width(model: ModelSpec) -> int:
    """Output columns of the fused QKV projection (grouped-query attention: narrower K and V)."""
    return (model.heads + 2 * model.kv_heads) * model.head_dim


def mlp_up_width(model: ModelSpec) -> int:
    """Output columns of the MLP's up projection: 2 × ffn_hidden for a gated MLP."""
    return (2 if is_gated(model) else 1) * model.ffn_hidden


#: How frameworks size a gated MLP when the config gives no width: Megatron-LM's ``--swiglu``
#: takes 2/3 of 4h rounded *down* to a multiple of 64; Meta's LLaMA code (``multiple_of=256``)
#: rounds *up* to a multiple of 256.
GATED_FFN_RULES = ("megatron", "llama")


def gated_ffn_width(hidden: int, rule: str = "megatron") -> int:
    """The default inner width of a gated MLP of ``hidden`` under ``rule`` (:data:`GATED_FFN_RULES`)."""
    if rule == "megatron":
        return int((4 * hidden * 2 / 3) / 64) * 64
    if rule == "llama":
        return int(math.ceil(8 * hidden / 3 / 256) * 256)
    raise ValueError(f"gated_ffn_width: rule {rule!r} is not one of {', '.join(GATED_FFN_RULES)}")

# ------------------------------------------------------------------------------ DeepSpeed's arithmetic
def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """``deepspeed.runtime.utils.partition_uniform``: part boundaries (num_parts + 1 of them).

    Each part gets ``num_items // num_parts`` items and the first ``num_items % num_parts`` parts
    one more; with no more items than parts, one item each and the rest empty.
    """
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """``deepspeed.runtime.utils.partition_balanced`` (DeepSpeed ≥ 0.13.1): part boundaries.

    DeepSpeed's dynamic programme over (items so far i, parts so far j) keeps, per cell, the one
    predecessor k whose split has the smallest spread max − min of part weights, the last such k
    on ties (its loop over k ascends and replaces on ``>=``).  This is the same recurrence with the
    loop over i and k done as array operations, only over the cells a full split can pass through.
    """
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    key = tuple(float(w) for w in weights)
    cells = m * (n - m + 1) ** 2
    if cells > _DP_LIMIT:
        log.info("pipeline split of %d items over %d stages: DeepSpeed's O(n²·p) search is out of "
                 "reach (%d cells); using its older bisection", n, m, cells)
        return list(_partition_bisect(key, m))
    return list(_partition_dp(key, m))


@functools.lru_cache(maxsize=1024)
def _partition_dp(weights: tuple[float, ...], m: int) -> tuple[int, ...]:
    import numpy as np   # lazily: `import predictor` stays light

    n = len(weights)
    ps = np.zeros(n + 1)
    ps[1:] = np.cumsum(weights)
    inf = math.inf
    # Column j - 1 of DeepSpeed's dp_max / dp_min / dp_cost, over k = 0..n.  Column 0: only k = 0
    # is reached; DeepSpeed never sets dp_min[0, 0], so it stays +inf there.
    prev_max = np.full(n + 1, inf)
    prev_min = np.full(n + 1, inf)
    prev_max[0] = 0.0
    position = np.zeros((n + 1, m + 1), dtype=np.int64)
    for j in range(1, m + 1):
        # Rows i that a split of all n items into m parts can pass through at column j, and the
        # predecessors k worth looking at: k < j - 1 are unreached (cost +inf; DeepSpeed visits
        # them first, so they never win against a reached k).
        lo_i, hi_i = j, n - (m - j)
        ks = np.arange(j - 1, hi_i)
        cur_max = np.full(n + 1, inf)
        cur_min = np.full(n + 1, inf)
        pmax, pmin = prev_max[ks], prev_min[ks]
        for r0 in range(lo_i, hi_i + 1, 512):          # row blocks bound the memory
            rows = np.arange(r0, min(r0 + 512, hi_i + 1))
            seg = ps[rows][:, None] - ps[ks][None, :]
            mx = np.maximum(pmax[None, :], seg)
            mn = np.minimum(pmin[None, :], seg)
            cost = mx - mn
            cost[ks[None, :] >= rows[:, None]] = np.nan    # k < i only
            best = np.nanmin(cost, axis=1)
            hit = cost == best[:, None]
            last = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
            idx = np.arange(len(rows))
            cur_max[rows] = mx[idx, last]
            cur_min[rows] = mn[idx, last]
            position[rows, j] = ks[last]
        prev_max, prev_min = cur_max, cur_min
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return tuple(reversed(parts))


@functools.lru_cache(maxsize=256)
def _partition_bisect(weights: tuple[float, ...], m: int, eps: float = 1e-3) -> tuple[int, ...]:
    """DeepSpeed < 0.13.1's partition_balanced: the smallest bottleneck by bisection, then greedy
    packing from the front (``_lprobe``)."""
    prefix = []
    total = 0.0
    for w in weights:
        total += w
        prefix.append(total)
    lower, upper = total / m, total
    while upper > lower + eps:
        mid = lower + (upper - lower) / 2
        if _lprobe(prefix, m, mid)[1]:
            upper = mid
        else:
            lower = mid + eps
    parts, ok = _lprobe(prefix, m, upper)
    assert ok, "DeepSpeed's bisection always ends on a feasible bottleneck"
    return tuple(parts)


def _lprobe(prefix: list[float], m: int, bottleneck: float) -> tuple[list[int], bool]:
    n = len(prefix)
    parts = [0] + [n] * m
    bsum = bottleneck
    chunk = n // m
    step = chunk
    for p in range(1, m):
        while step < n and prefix[step] < bsum:
            step += chunk
        parts[p] = bisect_left(prefix, bsum, lo=step - chunk, hi=min(step, n))
        if parts[p] == n:
            return parts, prefix[-1] - prefix[parts[p - 1]] < bottleneck
        bsum = prefix[parts[p] - 1] + bottleneck
    return parts, bsum >= prefix[-1]


# ------------------------------------------------------------------------------ the split
def _neox_items(model: ModelSpec, tp: int, rule: str) -> list[int]:
    """Weights of GPT-NeoX's pipeline items [embedding, pre hook, L layers, post hook, norm, head]
    under ``pipe_partition_method`` ``type:transformer|mlp`` or ``parameters``."""
    L = model.layers
    if rule == "neox":
        # The regex matches ParallelTransformerLayerPipe and the _pre/_post_transformer_block hooks.
        return [0, 1] + [1] * L + [1, 0, 0]
    emb = vocab_per_rank(model.vocab, tp) * model.hidden + position_parameters(model)
    norm = norm_parameters(model)
    # Tied embeddings: the head is a second TiedLayerSpec of the whole EmbeddingPipe, and DeepSpeed
    # builds and counts it like the first; untied, a ParallelLinearPipe without bias.
    head = emb if model.tied_embeddings else vocab_per_rank(model.vocab, tp) * model.hidden
    return [emb, 0] + [layer_parameters(model, tp)] * L + [0, norm, head]


def _layers_per_part(parts: Sequence[int], layers: int) -> tuple[int, ...]:
    """Transformer layers in each part of the NeoX item list (layers are items 2 .. L + 1)."""
    lo, hi = FIRST_STAGE_ITEMS, FIRST_STAGE_ITEMS + layers
    return tuple(max(0, min(b, hi) - max(a, lo)) for a, b in zip(parts, parts[1:]))


def _megatron(model: ModelSpec, lay: "Layout | _SplitKeys") -> tuple[int, ...]:
    """Megatron-LM's get_num_layers_to_build, for every (virtual) stage, in pipeline order."""
    L, pp, v = model.layers, lay.pp, lay.virtual_stages
    first, last = lay.first_stage_layers, lay.last_stage_layers
    if first or last:
        if lay.account_for_embedding or lay.account_for_loss:
            key = "layout.account_for_embedding" if lay.account_for_embedding else "layout.account_for_loss"
            raise JobError(key, "cannot be combined with layout.first_stage_layers / last_stage_layers "
                                "(Megatron: no standalone embedding or loss stage with uneven pp)")
        key = "layout.first_stage_layers" if first else "layout.last_stage_layers"
        if pp < 2:
            raise JobError(key, "an uneven first or last stage needs pp of at least 2")
        if pp == 2 and first and last and first + last != L:
            raise JobError(key, f"first_stage_layers + last_stage_layers = {first + last} "
                                f"must be the {L} layers when pp = 2")
        rest = L - first - last
        left = pp - (1 if first else 0) - (1 if last else 0)
        if rest < 0 or (left == 0 and rest):
            raise JobError(key, f"first_stage_layers + last_stage_layers = {first + last} "
                                f"do not fit the {L} layers")
        if left and rest % left:
            raise JobError(key, f"the {rest} layers left after the first/last stage must be divisible "
                                f"by the {left} other stages (Megatron refuses otherwise)")
        mid = rest // left if left else 0
        per_rank = [mid] * pp
        if first:
            per_rank[0] = first
        if last:
            per_rank[-1] = last
        if v > 1:
            for r, n in enumerate(per_rank):
                if n % v:
                    k = ("layout.first_stage_layers" if r == 0 and first else
                         "layout.last_stage_layers" if r == pp - 1 and last else "layout.virtual_stages")
                    raise JobError(k, f"stage {r}'s {n} layers must be divisible by virtual_stages ({v})")
        # Chunk c = k·pp + r holds stage r's k-th model chunk.
        return tuple(per_rank[c % pp] // v for c in range(pp * v))
    extra = int(lay.account_for_embedding) + int(lay.account_for_loss)
    total = L + extra
    if total % pp:
        what = f"layers ({L})" + (f" + {extra} for embedding/loss" if extra else "")
        raise JobError("layout.pp", f"Megatron splits the layers evenly: {what} must be divisible by "
                                    f"pp ({pp}); or set layout.first_stage_layers / last_stage_layers")
    per_rank = total // pp
    if per_rank % v:
        raise JobError("layout.virtual_stages", f"the {per_rank} layers per stage must be divisible by "
                                                f"virtual_stages ({v})")
    chunks = [per_rank // v] * (pp * v)
    # The embedding (loss) counts as a layer of the first (last) model chunk, which builds one less.
    chunks[0] -= int(lay.account_for_embedding)
    chunks[-1] -= int(lay.account_for_loss)
    if min(chunks) < 0:
        key = "layout.account_for_embedding" if chunks[0] < 0 else "layout.account_for_loss"
        raise JobError(key, "not enough layers in the first/last (virtual) stage to count the "
                            "embedding/loss as one of them")
    return tuple(chunks)


def pipeline_split(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Transformer layers of each pipeline (virtual) stage: ``pp × virtual_stages`` entries in
    pipeline order (entry c is device ``c % pp``'s model chunk ``c // pp``), summing to the layers.

    The framework's rule is ``layout.pipe_split`` (module docstring); ``layout.stage_layers``, when
    given, is the split.  A split the framework would refuse raises :class:`JobError` naming the
    key.  The DeepSpeed rules may leave a stage without transformer layers, as DeepSpeed does when
    there are few layers per stage; explicit and Megatron splits never do unless asked to.
    """
    # Cached on what the split depends on (perf-advise asks for thousands of layouts that differ
    # only in dp, micro-batch, recompute or ZeRO); tp only matters when parameters are weighed.
    tp = layout.tp if layout.pipe_split == "deepspeed_parameters" else 1
    return _split_cached(model, tp, layout.pp, layout.virtual_stages, layout.pipe_split,
                         tuple(layout.stage_layers), layout.first_stage_layers,
                         layout.last_stage_layers, layout.account_for_embedding,
                         layout.account_for_loss)


class _SplitKeys(NamedTuple):
    """The layout keys the split reads, under the layout's names (cheaper to build than a Layout)."""

    pp: int
    tp: int
    virtual_stages: int
    pipe_split: str
    stage_layers: tuple[int, ...]
    first_stage_layers: int
    last_stage_layers: int
    account_for_embedding: bool
    account_for_loss: bool


@functools.lru_cache(maxsize=4096)
def _split_cached(model: ModelSpec, tp: int, pp: int, v: int, rule: str, explicit: tuple[int, ...],
                  first: int, last: int, emb: bool, loss: bool) -> tuple[int, ...]:
    return _split(model, _SplitKeys(pp, tp, v, rule, explicit, first, last, emb, loss))


def _split(model: ModelSpec, layout: "Layout | _SplitKeys") -> tuple[int, ...]:
    L, pp, v = model.layers, layout.pp, layout.virtual_stages
    chunks = pp * v
    megatron_opts = [k for k in ("first_stage_layers", "last_stage_layers", "account_for_embedding",
                                 "account_for_loss") if getattr(layout, k)]
    if layout.stage_layers:
        if megatron_opts:
            raise JobError("layout.stage_layers", f"an explicit split cannot be combined with "
                                                  f"layout.{megatron_opts[0]}")
        split = tuple(layout.stage_layers)
        if len(split) != chunks:
            raise JobError("layout.stage_layers",
                           f"has {len(split)} entries; pp × virtual_stages = {chunks} are needed")
        if any(n < 1 for n in split):
            raise JobError("layout.stage_layers", f"every stage needs at least one layer, got {list(split)}")
        if sum(split) != L:
            raise JobError("layout.stage_layers", f"sums to {sum(split)}, not the model's {L} layers")
        return split
    if layout.pipe_split == "megatron":
        return _megatron(model, layout)
    if layout.pipe_split not in PIPE_SPLITS:
        raise JobError("layout.pipe_split", f"{layout.pipe_split!r} is not one of {', '.join(PIPE_SPLITS)}")
    if megatron_opts:
        raise JobError(f"layout.{megatron_opts[0]}",
                       f"is a Megatron option: it needs layout.pipe_split = 'megatron', "
                       f"not {layout.pipe_split!r}")
    if L < chunks:
        raise JobError("layout.pp", f"{L} layers cannot fill pp × virtual_stages = {chunks} stages")
    if v > 1:
        if L % chunks:
            raise JobError("layout.virtual_stages",
                           f"layers ({L}) must be divisible by pp × virtual_stages ({chunks}) "
                           "for the interleaved schedule")
        return (L // chunks,) * chunks
    if pp == 1:
        return (L,)
    if layout.pipe_split == "deepspeed_uniform":
        parts = partition_uniform(L + FIRST_STAGE_ITEMS + LAST_STAGE_ITEMS, pp)
    else:
        parts = partition_balanced(_neox_items(model, layout.tp, layout.pipe_split), pp)
    return _layers_per_part(parts, L)


def stage_layers(model: Union[ModelSpec, JobParts], layout: Optional[Layout] = None) -> list[int]:
    """Transformer layers per pipeline stage (per device; summed over its virtual chunks).

    ``stage_layers(job)`` or ``stage_layers(job.model, job.layout)``; see :func:`pipeline_split`.
    """
    if layout is None and isinstance(getattr(model, "layout", None), Layout):   # a TrainingJob
        model, layout = model.model, model.layout
    if not isinstance(model, ModelSpec) or not isinstance(layout, Layout):
        raise TypeError("stage_layers(model, layout) or stage_layers(job): the split depends on the "
                        "framework's rule in the layout, not on the layer count alone")
    split, pp = pipeline_split(model, layout), layout.pp
    if len(split) == pp:
        return list(split)
    # Device r holds chunks r, r + pp, r + 2·pp, ... (Megatron's interleaved order).
    return [sum(split[r::pp]) for r in range(pp)]


# ------------------------------------------------------------------------------ parameters
def layer_parameters(model: ModelSpec, tp: int = 1) -> int:
    """Parameters of one transformer layer on one tensor-parallel rank (Eq. 6, with GQA, gated
    MLPs and the bias rule of :func:`linear_bias`).

    Megatron's split, which DeepSpeed counts the same way when it builds a layer on one rank: QKV
    and MLP-up are column parallel (weights and biases ÷ tp), attention-out and MLP-down row
    parallel (weights ÷ tp, biases whole), the two norms whole.
    """
    h = model.hidden
    bias = 1 if linear_bias(model) else 0
    qkv, up = qkv_width(model) // tp, mlp_up_width(model) // tp
    attn_in, ffn = model.heads * model.head_dim // tp, model.ffn_hidden // tp
    return (h * qkv + bias * qkv) + (attn_in * h + bias * h) \
        + (h * up + bias * up) + (ffn * h + bias * h) + 2 * norm_parameters(model)


def position_parameters(model: ModelSpec) -> int:
    """Learned position embeddings (seq_len × hidden, whole on every TP rank of the first stage);
    rotary, ALiBi and none have no parameters."""
    return model.seq_len * model.hidden if model.pos_emb == "learned" else 0


def input_embedding_parameters(model: ModelSpec, tp: int = 1) -> int:
    """The first stage's embedding parameters on one TP rank: its vocabulary shard and the
    learned positions, if any."""
    return vocab_per_rank(model.vocab, tp) * model.hidden + position_parameters(model)


def stage_parameters(model: ModelSpec, layout: Layout, stage: int, layers: Optional[int] = None) -> int:
    """Parameters one GPU of pipeline ``stage`` holds (its tensor-parallel shard), before ZeRO
    (Table III).  ``layers``: the stage's transformer layers when the caller has the split."""
    if layers is None:
        layers = stage_layers(model, layout)[stage]
    return layers * layer_parameters(model, layout.tp) + _end_parameters(model, layout, stage)


def stage_parameter_counts(model: ModelSpec, layout: Layout) -> list[int]:
    """:func:`stage_parameters` of every pipeline stage, in order."""
    per_layer = layer_parameters(model, layout.tp)
    return [n * per_layer + _end_parameters(model, layout, r) for r, n in enumerate(stage_layers(model, layout))]


def _end_parameters(model: ModelSpec, layout: Layout, stage: int) -> int:
    """What ``stage`` holds beside its layers: the first stage's embedding, the last's final norm
    and head."""
    tp, pp = layout.tp, layout.pp
    n = 0
    if stage == 0:
        n += input_embedding_parameters(model, tp)
    if stage == pp - 1:
        n += norm_parameters(model)                  # the final norm
        # The head: its own matrix when untied; with pp > 1 the last stage also keeps its own copy
        # of a tied embedding (its gradient is all-reduced with the first stage's).
        if not model.tied_embeddings or pp > 1:
            n += vocab_per_rank(model.vocab, tp) * model.hidden
    return n


def total_parameters(model: ModelSpec, tp: int = 1) -> int:
    """Parameters of the whole model, its vocabulary padded for ``tp`` ranks."""
    embedding = padded_vocab(model.vocab, tp) * model.hidden
    return (model.layers * layer_parameters(model, 1) + embedding * (1 if model.tied_embeddings else 2)
            + position_parameters(model) + norm_parameters(model))


# ------------------------------------------------------------------------------ operators
#: The attention core: what selective recompute replays in backward, and what hides the ring
#: K/V passes of context parallelism.
ATTENTION_CORE = frozenset(("baddbmm", "scaled_masked_softmax", "bmm", "fillmask", "flash_atten"))


def fused_attention(model: ModelSpec) -> bool:
    """Whether the job's attention runs as one fused kernel: ``attention = "flash"``, unless its
    kernel is SDPA's math fallback, which computes (and keeps) the scores as the unfused path."""
    return model.attention == "flash" and model.attention_impl != "math"


def attention_window_fraction(seq_len: float, window: int) -> float:
    """The share of causal attention's work that a sliding window of ``window`` keys per query
    (itself included; 0 = no window) computes at sequence length ``seq_len``: query i meets
    min(i + 1, w) keys, w(w + 1)/2 + (s − w)·w pairs in all against s(s + 1)/2 for the whole causal
    square.  1.0 exactly without a window or with one at least the sequence long."""
    s, w = seq_len, window
    if w <= 0 or w >= s:
        return 1.0
    return (w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2)


@dataclass(frozen=True)
class OperatorCall:
    """One operator kind (a :data:`predictor.operators.OPERATORS` name) with its shape on one
    rank, called ``count`` times per micro-batch in forward (and as often in backward).

    ``work``: the share of each call's work (its FLOPs and its time at that shape) the call does:
    below 1 for a fused attention kernel that skips the blocks outside a sliding window
    (:func:`attention_window_fraction`); what the call keeps in memory does not change."""

    name: str
    shape: Mapping[str, float]
    count: float = 1.0
    work: float = 1.0

    @property
    def attention_core(self) -> bool:
        return self.name in ATTENTION_CORE

    def forward_flops(self) -> float:
        """FLOPs of the ``count`` forward calls (element-wise operators count none)."""
        from .operators import OPERATORS    # the numpy catalogue; the split alone does not need it
        flops = OPERATORS[self.name].flops({k: float(v) for k, v in self.shape.items()})
        if self.work != 1.0:
            return float(flops) * self.count * self.work
        return float(flops) * self.count


@dataclass(frozen=True)
class MicroBatchRecipe:
    """What one rank runs for one micro-batch, and the sizes its communication moves.

    Sizes are tensor elements; ``layer`` is one transformer layer, ``embedding`` the first stage's
    extra operators, ``head`` the last stage's (final norm, output projection, loss).
    """

    tokens: float                        # tokens per rank: micro_batch × seq_len / cp
    layer: tuple[OperatorCall, ...]
    embedding: tuple[OperatorCall, ...]
    head: tuple[OperatorCall, ...]
    tp_allreduce_entries: float          # one TP all-reduce of a layer's output
    p2p_entries: float                   # one pipeline send of activations (or their gradients)
    cp_kv_entries: float                 # one ring pass of this rank's K and V chunk
    tied_embedding_entries: float        # the tied embedding's gradient, first to last stage


def micro_batch_recipe(model: ModelSpec, layout: Layout) -> MicroBatchRecipe:
    """The operators (paper Table I) and communication sizes of one micro-batch on one rank."""
    tp = layout.tp
    return _micro_batch_recipe(model, tp, layout.cp, layout.micro_batch, layout.sequence_parallel and tp > 1)


# Cached on what the recipe depends on: perf-advise's layouts share it across pp, dp, ZeRO and
# recomputation, and no layout is kept alive by the cache.
@functools.lru_cache(maxsize=1024)
def _micro_batch_recipe(model: ModelSpec, tp: int, cp: int, b: int, sp: bool) -> MicroBatchRecipe:
    # With context parallelism each rank holds seq_len / cp tokens of every sequence.
    tokens = b * model.seq_len // cp
    norm_tokens = tokens / tp if sp else tokens
    hpg, kvpg, d, h = model.heads // tp, model.kv_heads // tp, model.head_dim, model.hidden
    ffn = model.ffn_hidden // tp
    vpr = vocab_per_rank(model.vocab, tp)

    def call(name: str, count: float = 1, **shape: float) -> OperatorCall:
        return OperatorCall(name, shape, count)

    layer = [call(model.norm, 2, tokens=norm_tokens, dim=h),
             call("linear1", m=tokens, k=h, n=qkv_width(model) // tp)]
    if model.pos_emb == "rotary":
        layer.append(call("rope", tokens=tokens, heads=(hpg + kvpg) / 2, d=d))
    attn_batch = b * hpg
    if fused_attention(model):
        # Ring attention (cp > 1): a rank's queries meet every K/V chunk in turn, cp blocks of
        # seq_len / cp — with Megatron's load balancing, 1/cp of the whole causal attention.  A
        # sliding window skips the blocks outside it: that share of the whole sequence's causal
        # work (the unfused paths below compute the whole square and mask it).
        flash = call("flash_atten", cp, b=b, heads=hpg, l=model.seq_len // cp, d=d)
        work = attention_window_fraction(model.seq_len, model.attention_window)
        layer.append(flash if work == 1.0 else OperatorCall(flash.name, flash.shape, flash.count, work))
    elif model.attention == "fused_softmax":
        layer += [call("baddbmm", batch=attn_batch, l=model.seq_len, d=d),
                  call("scaled_masked_softmax", batch=attn_batch, l=model.seq_len),
                  call("bmm", batch=attn_batch, l=model.seq_len, d=d)]
    else:   # unfused (and SDPA's math): baddbmm, mask fill and softmax measured as one block, then ·V
        layer += [call("fillmask", batch=attn_batch, l=model.seq_len, d=d),
                  call("bmm", batch=attn_batch, l=model.seq_len, d=d)]
    layer += [call("linear2", m=tokens, k=hpg * d, n=h),
              call("res_add", 2, tokens=norm_tokens, dim=h),
              call("linear3", m=tokens, k=h, n=mlp_up_width(model) // tp),
              call(model.activation, tokens=tokens, width=ffn),
              call("linear4", m=tokens, k=ffn, n=h)]
    embedding = (call("embedding", tokens=tokens, dim=h, vocab=vpr),)
    head = (call(model.norm, tokens=norm_tokens, dim=h),
            call("linear_final", m=tokens, k=h, n=vpr),
            call("cross_entropy", tokens=tokens, vocab=vpr))
    # The tensor a stage hands the next: the whole activation on every TP rank, 1/tp of it under
    # sequence parallelism.  How the framework sends it is pipeline_sends'.
    p2p = tokens * h / tp if sp else tokens * h
    return MicroBatchRecipe(tokens, tuple(layer), embedding, head, tokens * h, p2p,
                            2 * tokens * kvpg * d, vpr * h)


def gradient_reduction(layout: Layout, framework: str = "") -> str:
    """The collective that reduces gradients over data parallelism.

    ZeRO-2/3 reduce-scatter.  Megatron's distributed optimizer (``--use-distributed-optimizer``,
    which the launch readers take as ZeRO-1) reduce-scatters its gradient buffer in one collective,
    each rank keeping the shard it updates.  DeepSpeed's ZeRO-1 reduces bucket by bucket, one
    ``reduce`` to each partition's owner, costed as the all-reduce of the paper's model, which its
    GPT-NeoX runs were fitted next to (docs/modelling.md §3).  Both then all-gather the updated
    parameters.
    """
    if layout.zero_stage >= 2:
        return "reduce_scatter"
    if layout.zero_stage == 1 and not runs_deepspeed_engine(layout, framework):
        return "reduce_scatter"
    return "allreduce"


def gathers_layers(layout: Layout, framework: str = "") -> bool:
    """Whether data parallelism gathers each layer's parameters before the layer runs and
    reduce-scatters its gradients as its backward ends, every micro-batch: ZeRO-3 under every
    framework, and ZeRO-2 under FSDP1 (SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2).

    FSDP1 keeps only the shard of a unit's flat parameter between micro-batches whatever its
    strategy: after a backward that syncs gradients it frees the gathered parameter
    (``_runtime_utils._should_free_in_backward``) and reduce-scatters the gradient
    (``_reduce_grad``), and Composer syncs every micro-batch under FSDP (its ``ddp_sync_context``
    acts on DDP only).  SHARD_GRAD_OP differs from FULL_SHARD only in keeping the forward's
    gather for the backward (:func:`reshards_after_forward`); FSDP2 at stage 2 is the same (its
    ``reshard_after_forward = False``).  DeepSpeed's ZeRO-2 keeps the full parameters, and
    reduces every micro-batch's gradients in its buckets (:func:`reduces_every_micro_batch`)."""
    return layout.zero_stage == 3 or (layout.zero_stage == 2 and framework in FSDP1_FRAMEWORKS + FSDP2_FRAMEWORKS)


def reduces_every_micro_batch(layout: Layout, framework: str = "") -> bool:
    """Whether DeepSpeed's engine reduces the gradients after every micro-batch's backward, not
    once per step: at ZeRO-2 each rank keeps only its partition of the accumulated gradients, so
    each backward's gradients are reduced to their owners before the next (the engine's
    ``reduce_ready_partitions_and_remove_grads`` runs whenever ``partition_gradients``; "gradient
    reduction is required after every backward because of gradient partitioning", DeepSpeed issue
    2252).  Without ``overlap_comm`` (DeepSpeed's default below stage 3) the buckets are reduced
    on the compute stream, so each reduction adds to its micro-batch."""
    return layout.zero_stage == 2 and runs_deepspeed_engine(layout, framework)


def reshards_after_forward(layout: Layout, framework: str = "") -> bool:
    """Whether ZeRO-3 frees each layer's gathered parameters after its forward (and gathers them
    again for its backward).  ``layout.reshard_after_forward`` "always" / "never" say so; the
    default is TorchTitan's (``fsdp_reshard_after_forward = "default"``: not under pipeline
    parallelism, "to avoid per-microbatch all-gathers") and DeepSpeed's stage 3 (always).
    Below stage 3 nothing is freed after the forward (FSDP1's SHARD_GRAD_OP is among its
    ``NO_RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES``)."""
    if layout.zero_stage < 3:
        return False
    if layout.reshard_after_forward != "default":
        return layout.reshard_after_forward == "always"
    return not (framework == "torchtitan" and layout.pp > 1)


#: Bytes per element of the sharded (master) parameters FSDP keeps under mixed precision:
#: TorchTitan builds the model in fp32 and computes in ``mixed_precision_param`` (bf16); Composer
#: builds llm-foundry's in fp32 and computes in ``MixedPrecision.param_dtype``.
FSDP2_MASTER_BYTES = 4


@dataclass(frozen=True)
class ShardCopies:
    """Device-memory bytes FSDP moves per parameter per micro-batch besides its collectives, in
    the forward and the backward (:func:`fsdp2_shard_copies`, :func:`fsdp1_shard_copies`).

    The lent H100's one-rank FSDP2 steps (benchmarks/data/h100-lent/stacks) spend 32-40 bytes per
    parameter per micro-batch at 3 TB/s more than the same model unwrapped; FSDP2's count gives 38."""

    forward_bytes: float
    backward_bytes: float


@dataclass(frozen=True)
class _ShardDtypes:
    """Bytes per element of what FSDP's copies move: the sharded master parameter, the parameter
    as computed on, the gradient as reduced; and the ranks a parameter is sharded over."""

    ranks: int
    master: int
    compute: int
    reduce: int

    @property
    def shard_cast(self) -> float:
        """Casting the local shard to the compute dtype before its all-gather (read master/N,
        write compute/N)."""
        return (self.master + self.compute) / self.ranks


def _shard_dtypes(layout: Layout, compute_precision: str, reduce_precision: str,
                  bytes_per_element: Mapping[str, int]) -> _ShardDtypes:
    compute = bytes_per_element[compute_precision]
    return _ShardDtypes(shard_ranks(layout), max(compute, FSDP2_MASTER_BYTES), compute,
                        bytes_per_element[reduce_precision])


def fsdp2_shard_copies(layout: Layout, framework: str, precision: str, reduce_precision: str,
                       bytes_per_element: Mapping[str, int]) -> Optional[ShardCopies]:
    """:class:`ShardCopies` of a ZeRO-2/3 job under an FSDP2 framework, else None.

    Counted from ``torch.distributed.fsdp._fully_shard._fsdp_collectives``: each all-gather's
    copy-in casts the local shard into the flat all-gather buffer (:attr:`_ShardDtypes.shard_cast`)
    and its copy-out splits the gathered buffer into the per-parameter tensors (read and write the
    full parameter); each reduce-scatter's copy-in writes the full gradient into the flat buffer in
    the reduce dtype (read compute, write reduce), and the result is accumulated into the sharded
    gradient (read two shards, write one).  At ZeRO-2 (``reshard_after_forward = False``) the
    layer is gathered once per micro-batch, for its forward, and kept for its backward
    (:func:`gathers_layers`)."""
    if layout.zero_stage < 2 or framework not in FSDP2_FRAMEWORKS:
        return None
    d = _shard_dtypes(layout, precision, reduce_precision, bytes_per_element)
    n, compute, reduce = d.ranks, d.compute, d.reduce
    gather = d.shard_cast + 2 * compute
    gathers_in_backward = 1 if reshards_after_forward(layout, framework) else 0
    return ShardCopies(gather, gathers_in_backward * gather + compute + reduce + 3 * reduce / n)


def gradient_divide_factors(ranks: int) -> tuple[float, float]:
    """The factors FSDP1 divides a gradient by before and after its reduction over ``ranks``
    data-parallel ranks (``_init_utils``: the largest power of two f with ranks % f == 0 and
    f ≤ ranks / f before, ranks / f after), so that low-precision sums neither overflow nor
    underflow."""
    before = 1
    while ranks % before == 0 and ranks / before > before:
        before *= 2
    return float(before), ranks / before


def fsdp1_shard_copies(layout: Layout, framework: str, precision: str, reduce_precision: str,
                       bytes_per_element: Mapping[str, int], param_precision: str = "") -> Optional[ShardCopies]:
    """:class:`ShardCopies` of a ZeRO-2/3 job under an FSDP1 framework (Composer's
    ``FullyShardedDataParallel``, ``use_orig_params``), else None.  ``param_precision``: FSDP1's
    ``MixedPrecision.param_dtype`` ("" = ``precision``, Composer's DEFAULT and PURE; its FULL keeps
    fp32 parameters, and autocast casts them inside the operators as it would without FSDP).

    Counted from torch.distributed.fsdp (``_flat_param``, ``_runtime_utils``), per parameter:

    * each unshard with a low-precision ``param_dtype`` casts the fp32 local shard into ``_mp_shard``
      (``_use_low_precision_shard``: read 4/N, write 2/N), then all-gathers straight into the padded
      flat parameter, which the modules use through views: no copy-out.  FULL_SHARD (and hybrid
      sharding) gathers again, and casts again, for the backward; SHARD_GRAD_OP keeps the gathered
      parameter to the end of the backward, then frees it (Composer syncs every micro-batch).
    * the backward of the views' ``split`` concatenates the per-parameter gradients into the flat
      gradient (read and write compute); ``_post_backward_hook`` casts it to ``reduce_dtype`` where
      the two differ; ``_reduce_grad`` divides the padded gradient by the pre-divide factor, and the
      reduced shard by the post-divide factor (:func:`gradient_divide_factors`), casts the shard back
      to the parameter dtype (``_cast_grad_to_param_dtype``) and adds it to the shard the earlier
      micro-batches of the step left (``_saved_grad_shard``: every micro-batch but the first).
    * on one rank FSDP1 runs NO_SHARD instead: the cast covers the whole parameter and is redone for
      the backward (``post_reshard`` frees ``_mp_shard``); the flat gradient is cast to the reduce
      dtype and back, and from the second micro-batch on autograd adds the new gradient into the
      kept fp32 one, which the hook then casts to the reduce dtype and back.
    """
    if layout.zero_stage < 2 or framework not in FSDP1_FRAMEWORKS:
        return None
    d = _shard_dtypes(layout, param_precision or precision, reduce_precision, bytes_per_element)
    n, master, compute, reduce = d.ranks, d.master, d.compute, d.reduce
    cast = d.shard_cast if compute != master else 0.0
    to_reduce = compute + reduce if compute != reduce else 0.0
    to_master = reduce + master if reduce != master else 0.0
    later = (layout.micro_batches - 1) / layout.micro_batches    # micro-batches that accumulate
    flat_grad = 2 * compute
    if n == 1:
        round_trip = master + reduce + reduce + master if master != reduce else 0.0
        first = to_reduce + to_master
        accumulate = 2 * master + compute + round_trip
        return ShardCopies(cast, cast + flat_grad + (1 - later) * first + later * accumulate)
    before, after = gradient_divide_factors(layout.dp * layout.cp)
    gathers_in_backward = reshards_after_forward(layout, framework)
    backward = (cast * gathers_in_backward + flat_grad + to_reduce
                + (2 * reduce if before > 1 else 0.0) + (2 * reduce / n if after > 1 else 0.0)
                + to_master / n + later * 3 * master / n)
    return ShardCopies(cast, backward)


def fsdp_shard_copies(layout: Layout, framework: str, precision: str, reduce_precision: str,
                      bytes_per_element: Mapping[str, int]) -> Optional[ShardCopies]:
    """The job's FSDP copies (FSDP2's or FSDP1's, by framework), or None."""
    if framework in FSDP1_FRAMEWORKS:
        return fsdp1_shard_copies(layout, framework, precision, reduce_precision, bytes_per_element)
    return fsdp2_shard_copies(layout, framework, precision, reduce_precision, bytes_per_element)


def op_sac_recompute_share(name: str, model: ModelSpec) -> float:
    """The share of one layer operator's forward that TorchTitan's op-level selective activation
    checkpointing (``mode = "selective"``, ``selective_ac_option = "op"``, its default) runs again in
    the backward.  Its policy (``torchtitan/distributed/activation_checkpoint.py``, 2024-2025
    releases) saves the outputs of matmuls, SDPA and reduce-scatters "except every second mm",
    counting a layer's matmuls in forward order, and recomputes every other operator.  A Llama
    layer's matmuls run wq, wk, wv, wo, then w1, w3, w2 (a GELU MLP: up, down), so the second,
    fourth and sixth are recomputed: wk (of the fused QKV, its share of the columns), wo (all of
    the attention output projection), w3 (half of the gated MLP's up projection) or the GELU MLP's
    down projection.  Fused attention is saved; norms, rotary, activations, residual adds and an
    unfused attention's score ops are recomputed whole."""
    if name == "flash_atten":
        return 0.0
    gated = is_gated(model)
    if name == "linear1":
        return model.kv_heads / (model.heads + 2 * model.kv_heads)
    if name == "linear2":
        return 1.0
    if name == "linear3":
        return 0.5 if gated else 0.0
    if name == "linear4":
        return 0.0 if gated else 1.0
    return 1.0


def runs_op_sac(layout: Layout, framework: str) -> bool:
    """Whether ``layout.recompute = "selective"`` is TorchTitan's op-level checkpointing
    (:func:`op_sac_recompute_share`) rather than Megatron's (the attention core only)."""
    return layout.recompute == "selective" and framework == "torchtitan"


def checkpoint_input_entries(model: ModelSpec, layout: Layout) -> float:
    """Elements one rank's checkpoint of one layer keeps for one micro-batch, its floating-point
    inputs: the layer's input under full recomputation (tokens × hidden, 1/tp of it under sequence
    parallelism), the attention core's query, key and value under Megatron-style selective
    recomputation (tokens × the QKV width / tp); none without recomputation.  What DeepSpeed's
    partitioned and CPU checkpointing act on (predictor/checkpointing.py)."""
    tokens = layout.micro_batch * model.seq_len // layout.cp
    if layout.recompute == "full":
        sp = layout.sequence_parallel and layout.tp > 1
        return tokens * model.hidden / (layout.tp if sp else 1)
    if layout.recompute == "selective":
        return tokens * qkv_width(model) / layout.tp
    return 0.0


def shard_ranks(layout: Layout) -> int:
    """The ranks ZeRO shards a parameter over: dp × cp, or dp_shard × cp under hybrid sharding."""
    return (layout.dp_shard or layout.dp) * layout.cp


def gradient_precision(precision: str, layout: Layout, framework: str = "", explicit: str = "") -> str:
    """The precision gradients are reduced in over data parallelism (``run.grad_reduce_precision``
    when the job says, else the framework's default).

    Megatron-LM reduces bf16 training's gradients in fp32 (``arguments.py``: "bfloat16 requires
    gradient accumulation and all-reduce to be done in fp32", unless ``--grad-reduce-in-bf16``);
    NeMo's Megatron strategy sets ``grad_reduce_in_fp32`` and TorchTitan's FSDP reduces in
    ``mixed_precision_reduce = "float32"``.  DeepSpeed's engines reduce in the training precision,
    as do fp16 and fp32 jobs everywhere.
    """
    if explicit:
        return explicit
    if precision == "bf16" and not runs_deepspeed_engine(layout, framework):
        return "fp32"
    return precision


@dataclass(frozen=True)
class PipelineSends:
    """What one TP rank moves to hand a micro-batch's tensor (activation or gradient) to the next
    stage: a p2p send of ``send_entries``, then, where ``gather_entries`` > 0, an all-gather over the
    receiver's TP group of shards of that size (before the receiver can use the tensor)."""

    send_entries: float
    gather_entries: float


def pipeline_sends(recipe: MicroBatchRecipe, layout: Layout, framework: str = "") -> PipelineSends:
    """How the framework passes tensors between pipeline stages.

    DeepSpeed's ``PipelineEngine`` (GPT-NeoX, DeepSpeed, Megatron-DeepSpeed) partitions what it
    sends over the tensor-parallel group when tp > 1 (``pipe_partitioned`` / ``grad_partitioned``,
    both on by default: ``is_model_parallel``): each TP rank sends 1/tp of the tensor, and the
    receiving stage rebuilds it with ``PartitionedTensor.full()``, an all-gather over its TP group,
    before its forward (activations) or backward (gradients).  Megatron-core (Megatron-LM, NeMo)
    and TorchTitan send the whole tensor from every TP rank (1/tp of it under sequence
    parallelism, as :func:`micro_batch_recipe` has it).  A job that names no framework follows its
    split rule: ``pipe_split = "megatron"`` is Megatron's, the DeepSpeed rules DeepSpeed's.
    ``recipe`` is :func:`micro_batch_recipe` of the job's model and ``layout``.
    """
    tensor = recipe.p2p_entries
    if runs_deepspeed_engine(layout, framework) and layout.tp > 1:
        shard = tensor / layout.tp
        return PipelineSends(shard, shard)
    return PipelineSends(tensor, 0.0)


def model_flops_per_iteration(model: ModelSpec, layout: Layout) -> float:
    """Model FLOPs of one optimizer step over every GPU: 3 × the forward FLOPs (backward is twice
    forward), recomputation not counted (model FLOPs in the PaLM sense).  Summed from the operators
    of :func:`micro_batch_recipe`, so attention counts as it runs (flash attention skips the
    causal half, and a sliding window the blocks outside it; the fused and unfused paths compute the
    whole square)."""
    r = micro_batch_recipe(model, layout)
    per_rank = (model.layers * sum(c.forward_flops() for c in r.layer)
                + sum(c.forward_flops() for c in r.embedding + r.head))
    ranks_per_micro_batch = layout.tp * layout.cp
    return 3.0 * per_rank * ranks_per_micro_batch * layout.micro_batches * layout.dp

@dataclass(frozen=True)
class Group:
    """A communication group as the collectives see it: ``nodes`` × ``gpus_per_node`` ranks."""

    nodes: int
    gpus_per_node: int

    @property
    def size(self) -> int:
        return self.nodes * self.gpus_per_node


# The groups most jobs have (immutable, so shared): one rank; a pair inside one node; a pair of nodes.
_ONE_RANK = Group(1, 1)
_PAIR_IN_NODE = Group(1, 2)
_PAIR_OF_NODES = Group(2, 1)


def _group(size: int, stride: int, gpn: int) -> Group:
    """Where ``size`` ranks spaced ``stride`` apart land, with ranks filling nodes in order."""
    if size <= 1:
        return _ONE_RANK
    if stride >= gpn:
        return Group(size, 1)
    per_node = max(1, min(size, gpn // stride))
    return Group(math.ceil(size / per_node), per_node)


def groups(job: JobParts, gpus_per_node: int) -> dict[str, Group]:
    """TP, CP, DP and PP groups in Megatron/DeepSpeed rank order (tp fastest, then cp, dp, pp).

    The DP group is sized from dp (the paper's code sized it from GPUs per node), and a pipeline
    that fits in one node communicates inside it (the paper's code costed it as inter-node).
    """
    lay = job.layout
    tp = _group(lay.tp, 1, gpus_per_node)
    # Megatron-core's order with context parallelism: tp fastest, then cp, then dp, then pp.
    cp = _group(lay.cp, lay.tp, gpus_per_node)
    dp = _group(lay.dp, lay.tp * lay.cp, gpus_per_node)
    # Gradients are reduced over the dp × cp ranks that hold the same parameters.
    dpcp = _group(lay.dp * lay.cp, lay.tp, gpus_per_node)
    # Neighbouring stages are tp × cp × dp ranks apart: once the job spans nodes, some stage
    # boundary crosses a node and the pipeline runs at the pace of that slowest link.
    pp = _PAIR_OF_NODES if (lay.pp > 1 and lay.gpus > gpus_per_node) else _PAIR_IN_NODE
    # Ring attention passes K/V to the next cp rank: across nodes once the cp group spans them.
    cp_ring = _PAIR_OF_NODES if cp.nodes > 1 else _PAIR_IN_NODE
    out = {"tp": tp, "dp": dp, "pp": pp, "cp": cp, "dpcp": dpcp, "cp_ring": cp_ring}
    if lay.dp_shard and lay.dp_shard < lay.dp:
        # Hybrid sharding (TorchTitan's dp_shard × dp_replicate mesh, shard innermost): each
        # parameter is sharded over neighbouring ranks and replicated across the shard groups.
        out["dp_shard"] = _group(lay.dp_shard * lay.cp, lay.tp, gpus_per_node)
        out["dp_replicate"] = _group(lay.dp // lay.dp_shard, lay.tp * lay.cp * lay.dp_shard, gpus_per_node)
    return out
