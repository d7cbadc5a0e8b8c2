"""Data-parallel communication run under computation: Megatron-core's bucketed overlap.

With ``--overlap-grad-reduce`` Megatron-core's DDP splits a stage's gradient buffer into buckets
(:func:`bucket_entries` parameters each, formed in backward order: the output layer's end first,
the embedding last) and launches each bucket's reduce-scatter (all-reduce without the distributed
optimizer) as soon as the last micro-batch's backward has produced all of its gradients; the
step waits for the last one.  With ``--overlap-param-gather`` the distributed optimizer's updated
shards are all-gathered bucket by bucket in forward order under the next step's first forward:
the first bucket's gather is issued at the end of the step, and each next one when the forward
reaches the bucket before it (Megatron's forward pre-hook; it issues one gather ahead so that
communication kernels never queue in front of the compute under CUDA_DEVICE_MAX_CONNECTIONS=1).

Both are costed here from the collectives' own times and the compute window they run under:

* gradients arrive at a steady rate over the window in proportion to the parameters the backward
  has passed (a GEMM's work is proportional to its weight's size at a fixed token count); the
  input embedding, whose gradient is written last and whose forward is a lookup, takes no time;
* a bucket's collective starts when its gradients are ready and the previous collective is done
  (NCCL runs them in order on one stream); what ends after the window is exposed.

ZeRO-3 (FSDP2, DeepSpeed stage 3) is the same pattern with one bucket per layer, every
micro-batch (predictor/estimate.py passes its windows and layer-sized buckets).

The closed forms below give what a bucket-by-bucket replay gives (tests/predictor/test_overlap.py
replays it) in constant time, whatever the bucket count: a 70 B model unsplit has over 1,700.
What they leave out: the collectives slow the GEMMs they share the GPU with (NCCL's kernels take
SMs and memory bandwidth), which no measurement here gives; a stage's gradients are assumed to
arrive evenly (attention and recomputation are spread like the GEMMs).
"""
from __future__ import annotations

import math

# Megatron-core's default bucket (DistributedDataParallelConfig.bucket_size): "max(40000000,
# 1000000 * dp_size) parameters (larger DP sizes need larger buckets to ensure collectives do
# not become latency-bound)", dp_size counting context-parallel ranks.
BUCKET_MIN_ENTRIES = 40_000_000
BUCKET_ENTRIES_PER_RANK = 1_000_000


def bucket_entries(dp_ranks: int) -> int:
    """Parameters per bucket at ``dp_ranks`` data-parallel (× context-parallel) ranks."""
    return max(BUCKET_MIN_ENTRIES, BUCKET_ENTRIES_PER_RANK * dp_ranks)


def split_buckets(parameters: int, bucket: int) -> tuple[int, int]:
    """(full buckets, parameters left over for the last one) of a stage's buffer."""
    full, rest = divmod(int(parameters), int(bucket))
    return full, rest


def exposed_reduction_seconds(window_seconds: float, parameters: int, late_parameters: int,
                              bucket: int, full_seconds: float, rest_seconds: float) -> float:
    """Seconds the gradient reduction runs past the end of the backward it overlaps.

    ``parameters``: the stage's buffer; ``late_parameters``: of which those whose gradient is
    ready only at the end of the window (the input embedding); buckets of ``bucket`` parameters in
    backward order, the leftover last; ``full_seconds`` / ``rest_seconds``: one full bucket's
    collective and the leftover's.
    """
    full, rest = split_buckets(parameters, bucket)
    early = max(0, int(parameters) - int(late_parameters))   # gradients that arrive over the window
    w = max(0.0, window_seconds)
    end = w
    if full:
        # Bucket j (1-based) is ready at r_j = w · min(1, j·bucket / early) and the last full one
        # ends at max_j (r_j + (full − j + 1) · c): concave in j, so at an end or at the kink.
        c = full_seconds
        kink = early / bucket if early else 0.0
        candidates = {1, full, min(full, max(1, math.floor(kink))), min(full, max(1, math.ceil(kink)))}

        def ready(j: int) -> float:
            return w if not early else w * min(1.0, j * bucket / early)

        end = max(end, max(ready(j) + (full - j + 1) * c for j in candidates))
    if rest:
        # The leftover holds the first layers' end of the buffer, the embedding's with it: ready
        # with the window's end.
        end = max(end, w) + rest_seconds
    return max(0.0, end - w)


def exposed_gather_seconds(window_seconds: float, parameters: int, late_parameters: int,
                           bucket: int, full_seconds: float, rest_seconds: float) -> float:
    """Seconds the parameter all-gather adds to the forward it overlaps.

    Forward order is the reverse of the buffer's: the leftover bucket (the embedding, which takes
    no time, and the first layers) first, then the full ones.  Bucket k's forward starts when its
    gather is done and bucket k − 1's forward is; gather k + 1 is issued when bucket k's forward
    starts, so the forward takes g_1 + Σ_k max(g_{k+1}, d_k) + d_n for gathers g and forward
    times d.
    """
    full, rest = split_buckets(parameters, bucket)
    late = min(int(late_parameters), int(parameters))
    early = int(parameters) - late
    w = max(0.0, window_seconds)
    per_param = w / early if early else 0.0
    # Buckets in forward order as runs of identical ones: (gather seconds, forward seconds, count).
    # The leftover comes first; then full buckets wholly inside the embedding (no forward time),
    # at most one that straddles its end, and the rest, each a full bucket's share of the window.
    runs: list[tuple[float, float, int]] = []
    if rest:
        runs.append((rest_seconds, per_param * max(0, rest - late), 1))
    if full:
        inside = min(full, max(0, late - rest) // bucket)
        straddle = 1 if inside < full and rest + inside * bucket < late else 0
        runs.append((full_seconds, 0.0, inside))
        if straddle:
            runs.append((full_seconds, per_param * (rest + (inside + 1) * bucket - late), 1))
        runs.append((full_seconds, per_param * bucket, full - inside - straddle))
    runs = [r for r in runs if r[2] > 0]
    if not runs:
        return 0.0
    total = runs[0][0]
    for k, (g, d, count) in enumerate(runs):
        total += (count - 1) * max(g, d)             # inside a run
        if k + 1 < len(runs):
            total += max(runs[k + 1][0], d)          # into the next run
    total += runs[-1][1]
    return max(0.0, total - w)
