"""A job, decomposed: pipeline stages, parameters, and the operators one micro-batch runs.

Paper references are to Zhang et al., arXiv:2509.22832: Eq. 1–2 vocabulary padding, Eq. 3–5
stage split, Eq. 6 / Table III parameter counts.  Where their code goes wrong (see the issue), the
comments say what we do instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .job import TrainingJob

# GPT-NeoX pads the vocabulary to a multiple of 128 × tp (make_vocab_size_divisible_by = 128).
VOCAB_MULTIPLE = 128
# GPT-NeoX builds a pipeline of L transformer layers plus five other items: the embedding and a
# pre-block hook on the first stage; a post-block hook, the final norm and the output linear on the
# last.  DeepSpeed splits those L + 5 items uniformly over the stages (Eq. 3–5).
FIRST_STAGE_ITEMS = 2
LAST_STAGE_ITEMS = 3


def padded_vocab(vocab: int, tp: int) -> int:
    """Eq. 1: the whole padded vocabulary."""
    unit = VOCAB_MULTIPLE * tp
    return math.ceil(vocab / unit) * unit


def vocab_per_rank(vocab: int, tp: int) -> int:
    """Eq. 2: the vocabulary rows one tensor-parallel rank holds."""
    return padded_vocab(vocab, tp) // tp


def stage_layers(layers: int, pp: int, virtual_stages: int = 1) -> list[int]:
    """Transformer layers per pipeline stage (per device; summed over its virtual chunks).

    Non-interleaved: DeepSpeed's uniform split of the L + 5 pipeline items (the paper's Eq. 3–5,
    generalised to any remainder, and correct for pp = 1 and 2, where the paper's closed form costs
    pp = 1 as L + 5 layers).  Interleaved: Megatron splits L evenly over pp × v chunks.
    """
    if pp == 1:
        return [layers]
    if virtual_stages > 1:
        return [layers // pp] * pp
    items = layers + FIRST_STAGE_ITEMS + LAST_STAGE_ITEMS
    chunk, residual = divmod(items, pp)
    sizes = [chunk + (1 if i < residual else 0) for i in range(pp)]
    sizes[0] -= FIRST_STAGE_ITEMS
    sizes[-1] -= LAST_STAGE_ITEMS
    # Few layers over many stages: the end stages would go negative; move layers inward.
    for end in (0, pp - 1):
        while sizes[end] < 0:
            inner = max(range(1, pp - 1), key=lambda i: sizes[i]) if pp > 2 else (1 - end if end == 0 else 0)
            sizes[end] += 1
            sizes[inner] -= 1
    return sizes


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
    sizes = stage_layers(m.layers, lay.pp, lay.virtual_stages)
    out = [n * per_layer for n in sizes]
    final_norm = (2 if m.norm == "layernorm" else 1) * m.hidden
    out[0] += emb
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
    return m.layers * per_layer + emb * (1 if m.tied_embeddings else 2) + norm


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
    """TP, DP and PP groups in Megatron/DeepSpeed rank order (tp fastest, then dp, then pp).

    The DP group is sized from dp (the paper's code sized it from GPUs per node), and a pipeline
    that fits in one node communicates inside it (the paper's code costed it as inter-node).
    """
    lay = job.layout
    tp = _group(lay.tp, 1, gpus_per_node)
    dp = _group(lay.dp, lay.tp, gpus_per_node)
    # Neighbouring stages are tp × dp ranks apart: once the job spans nodes, some stage boundary
    # crosses a node and the pipeline runs at the pace of that slowest link.
    pp = Group(2, 1) if (lay.pp > 1 and lay.gpus > gpus_per_node) else Group(1, 2)
    return {"tp": tp, "dp": dp, "pp": pp}
