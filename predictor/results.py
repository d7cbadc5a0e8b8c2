"""What a prediction answers, as typed objects: the iteration's breakdown and the details behind it.

The fields carry units in their names; ``to_dict`` writes them as the JSON keys of
``perf-predict --json`` (docs/job-file.md), and the text output prints the same words.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Optional


@dataclass(frozen=True)
class Breakdown:
    """Seconds of one iteration on its critical path, by part.

    The first five and ``step_overhead_seconds`` add up to the iteration; the others are already
    inside them (``tp_allreduce_seconds``, ``pp_p2p_seconds``, ``cp_exposed_seconds`` and
    ``dp_exposed_seconds`` inside the stage times, ``host_wait_seconds`` inside the backward).
    """

    forward_seconds: float               # micro-batches × the slowest stage's forward
    backward_seconds: float              # micro-batches × the slowest stage's backward
    bubble_seconds: float                # pipeline fill and drain
    gradient_reduce_seconds: float       # data-parallel gradient reduction of the critical stage
    optimizer_seconds: float             # optimizer step (and ZeRO all-gather) of that stage
    step_overhead_seconds: float         # the platform's fixed per-step cost + the engine's (host)
    tp_allreduce_seconds: float = 0.0
    pp_p2p_seconds: float = 0.0
    host_wait_seconds: float = 0.0
    cp_exposed_seconds: float = 0.0
    # ZeRO-3's per-layer all-gathers and reduce-scatters that the layers' work does not cover
    dp_exposed_seconds: float = 0.0

    # One vocabulary: the JSON key of each part is its field name, and perf-predict prints the same
    # words (acronyms in capitals, the unit in the column header).  The parts that add up to the
    # iteration come first, in order; then those already inside them ("of which").
    TERMS = (("forward_seconds", "forward (slowest stage)"),
             ("backward_seconds", "backward (slowest stage)"),
             ("bubble_seconds", "bubble"),
             ("gradient_reduce_seconds", "gradient reduce"),
             ("optimizer_seconds", "optimizer (+ all-gather)"),
             ("step_overhead_seconds", "step overhead"),
             ("tp_allreduce_seconds", "TP allreduce"),
             ("pp_p2p_seconds", "PP p2p"),
             ("host_wait_seconds", "host wait"),
             ("cp_exposed_seconds", "CP exposed"),
             ("dp_exposed_seconds", "DP exposed"))
    PARTS = tuple(t[0] for t in TERMS[:6])
    INSIDE = tuple(t[0] for t in TERMS[6:])
    LABELS = dict(TERMS)
    _NAMES = PARTS + INSIDE
    _VALUES = attrgetter(*_NAMES)

    def to_dict(self) -> dict[str, float]:
        return dict(zip(self._NAMES, map(float, self._VALUES(self))))


@dataclass(frozen=True)
class StageTimes:
    """Per pipeline stage (device), seconds of one micro-batch and the layers it runs."""

    layers: tuple[int, ...]
    forward_seconds: tuple[float, ...]
    backward_seconds: tuple[float, ...]
    host_wait_seconds: tuple[float, ...]


@dataclass(frozen=True)
class TotalTime:
    """The whole job beyond its iterations: start-up, evaluations and checkpoints."""

    startup_seconds: float = 0.0
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    evaluations: int = 0
    checkpoints: int = 0


@dataclass
class Details:
    """What stands behind a prediction: the stages, the pipeline, the interval's inputs, the
    whole-job parts and where the job runs.  ``to_dict`` writes the documented ``details`` JSON."""

    stages: StageTimes
    forward_pipeline_seconds: float          # one forward wave through the pipeline (evaluation)
    timeline_ratio: tuple[float, float] = (1.0, 1.0)
    timeline_runs: int = 0
    fitted_scales: Optional[dict[str, float]] = None
    operator_spread_seconds: tuple[float, float] = (0.0, 0.0)   # every term at its low / high end
    interval_rule: Optional[dict[str, Any]] = None              # predictor.interval.IntervalRule
    analytic_collectives: bool = False       # a collective costed by the ring model (wider interval)
    total: TotalTime = field(default_factory=TotalTime)
    gpus: int = 0
    nodes: int = 0
    # Data-parallel communication run under compute (layout.overlap_grad_reduce /
    # overlap_param_gather): not in the iteration; the most of any stage.
    dp_hidden_seconds: float = 0.0
    # Tensor-parallel communication run under the GEMMs (layout.tp_comm_overlap): what the serial
    # collectives would have cost beyond the overlap, over the iteration on the longest stage.
    tp_hidden_seconds: float = 0.0
    # The job's kind (predictor/kinds.py) and whose fitted terms it was predicted with: "kind"
    # ([[fitted_kind]]), "partition" ([fitted], a kind without runs), "platform", "none" (no fitted
    # factors: none fitted, or the job lies outside the runs they were fitted on).
    kind: Optional[dict[str, Any]] = None

    def to_dict(self) -> dict[str, Any]:
        s, t = self.stages, self.total
        d: dict[str, Any] = {
            "stage_forward_seconds": list(s.forward_seconds), "stage_backward_seconds": list(s.backward_seconds),
            "stage_host_wait_seconds": list(s.host_wait_seconds), "stage_layers": list(s.layers),
            "forward_pipeline_seconds": self.forward_pipeline_seconds,
            "timeline_ratio": list(self.timeline_ratio), "timeline_runs": self.timeline_runs,
        }
        if self.fitted_scales is not None:
            d["fitted_scales"] = dict(self.fitted_scales)
        d["operator_spread_seconds"] = list(self.operator_spread_seconds)
        if self.interval_rule is not None:
            d["interval_rule"] = dict(self.interval_rule)
        d["analytic_collectives"] = self.analytic_collectives
        d.update({"startup_seconds": t.startup_seconds, "train_seconds": t.train_seconds,
                  "eval_seconds": t.eval_seconds, "checkpoint_seconds": t.checkpoint_seconds,
                  "evaluations": t.evaluations, "checkpoints": t.checkpoints,
                  "gpus": self.gpus, "nodes": self.nodes, "dp_hidden_seconds": self.dp_hidden_seconds,
                  "tp_hidden_seconds": self.tp_hidden_seconds})
        if self.kind is not None:
            d["kind"] = dict(self.kind)
        return d
