"""Tensor-parallel communication run under the GEMMs: Transformer Engine's userbuffers overlap.

With sequence parallelism every transformer layer gathers its sequence shards before the QKV and
MLP-up GEMMs and reduce-scatters after the projection and MLP-down GEMMs (and the mirror image in
backward).  Megatron-LM's ``--tp-comm-overlap`` and NeMo's ``model.ub_tp_comm_overlap`` hand these
collectives to Transformer Engine, which splits each GEMM into chunks and moves one chunk's data
while another chunk computes.  Its default configuration (``transformer_engine.pytorch`` module
``base.py``, ``initialize_ub``; Megatron-LM passes no other unless ``--tp-comm-overlap-cfg`` is
given) runs, per layer:

* **ring exchange** for the all-gathers in front of the QKV and MLP-up forward GEMMs and of the
  projection and MLP-down data-gradient GEMMs: ``num_splits = tp`` chunks, each rank computing
  on the chunk it holds while the next arrives from its neighbour over the copy engines
  (``use_ce``, one SM, no SM margin): ``g + (tp - 1) · max(g, c)`` for a chunk GEMM ``g`` and one
  ring step ``c`` (the all-gather's time over its ``tp - 1`` steps);
* **pipeline** for the reduce-scatters after the projection and MLP-down forward GEMMs: the GEMM
  in ``num_splits = 4`` chunks, each chunk's reduce-scatter on ``num_sm = 16`` SMs while the next
  chunk computes on the others (``set_sm_margin``): ``g' + 3 · max(g', r) + r`` for a chunk GEMM
  ``g'`` on the remaining SMs and one chunk's reduce-scatter ``r``;
* **bulk** in the QKV and MLP-up backward: the all-gather of the layer-norm output (which the
  weight gradient needs) on 16 SMs beside the data-gradient GEMM, then the reduce-scatter of the
  data gradient beside the weight-gradient GEMM: ``max(dgrad', ag) + max(wgrad', rs)``.

Under FP8 the all-gathers move the GEMMs' FP8 inputs (``fp8_buf``, on by default for every
all-gather overlap): half the bytes of a 16-bit gather; the reduce-scatters stay 16-bit.

Every constant is Transformer Engine's default (:data:`PIPELINE_SPLITS`, :data:`COMM_SMS`; the
SM margin as of Transformer Engine 2.0, before which ``set_sm_margin`` defaulted off).  A GEMM
that keeps ``S - 16`` of a GPU's ``S`` SMs (NVIDIA's data sheets, :data:`SM_COUNTS`) runs as much
longer as measured where it was (:data:`MEASURED_MARGIN_SLOWDOWN`: ×1.097 on the lent H100's 132
SMs, not the ×1.138 of ``S / (S - 16)``), else ``S / (S - 16)`` times as long, as a GEMM's
many-wave throughput goes with its SMs.  A chunk's GEMM
time comes from the platform's own GEMM models at the chunk's shape, so the chunks' loss of
efficiency is measured, not assumed.  A backward GEMM sample holds the data- and weight-gradient
GEMMs, which do the same FLOPs: each is half of it.

The overlap can cost more than the serial figure: the bulk overlap costs the backward's all-gather
of the layer-norm output, which the serial costing (predictor/estimate.py: two all-reduces' worth
per layer and direction) takes as hidden by Megatron's asynchronous all-gather under the
data-gradient GEMM, so where communication dwarfs the GEMMs it exposes more; and where the GEMMs
dwarf the communication (tp = 2, say) the SMs the pipelined and bulk collectives keep slow the
GEMMs by more than the collectives cost.

What this leaves out: memory-bandwidth contention between the copy engines and the GEMMs, and
the per-layer configurations NeMo's recipes tune for some models (other ``num_sm``, atomic GEMMs
in FP8); the interval carries the GEMM models' own error.
"""
from __future__ import annotations

from dataclasses import dataclass

# Transformer Engine's defaults (initialize_ub's default_cfg): the pipelined reduce-scatter's
# chunks, and the SMs a pipelined or bulk collective keeps for itself (set_sm_margin).
PIPELINE_SPLITS = 4
COMM_SMS = 16

# Streaming multiprocessors per GPU (NVIDIA data sheets and architecture whitepapers), matched as
# substrings of the platform's GPU name, longest first.
SM_COUNTS = {
    "gh200": 132, "h200": 132, "h100 pcie": 114, "h100": 132, "h800": 132, "a100": 108, "a800": 108,
    "b200": 148, "l40s": 142, "a40": 84, "v100": 80,
}
DEFAULT_SMS = 132      # an H100's, where the GPU is not in the table (the overlap's usual home)


def sm_count(gpu_name: str) -> tuple[int, bool]:
    """(SMs of the GPU, whether its name was recognised)."""
    low = gpu_name.lower()
    for key in sorted(SM_COUNTS, key=len, reverse=True):
        if key in low:
            return SM_COUNTS[key], True
    return DEFAULT_SMS, False


#: (SMs, margin) -> how much longer a GEMM ran with ``margin`` SMs carved out, measured: on the lent
#: H100 (132 SMs) with PyTorch's SM carve-out, the cuBLASLt SM-count target that TE's set_sm_margin
#: sets, the layers' GEMM shapes of Llama-3 8B / 70B at 2,048-16,384 tokens ran ×1.097 (bf16) and
#: ×1.096 (FP8) as long at a 16-SM margin, the median of 24 shapes each (bf16 ×0.99-×1.21);
#: ``python benchmarks/bench_sm_margin.py``, benchmarks/data/h100-lent/sm-margin.json.  Hopper's
#: other 132-SM parts (H200, GH200) share the SM and its cuBLASLt kernels.
MEASURED_MARGIN_SLOWDOWN = {(132, 16): 1.097}


def margin_slowdown(sms: int) -> float:
    """How much longer a GEMM runs on the SMs a pipelined or bulk collective leaves it: measured
    where it was (:data:`MEASURED_MARGIN_SLOWDOWN`), else in proportion to the SMs."""
    return MEASURED_MARGIN_SLOWDOWN.get((sms, COMM_SMS), sms / (sms - COMM_SMS))


def ring_seconds(chunk_gemm_seconds: float, gather_seconds: float, tp: int) -> float:
    """A GEMM on ``tp`` chunks of an all-gathered input, each chunk computed while the next one
    arrives: one chunk GEMM, then ``tp - 1`` steps of the slower of a chunk GEMM and a ring step."""
    step = gather_seconds / (tp - 1)
    return chunk_gemm_seconds + (tp - 1) * max(chunk_gemm_seconds, step)


def pipeline_seconds(chunk_gemm_seconds: float, chunk_scatter_seconds: float,
                     splits: int = PIPELINE_SPLITS) -> float:
    """A GEMM in ``splits`` chunks, each chunk's reduce-scatter under the next chunk's GEMM: the
    first GEMM, ``splits - 1`` steps of the slower of the two, and the last reduce-scatter."""
    return chunk_gemm_seconds + (splits - 1) * max(chunk_gemm_seconds, chunk_scatter_seconds) \
        + chunk_scatter_seconds


@dataclass(frozen=True)
class LayerGemms:
    """One transformer layer's four linear GEMMs and the collectives overlapped with them, in
    seconds.  ``*_fwd`` / ``*_bwd``: the whole GEMM's forward / backward (data + weight gradient);
    ``qkv_fwd_chunk`` / ``up_fwd_chunk``: a 1/tp chunk's forward of the QKV / MLP-up GEMM;
    ``proj_fwd_chunk`` / ``down_fwd_chunk``: a 1/4 chunk's forward of the projection / MLP-down
    GEMM; ``proj_bwd_chunk`` / ``down_bwd_chunk``: a 1/tp chunk's backward of those two (half is
    its data gradient); ``gather``: one sequence-parallel all-gather; ``scatter``: one whole
    reduce-scatter; ``scatter_chunk``: a 1/4 one."""

    qkv_fwd: float
    qkv_bwd: float
    proj_fwd: float
    proj_bwd: float
    up_fwd: float
    up_bwd: float
    down_fwd: float
    down_bwd: float
    qkv_fwd_chunk: float
    up_fwd_chunk: float
    proj_fwd_chunk: float
    down_fwd_chunk: float
    proj_bwd_chunk: float
    down_bwd_chunk: float
    gather: float
    scatter: float
    scatter_chunk: float


def layer_extra_seconds(g: LayerGemms, tp: int, slowdown: float) -> tuple[float, float]:
    """(forward, backward) seconds one layer's overlapped GEMMs and collectives take beyond the
    four GEMMs alone.  A chunked GEMM is never costed below the whole one (a smaller GEMM is never
    more efficient; the models' noise could say so), so neither figure is negative."""
    def ring(whole: float, chunk: float) -> float:
        return max(whole, ring_seconds(chunk, g.gather, tp))

    def pipe(whole: float, chunk: float) -> float:
        return max(whole, pipeline_seconds(chunk * slowdown, g.scatter_chunk))

    fwd = (ring(g.qkv_fwd, g.qkv_fwd_chunk) - g.qkv_fwd
           + pipe(g.proj_fwd, g.proj_fwd_chunk) - g.proj_fwd
           + ring(g.up_fwd, g.up_fwd_chunk) - g.up_fwd
           + pipe(g.down_fwd, g.down_fwd_chunk) - g.down_fwd)

    def dgrad_ring(whole_bwd: float, chunk_bwd: float) -> float:
        # The data gradient on gathered chunks of the output gradient, then the weight gradient.
        return ring(0.5 * whole_bwd, 0.5 * chunk_bwd) + 0.5 * whole_bwd

    def bulk(whole_bwd: float) -> float:
        half = 0.5 * whole_bwd * slowdown
        return max(half, g.gather) + max(half, g.scatter)

    bwd = (bulk(g.qkv_bwd) - g.qkv_bwd
           + dgrad_ring(g.proj_bwd, g.proj_bwd_chunk) - g.proj_bwd
           + bulk(g.up_bwd) - g.up_bwd
           + dgrad_ring(g.down_bwd, g.down_bwd_chunk) - g.down_bwd)
    return fwd, bwd


def layer_launches(tp: int) -> tuple[int, int]:
    """Kernel launches per layer (forward, backward) the overlap issues beyond one per GEMM: a
    ring exchange ``tp`` chunk GEMMs and ``tp - 1`` copies, a pipeline 4 chunk GEMMs and 4
    reduce-scatters, a bulk overlap its two collectives."""
    ring = 2 * tp - 2
    pipe = 2 * PIPELINE_SPLITS - 1
    return 2 * ring + 2 * pipe, 2 * ring + 2 * 2


__all__ = ["PIPELINE_SPLITS", "COMM_SMS", "SM_COUNTS", "sm_count", "margin_slowdown", "ring_seconds",
           "pipeline_seconds", "LayerGemms", "layer_extra_seconds", "layer_launches"]
