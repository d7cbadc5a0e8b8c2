"""Layout search: which PP × TP × DP (and micro-batch, recompute, ZeRO, interleaving) is fastest?

For a job and a GPU count, :func:`advise` enumerates every layout that keeps the job's global
batch (so every candidate does the same work per optimizer step), drops the ones the memory model
(:mod:`predictor.memory`) says do not fit the platform's GPU, predicts the rest in **one** batched
``predict_many`` call (one regressor call per operator for all candidates, never one candidate at
a time) and ranks them by predicted seconds per step.  :func:`sweep` does the same for several
GPU counts, in one batched call too, and reports time-to-train and GPU-hours per count.

Constraints of the enumeration (each one a reason a layout would fail to launch):

* pp × tp × cp × dp = the GPU count; whole nodes when more than one node is used;
* every layout passes :func:`predictor.job.check_layout`, the rules a job file is validated by;
* context parallelism (cp > 1) only with flash attention, and while each rank keeps at least
  :data:`CP_MIN_TOKENS_PER_RANK` tokens of a sequence (or up to the job's own cp);
* heads, kv_heads and ffn_hidden divisible by tp; tp within a node (tp ≤ GPUs per node and a
  divisor of it) unless ``allow_cross_node_tp`` — tensor parallelism all-reduces twice per layer
  and direction, which inter-node links turn into the bottleneck;
* at least one layer per stage (GPT-NeoX balances uneven splits); with virtual stages v > 1,
  layers divisible by pp × v and micro-batches per step divisible by pp (Megatron's interleaved
  schedule);
* a split of the layers over the pp stages that the job's framework makes
  (:func:`predictor.recipe.pipeline_split`, the same split the predictor times and the memory
  model sizes): a candidate keeps the job's ``layout.pipe_split`` rule; its explicit
  ``layout.stage_layers`` and Megatron's first/last-stage layer counts where they fit the
  candidate's pp and v (the job's own pp and v), the rule alone where they do not; Megatron's
  even split rules out a pp that does not divide the layers;
* global batch divisible by micro_batch × dp;
* ZeRO stage ≥ 2 only with pp = 1 (DeepSpeed), as :class:`~predictor.job.TrainingJob` enforces.

Dominated layouts are not predicted: when a layout fits without recomputation, the same layout
with selective or full recomputation does strictly more work for the same communication, so it
cannot be faster (and full is dropped where selective fits likewise); ZeRO-3 is dropped where
ZeRO-2 fits with no more recomputation (same compute, more traffic).  Pinned knobs are never
pruned.

Model FLOPs (for TFLOP/s and MFU; Narayanan et al., SC 2021, Appendix, generalised to GQA and any
MLP width; recomputation is *not* counted, so MFU is model FLOPs utilisation in the PaLM sense)::

    F = 6 · B · s · (L · P_layer + h · V)  +  12 · B · s² · L · h

with B sequences per step, s sequence length, L layers, h hidden, V the padded vocabulary,
P_layer = h·(h + 2k) + h·h + h·f·(2 if gated else 1) + f·h the matmul weights of one layer
(k = K/V width, f = MLP inner width); the first term is every weight GEMM forward and backward
(2 + 4 FLOPs per weight per token), the second QKᵀ and attention·V (2·2·s·h per token and layer
forward, ×3 with backward).  For k = h, f = 4h it is Narayanan's 72·B·s·L·h²·(1 + s/6h + V/12hL).
The FLOPs are summed from the recipe's operators (:func:`predictor.recipe.model_flops_per_iteration`),
so causal flash attention counts the half of the s² square it computes.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .errors import JobError, PerfcastError
from .job import Layout, ModelSpec, TrainingJob, ClusterSpec, RECOMPUTES, check_layout
from .recipe import model_flops_per_iteration, pipeline_split, stage_layers
from . import memory as mem

log = logging.getLogger(__name__)

PredictMany = Callable[[Sequence[TrainingJob], Any], list]

# Tuple key of a layout, in the order of the JSON answer.
LAYOUT_KEYS = ("pp", "tp", "cp", "dp", "micro_batch", "micro_batches", "recompute", "zero_stage",
               "virtual_stages")
# The keys of the pipeline split, which candidates inherit from the job (see _split_fields).
SPLIT_KEYS = ("pipe_split", "stage_layers", "first_stage_layers", "last_stage_layers",
              "account_for_embedding", "account_for_loss")
# Megatron-core's overlapped communication: candidates keep the job's choice where their ZeRO
# stage allows it (the gradient overlap up to the distributed optimizer, the gather with it), and
# the tensor-parallel overlap where they keep sequence parallelism.
OVERLAP_KEYS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap")
_RECOMPUTE_COST = {"none": 0, "selective": 1, "full": 2}
# Context parallelism is searched while each rank keeps at least this many tokens of a sequence:
# shorter chunks leave ring attention too little work to hide its K/V passes behind.
CP_MIN_TOKENS_PER_RANK = 4096


class AdviseError(PerfcastError):
    """A search that cannot be done as asked (no GPU count fits the job, no platform, ...)."""


@dataclass(frozen=True)
class SearchOptions:
    """What the search may change.  A knob set to a value is pinned; None leaves it free."""

    gpus: Optional[int] = None                 # None: the job's own pp × tp × dp
    micro_batch: Optional[int] = None
    recompute: Optional[str] = None
    zero_stage: Optional[int] = None
    virtual_stages: Optional[int] = None
    pp: Optional[int] = None
    tp: Optional[int] = None
    cp: Optional[int] = None
    max_cp: Optional[int] = None               # None: the job's cp, or seq_len / CP_MIN_TOKENS_PER_RANK
    allow_cross_node_tp: bool = False
    include_unfit: bool = False                # --all: predict and show layouts that do not fit
    max_micro_batch: int = 32                  # beyond this no A100/H100 layout of an LLM fits
    max_virtual_stages: int = 8
    prune_dominated: bool = True

    def __post_init__(self) -> None:
        if self.recompute is not None and self.recompute not in RECOMPUTES:
            raise AdviseError(f"recompute must be one of {', '.join(RECOMPUTES)}, got {self.recompute!r}")
        if self.zero_stage is not None and not 0 <= self.zero_stage <= 3:
            raise AdviseError(f"ZeRO stage must be 0..3, got {self.zero_stage}")
        for name in ("gpus", "micro_batch", "virtual_stages", "pp", "tp", "cp", "max_cp"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise AdviseError(f"{name.replace('_', ' ')} must be at least 1, got {v}")


@dataclass(frozen=True)
class Candidate:
    """One layout with its memory estimate and, when predicted, its predicted step time."""

    layout: Layout
    memory: mem.MemoryEstimate
    fits: bool
    prediction: Any = None                     # predictor.Prediction, or None
    flops_per_step: float = 0.0
    gpus: int = 0
    tokens_per_step: int = 0
    peak_tflops: float = 0.0
    note: str = ""
    model: Optional[ModelSpec] = None          # for the stage split in to_dict

    @property
    def key(self) -> tuple:
        return layout_key(self.layout)

    @property
    def name(self) -> str:
        """PP-TP-DP, and PP-TP-DP-CP with context parallelism (perfcast's one spelling of a layout)."""
        lay = self.layout
        return f"{lay.pp}-{lay.tp}-{lay.dp}-{lay.cp}" if lay.cp > 1 else f"{lay.pp}-{lay.tp}-{lay.dp}"

    @property
    def stage_layers(self) -> list[int]:
        """Transformer layers per pipeline stage (per device)."""
        return stage_layers(self.model, self.layout) if self.model is not None else []

    @property
    def iteration_seconds(self) -> float:
        return float(self.prediction.iteration_seconds) if self.prediction is not None else math.inf

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.iteration_seconds

    @property
    def tflops_per_gpu(self) -> float:
        return self.flops_per_step / self.iteration_seconds / self.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu / self.peak_tflops if self.peak_tflops else math.nan

    @property
    def bubble_share(self) -> float:
        if self.prediction is None:
            return math.nan
        return min(1.0, self.prediction.breakdown.bubble_seconds / self.iteration_seconds)

    @property
    def comm_share(self) -> float:
        """Share of the step spent communicating outside the bubble (TP all-reduces and pipeline
        sends of the critical stage, the DP all-reduce): :meth:`time_split`'s communication."""
        if self.prediction is None:
            return math.nan
        return min(1.0, self.time_split()["communication"] / self.iteration_seconds)

    def time_split(self) -> dict[str, float]:
        """Seconds per step in four additive parts: compute, communication, pipeline bubble and
        the rest (optimizer step, overheads).

        The predictor reports TP all-reduces and pipeline sends (``tp_allreduce_seconds``,
        ``pp_p2p_seconds``) as the part of the whole pipeline, bubble slots included, that is communication; the
        same fraction of the non-bubble stage time is communication here, and the DP all-reduce
        is added to it, and so are ZeRO-3's exposed per-layer gathers and reduce-scatters
        (``dp_exposed_seconds``, inside the stage times: ZeRO-3 has no separate reduction).
        """
        if self.prediction is None:
            return {}
        b = self.prediction.breakdown
        t = self.iteration_seconds
        zero3 = min(getattr(b, "dp_exposed_seconds", 0.0), b.forward_seconds + b.backward_seconds)
        stage = b.forward_seconds + b.backward_seconds - zero3
        bubble = b.bubble_seconds
        pipeline = stage + bubble
        inside = b.tp_allreduce_seconds + b.pp_p2p_seconds
        frac = min(1.0, inside / pipeline) if pipeline > 0 else 0.0
        compute = stage * (1.0 - frac)
        comm = stage * frac + zero3 + b.gradient_reduce_seconds
        return {"compute": compute, "communication": comm, "bubble": bubble,
                "other": max(0.0, t - compute - comm - bubble)}

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self.layout, k) for k in LAYOUT_KEYS}
        # Which layers each stage holds: the split this candidate was timed and sized with.
        d["stage_layers"] = self.stage_layers
        predicted = self.prediction is not None
        d.update({
            "iteration_seconds": round(self.iteration_seconds, 6) if predicted else None,
            "memory_gib": round(self.memory.total_gib, 3),
            "fits": self.fits,
            "tokens_per_second": round(self.tokens_per_second, 1) if predicted else None,
            "tflops_per_gpu": round(self.tflops_per_gpu, 2) if predicted else None,
            "mfu": round(self.mfu, 4) if predicted and self.peak_tflops else None,
            "bubble_share": round(self.bubble_share, 4) if predicted else None,
            "comm_share": round(self.comm_share, 4) if predicted else None,
            "memory": self.memory.to_dict(),
        })
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class Advice:
    """The answer of :func:`advise`: candidates fastest first (with ``--all`` the ones that do
    not fit are among them, flagged ``fits=False``), and where the job's own layout stands."""

    job: TrainingJob
    platform: str
    gpus: int
    gpus_per_node: int
    candidates: list[Candidate]
    current: Optional[Candidate]
    current_rank: Optional[int]                # 1 = best; None when it does not fit / no current
    iterations: int
    enumerated: int = 0                        # layouts that met the launch constraints
    # of those, reason -> count not predicted (dominated, over memory): enumerated = the
    # candidates that fit + these
    dropped: dict[str, int] = field(default_factory=dict)
    # combinations ruled out before they were layouts (cannot launch), reason -> count
    ruled_out: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.fits]

    @property
    def best(self) -> Optional[Candidate]:
        f = self.fitting
        return f[0] if f else None

    @property
    def gpu_hours_saved(self) -> Optional[float]:
        """GPU-hours the best layout saves over the job's iterations against the job's own."""
        best, cur = self.best, self.current
        if best is None or cur is None or cur.prediction is None or not self.iterations:
            return None
        return max(0.0, (cur.iteration_seconds - best.iteration_seconds) * self.iterations
                   * self.gpus / 3600.0)

    @property
    def warnings(self) -> list[str]:
        """The predictor's warnings for the best and the job's own layout (deduplicated): an
        uncalibrated platform or extrapolated shapes weaken the ranking, and the user should know."""
        out: list[str] = []
        for c in (self.best, self.current):
            for w in getattr(c.prediction, "warnings", None) or () if c is not None else ():
                if w not in out:
                    out.append(w)
        return out

    def to_dict(self) -> dict[str, Any]:
        cur = None
        if self.current is not None:
            cur = self.current.to_dict()
            cur["rank"] = self.current_rank
        return {
            "platform": self.platform,
            "gpus": self.gpus,
            "nodes": max(1, math.ceil(self.gpus / self.gpus_per_node)),
            "global_batch": self.job.layout.global_batch,
            "iterations": self.iterations,
            "candidates": [c.to_dict() for c in self.candidates],
            "current": cur,
            "gpu_hours_saved": None if self.gpu_hours_saved is None else round(self.gpu_hours_saved, 2),
            "enumerated": self.enumerated,
            "dropped": dict(self.dropped),
            "ruled_out": dict(self.ruled_out),
            "notes": list(self.notes),
            "warnings": self.warnings,
        }


@dataclass(frozen=True)
class SweepPoint:
    """The best layout at one GPU count."""

    gpus: int
    nodes: int
    best: Optional[Candidate]
    iterations: int
    advice: Advice

    @property
    def step_seconds(self) -> Optional[float]:
        return self.best.iteration_seconds if self.best else None

    @property
    def train_seconds(self) -> Optional[float]:
        """Time to train: the predictor's total (startup, evaluation, checkpoints included) when
        the job says how many iterations, else the step time × iterations (0 → per step)."""
        if self.best is None:
            return None
        total = getattr(self.best.prediction, "total_seconds", None)
        if self.iterations and total:
            return float(total)
        return self.best.iteration_seconds * max(self.iterations, 1)

    @property
    def gpu_hours(self) -> Optional[float]:
        t = self.train_seconds
        return None if t is None else t * self.gpus / 3600.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus, "nodes": self.nodes,
            "best": None if self.best is None else self.best.to_dict(),
            "iteration_seconds": self.step_seconds,
            "train_seconds": self.train_seconds,
            "gpu_hours": self.gpu_hours,
        }


# ------------------------------------------------------------------------------------ FLOPs
def model_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one optimizer step (module docstring; no recompute), from the recipe's
    operators: the same FLOPs whatever the layout, so they are counted on one GPU."""
    return model_flops_per_iteration(model, Layout(micro_batch=1, micro_batches=global_batch))


# ------------------------------------------------------------------------------------ enumeration
def layout_key(layout: Layout) -> tuple:
    return tuple(getattr(layout, k) for k in LAYOUT_KEYS)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _tp_choices(model: ModelSpec, gpus: int, gpus_per_node: int, opts: SearchOptions,
                skip: Callable[[str], None] = lambda why: None) -> list[int]:
    if opts.tp is not None and gpus % opts.tp:
        skip(f"tp {opts.tp} does not divide {gpus} GPU{'s' if gpus != 1 else ''}")
    if opts.cp is not None and gpus % opts.cp:
        skip(f"cp {opts.cp} does not divide {gpus} GPU{'s' if gpus != 1 else ''}")
        return []
    out = []
    for tp in _divisors(gpus):
        if opts.tp is not None and tp != opts.tp:
            continue
        if model.heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
            if opts.tp is not None:
                skip(f"tp {tp} does not divide the model's {model.heads} heads, {model.kv_heads} KV "
                     f"heads and FFN width {model.ffn_hidden}")
            continue
        if not opts.allow_cross_node_tp and opts.tp is None:
            if tp > gpus_per_node or gpus_per_node % tp:
                continue
        out.append(tp)
    return out


def _split_fields(job: TrainingJob, pp: int, tp: int, v: int) -> tuple[Optional[dict[str, Any]], str]:
    """The pipeline-split keys a candidate of ``pp`` stages (``v`` virtual) inherits from the job,
    or None and why when the job's framework would not split its layers so.

    The job's own explicit split and Megatron first/last-stage counts are tied to its pp and v: a
    candidate keeps them where they fit and falls back to the job's rule alone where they do not.
    """
    lay = job.layout
    full = {k: getattr(lay, k) for k in SPLIT_KEYS}
    if (pp, v) != (lay.pp, lay.virtual_stages):
        # An explicit split is the job's own stages: another pp × v of the same length (2 × 2
        # for 4 × 1) would read it as a different split.
        full["stage_layers"] = ()
    rule_only = dict(full, stage_layers=(), first_stage_layers=0, last_stage_layers=0)
    tries = [full, rule_only] if full != rule_only else [full]
    reason = ""
    for fields in tries:
        try:
            pipeline_split(job.model, Layout(pp=pp, tp=tp, virtual_stages=v, **fields))
        except JobError as exc:
            reason = f"the {lay.pipe_split} pipeline split refuses it ({exc.key})"
            continue
        return fields, ""
    return None, reason


def _cp_choices(job: TrainingJob, ranks: int, opts: SearchOptions,
                skip: Callable[[str], None] = lambda why: None) -> list[int]:
    """Context-parallel sizes to search among ``ranks`` GPUs (see the module docstring)."""
    m = job.model
    if opts.cp is not None:
        if ranks % opts.cp:
            skip(f"cp {opts.cp} does not divide the GPUs left by tp ({ranks})")
            return []
        return [opts.cp]
    if m.attention != "flash":
        return [1]
    top = opts.max_cp or max(job.layout.cp, m.seq_len // CP_MIN_TOKENS_PER_RANK)
    return [c for c in _divisors(ranks) if c <= top and m.seq_len % (2 * c) == 0]


def enumerate_layouts(job: TrainingJob, gpus: int, gpus_per_node: int,
                      opts: SearchOptions) -> tuple[list[Layout], dict[str, int]]:
    """Every layout of ``gpus`` GPUs that keeps the job's global batch and could launch.

    Returns the layouts and, per reason, how many combinations were ruled out before they became
    layouts (for the report; a combination is counted once at the step that rules it out).
    """
    m, lay = job.model, job.layout
    gb = lay.global_batch
    skipped: dict[str, int] = {}

    def skip(reason: str, n: int = 1) -> None:
        skipped[reason] = skipped.get(reason, 0) + n

    recomputes = (opts.recompute,) if opts.recompute else RECOMPUTES
    out: list[Layout] = []
    for tp in _tp_choices(m, gpus, gpus_per_node, opts, skip):
        for cp in _cp_choices(job, gpus // tp, opts, skip):
            for pp in _divisors(gpus // (tp * cp)):
                if opts.pp is not None and pp != opts.pp:
                    continue
                if pp > m.layers:
                    skip("fewer layers than pipeline stages")
                    continue
                dp = gpus // (tp * cp * pp)
                if gb % dp:
                    skip("global batch not divisible by dp")
                    continue
                if opts.zero_stage is not None:
                    zeros: Sequence[int] = (opts.zero_stage,)
                elif dp * cp == 1:
                    # Nothing to shard over one data-parallel rank: every stage is the same layout.
                    z = lay.zero_stage
                    zeros = (z if z <= 1 or pp == 1 else 0,)
                else:
                    zeros = (0, 1, 2, 3) if pp == 1 or job.run.framework == "torchtitan" else (0, 1)
                if opts.virtual_stages is not None:
                    vs: Sequence[int] = (opts.virtual_stages,)
                elif pp == 1:
                    vs = (1,)
                else:
                    vs = [v for v in range(1, opts.max_virtual_stages + 1)
                          if v == 1 or m.layers % (pp * v) == 0]
                per_dp = gb // dp
                splits = {v: _split_fields(job, pp, tp, v) for v in vs}
                for mb in _divisors(per_dp):
                    if opts.micro_batch is not None:
                        if mb != opts.micro_batch:
                            continue
                    elif mb > opts.max_micro_batch:
                        continue
                    for v in vs:
                        fields, why = splits[v]
                        if fields is None:
                            skip(why)
                            continue
                        for z in zeros:
                            base = Layout(pp=pp, tp=tp, cp=cp, dp=dp, micro_batch=mb,
                                          micro_batches=per_dp // mb, zero_stage=z,
                                          sequence_parallel=lay.sequence_parallel and tp > 1,
                                          overlap_grad_reduce=lay.overlap_grad_reduce and z <= 1,
                                          overlap_param_gather=lay.overlap_param_gather and z == 1,
                                          tp_comm_overlap=lay.tp_comm_overlap and lay.sequence_parallel
                                          and tp > 1,
                                          virtual_stages=v, **fields)
                            try:
                                # The job file's own rules: one statement of what launches.
                                check_layout(m, base, job.run.framework)
                            except JobError as exc:
                                skip(f"the job rules refuse it ({exc.key})")
                                continue
                            out.extend(dataclasses.replace(base, recompute=rc) for rc in recomputes)
    if opts.micro_batch is not None and not out:
        skip(f"micro-batch {opts.micro_batch} does not divide the global batch per dp rank")
    return out, skipped


# ------------------------------------------------------------------------------------ search
@dataclass
class _Plan:
    """Layouts of one GPU count after the memory filter, ready to predict."""

    gpus: int
    fitting: list[tuple[Layout, mem.MemoryEstimate]]
    unfit: list[tuple[Layout, mem.MemoryEstimate]]
    current: Optional[tuple[Layout, mem.MemoryEstimate]]
    current_note: str
    current_status: str          # searched | dominated (or why) | outside (the search space) | none
    enumerated: int
    dropped: dict[str, int]
    ruled_out: dict[str, int]
    gpus_per_node: int           # as placed (gpus_per_node_used)


def gpus_per_node_used(gpus: int, gpus_per_node: int) -> int:
    """GPUs per node that ``gpus`` GPUs use, as sbatch places them (``--nodes N --gpus-per-node G``):
    part of one node, whole nodes, or the fewest nodes with the same number on each (12 GPUs on
    8-GPU nodes: 2 nodes of 6). A count no node count splits evenly is refused."""
    if gpus <= gpus_per_node or gpus % gpus_per_node == 0:
        return gpus_per_node
    nodes = -(-gpus // gpus_per_node)
    if gpus % nodes:
        raise AdviseError(f"{gpus} GPUs cannot be spread evenly over {nodes} nodes of {gpus_per_node} GPUs "
                          f"(ask for whole nodes, or a multiple of {nodes} up to {nodes * gpus_per_node})")
    return gpus // nodes


def _current_layout(job: TrainingJob, gpus: int) -> tuple[Optional[Layout], str]:
    """The job's own layout at ``gpus`` GPUs: as written, or with dp scaled to the new count."""
    lay = job.layout
    if lay.gpus == gpus:
        return lay, ""
    if gpus % (lay.pp * lay.tp * lay.cp):
        return None, (f"your pp × tp × cp = {lay.pp * lay.tp * lay.cp} does not divide {gpus} GPU{'s' if gpus != 1 else ''}: "
                      "no like-for-like comparison")
    dp = gpus // (lay.pp * lay.tp * lay.cp)
    if lay.global_batch % (lay.micro_batch * dp):
        return None, (f"your global batch {lay.global_batch} is not divisible by micro-batch "
                      f"{lay.micro_batch} × dp {dp} at {gpus} GPUs")
    cur = Layout(**{**_layout_dict(lay), "dp": dp,
                    "micro_batches": lay.global_batch // (lay.micro_batch * dp)})
    return cur, f"your layout with dp scaled to {gpus} GPUs"


def _layout_dict(lay: Layout) -> dict[str, Any]:
    # The split keys too: the job's own pp and v keep its own split.
    return {k: getattr(lay, k) for k in LAYOUT_KEYS + ("sequence_parallel",) + SPLIT_KEYS + OVERLAP_KEYS}


def _prune_dominated(fitting: list[tuple[Layout, mem.MemoryEstimate]],
                     prune_zero: bool = True) -> tuple[list, int]:
    """Drop layouts that cannot be the fastest because a cheaper variant of them fits.

    * recompute: per layout apart from recompute keep only the least recomputation that fits
      (selective and full only add forward work, never remove communication);
    * ZeRO-3 vs ZeRO-2 (pp = 1): stage 3 adds parameter all-gathers in forward and backward to
      stage 2's traffic with the same compute, so it is dropped where stage 2 fits with no more
      recomputation.
    """
    best: dict[tuple, tuple[Layout, mem.MemoryEstimate]] = {}
    for lay, est in fitting:
        k = (lay.pp, lay.tp, lay.cp, lay.dp, lay.micro_batch, lay.zero_stage, lay.virtual_stages)
        prev = best.get(k)
        if prev is None or _RECOMPUTE_COST[lay.recompute] < _RECOMPUTE_COST[prev[0].recompute]:
            best[k] = (lay, est)
    kept = list(best.values())
    if prune_zero:
        def z2(lay: Layout) -> Optional[tuple[Layout, mem.MemoryEstimate]]:
            return best.get((lay.pp, lay.tp, lay.cp, lay.dp, lay.micro_batch, 2, lay.virtual_stages))
        kept = [(lay, est) for lay, est in kept
                if lay.zero_stage != 3 or (other := z2(lay)) is None
                or _RECOMPUTE_COST[other[0].recompute] > _RECOMPUTE_COST[lay.recompute]]
    return kept, len(fitting) - len(kept)


def _dominating(lay: Layout, kept: list[tuple[Layout, mem.MemoryEstimate]]) -> Optional[Layout]:
    """The kept layout that made :func:`_prune_dominated` drop ``lay``."""
    for other, _ in kept:
        if (other.pp, other.tp, other.cp, other.dp, other.micro_batch, other.virtual_stages) != \
                (lay.pp, lay.tp, lay.cp, lay.dp, lay.micro_batch, lay.virtual_stages):
            continue
        if other.zero_stage == lay.zero_stage or (lay.zero_stage == 3 and other.zero_stage == 2):
            if _RECOMPUTE_COST[other.recompute] <= _RECOMPUTE_COST[lay.recompute]:
                return other
    return None


def _plan(job: TrainingJob, platform: Any, gpus: int, opts: SearchOptions) -> _Plan:
    gpn = gpus_per_node_used(gpus, int(platform.gpus_per_node))
    capacity = float(platform.gpu.memory_gib)
    precision = job.run.precision
    layouts, ruled_out = enumerate_layouts(job, gpus, gpn, opts)
    dropped: dict[str, int] = {}
    fitting, unfit = [], []
    for lay in layouts:
        est = mem.estimate(job.model, lay, precision, mem.job_gradient_precision(job, lay), job.run.framework)
        (fitting if est.fits(capacity) else unfit).append((lay, est))
    fitting_keys = {layout_key(lay) for lay, _ in fitting}
    if opts.prune_dominated:
        # A pinned recompute leaves one setting per layout (nothing to prune); a pinned ZeRO
        # stage is never traded for another.
        fitting, n = _prune_dominated(fitting, prune_zero=opts.zero_stage is None)
        if n:
            dropped["dominated (a cheaper variant of it fits)"] = n
    if unfit:
        dropped[f"over {capacity:g} GiB per GPU"] = len(unfit)
    cur_layout, note = _current_layout(job, gpus)
    current, status = None, "none"
    if cur_layout is not None:
        current = (cur_layout, mem.estimate(job.model, cur_layout, precision,
                                            mem.job_gradient_precision(job, cur_layout), job.run.framework))
        key = layout_key(cur_layout)
        if any(layout_key(lay) == key for lay, _ in fitting):
            status = "searched"
        elif key in fitting_keys:
            status = "dominated"
            alt = _dominating(cur_layout, fitting)
            if alt is not None:
                status = (f"the same layout with {'no' if alt.recompute == 'none' else alt.recompute} recompute "
                          f"and ZeRO {alt.zero_stage} "
                          "also fits, does less work or traffic, and is listed instead")
        else:
            status = "outside"
    log.debug("advise %d GPUs: %d layouts, %d fit", gpus, len(layouts), len(fitting))
    return _Plan(gpus, fitting, unfit, current, note, status, len(layouts), dropped, ruled_out, gpn)


def _job_for(job: TrainingJob, layout: Layout, gpus_per_node: int) -> TrainingJob:
    # Built directly rather than via job.replace(): replace() round-trips through dicts, which
    # at thousands of candidates costs more than the prediction itself.  Validation still runs.
    return TrainingJob(model=job.model, layout=layout, run=job.run,
                       cluster=ClusterSpec(gpus_per_node=gpus_per_node, platform=job.cluster.platform),
                       source=job.source)


def _default_predict_many() -> PredictMany:
    # Lazy, through the package's public name: keeps `import predictor.advise` light and does
    # not depend on which module implements it.
    from . import predict_many
    return predict_many


def _predict_plans(job: TrainingJob, platform: Any, plans: Sequence[_Plan], opts: SearchOptions,
                   predict_many: Optional[PredictMany]) -> list[Advice]:
    """Predict every plan's layouts in one batched call and assemble the answers."""
    pm = predict_many or _default_predict_many()
    capacity = float(platform.gpu.memory_gib)
    precision = job.run.precision
    peak = float(platform.gpu.tflops.get(precision, 0.0)) if hasattr(platform.gpu, "tflops") else 0.0
    flops = model_flops_per_step(job.model, job.layout.global_batch)
    tokens = job.tokens_per_iteration

    batch: list[TrainingJob] = []
    index: list[tuple[int, str, Layout, mem.MemoryEstimate]] = []   # plan, role, layout, memory
    for i, plan in enumerate(plans):
        rows = [("fit", lay, est) for lay, est in plan.fitting]
        if opts.include_unfit:
            rows += [("unfit", lay, est) for lay, est in plan.unfit]
        keys = {layout_key(lay) for _, lay, _ in rows}
        if plan.current is not None and layout_key(plan.current[0]) not in keys:
            rows.append(("current", *plan.current))
        for role, lay, est in rows:
            try:
                batch.append(_job_for(job, lay, plan.gpus_per_node))
            except JobError as exc:  # the enumeration and TrainingJob disagree: a bug, not input
                log.warning("layout %s rejected by TrainingJob: %s", layout_key(lay), exc)
                continue
            index.append((i, role, lay, est))
    preds = pm(batch, platform) if batch else []
    if len(preds) != len(batch):
        raise AdviseError(f"predict_many returned {len(preds)} predictions for {len(batch)} jobs")

    answers = []
    for i, plan in enumerate(plans):
        cands: list[Candidate] = []
        current: Optional[Candidate] = None
        cur_key = layout_key(plan.current[0]) if plan.current else None
        for (pi, role, lay, est), pred in zip(index, preds):
            if pi != i:
                continue
            c = Candidate(layout=lay, memory=est, fits=est.fits(capacity), prediction=pred,
                          flops_per_step=flops, gpus=plan.gpus, tokens_per_step=tokens,
                          peak_tflops=peak, model=job.model)
            if role != "current":
                cands.append(c)
            if layout_key(lay) == cur_key:
                current = c
        # With --all the unfit layouts are interleaved by time: "the three fastest layouts need
        # more memory" is the point of asking to see them.
        cands.sort(key=lambda c: (c.iteration_seconds, not c.fits, layout_key(c.layout)))
        rank = None
        notes = []
        if current is not None:
            if plan.current_note:
                current = _with_note(current, plan.current_note)
            if current.fits:
                faster = sum(1 for c in cands if c.fits and c.iteration_seconds < current.iteration_seconds
                             and c.key != current.key)
                rank = faster + 1
            else:
                notes.append(f"your layout {current.name} needs {current.memory.total_gib:.1f} GiB "
                             f"per GPU, over the {capacity:g} GiB of the GPU")
            if plan.current_status.startswith("the same layout"):
                notes.append(f"your layout {current.name}: {plan.current_status}")
            elif plan.current_status == "dominated":
                notes.append(f"a cheaper variant of your layout {current.name} fits (less "
                             "recomputation, or ZeRO-2 instead of 3) and is listed instead")
            elif plan.current_status == "outside" and current.fits:
                notes.append(f"your layout {current.name} is outside the searched space "
                             "(ranked against it all the same)")
        elif plan.current_note:
            notes.append(plan.current_note)
        if not plan.enumerated:
            # Nothing reached the memory filter: say what the constraints ruled out instead.
            why = "; ".join(sorted(plan.ruled_out)) or "none of the searched combinations can launch"
            notes.append(f"no layout of {plan.gpus} GPUs meets the constraints ({why})")
        elif not any(c.fits for c in cands):
            notes.append(f"no layout of {plan.gpus} GPUs fits in {capacity:g} GiB per GPU")
        answers.append(Advice(job=job, platform=str(getattr(platform, "name", "")), gpus=plan.gpus,
                              gpus_per_node=plan.gpus_per_node, candidates=cands, current=current,
                              current_rank=rank, iterations=job.iterations,
                              enumerated=plan.enumerated, dropped=plan.dropped, ruled_out=plan.ruled_out,
                              notes=notes))
    return answers


def _with_note(c: Candidate, note: str) -> Candidate:
    return dataclasses.replace(c, note=note)


def advise(job: TrainingJob, platform: Any, options: Optional[SearchOptions] = None,
           predict_many: Optional[PredictMany] = None) -> Advice:
    """Rank the layouts of ``options.gpus`` GPUs (default: the job's) for ``job`` on ``platform``.

    ``predict_many(jobs, platform) -> list[Prediction]`` defaults to
    :func:`predictor.predict_many`; tests inject a fake.
    """
    opts = options or SearchOptions()
    gpus = opts.gpus or job.layout.gpus
    plan = _plan(job, platform, gpus, opts)
    return _predict_plans(job, platform, [plan], opts, predict_many)[0]


def sweep(job: TrainingJob, platform: Any, gpu_counts: Sequence[int],
          options: Optional[SearchOptions] = None,
          predict_many: Optional[PredictMany] = None) -> list[SweepPoint]:
    """The best layout at each GPU count, with time-to-train and GPU-hours (one batched call)."""
    opts = options or SearchOptions()
    counts = sorted(set(int(g) for g in gpu_counts))
    if not counts:
        raise AdviseError("no GPU counts to sweep")
    plans = [_plan(job, platform, g, opts) for g in counts]
    answers = _predict_plans(job, platform, plans, opts, predict_many)
    return [SweepPoint(gpus=a.gpus, nodes=max(1, math.ceil(a.gpus / a.gpus_per_node)), best=a.best,
                       iterations=job.iterations, advice=a) for a in answers]
