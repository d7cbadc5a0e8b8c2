"""A small physical stand-in for predict_many, so the search can be tested without bundles.

It is deliberately crude but monotone in the right directions: more FLOPs per GPU, recompute,
tensor parallelism across nodes, pipeline bubbles and ZeRO-3 all cost time.  It also counts calls,
so tests can check the search batches (one call per search, never one per candidate).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from predictor.advise import model_flops_per_step
from predictor.memory import stage_parameters
from predictor.results import Breakdown
from predictor.operators import GpuSpec


@dataclass(frozen=True)
class FakePlatform:
    name: str = "fake-a100"
    gpus_per_node: int = 4
    gpu: GpuSpec = GpuSpec("A100-SXM4-80GB", 80.0, {"fp16": 312.0, "bf16": 312.0, "fp32": 19.5}, 2039.0)
    bundle_id: str = "fake"


@dataclass
class FakePrediction:
    iteration_seconds: float
    breakdown: Breakdown
    iterations: int
    total_seconds: float
    interval_seconds: tuple = (0.0, 0.0)
    warnings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"iteration_seconds": self.iteration_seconds, "breakdown": self.breakdown.to_dict()}


class FakePredictMany:
    """predict_many(jobs, platform) with a call log."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, jobs: Sequence[Any], platform: Any) -> list[FakePrediction]:
        self.calls.append(len(jobs))
        return [_predict(j, platform) for j in jobs]


def _predict(job: Any, platform: Any) -> FakePrediction:
    m, lay = job.model, job.layout
    gpn = platform.gpus_per_node
    peak = platform.gpu.tflops[job.run.precision] * 1e12 * 0.5          # 50 % of peak
    flops = model_flops_per_step(m, lay.global_batch) / lay.gpus
    extra = {"none": 1.0, "selective": 1.03, "full": 4.0 / 3.0}[lay.recompute]
    # Small GEMMs run worse: efficiency falls with the per-GPU micro-batch width.
    width = lay.micro_batch * m.seq_len * m.hidden / lay.tp
    eff = min(1.0, 0.4 + 0.6 * width / (8 * 2048 * 6144 / 4))
    compute = flops * extra / peak / eff
    tokens = lay.micro_batch * m.seq_len
    tp_bw = 200e9 if lay.tp <= gpn else 5e9
    # TP all-reduces and pipeline sends of one micro-batch on one stage
    mp = 0.0 if lay.tp == 1 else (4 * m.layers / lay.pp * tokens * m.hidden * 2 * 2 * (lay.tp - 1)
                                  / lay.tp / tp_bw)
    p2p = 0.0 if lay.pp == 1 else 2 * tokens * m.hidden * 2 / 20e9
    # The real predictor's conventions: stage times per micro-batch include its communication;
    # the bubble is (p - 1)/v more micro-batch slots; mp/p2p are reported over all slots.
    per_mb = compute / lay.micro_batches + mp + p2p
    fwd, bwd = per_mb / 3, 2 * per_mb / 3
    slots = lay.micro_batches + (lay.pp - 1) / lay.virtual_stages
    bubble = (lay.pp - 1) / lay.virtual_stages * per_mb
    params = stage_parameters(m, lay, 0)
    dp_bw = 200e9 if lay.gpus <= gpn else 10e9
    dp = 0.0 if lay.dp == 1 else 2 * params * 2 * (lay.dp - 1) / lay.dp / dp_bw
    if lay.zero_stage == 3:
        dp *= 1.5
    update = params * 16 / (platform.gpu.memory_gbps * 1e9) / (lay.dp if lay.zero_stage else 1)
    it = lay.micro_batches * per_mb + bubble + dp + update
    b = Breakdown(forward_seconds=lay.micro_batches * fwd, backward_seconds=lay.micro_batches * bwd,
                  bubble_seconds=bubble, gradient_reduce_seconds=dp, optimizer_seconds=update,
                  step_overhead_seconds=0.0, tp_allreduce_seconds=slots * mp, pp_p2p_seconds=slots * p2p)
    iters = job.iterations
    return FakePrediction(it, b, iters, it * max(iters, 1))
