"""A job, decomposed: pipeline stages, parameters, and the operators one micro-batch runs.

Paper references are to Zhang et al., arXiv:2509.22832: Eq. 1–2 vocabulary padding, Eq. 3–5
stage split, Eq. 6 / Table III parameter counts.  Where their code goes wrong (see the issue), the
comments say what we do instead.

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
from typing import Optional, Sequence, Union

from .errors import JobError
from .job import PIPE_SPLITS, Layout, ModelSpec, TrainingJob

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
def _neox_layer_params(model: ModelSpec, tp: int) -> int:
    """Trainable parameters of one ParallelTransformerLayerPipe as DeepSpeed counts them when it
    builds the layer on one tensor-parallel rank: column-parallel weights and biases ÷ tp,
    row-parallel weights ÷ tp with whole biases, norms whole."""
    h, d = model.hidden, model.head_dim
    bias = 1 if model.norm == "layernorm" else 0
    qkv_out = (model.heads + 2 * model.kv_heads) * d
    up_out = (2 if model.activation == "swiglu" else 1) * model.ffn_hidden
    norm = (2 if model.norm == "layernorm" else 1) * h
    return (h * qkv_out // tp + bias * qkv_out // tp
            + model.heads * d // tp * h + bias * h
            + h * up_out // tp + bias * up_out // tp
            + model.ffn_hidden // tp * h + bias * h
            + 2 * norm)


def _neox_items(model: ModelSpec, tp: int, rule: str) -> list[int]:
    """Weights of GPT-NeoX's pipeline items [embedding, pre hook, L layers, post hook, norm, head]
    under ``pipe_partition_method`` ``type:transformer|mlp`` or ``parameters``."""
    L = model.layers
    if rule == "neox":
        # The regex matches ParallelTransformerLayerPipe and the _pre/_post_transformer_block hooks.
        return [0, 1] + [1] * L + [1, 0, 0]
    emb = vocab_per_rank(model.vocab, tp) * model.hidden
    if model.pos_emb == "learned":
        emb += model.seq_len * model.hidden
    norm = (2 if model.norm == "layernorm" else 1) * model.hidden
    # Tied embeddings: the head is a second TiedLayerSpec of the whole EmbeddingPipe, and DeepSpeed
    # builds and counts it like the first; untied, a ParallelLinearPipe without bias.
    head = emb if model.tied_embeddings else vocab_per_rank(model.vocab, tp) * model.hidden
    return [emb, 0] + [_neox_layer_params(model, tp)] * L + [0, norm, head]


def _layers_per_part(parts: Sequence[int], layers: int) -> tuple[int, ...]:
    """Transformer layers in each part of the NeoX item list (layers are items 2 .. L + 1)."""
    lo, hi = FIRST_STAGE_ITEMS, FIRST_STAGE_ITEMS + layers
    return tuple(max(0, min(b, hi) - max(a, lo)) for a, b in zip(parts, parts[1:]))


def _megatron(model: ModelSpec, lay: Layout) -> tuple[int, ...]:
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


@functools.lru_cache(maxsize=4096)
def _split_cached(model: ModelSpec, tp: int, pp: int, v: int, rule: str, explicit: tuple[int, ...],
                  first: int, last: int, emb: bool, loss: bool) -> tuple[int, ...]:
    layout = Layout(pp=pp, tp=tp, virtual_stages=v, pipe_split=rule, stage_layers=explicit,
                    first_stage_layers=first, last_stage_layers=last, account_for_embedding=emb,
                    account_for_loss=loss)
    return _split(model, layout)


def _split(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
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


def stage_layers(model: Union[ModelSpec, TrainingJob], layout: Optional[Layout] = None) -> list[int]:
    """Transformer layers per pipeline stage (per device; summed over its virtual chunks).

    ``stage_layers(job)`` or ``stage_layers(job.model, job.layout)``; see :func:`pipeline_split`.
    """
    if isinstance(model, TrainingJob):
        model, layout = model.model, model.layout
    if not isinstance(model, ModelSpec) or not isinstance(layout, Layout):
        raise TypeError("stage_layers(model, layout) or stage_layers(job): the split depends on the "
                        "framework's rule in the layout, not on the layer count alone")
    return list(_per_device(pipeline_split(model, layout), layout.pp))


@functools.lru_cache(maxsize=4096)
def _per_device(split: tuple[int, ...], pp: int) -> tuple[int, ...]:
    # Device r holds chunks r, r + pp, r + 2·pp, ... (Megatron's interleaved order).
    return tuple(sum(split[r::pp]) for r in range(pp))


def layer_params(job: TrainingJob) -> float:
    """Parameters of one transformer layer on one tensor-parallel rank (Eq. 6, with GQA and gated MLP).

    Norm weights (and LayerNorm biases) are replicated on every rank; linear weights and biases are
    split.  A gated MLP's up projection holds gate and up (2 × ffn columns).
    """
    m, tp = job.model, job.layout.tp
    h, d = m.hidden, m.head_dim
    norm = (2 if m.norm == "layernorm" else 1) * h
    qkv_out = (m.heads + 2 * m.kv_heads) * d
    up_out = (2 if m.activation == "swiglu" else 1) * m.ffn_hidden
    bias = 1 if m.norm == "layernorm" else 0   # NeoX-style linears carry biases; LLaMA-style do not
    linears = (h * qkv_out + bias * qkv_out) + (m.heads * d * h + bias * h) \
        + (h * up_out + bias * up_out) + (m.ffn_hidden * h + bias * h)
    return 2 * norm + linears / tp


def stage_params(job: TrainingJob) -> list[float]:
    """Parameters held by one GPU of each pipeline stage (Table III)."""
    m, lay = job.model, job.layout
    emb = vocab_per_rank(m.vocab, lay.tp) * m.hidden
    per_layer = layer_params(job)
    sizes = stage_layers(m, lay)
    out = [n * per_layer for n in sizes]
    final_norm = (2 if m.norm == "layernorm" else 1) * m.hidden
    out[0] += emb + _position_params(m)
    out[-1] += final_norm
    if lay.pp > 1 or not m.tied_embeddings:
        # The output projection: tied embeddings keep a copy on the last stage when pp > 1.
        out[-1] += emb
    return out


def total_params(job: TrainingJob) -> float:
    """Parameters of the whole model (every rank of one pipeline × tp)."""
    m, tp = job.model, job.layout.tp
    norm = (2 if m.norm == "layernorm" else 1) * m.hidden
    # A layer's split part times tp, plus its replicated norms once.
    per_layer = (layer_params(job) - 2 * norm) * tp + 2 * norm
    emb = padded_vocab(m.vocab, tp) * m.hidden
    return m.layers * per_layer + emb * (1 if m.tied_embeddings else 2) + _position_params(m) + norm


def _position_params(m) -> int:
    """Learned position embeddings (seq_len × hidden, replicated on every TP rank of stage 0);
    rotary, ALiBi and none have no parameters."""
    return m.seq_len * m.hidden if m.pos_emb == "learned" else 0


@dataclass(frozen=True)
class Group:
    """A communication group as the collectives see it: ``nodes`` × ``gpus_per_node`` ranks."""

    nodes: int
    gpus_per_node: int

    @property
    def size(self) -> int:
        return self.nodes * self.gpus_per_node


def _group(size: int, stride: int, gpn: int) -> Group:
    """Where ``size`` ranks spaced ``stride`` apart land, with ranks filling nodes in order."""
    if size <= 1:
        return Group(1, 1)
    if stride >= gpn:
        return Group(size, 1)
    per_node = max(1, min(size, gpn // stride))
    return Group(math.ceil(size / per_node), per_node)


def groups(job: TrainingJob, gpus_per_node: int) -> dict[str, Group]:
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
    pp = Group(2, 1) if (lay.pp > 1 and lay.gpus > gpus_per_node) else Group(1, 2)
    # Ring attention passes K/V to the next cp rank: across nodes once the cp group spans them.
    cp_ring = Group(2, 1) if cp.nodes > 1 else Group(1, 2)
    return {"tp": tp, "dp": dp, "pp": pp, "cp": cp, "dpcp": dpcp, "cp_ring": cp_ring}
