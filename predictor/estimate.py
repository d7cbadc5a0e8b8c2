"""Predictor: a job's operators costed by the platform's regressors, composed by the pipeline timeline.

A batch of jobs (perf-advise's candidates) costs one regressor call per model, in four steps:

- structure, :func:`_plan`: every operator and collective a job needs, as handles into a shared
  :class:`QuerySet` (``_layer_terms``, ``_pipeline_terms``, ``_data_parallel_terms``, ``_host_terms``);
- costing, :meth:`QuerySet.evaluate`: each model once over all its rows;
- timeline, :func:`_assemble`: each stage's micro-batch (``_stage_seconds``), then the iteration
  along the critical path (``_iteration``);
- totals, :meth:`Predictor._prediction`: the interval, the whole job (``_total``), the warnings.

The interval comes from assembling again with every term at the low and high end
of its own uncertainty (validation p90, plus a measured extrapolation error outside the sampled
range), then widened by the timeline's own error: the spread of measured / predicted over real
runs recorded on the platform (:mod:`predictor.validation`).

Timeline (the paper's Eq. 7, 1F1B + DP, extended):
    iteration = (m + (p − 1)/v) · (F + B) + max over stages (DP gradient reduction + update) + overhead
with F, B the slowest stage's forward and backward time for one micro-batch (p2p and TP
all-reduces included; recomputation folded into B), v the virtual stages, and update = optimizer
(on the ZeRO shard) + the all-gather of updated parameters.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .bundle import Bundle, LoadedModel, ModelRows, collective_row_features
from .recipe import (Group, MicroBatchRecipe, ModelSpec, fsdp_shard_copies, fused_attention, gathers_layers,
                     gradient_precision, gradient_reduction, groups, input_embedding_parameters, layer_parameters,
                     micro_batch_recipe, op_sac_recompute_share, pipeline_sends, reduces_every_micro_batch,
                     reshards_after_forward, runs_op_sac, shard_ranks, stage_layers, stage_parameter_counts,
                     total_parameters)
from .results import Breakdown, Details, StageTimes, TotalTime
from .errors import BundleError, JobError
from . import attention, checkpointing, fp8, memory, overlap, tp_overlap
from .host import (FSDP_FRAMEWORKS, checkpoint_wrapper_for, engine_for as host_engine_for, fsdp_hook_share,
                   layer_extra_seconds, zero_hook_layer_seconds)
from .interval import IntervalRule, interval_seconds, run_scores
from .job import DEEPSPEED_PIPELINE_FRAMEWORKS, TrainingJob
from .kinds import kind_of
from .network import ring_seconds
from .operators import BYTES_PER_ELEMENT, OPERATORS, Operator, log2_features
from .platform import Platform

# An operator without samples is costed with a physically close one (its efficiency, at the
# original operator's FLOPs and bytes) and the answer says so.
SUBSTITUTES = {"swiglu": "gelu", "gelu": "swiglu", "rmsnorm": "layernorm", "layernorm": "rmsnorm",
               "scaled_masked_softmax": "softmax", "softmax": "scaled_masked_softmax",
               # FP8 casts are never calibrated: another memory-bound pass at their own bytes.
               "fp8_cast": "res_add", "amax": "res_add"}


def model_candidates(name: str, direction: str, precision: str) -> Iterator[tuple[str, str, str]]:
    """(operator, direction, precision) of the bundle models that cost operator ``name``'s
    ``direction`` at ``precision``, in the order the predictor tries them: its own, then its
    substitute's (:data:`SUBSTITUTES`); where a backward has no model (its samples failed), the
    forward's measured efficiency at the backward's FLOPs and bytes; an FP8 GEMM from its own FP8
    samples where the bundle has them, else from the 16-bit measurement of its shape
    (predictor.fp8); another precision's samples against this one's roofline last."""
    directions = (direction, "fwd") if direction == "bwd" else (direction,)
    precs = ("fp8", fp8.BASE_PRECISION, "fp16") if precision == "fp8" else (precision, "fp16", "bf16")
    for op_name in (name, SUBSTITUTES.get(name)):
        if op_name is None:
            continue
        for model_dir in directions:
            for prec in precs:
                yield op_name, model_dir, prec


# DeepSpeed's default reduce bucket (zero_optimization.reduce_bucket_size = 5e8 elements, DeepSpeed's
# configuration docs): gradients are reduced in chunks of this many elements.
REDUCE_BUCKET_ENTRIES = 500_000_000
# Relative errors with no measurement behind them (docs/modelling.md §7 says so): a collective on a
# topology calibration never timed, costed by the ring model of link figures...
ANALYTIC_REL_ERROR = 0.5
# ...and compute ratios moved from another GPU onto this one's published peaks.
TRANSFER_REL_ERROR = 0.25
# What a term's relative error gains when its shape lies outside its model's sampled range (the
# ratio held at the range's edge), on top of the model's in-range p90: measured by holding out the
# top or bottom quarter of each feature's samples (python benchmarks/bench_extrapolation.py), the
# largest over the shipped bundles; per-bundle figures in docs/modelling.md §7.
EXTRAPOLATION_ERROR_ABOVE = 0.16
EXTRAPOLATION_ERROR_BELOW = 0.251


def extrapolation_error(side: "np.ndarray | int") -> "np.ndarray | float":
    """The relative error added to a model's p90 for rows inside (0), below (−1) or above (+1) its range."""
    if isinstance(side, int):      # one collective: plain floats (numpy's per-call cost)
        return EXTRAPOLATION_ERROR_BELOW if side < 0 else (EXTRAPOLATION_ERROR_ABOVE if side > 0 else 0.0)
    return np.where(side < 0, EXTRAPOLATION_ERROR_BELOW, np.where(side > 0, EXTRAPOLATION_ERROR_ABOVE, 0.0))


# A model's rows are costed in plain floats up to this many, as numpy columns beyond.
_FLOAT_ROWS = 16
# A query set's answers are filled as plain lists up to this many handles, as arrays beyond.
_LIST_HANDLES = 256
# Per handle: a list (one job's) or an array (many jobs') of seconds, errors or flags.
_Cells = Union[list, np.ndarray]
# Rows of every model in one matrix: padded to the widest feature list (log2(1) = 0; a model
# never reads its padding).
_PAD = (1.0,) * max(len(o.features) for o in OPERATORS.values())


@dataclass
class Prediction:
    """The answer for one job on one platform (JSON shape in docs/job-file.md)."""

    iteration_seconds: float
    interval_seconds: tuple[float, float]
    total_seconds: float
    iterations: int
    breakdown: Breakdown
    platform: str
    bundle: str
    warnings: list[str]
    job: TrainingJob
    extrapolated: bool = False
    details: Optional[Details] = None

    @property
    def parameters(self) -> int:
        """Parameters of the whole model."""
        return total_parameters(self.job.model, self.job.layout.tp)

    def stages(self, gpu_memory_gib: float = 0.0) -> list[dict[str, Any]]:
        """One entry per pipeline stage: its layers, parameters and peak memory per GPU (the
        figures perf-advise uses), and its forward and backward seconds per micro-batch.

        Computed on demand: perf-advise predicts thousands of layouts and sizes them itself.
        """
        job = self.job
        est = memory.stage_estimates(job.model, job.layout, job.run.precision,
                                     memory.job_gradient_precision(job), job.run.framework)
        st = self.details.stages
        fwd, bwd = st.forward_seconds, st.backward_seconds
        out = []
        for i, (n, e) in enumerate(zip(st.layers, est)):
            row = {"stage": i, "layers": int(n), "parameters": int(e.parameters),
                   "peak_memory_bytes": int(e.total), "forward_seconds": fwd[i], "backward_seconds": bwd[i]}
            if gpu_memory_gib:
                row["fits"] = e.fits(gpu_memory_gib)
            out.append(row)
        return out

    def to_dict(self, gpu_memory_gib: float = 0.0) -> dict[str, Any]:
        return {
            "iteration_seconds": self.iteration_seconds,
            "interval_seconds": list(self.interval_seconds),
            "total_seconds": self.total_seconds,
            "iterations": self.iterations,
            "breakdown": self.breakdown.to_dict(),
            "platform": self.platform,
            "bundle": self.bundle,
            "warnings": list(self.warnings),
            "extrapolated": self.extrapolated,
            "details": self.details.to_dict() if self.details is not None else {},
            "parameters": self.parameters,
            "stages": self.stages(gpu_memory_gib),
            "job": self.job.to_dict(),
        }


# ------------------------------------------------------------------------------------ queries
# Operator and collective answers a Predictor keeps for its platform (see QuerySet._remember):
# bounded, cleared when full rather than grown.
MEMO_ENTRIES = 200_000
# Lists of models whose forest arrays a Predictor keeps, per bundle (QuerySet._kept_rows).
KEPT_MODEL_LISTS = 256


@dataclass
class _OperatorRows:
    """The operator questions of a query set, one row each, in the order costed."""

    handles: list[int] = field(default_factory=list)
    roofs: list[float] = field(default_factory=list)
    sides: list[int] = field(default_factory=list)        # 0 inside the sampled range, -1 below, +1 above
    p90: list[float] = field(default_factory=list)
    calls: list[float] = field(default_factory=list)      # the host's seconds for the call
    fp8_rows: list[tuple[int, float, float]] = field(default_factory=list)   # (row, FLOPs, FP8 bytes)
    gather: list[int] = field(default_factory=list)       # row -> its distinct regressor row
    distinct_rows: list[tuple[float, ...]] = field(default_factory=list)
    distinct_keys: list[str] = field(default_factory=list)
    attention: list[bool] = field(default_factory=list)   # a fused attention kernel ([fitted] attention_scale)


@dataclass(eq=False)
class _OperatorModel:
    """Which model costs an operator question (name, direction, precision) on the platform, and
    what every row of it shares: worked out once per :class:`Predictor` (QuerySet._resolve_op)."""

    op: Operator
    direction: str
    precision: str                # the roofline's (an FP8 GEMM without FP8 samples: its 16-bit)
    in_fp8: bool                  # an FP8 GEMM costed from its 16-bit samples (predictor.fp8)
    model_key: str
    model: LoadedModel
    model_features: tuple[str, ...]   # the features the model reads (a substitute's own)
    call_seconds: float           # the host's time for one call (0: no [host] table)
    note: str                     # why a substitute answers, where one does
    roofline_seconds: Callable[[Mapping[str, float]], float]    # of one row (Operator.row_roofline)
    fused_attention: bool         # a fused attention kernel ([fitted] attention_scale)


@dataclass
class _PlatformMemo:
    """What a :class:`Predictor` works out from its platform alone, for every later job."""

    operators: dict[tuple[str, str, str], _OperatorModel] = field(default_factory=dict)   # (op, dir, prec)
    # (attention kernel, framework, sequence, precision) -> how that attention is costed
    attention_costs: dict[tuple, attention.AttentionCost] = field(default_factory=dict)
    # (collective, precision) -> its measured model (None: the ring model), the kind that model
    # measured, and the (nodes, GPUs per node) it measured
    collectives: dict[tuple[str, str], tuple[Optional[LoadedModel], str, frozenset]] = \
        field(default_factory=dict)
    # the forests' arrays for the lists of models asked of each bundle (Bundle.model_rows)
    compute_rows: dict[tuple[str, ...], ModelRows] = field(default_factory=dict)
    collective_rows: dict[tuple[str, ...], ModelRows] = field(default_factory=dict)


class QuerySet:
    """Operator and collective queries of many jobs, answered with one model call per model."""

    def __init__(self, platform: Platform, answers: Optional[dict] = None,
                 known: Optional[_PlatformMemo] = None, memo_entries: int = MEMO_ENTRIES):
        """``answers`` and ``known``: what earlier sets on the same platform costed, and what the
        platform alone decided for them (a :class:`Predictor`'s memos); fresh when not given."""
        self.platform = platform
        self.memo_entries = memo_entries
        # the operator's model -> (handle, shape, its feature values)
        self._op_rows: dict[_OperatorModel, list[tuple[int, Mapping[str, float], tuple[float, ...]]]] = \
            defaultdict(list)
        self._coll_rows: list[tuple[int, str, str, float, Group]] = []
        self._n = 0
        self.warnings: dict[int, list[str]] = defaultdict(list)   # handle -> warnings
        self._memo = answers if answers is not None else {}
        self.known = known if known is not None else _PlatformMemo()
        self._static = self.known.operators
        self._known: dict[int, tuple[float, float, bool]] = {}     # handle -> memoised answer
        self._keys: dict[int, tuple] = {}                            # handle -> memo key (misses)
        self.analytic: set[int] = set()       # collectives costed by the ring model of link speeds
        self._names: dict[int, str] = {}      # handle -> operator or collective (for messages)
        # memo key -> handle: a question asked twice (jobs share shapes) is one handle, costed once
        self._asked: dict[tuple, int] = {}
        self._by_plan: dict[int, None] = {}     # handles asked since the last take_asked()

    def take_asked(self) -> list[int]:
        """The handles asked for since the last call, in the order first asked (one job's)."""
        asked, self._by_plan = list(self._by_plan), {}
        return asked

    def _ask(self, key: tuple) -> tuple[int, bool]:
        """The handle of a question (memo key), and whether this set is asked it for the first
        time; either way it counts as asked by the current job (:meth:`take_asked`)."""
        n = self._n
        h = self._asked.setdefault(key, n)      # one hash of the key, asked before or not
        new = h == n
        if new:
            self._n = n + 1
        self._by_plan[h] = None
        return h, new

    def op(self, name: str, direction: str, precision: str, shape: Mapping[str, float]) -> int:
        values = tuple([float(shape[f]) for f in OPERATORS[name].features])
        return self._op(name, direction, precision, shape, values)

    def op_both(self, name: str, precision: str, shape: Mapping[str, float]) -> tuple[int, int]:
        """:meth:`op` forward, then backward, of one shape (its features read once)."""
        values = tuple([float(shape[f]) for f in OPERATORS[name].features])
        return self._op(name, "fwd", precision, shape, values), self._op(name, "bwd", precision, shape, values)

    def _op(self, name: str, direction: str, precision: str, shape: Mapping[str, float],
            values: tuple[float, ...]) -> int:
        key = ("op", name, direction, precision, values)
        h, new = self._ask(key)
        if not new:               # asked before in this set (another stage, another candidate)
            return h
        self._names[h] = name
        rkey = (name, direction, precision)
        model = self._static.get(rkey)
        if model is None:
            model = self._static[rkey] = self._resolve_op(name, direction, precision)
        if model.note:
            self.warnings[h].append(model.note)
        hit = self._memo.get(key)
        if hit is not None:
            self._known[h] = hit
        else:
            self._keys[h] = key
            self._op_rows[model].append((h, shape, values))
        return h

    def seconds(self, name: str, seconds: float) -> int:
        """A term whose time is known without a model (a formula's): ``name`` labels it."""
        h, new = self._ask(("seconds", name, float(seconds)))
        if new:
            self._names[h] = name
            self._known[h] = (float(seconds), 0.0, False)
        return h

    def coll(self, kind: str, entries: float, group: Group, precision: str) -> int:
        key = ("coll", kind, precision, float(entries), group.nodes, group.gpus_per_node)
        h, new = self._ask(key)
        if not new:
            return h
        self._names[h] = kind
        hit = self._memo.get(key)
        if hit is not None:
            self._known[h] = hit[:3]
            if hit[3]:
                self.warnings[h].append(hit[3])
            if hit[4]:
                self.analytic.add(h)
        else:
            self._keys[h] = key
            self._coll_rows.append((h, kind, precision, float(entries), group))
        return h

    def _resolve_op(self, name: str, direction: str, precision: str) -> _OperatorModel:
        bundle = self.platform.compute
        for op_name, model_dir, prec in model_candidates(name, direction, precision):
            key = f"{op_name}.{model_dir}.{prec}"
            if bundle.get(key) is None:
                continue
            notes = []
            if op_name != name:
                notes.append(f"operator {name} has no model in bundle {bundle.name}; costed "
                             f"with {op_name}'s measured efficiency at {name}'s FLOPs and bytes")
            if model_dir != direction:
                notes.append(f"{op_name} {direction} has no model in bundle {bundle.name} "
                             f"({bundle.not_fitted_reason(f'{op_name}.{direction}.{prec}')}); costed "
                             f"with the {model_dir} pass's measured efficiency at the {direction} "
                             "pass's FLOPs and bytes")
            if prec != precision and precision != "fp8":
                notes.append(f"{precision} costed with {prec} samples of bundle {bundle.name} "
                             f"(against the {precision} roofline)")
            return self._operator_model(name, direction, precision, key, op_name, "; ".join(notes))
        raise BundleError(f"operator {name} ({direction}, {precision}) has no model in bundle "
                          f"{bundle.name} ({bundle.path}) and no substitute")

    def _operator_model(self, name: str, direction: str, precision: str, model_key: str, model_op: str,
                        note: str) -> _OperatorModel:
        plat = self.platform
        # An FP8 GEMM without FP8 samples: the 16-bit measurement first, against its own roofline.
        in_fp8 = precision == "fp8" and not model_key.endswith(".fp8")
        if in_fp8:
            precision = fp8.BASE_PRECISION
        call = plat.host.call_seconds(model_op, direction, precision) if plat.host is not None else 0.0
        op = OPERATORS[name]
        return _OperatorModel(op, direction, precision, in_fp8, model_key, plat.compute.models[model_key],
                              OPERATORS[model_op].features, call, note,
                              op.row_roofline(direction, precision, plat.gpu), name.startswith("flash_atten"))

    def evaluate(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(seconds, relative error, extrapolated) per handle."""
        n = self._n
        # One job's few dozen handles are filled as plain lists (numpy's per-call cost would be
        # most of the time), perf-advise's thousands as arrays; either way each cell is written
        # once by the same float operations, so the arrays returned are the same bits.
        secs: _Cells
        rel: _Cells
        extra: _Cells
        if n <= _LIST_HANDLES:
            secs, rel, extra = [0.0] * n, [0.0] * n, [False] * n
            for h, (s, r, x) in self._known.items():
                secs[h], rel[h], extra[h] = s, r, x > 0.5
        else:
            secs, rel, extra = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)
            if self._known:
                known = np.array(list(self._known.values()), dtype=float).reshape(-1, 3)
                hs = np.fromiter(self._known, dtype=int, count=len(self._known))
                secs[hs], rel[hs], extra[hs] = known[:, 0], known[:, 1], known[:, 2] > 0.5
        if self._op_rows:
            self._evaluate_operators(secs, rel, extra)
        if self._coll_rows:
            self._evaluate_collectives(secs, rel, extra)
        self._remember(secs, rel, extra)
        if isinstance(secs, list):
            return np.array(secs, dtype=float), np.array(rel, dtype=float), np.array(extra, dtype=bool)
        return secs, rel, extra

    def _evaluate_operators(self, secs: _Cells, rel: _Cells, extra: _Cells) -> None:
        # One prediction asks for ~30 models with a row or two each, perf-advise for the same
        # models with many rows: each group's rows are costed in plain floats when few (numpy's
        # per-call cost would be most of the time) and as columns when many, and everything after
        # the regressors runs once over the rows of all groups.
        rows = self._operator_rows()
        t, r, inside = self._operator_seconds(rows)
        if isinstance(secs, list):
            if isinstance(t, np.ndarray):
                t, r, inside = t.tolist(), r.tolist(), inside.tolist()
            for h, t_h, r_h, in_h in zip(rows.handles, t, r, inside):
                secs[h], rel[h], extra[h] = t_h, r_h, not in_h
        else:
            hs = np.asarray(rows.handles)
            secs[hs], rel[hs], extra[hs] = t, r, ~np.asarray(inside, dtype=bool)

    def _operator_rows(self) -> "_OperatorRows":
        """Every operator question as a row: its roofline, where it lies against its model's
        sampled range, the model's p90, the host's time for the call, and its regressor row."""
        gpu = self.platform.gpu
        out = _OperatorRows()
        handles, roofs, sides, p90, calls = out.handles, out.roofs, out.sides, out.p90, out.calls
        fp8_rows, gather = out.fp8_rows, out.gather
        distinct_rows, distinct_keys = out.distinct_rows, out.distinct_keys
        for model, rows in self._op_rows.items():
            op, direction, precision, model_key, lm = \
                model.op, model.direction, model.precision, model.model_key, model.model
            # The memo key holds the operator's own features; a substitute model with other
            # features reads its own from the shape.
            raws = [r for _, _, r in rows] if model.model_features == op.features else \
                [tuple(float(s[f]) for f in model.model_features) for _, s, _ in rows]
            # Rows repeat across jobs (advise's candidates share tp and micro-batch): each
            # distinct row goes to the regressor once.
            seen: dict[tuple[float, ...], int] = {}
            for r in raws:
                at = seen.get(r)
                if at is None:
                    at = seen[r] = len(distinct_rows)
                    distinct_rows.append(r + _PAD[len(r):])
                    distinct_keys.append(model_key)
                gather.append(at)
            handles.extend([h for h, _, _ in rows])
            out.attention.extend([model.fused_attention] * len(rows))
            if len(rows) <= _FLOAT_ROWS:
                roofs.extend([model.roofline_seconds(shape) for _, shape, _ in rows])
                sides.extend([lm.row_range_side(r) for r in raws])
            else:
                cols = np.array([r for _, _, r in rows])     # the operator's own features
                roofs.extend(op.roofline_seconds({f: cols[:, i] for i, f in enumerate(op.features)},
                                                 direction, precision, gpu).tolist())
                sides.extend(lm.range_side(np.array(raws)).tolist())
            if model.in_fp8:
                scale = 1.0 if direction == "fwd" else op.bwd_factor
                first = len(handles) - len(rows)
                fp8_rows.extend((first + i, scale * float(op.flops(shape)),
                                 fp8.gemm_bytes(float(shape["m"]), float(shape["k"]), float(shape["n"]), direction))
                                for i, (_, shape, _) in enumerate(rows))
            p90.extend([lm.info.validation_p90] * len(rows))
            calls.extend([model.call_seconds] * len(rows))
        return out

    def _operator_seconds(self, rows: "_OperatorRows") -> "tuple[_Cells, _Cells, _Cells]":
        """(device seconds, relative error, inside the sampled range) of every row: the regressors'
        ratios times the rooflines, then the launch floor, the host's lead-in, FP8 and the fitted
        compute scale."""
        plat = self.platform
        gpu = plat.gpu
        keys = rows.distinct_keys
        if len(keys) <= _FLOAT_ROWS:
            keys = self._kept_rows(self.known.compute_rows, plat.compute, keys)
        ratios = plat.compute.ratios_rows(keys, log2_features(rows.distinct_rows))
        if len(rows.handles) <= _FLOAT_ROWS and not rows.fp8_rows:
            return self._operator_seconds_floats(rows, ratios.tolist())
        roof = np.asarray(rows.roofs)
        t = ratios[np.asarray(rows.gather)] * roof
        side_a = np.asarray(rows.sides, dtype=int)
        inside_a = side_a == 0
        if not inside_a.all():
            # Outside the sampled range the ratio is held at the edge: below it, a launch floor
            # (the least the bundle ever measured), not a time that shrinks to nothing.
            t = np.where(inside_a, t, np.maximum(t, plat.compute.kernel_floor_seconds))
        r = np.asarray(rows.p90) + extrapolation_error(side_a) + \
            (TRANSFER_REL_ERROR if plat.transferred else 0.0)
        call = np.asarray(rows.calls)
        if call.any():
            # A sample is one isolated call timed between CUDA events: max(host issue, host
            # lead-in + device work).  The host model counts the issuing once per micro-batch,
            # so the device's share is the sample less the lead-in, which lies between nothing
            # and the whole call's host time: the midpoint, never below the roofline, with both
            # ends inside the interval (see predictor/host.py).
            timed = call > 0
            dev = np.where(timed, np.maximum(t - 0.5 * call, roof), t)
            r = r + np.where(timed, np.minimum(0.5 * call, t - roof).clip(min=0.0) / dev, 0.0)
            t = dev
        if rows.fp8_rows:
            # FP8 GEMMs: the tensor-core part of the 16-bit time at the FP8 peak (predictor.fp8),
            # never below the launch floor; the rest of the kernel's time, and the gap to the
            # whole-kernel bound in its error.
            at, tc, byt = (np.asarray(c) for c in zip(*rows.fp8_rows))
            t8, gap = fp8.gemm_seconds(t[at], tc, byt, gpu.peak_flops(fp8.BASE_PRECISION),
                                       gpu.peak_flops("fp8"), gpu.memory_gbps * 1e9)
            t8 = np.maximum(t8, plat.compute.kernel_floor_seconds)
            r[at] += gap
            t[at] = t8
            roof[at] = np.minimum(roof[at], t8)
        if plat.fitted is not None and plat.fitted.compute_scale != 1.0:
            # [fitted] compute scale (perf-calibrate validate --fit): device time, never below the
            # roofline (no kernel beats it).
            t = np.maximum(t * plat.fitted.compute_scale, roof)
        if plat.fitted is not None and plat.fitted.attention_scale != 1.0:
            t = np.where(np.asarray(rows.attention, dtype=bool),
                         np.maximum(t * plat.fitted.attention_scale, roof), t)
        return t, r, inside_a

    def _operator_seconds_floats(self, rows: "_OperatorRows",
                                 ratios: list[float]) -> tuple[list[float], list[float], list[bool]]:
        """:meth:`_operator_seconds` of a few rows without FP8 GEMMs, in plain floats (numpy's
        per-call cost would be most of the time): the same operations in the same order, so the
        same bits."""
        plat = self.platform
        base_error = TRANSFER_REL_ERROR if plat.transferred else 0.0
        fitted = plat.fitted
        compute_scale = fitted.compute_scale if fitted is not None else 1.0
        attention_scale = fitted.attention_scale if fitted is not None else 1.0
        ts, rs, inside = [], [], []
        for g, roof, side, p90, call, fused in zip(rows.gather, rows.roofs, rows.sides, rows.p90,
                                                    rows.calls, rows.attention):
            t = ratios[g] * roof
            if side != 0:
                t = max(t, plat.compute.kernel_floor_seconds)
            r = p90 + extrapolation_error(side) + base_error
            if call > 0:
                dev = max(t - 0.5 * call, roof)
                r = r + max(min(0.5 * call, t - roof), 0.0) / dev
                t = dev
            if compute_scale != 1.0:
                t = max(t * compute_scale, roof)
            if attention_scale != 1.0 and fused:
                t = max(t * attention_scale, roof)
            ts.append(t)
            rs.append(r)
            inside.append(side == 0)
        return ts, rs, inside

    def _remember(self, secs: _Cells, rel: _Cells, extra: _Cells) -> None:
        """Keep what this set computed: the platform never changes once loaded (a reload is a new
        Platform), so the same shape costs the same on the next job the daemon or perf-advise asks
        about.  Bounded: cleared when full rather than grown."""
        memo = self._memo
        if len(memo) + len(self._keys) > self.memo_entries:
            memo.clear()
        if isinstance(secs, np.ndarray):
            secs, rel, extra = secs.tolist(), rel.tolist(), extra.tolist()
        for h, key in self._keys.items():
            answer = (float(secs[h]), float(rel[h]), bool(extra[h]))
            if key[0] == "coll":
                answer += ("; ".join(self.warnings.get(h, ())), h in self.analytic)
            memo[key] = answer

    def _evaluate_collectives(self, secs: _Cells, rel: _Cells, extra: _Cells) -> None:
        plat = self.platform
        models = self.known.collectives
        # (handle, entries, model, ring-model seconds of the measured kind) for the regressors
        measured: list[tuple[int, float, Any, float]] = []
        rows: list[tuple[float, int, int]] = []       # their (entries, nodes, GPUs per node)
        between_nodes: list[int] = []
        for h, kind, precision, entries, group in self._coll_rows:
            if group.size <= 1 or entries <= 0:
                continue
            nodes, gpn = group.nodes, group.gpus_per_node
            if nodes > 1:
                between_nodes.append(h)
            eb = BYTES_PER_ELEMENT[precision]
            found = models.get((kind, precision))
            if found is None:
                model, measured_kind = self._collective_model(kind, precision)
                topo = frozenset(tuple(t) for t in model.info.topologies) if model is not None else frozenset()
                found = models[(kind, precision)] = (model, measured_kind, topo)
            model, measured_kind, topo = found
            if (nodes, gpn) not in topo:
                secs[h] = ring_seconds(plat.links, kind, entries, nodes, gpn, eb)
                rel[h] = ANALYTIC_REL_ERROR
                self.analytic.add(h)
                if plat.collectives is not None:      # else one platform-level warning (predict_many)
                    self.warnings[h].append(
                        f"{kind} over {nodes}×{gpn} GPUs was not measured on platform {plat.name}; "
                        "analytic ring model from its fitted link speeds (wider interval)")
                continue
            # reduce-scatter costed from a measured all-reduce: half of the ring.
            base = ring_seconds(plat.links, measured_kind, entries, nodes, gpn, eb) * \
                (0.5 if measured_kind != kind else 1.0)
            measured.append((h, entries, model, base))
            rows.append((entries, nodes, gpn))
        if measured:
            self._measured_collectives(measured, rows, secs, rel, extra)
        if between_nodes and plat.fabric is not None:
            # [fabric] (perf-calibrate fabric): calibration timed each collective on one group with
            # the fabric to itself; in a job the other groups of its layout run theirs over the same
            # adapters and switches at the same time.
            for h in between_nodes:
                secs[h] *= plat.fabric.between_nodes_slowdown
        if between_nodes and plat.fitted is not None and plat.fitted.network_scale != 1.0:
            # [fitted] network scale (perf-calibrate validate --fit): the fabric under a whole job
            # against the collectives calibration timed alone; communication inside a node keeps
            # what was measured.
            for h in between_nodes:
                secs[h] *= plat.fitted.network_scale

    def _measured_collectives(self, measured: list, rows: list, secs: _Cells, rel: _Cells,
                              extra: _Cells) -> None:
        """The collective regressors' answers for ``measured`` (handle, entries, model, ring-model
        seconds) at ``rows`` (entries, nodes, GPUs per node)."""
        plat = self.platform
        keys: Sequence[str] = [m.info.key for _, _, m, _ in measured]
        if len(keys) <= _FLOAT_ROWS:
            keys = self._kept_rows(self.known.collective_rows, plat.collectives, keys)
        ratios = plat.collectives.ratios_rows(keys, collective_row_features(rows)).tolist()
        for (h, entries, model, base), ratio in zip(measured, ratios):
            secs[h] = ratio * base
            side = -1 if entries < model.info.feature_min[0] * 0.99 else \
                (1 if entries > model.info.feature_max[0] * 1.01 else 0)
            extra[h] = side != 0
            rel[h] = model.info.validation_p90 + extrapolation_error(side)

    @staticmethod
    def _kept_rows(kept: dict[tuple[str, ...], ModelRows], bundle: Bundle, keys: Sequence[str]) -> ModelRows:
        """``keys`` with ``bundle``'s forest arrays for them (:meth:`Bundle.model_rows`), kept in
        ``kept`` (a Predictor's, for this bundle): one job's few lists of models come back with
        every job of its layout.  Bounded: cleared when full."""
        key = tuple(keys)
        rows = kept.get(key)
        if rows is None:
            if len(kept) >= KEPT_MODEL_LISTS:
                kept.clear()
            rows = kept[key] = bundle.model_rows(key)
        return rows

    def _collective_model(self, kind: str, precision: str):
        """The measured-collective model for a kind (reduce-scatter falls back to all-reduce)."""
        if self.platform.collectives is None:
            return None, kind
        for k in (kind, "allreduce") if kind == "reduce_scatter" else (kind,):
            for prec in (precision, "fp16", "bf16"):
                model = self.platform.collectives.get(f"{k}.{prec}")
                if model is not None:
                    return model, k
        return None, kind

    def names_of(self, handles: "list[int]") -> list[str]:
        """Operator or collective names behind some handles (for messages)."""
        out: list[str] = []
        for h in handles:
            n = self._names.get(h)
            if n and n not in out:
                out.append(n)
        return out


# ------------------------------------------------------------------------------------ per job
class _Term:
    """Handles times multiplicity: the seconds of a term are Σ count · seconds[handle]."""

    __slots__ = ("parts",)      # a job makes dozens

    def __init__(self, parts: Optional[list[tuple[int, float]]] = None):
        self.parts: list[tuple[int, float]] = parts if parts is not None else []

    def __repr__(self) -> str:
        return f"_Term({self.parts!r})"

    def add(self, handle: int, count: float = 1.0) -> "_Term":
        self.parts.append((handle, count))
        return self

    def extend(self, other: "_Term", count: float = 1.0) -> "_Term":
        if count == 1.0:
            self.parts.extend(other.parts)
        else:
            self.parts.extend([(h, c * count) for h, c in other.parts])
        return self


@dataclass
class _JobPlan:
    job: TrainingJob
    stage_fwd: list[_Term]
    stage_bwd: list[_Term]
    stage_dp: list[_Term]          # gradient reduction per stage
    stage_update: list[_Term]      # optimizer + parameter all-gather per stage
    mp_comm: list[tuple[_Term, _Term]]     # per stage: TP collectives inside fwd, bwd
    p2p: list[tuple[_Term, _Term]]
    warnings: list[str]
    stage_host: list[float] = field(default_factory=list)   # host seconds per micro-batch (fwd + bwd)
    # Context parallelism: (K/V passes fwd, attention fwd, passes bwd, attention bwd) per layer.
    cp_ring: Optional[tuple[_Term, _Term, _Term, _Term]] = None
    sizes: list[int] = field(default_factory=list)          # layers per stage
    handles: list[int] = field(default_factory=list)        # every handle the job asked for, in order
    # Megatron-core's overlapped data parallelism: each stage's buckets (predictor.overlap).
    buckets: list["_Buckets"] = field(default_factory=list)
    # ZeRO-3: each stage's layers as buckets, gathered and reduced every micro-batch.
    sharded: list["_Buckets"] = field(default_factory=list)
    # --tp-comm-overlap: one layer's GEMMs whole and in chunks and its collectives
    # (_tp_overlap_terms), and the GEMMs' slowdown beside a collective's SMs.
    tp_ub: Optional[list[_Term]] = None
    tp_ub_slowdown: float = 1.0
    # The framework engine's own host work per step (predictor.host.engine_for).
    engine_step_seconds: float = 0.0
    # ZeRO-3: the layers gathered again for the backward (reshard after forward), or kept
    # unsharded from forward to backward.
    regather_backward: bool = True
    # DeepSpeed's ZeRO-2: every micro-batch's gradients reduced after its backward, not once a step.
    reduce_every_micro_batch: bool = False


@dataclass
class _Buckets:
    """One stage's parameters as the buckets its data-parallel collectives run in (Megatron-core's
    --overlap-grad-reduce buckets, or ZeRO-3's layers): how many, of which those that do no work
    in the windows the collectives run under (the input embedding; under ZeRO-3 everything beyond
    the layers), the bucket size, and the terms of one full bucket's and the leftover's reduction
    and all-gather."""

    parameters: int
    late_parameters: int
    bucket: int
    terms: list[_Term]

    def whole_seconds(self, full_seconds: float, rest_seconds: float) -> float:
        """The stage's collective done bucket by bucket, none of it hidden."""
        return (self.parameters // self.bucket) * full_seconds + rest_seconds


def _attention_cost(job: TrainingJob, plat: Platform, seq: float,
                    known: Optional[dict] = None) -> attention.AttentionCost:
    """How the job's fused attention is costed; ``known``: the answers for this platform so far
    (they depend on the platform, the kernel, the framework, the sequence and the precision alone)."""
    key = (job.model.attention_impl, job.run.framework, seq, job.run.precision)
    cost = known.get(key) if known is not None else None
    if cost is None:
        cost = _attention_cost_of(job, plat, seq)
        if known is not None:
            known[key] = cost
    return cost


def _attention_cost_of(job: TrainingJob, plat: Platform, seq: float) -> attention.AttentionCost:
    bundle = plat.compute

    def has_model(operator: str) -> bool:
        return any(bundle.get(f"{operator}.fwd.{p}") is not None
                   for p in (job.run.precision, "fp16", "bf16"))
    try:
        return attention.attention_cost(job.model.attention_impl, job.run.framework, seq, bundle.name,
                                        bundle.manifest.get("source", {}), has_model, plat.gpu.tflops,
                                        plat.gpu.name)
    except ValueError as exc:
        raise JobError("model.attention_impl", str(exc), job.source) from None


@dataclass
class _LayerTerms:
    """One transformer layer's terms for one micro-batch, the same on every stage."""

    forward: _Term
    backward: _Term                # recomputation included
    core_forward: _Term            # the attention core (selective recomputation repeats it)
    core_backward: _Term
    mp_forward: _Term              # its TP collectives, inside forward and backward
    mp_backward: _Term
    # Context parallelism: (K/V passes fwd, attention fwd, passes bwd, attention bwd).
    cp_ring: Optional[tuple[_Term, _Term, _Term, _Term]] = None
    tp_ub: Optional[list[_Term]] = None     # --tp-comm-overlap (_tp_overlap_terms)
    # DeepSpeed's checkpointing options on the layer (None: none in effect); the host pays them too.
    checkpoint_costs: Optional[checkpointing.LayerCheckpointCosts] = None


@dataclass
class _PipelineTerms:
    """Per pipeline stage: forward and backward of one micro-batch, and the TP collectives and
    point-to-point sends inside them."""

    forward: list[_Term]
    backward: list[_Term]
    mp_comm: list[tuple[_Term, _Term]]
    p2p: list[tuple[_Term, _Term]]


@dataclass
class _DataParallelTerms:
    """Per pipeline stage: gradient reduction and update (optimizer + parameter all-gather), and
    the buckets of overlapped data parallelism (Megatron-core's, or ZeRO-3's layers)."""

    reduction: list[_Term]
    update: list[_Term]
    buckets: list[_Buckets]
    sharded: list[_Buckets]


def _plan(job: TrainingJob, plat: Platform, q: QuerySet) -> _JobPlan:
    """The terms of a job's timeline as handles into ``q``, in four steps: one layer's operators
    and collectives, the pipeline stages built from them, data parallelism per stage, and the
    host's time to issue each stage's work."""
    q.take_asked()
    lay = job.layout
    gpn = job.cluster.gpus_per_node or plat.gpus_per_node
    warnings: list[str] = []
    if job.cluster.gpus_per_node and job.cluster.gpus_per_node != plat.gpus_per_node:
        more = job.cluster.gpus_per_node > plat.gpus_per_node
        warnings.append(f"the job says {job.cluster.gpus_per_node} GPUs per node, platform "
                        f"{plat.name} has {plat.gpus_per_node}; costed with the job's"
                        + (f", on nodes that platform does not have (for its real nodes give {plat.gpus_per_node} "
                           "per node: cluster.gpus_per_node in a job file, the ranks per node in a launch)"
                           if more else ""))
    grp = groups(job, gpn)
    recipe = micro_batch_recipe(job.model, lay)
    casts = _fp8_casts(job, plat, recipe, warnings)
    layer = _layer_terms(job, plat, q, recipe, casts, grp, warnings)
    sizes = stage_layers(job.model, lay)
    pipeline = _pipeline_terms(job, q, recipe, layer, grp, sizes)
    dp = _data_parallel_terms(job, q, recipe, grp, sizes)
    _shard_copy_terms(job, plat, q, pipeline)
    stage_host, engine_step = _host_terms(job, plat, layer, casts, pipeline, sizes)
    tp_ub_slowdown = 1.0
    if layer.tp_ub is not None:
        tp_ub_slowdown = _tp_overlap_slowdown(plat, grp, warnings)
    return _JobPlan(job, pipeline.forward, pipeline.backward, dp.reduction, dp.update, pipeline.mp_comm,
                    pipeline.p2p, warnings, stage_host, layer.cp_ring, list(sizes), q.take_asked(),
                    dp.buckets, dp.sharded, layer.tp_ub, tp_ub_slowdown, engine_step,
                    reshards_after_forward(lay, job.run.framework),
                    reduces_every_micro_batch(lay, job.run.framework))


def _shard_copy_terms(job: TrainingJob, plat: Platform, q: QuerySet, pipeline: "_PipelineTerms") -> None:
    """FSDP's copies around its collectives (recipe.fsdp_shard_copies: FSDP2's under TorchTitan,
    FSDP1's under llm-foundry), each micro-batch, in each stage's forward and backward: memory
    passes at the GPU's bandwidth."""
    lay = job.layout
    grad = gradient_precision(job.run.precision, lay, job.run.framework, job.run.grad_reduce_precision)
    copies = fsdp_shard_copies(lay, job.run.framework, job.run.precision, grad, BYTES_PER_ELEMENT)
    if copies is None:
        return
    bytes_per_second = plat.gpu.memory_gbps * 1e9
    for i, n_params in enumerate(stage_parameter_counts(job.model, lay)):
        pipeline.forward[i].add(q.seconds("fsdp_copies", n_params * copies.forward_bytes / bytes_per_second))
        pipeline.backward[i].add(q.seconds("fsdp_copies", n_params * copies.backward_bytes / bytes_per_second))


def _fp8_casts(job: TrainingJob, plat: Platform, recipe: MicroBatchRecipe,
               warnings: list[str]) -> Optional[fp8.CastCalls]:
    """The FP8 casts of one layer (run.fp8), or None."""
    if not job.run.fp8:
        return None
    if "fp8" not in plat.gpu.tflops:
        raise JobError("run.fp8", f"platform {plat.name}'s GPU ({plat.gpu.name}) has no FP8 tensor "
                       "cores (its bundle's gpu_spec gives no fp8 peak)", job.source)
    casts = fp8.layer_casts(recipe.layer, job.run.fp8, job.layout.micro_batches)
    if not fp8.measured(plat.compute):
        warnings.append("FP8 GEMMs (run.fp8) without FP8 samples in this platform's bundle costed "
                        "from its 16-bit measurements: the tensor-core part at the FP8 peak, casts "
                        "as memory passes (a prior; wider interval)")
    return casts


def _window_warnings(m: ModelSpec, cp: int, warnings: list[str]) -> None:
    """What a sliding window (model.attention_window) saves, where it saves less than its share."""
    if not fused_attention(m):
        warnings.append(f"model.attention_window {m.attention_window}: {m.attention} attention computes the "
                        "whole score matrix and masks it, so the window saves nothing; costed as full causal "
                        "attention")
    elif cp > 1:
        warnings.append(f"model.attention_window {m.attention_window} with layout.cp {cp}: the attention blocks "
                        "are costed at the window's share of the causal work, the ring's K/V passes as "
                        "without a window")


def _layer_terms(job: TrainingJob, plat: Platform, q: QuerySet, recipe: MicroBatchRecipe,
                 casts: Optional[fp8.CastCalls], grp: Mapping[str, Group], warnings: list[str]) -> _LayerTerms:
    """One layer: its operators, FP8 casts, context-parallel passes and TP collectives, with
    recomputation folded into the backward."""
    m, lay, prec = job.model, job.layout, job.run.precision
    tp, cp = lay.tp, lay.cp
    if m.attention_window and m.attention_window < m.seq_len:
        _window_warnings(m, cp, warnings)
    layer_fwd, layer_bwd, core_fwd = _Term(), _Term(), _Term()
    core_bwd = _Term()
    op_sac = runs_op_sac(lay, job.run.framework)
    sac_fwd = _Term()          # what TorchTitan's op-level checkpointing runs again in backward
    for c in recipe.layer:
        p_c = "fp8" if casts is not None and c.name in fp8.FP8_LINEARS else prec
        name, count_f, count_b = c.name, c.count, c.count
        if name == "flash_atten":
            # The job's attention kernel, from its own samples or the bundle's kernel's times a
            # measured kernel ratio (predictor/attention.py).
            at = _attention_cost(job, plat, c.shape["l"], q.known.attention_costs)
            warnings.extend(at.warnings)
            name, count_f, count_b = at.operator, c.count * at.forward_ratio, c.count * at.backward_ratio
            if c.work != 1.0:
                # A sliding window (model.attention_window): the kernel's measured time at this
                # length times the share of the causal work it does (recipe.attention_window_fraction).
                count_f, count_b = count_f * c.work, count_b * c.work
        hf, hb = q.op_both(name, p_c, c.shape)
        layer_fwd.add(hf, count_f)
        layer_bwd.add(hb, count_b)
        if op_sac:
            share = op_sac_recompute_share(c.name, m)
            if share:
                sac_fwd.add(hf, count_f * share)
        if c.attention_core:
            core_fwd.add(hf, count_f)
            core_bwd.add(hb, count_b)
    if casts is not None:
        for c in casts.forward:
            h = q.op(c.name, "fwd", prec, c.shape)
            layer_fwd.add(h, c.count)
            if op_sac:
                sac_fwd.add(h, c.count)
        for c in casts.backward:
            layer_bwd.add(q.op(c.name, "fwd", prec, c.shape), c.count)
    # Context parallelism: ring attention passes this rank's K and V chunk on cp − 1 times per
    # forward (K/V and their gradients in backward), overlapped with the attention blocks; only
    # what the attention does not hide is exposed (added in _stage_seconds).
    cp_ring = None
    if cp > 1:
        kv = q.coll("p2p", recipe.cp_kv_entries, grp["cp_ring"], prec)
        cp_ring = (_Term().add(kv, cp - 1), core_fwd, _Term().add(kv, 2 * (cp - 1)), core_bwd)
    # TP: one all-reduce after attention and one after the MLP in forward (one in all with a
    # parallel residual), two in backward; sequence parallelism swaps each for a reduce-scatter +
    # all-gather of the same volume, which the ring model costs the same.
    mp_fwd, mp_bwd = _Term(), _Term()
    tp_ub: Optional[list[_Term]] = None
    if tp > 1 and lay.tp_comm_overlap:
        # Transformer Engine's userbuffers: the collectives run in chunks under the GEMMs
        # (predictor/tp_overlap.py); what they add beyond the GEMMs is costed in _stage_seconds
        # from the GEMMs whole and in chunks and the collectives.
        tp_ub = _tp_overlap_terms(q, recipe, casts is not None, prec, grp["tp"], tp)
    elif tp > 1:
        ar = q.coll("allreduce", recipe.tp_allreduce_entries, grp["tp"], prec)
        mp_fwd.add(ar, 1 if m.parallel_residual else 2)
        mp_bwd.add(ar, 2)
    layer_fwd.extend(mp_fwd)
    layer_bwd.extend(mp_bwd)
    if lay.recompute == "full":
        layer_bwd.extend(layer_fwd)
        mp_bwd.extend(mp_fwd)
    elif op_sac:
        layer_bwd.extend(sac_fwd)
    elif lay.recompute == "selective":
        layer_bwd.extend(core_fwd)
    # After the recompute is folded in: the checkpoint function's own work is not recomputed.
    ckpt = _checkpoint_option_terms(job, plat, q, grp, layer_fwd, layer_bwd, mp_bwd, warnings)
    return _LayerTerms(layer_fwd, layer_bwd, core_fwd, core_bwd, mp_fwd, mp_bwd, cp_ring, tp_ub, ckpt)


def _checkpoint_option_terms(job: TrainingJob, plat: Platform, q: QuerySet, grp: Mapping[str, Group],
                             layer_fwd: _Term, layer_bwd: _Term, mp_bwd: _Term,
                             warnings: list[str]) -> Optional[checkpointing.LayerCheckpointCosts]:
    """The checkpoint function's options on one checkpointed layer (predictor/checkpointing.py):
    the partitioned input's all-gather over the TP group before the recompute (a TP collective on the
    critical path), the slice's copies, the copies to and from host memory, and the device's idle
    time after each synchronisation (a round trip and one launch).  Returns the costs (None where
    no option is in effect), which the host's terms read too."""
    lay, prec = job.layout, job.run.precision
    note = checkpointing.unapplied_warning(lay, job.run.framework)
    if note:
        warnings.append(note)
    costs = checkpointing.layer_costs(job.model, lay, BYTES_PER_ELEMENT[prec], job.run.framework)
    if costs is None:
        return None
    if costs.gather_shard_entries:
        gather = _Term().add(q.coll("allgather", costs.gather_shard_entries, grp["tp"], prec))
        layer_bwd.extend(gather)
        mp_bwd.extend(gather)
    hbm = plat.gpu.memory_gbps * 1e9
    if costs.copy_bytes_forward:
        layer_fwd.add(q.seconds("checkpoint_partition", costs.copy_bytes_forward / hbm))
        layer_bwd.add(q.seconds("checkpoint_partition", costs.copy_bytes_backward / hbm))
    if costs.offload_bytes:
        to_host, to_device, known = checkpointing.offload_gbps(plat.gpu.name)
        if not known:
            warnings.append(f"layout.checkpoint_in_cpu: the host link of {plat.gpu.name} is not known; "
                            f"its copies are costed at a pageable copy's measured {to_host:g} GB/s to the "
                            f"host and {to_device:g} GB/s back, within PCIe Gen4 x16's "
                            f"{checkpointing.DEFAULT_HOST_LINK_GBPS:g} GB/s")
        layer_fwd.add(q.seconds("checkpoint_offload", costs.offload_bytes / (to_host * 1e9)))
        layer_bwd.add(q.seconds("checkpoint_offload", costs.offload_bytes / (to_device * 1e9)))
    if costs.syncs_forward or costs.syncs_backward:
        wait = _sync_wait_seconds(plat)
        layer_fwd.add(q.seconds("checkpoint_sync", wait), costs.syncs_forward)
        layer_bwd.add(q.seconds("checkpoint_sync", wait), costs.syncs_backward)
    return costs


def _sync_wait_seconds(plat: Platform) -> float:
    """What the device idles after the host waited for it: the synchronize round trip and the next
    kernel's launch (the platform's measured launch, where it has a [host] table)."""
    launch = plat.host.launch_seconds if plat.host is not None else 0.0
    return checkpointing.SYNC_ROUND_TRIP_SECONDS + launch


def _pipeline_terms(job: TrainingJob, q: QuerySet, recipe: MicroBatchRecipe, layer: _LayerTerms,
                    grp: Mapping[str, Group], sizes: Sequence[int]) -> _PipelineTerms:
    """Each stage's layers, the embedding on the first, the head on the last, and the sends
    between stages."""
    lay, prec = job.layout, job.run.precision

    # First stage: vocab-parallel embedding (its output is all-reduced over TP).
    first_fwd, first_bwd = _Term(), _Term()
    for c in recipe.embedding:
        hf, hb = q.op_both(c.name, prec, c.shape)
        first_fwd.add(hf, c.count)
        first_bwd.add(hb, c.count)
    emb_mp = _Term()
    if lay.tp > 1:
        emb_mp.add(q.coll("allreduce", recipe.tp_allreduce_entries, grp["tp"], prec))
        first_fwd.extend(emb_mp)
    # Last stage: final norm, output projection, vocab-parallel cross entropy.
    last_fwd, last_bwd = _Term(), _Term()
    for c in recipe.head:
        hf, hb = q.op_both(c.name, prec, c.shape)
        last_fwd.add(hf, c.count)
        last_bwd.add(hb, c.count)
    p2p_h = gather_h = None
    if lay.pp > 1:
        sends = pipeline_sends(recipe, lay, job.run.framework)
        p2p_h = q.coll("p2p", sends.send_entries, grp["pp"], prec)
        if sends.gather_entries:
            gather_h = q.coll("allgather", sends.gather_entries, grp["tp"], prec)
    v = lay.virtual_stages
    out = _PipelineTerms([], [], [], [])
    for i, n_layers in enumerate(sizes):
        f = _Term().extend(layer.forward, n_layers)
        b = _Term().extend(layer.backward, n_layers)
        mpf = _Term().extend(layer.mp_forward, n_layers)
        mpb = _Term().extend(layer.mp_backward, n_layers)
        if i == 0:
            f.extend(first_fwd)
            b.extend(first_bwd)
            mpf.extend(emb_mp)
        if i == lay.pp - 1:
            f.extend(last_fwd)
            b.extend(last_bwd)
        pf, pb = _Term(), _Term()
        if p2p_h is not None:
            # Each device sends activations forward (all but the last stage) and gradients
            # backward (all but the first), once per model chunk it holds.
            if i < lay.pp - 1 or v > 1:
                pf.add(p2p_h, v)
            if i > 0 or v > 1:
                pb.add(p2p_h, v)
        if gather_h is not None:
            # DeepSpeed's engine (no interleaving): the receiver all-gathers the TP shards of the
            # activation before its forward (all but the first stage) and of the gradient before
            # its backward (all but the last).
            if i > 0:
                pf.add(gather_h)
            if i < lay.pp - 1:
                pb.add(gather_h)
        f.extend(pf)
        b.extend(pb)
        out.forward.append(f)
        out.backward.append(b)
        out.mp_comm.append((mpf, mpb))
        out.p2p.append((pf, pb))
    return out


def _data_parallel_terms(job: TrainingJob, q: QuerySet, recipe: MicroBatchRecipe,
                         grp: Mapping[str, Group], sizes: Sequence[int]) -> _DataParallelTerms:
    """Gradient reduction and the optimizer step, per stage."""
    m, lay, prec = job.model, job.layout, job.run.precision
    tp, cp = lay.tp, lay.cp
    params = stage_parameter_counts(m, lay)
    out = _DataParallelTerms([], [], [], [])
    stage_dp, stage_update, buckets, sharded = out.reduction, out.update, out.buckets, out.sharded
    # The ranks holding the same parameters: dp, times cp under context parallelism.
    dp, zero, dp_group = lay.dp * cp, lay.zero_stage, grp["dpcp"]
    # Layer by layer, every micro-batch (ZeRO-3; FSDP1's ZeRO-2 too: recipe.gathers_layers).
    by_layer = gathers_layers(lay, job.run.framework)
    # Hybrid sharding (FSDP's ZeRO-2 and 3): gathers and reduce-scatters over the shard group, and each
    # gradient shard all-reduced across the replicas as its layer's reduction ends.
    replicas = grp.get("dp_replicate")
    if by_layer and replicas is not None:
        dp, dp_group = shard_ranks(lay), grp["dp_shard"]
    # Gradients travel in the framework's reduction precision (fp32 for Megatron-core's bf16):
    # costed as a 16-bit collective of as many bytes.
    grad_prec = gradient_precision(prec, lay, job.run.framework, job.run.grad_reduce_precision)
    grad_scale = BYTES_PER_ELEMENT[grad_prec] / BYTES_PER_ELEMENT[prec]
    kind = gradient_reduction(lay, job.run.framework)
    if dp > 1 and by_layer:
        # ZeRO-3 (FSDP2, DeepSpeed stage 3) gathers each layer's parameters just before it runs,
        # the next one prefetched under the current one, in forward and again in backward, and
        # reduce-scatters each layer's gradients as its backward ends, every micro-batch (the
        # gradients are sharded, so accumulation happens on the shards): one "bucket" per layer.
        # FSDP1's SHARD_GRAD_OP does the same but keeps the forward's gather for the backward.
        bucket = layer_parameters(m, tp)
    elif dp > 1 and lay.overlap_grad_reduce:
        bucket = overlap.bucket_entries(dp)
    else:
        bucket = REDUCE_BUCKET_ENTRIES
    for i, n_params in enumerate(params):
        red, upd, gathers = _Term(), _Term(), _Term()
        shard = n_params / dp if (dp > 1 and zero >= 1) else n_params
        if dp > 1:
            full, rest = overlap.split_buckets(n_params, bucket)
            terms = [_Term(), _Term(), _Term(), _Term()]     # full, rest: reduction; full, rest: gather
            if full:
                terms[0].add(q.coll(kind, bucket * grad_scale, dp_group, prec))
            if rest:
                terms[1].add(q.coll(kind, rest * grad_scale, dp_group, prec))
            if by_layer and replicas is not None:
                if full:
                    terms[0].add(q.coll("allreduce", bucket / dp * grad_scale, replicas, prec))
                if rest:
                    terms[1].add(q.coll("allreduce", rest / dp * grad_scale, replicas, prec))
            if by_layer or lay.overlap_grad_reduce:
                if zero >= 1:
                    if full:
                        terms[2].add(q.coll("allgather", bucket / dp, dp_group, prec))
                    if rest:
                        terms[3].add(q.coll("allgather", rest / dp, dp_group, prec))
                # What is not a layer's (stage 0's embedding; layer by layer, all of the stage's
                # parameters beyond its layers) does no work in the windows the buckets run under.
                late = n_params - sizes[i] * bucket if by_layer else \
                    (input_embedding_parameters(m, tp) if i == 0 else 0)
                (sharded if by_layer else buckets).append(_Buckets(n_params, late, bucket, terms))
            if not by_layer:
                red.extend(terms[0], full).extend(terms[1])
                if zero >= 1:
                    if lay.overlap_grad_reduce:
                        gathers.extend(terms[2], full).extend(terms[3])
                    else:
                        gathers.add(q.coll("allgather", shard, dp_group, prec))
        if not lay.overlap_param_gather:
            upd.extend(gathers)
        upd.add(q.op("optimizer", "step", prec, {"params": shard}))
        stage_dp.append(red)
        stage_update.append(upd)
    if lay.pp > 1 and m.tied_embeddings:
        # Tied input and output embeddings live on the first and last stage: DeepSpeed all-reduces
        # their gradient between the two once per step, before the data-parallel reduction.
        tied = q.coll("allreduce", recipe.tied_embedding_entries, grp["pp"], prec)
        stage_dp[0].add(tied)
        stage_dp[-1].add(tied)
    return out


def _host_terms(job: TrainingJob, plat: Platform, layer: _LayerTerms, casts: Optional[fp8.CastCalls],
                pipeline: _PipelineTerms, sizes: Sequence[int]) -> tuple[list[float], float]:
    """The host's seconds to issue each stage's work for one micro-batch, and the framework
    engine's own per-step host work (none without a ``[host]`` table)."""
    lay = job.layout
    if plat.host is None:
        return [], 0.0
    engine = host_engine_for(job.run.framework, lay.pp)
    # Collective calls per layer (TP all-reduces: forward, backward, recompute; context-
    # parallel K/V passes) and kernel launches beyond a plain layer's kernels.
    layer_calls = sum(c for _, c in layer.mp_forward.parts) + sum(c for _, c in layer.mp_backward.parts) \
        if lay.tp > 1 else 0.0
    layer_launches = 0.0
    if layer.tp_ub is not None:
        ub_f, ub_b = tp_overlap.layer_launches(lay.tp)
        layer_launches += ub_f * (2 if lay.recompute == "full" else 1) + ub_b
    if casts is not None:
        # FP8 casts: each one more kernel, the forward's again when recomputed.
        layer_launches += casts.launches_forward * (2 if lay.recompute == "full" else 1) \
            + casts.launches_backward
    if layer.cp_ring is not None:
        # K/V passes: cp − 1 in forward, twice that in backward, the forward's again when
        # recomputed; each a send and a receive.
        passes = (lay.cp - 1) * (3 + (1 if lay.recompute == "full" else 0))
        layer_calls += 2 * passes
    # DeepSpeed's checkpointing options: the partition's all-gather is one more collective call, its
    # copies and the host copies more launches; each synchronisation the host waits out too.
    ckpt = layer.checkpoint_costs
    layer_sync_seconds = 0.0
    if ckpt is not None:
        layer_calls += 1 if ckpt.gather_shard_entries else 0
        layer_launches += ckpt.launches
        layer_sync_seconds = (ckpt.syncs_forward + ckpt.syncs_backward) * _sync_wait_seconds(plat)
    # FSDP (PyTorch's, under the frameworks that shard with it) runs its hooks around every
    # layer it wraps: unshard before forward and backward, reshard, reduce-scatter.
    fsdp = lay.zero_stage >= 2 and job.run.framework in FSDP_FRAMEWORKS
    # DeepSpeed's ZeRO-3 fetches and releases each module's partitioned parameters in hooks of its own.
    zero3 = lay.zero_stage == 3 and job.run.framework in DEEPSPEED_PIPELINE_FRAMEWORKS
    # The job's, the same on every stage.
    wrapper = checkpoint_wrapper_for(job.run.framework, lay.recompute, fsdp)
    fsdp_share = fsdp_hook_share(job.run.framework, lay.zero_stage, lay.micro_batches)
    # The framework's own layer, and DeepSpeed's ZeRO-1/2 gradient hooks (in the backward only).
    extra, extra_forward = layer_extra_seconds(job.run.framework)
    layer_extra = (extra + zero_hook_layer_seconds(job.run.framework, lay.zero_stage), extra_forward)
    stage_host = [plat.host.stage_seconds(n, n * layer_launches, lay.recompute, fitted=plat.fitted,
                                          engine=engine,
                                          collective_calls=n * layer_calls + len(pipeline.p2p[i][0].parts)
                                          + len(pipeline.p2p[i][1].parts),
                                          fsdp_layers=n if fsdp else 0, compiled=job.run.compile,
                                          zero3_layers=n if zero3 else 0,
                                          checkpoint=wrapper, fsdp_share=fsdp_share,
                                          layer_extra=layer_extra)
                  + n * layer_sync_seconds
                  for i, n in enumerate(sizes)]
    return stage_host, plat.host.engine_step_seconds(engine, plat.fitted)


def _tp_overlap_slowdown(plat: Platform, grp: Mapping[str, Group], warnings: list[str]) -> float:
    """--tp-comm-overlap: the GEMMs' slowdown beside the collectives' SMs."""
    sms, known = tp_overlap.sm_count(plat.gpu.name)
    if not known:
        warnings.append(f"layout.tp_comm_overlap: the SM count of {plat.gpu.name} is not known; "
                        f"costed with an H100's {sms}")
    if grp["tp"].nodes > 1:
        warnings.append("layout.tp_comm_overlap with the TP group across nodes: costed over the "
                        "inter-node links, although Transformer Engine's userbuffers need the group "
                        "inside one NVLink domain")
    return tp_overlap.margin_slowdown(sms)


# The linear GEMMs of a layer (predictor/recipe.py) as Transformer Engine names them, and the
# number of predictor.tp_overlap.LayerGemms' fields (_tp_overlap_terms gives these, then one more).
_UB_GEMMS = (("linear1", "qkv"), ("linear2", "proj"), ("linear3", "up"), ("linear4", "down"))
_UB_FIELDS = len(dataclasses.fields(tp_overlap.LayerGemms))


def _tp_overlap_terms(q: QuerySet, recipe: MicroBatchRecipe, in_fp8: bool, prec: str, group: Group,
                      tp: int) -> list[_Term]:
    """The terms of one layer's :class:`predictor.tp_overlap.LayerGemms`, in its field order, then
    the serial costing's TP all-reduce."""
    calls = {c.name: c for c in recipe.layer}
    gemm_prec = "fp8" if in_fp8 else prec

    def gemm(name: str, direction: str, rows_divisor: float = 1.0) -> _Term:
        shape = dict(calls[name].shape)
        shape["m"] = shape["m"] / rows_divisor
        return _Term().add(q.op(name, direction, gemm_prec, shape))

    whole = [gemm(name, d) for name, _ in _UB_GEMMS for d in ("fwd", "bwd")]
    chunks = [gemm("linear1", "fwd", tp), gemm("linear3", "fwd", tp),
              gemm("linear2", "fwd", tp_overlap.PIPELINE_SPLITS), gemm("linear4", "fwd", tp_overlap.PIPELINE_SPLITS),
              gemm("linear2", "bwd", tp), gemm("linear4", "bwd", tp)]
    entries = recipe.tp_allreduce_entries       # the whole (gathered) activation of a layer
    # Under FP8 the userbuffers all-gather the GEMMs' FP8 inputs (Transformer Engine's default
    # fp8_buf for every all-gather overlap): one byte an entry, costed as half the 16-bit entries.
    gathered = entries / tp * (0.5 if in_fp8 else 1.0)
    comm = [_Term().add(q.coll("allgather", gathered, group, prec)),
            _Term().add(q.coll("reduce_scatter", entries, group, prec)),
            _Term().add(q.coll("reduce_scatter", entries / tp_overlap.PIPELINE_SPLITS, group, prec))]
    # And the serial costing's all-reduce, for what the overlap hid (details.tp_hidden_seconds).
    serial = _Term().add(q.coll("allreduce", entries, group, prec))
    return whole + chunks + comm + [serial]


def _term_values(plan: _JobPlan, secs: np.ndarray) -> list[list[float]]:
    """Every term of ``plan`` at each column of ``secs`` (handles × columns): one matrix product,
    then plain floats (the timeline below is a few dozen scalar steps)."""
    terms = [t for ts in (plan.stage_fwd, plan.stage_bwd, plan.stage_dp, plan.stage_update) for t in ts]
    terms += [t for pair in plan.mp_comm for t in pair] + [t for pair in plan.p2p for t in pair]
    terms += list(plan.cp_ring or ())
    for b in plan.buckets + plan.sharded:
        terms += b.terms
    terms += plan.tp_ub or []
    # Columns: the handles the job asked for (every term's handles are among them).
    handles = plan.handles
    width = len(handles)
    cells: list[int] = []
    counts: list[float] = []
    if len(secs) == width and handles == list(range(width)):
        # A job alone in its query set (the daemon's): its handles are the set's, in order.
        at = secs
        for i, t in enumerate(terms):
            row = i * width
            for h, c in t.parts:
                cells.append(row + h)
                counts.append(c)
    else:
        at = secs[np.asarray(handles, dtype=int)]
        where = {h: j for j, h in enumerate(handles)}
        for i, t in enumerate(terms):
            row = i * width
            for h, c in t.parts:
                cells.append(row + where[h])
                counts.append(c)
    # bincount adds repeated cells in order, as ``weights[i, j] += c`` one by one would.
    weights = np.bincount(np.asarray(cells, dtype=np.intp), weights=np.asarray(counts, dtype=float),
                          minlength=len(terms) * width).reshape(len(terms), width)
    return (weights @ at).T.tolist()


@dataclass
class _StageSeconds:
    """Each stage's seconds for one micro-batch, overlaps and host waits included, and what the
    overlaps hid (from one column of :func:`_term_values`)."""

    forward: list[float]
    backward: list[float]
    reduction: Sequence[float]        # gradient reduction, serial
    update: Sequence[float]
    mp_comm: list[tuple[float, float]]
    p2p: list[tuple[float, float]]
    cp_exposed: list[float]
    tp_exposed: tuple[list[float], list[float]]
    tp_hidden: float                  # one layer's serial TP cost the overlap hid, on the longest stage
    zero3_exposed: tuple[list[float], list[float]]
    zero3_hidden: float
    host_wait: list[float]
    buckets_at: int                   # where the overlapped buckets' terms start in the column


def _assemble(plan: _JobPlan, vals: Sequence[float], plat: Platform) -> tuple[float, Breakdown, Details]:
    """The timeline of one job from its term values (one column of :func:`_term_values`): each
    stage's micro-batch, then the iteration along the critical path."""
    return _iteration(plan, _stage_seconds(plan, vals), vals, plat)


def _iteration_seconds(plan: _JobPlan, vals: Sequence[float], plat: Platform) -> float:
    """:func:`_assemble`'s iteration alone (the interval's ends need no breakdown)."""
    return _iteration(plan, _stage_seconds(plan, vals, breakdown=False), vals, plat, breakdown=False)[0]


def _stage_seconds(plan: _JobPlan, vals: Sequence[float], breakdown: bool = True) -> _StageSeconds:
    """Each stage's forward and backward with what the context-parallel passes, the overlapped
    TP collectives and ZeRO-3's per-layer collectives leave exposed, and the host's wait (without
    ``breakdown``, the TP collectives and sends inside them are not listed)."""
    lay = plan.job.layout
    p = lay.pp
    fwd, bwd = list(vals[:p]), list(vals[p:2 * p])
    dp, update = vals[2 * p:3 * p], vals[3 * p:4 * p]
    mp_comm: list[tuple[float, float]] = []
    p2p: list[tuple[float, float]] = []
    if breakdown:
        mp_comm = [(vals[4 * p + 2 * i], vals[4 * p + 2 * i + 1]) for i in range(p)]
        p2p = [(vals[6 * p + 2 * i], vals[6 * p + 2 * i + 1]) for i in range(p)]
    cp_exposed = [0.0] * len(fwd)
    if plan.cp_ring is not None:
        # What the attention blocks do not hide of the K/V passes, per layer (the forward's again
        # in a full recomputation).
        kv_f, att_f, kv_b, att_b = vals[8 * p:8 * p + 4]
        per_f, per_b = max(0.0, kv_f - att_f), max(0.0, kv_b - att_b)
        if lay.recompute == "full":
            per_b += per_f
        for i, n in enumerate(plan.sizes):
            fwd[i] += n * per_f
            bwd[i] += n * per_b
            cp_exposed[i] = n * (per_f + per_b)
    off = 8 * p + (4 if plan.cp_ring is not None else 0)
    sharded_at = off + 4 * len(plan.buckets)
    tp_exposed_f, tp_exposed_b = [0.0] * len(fwd), [0.0] * len(fwd)
    tp_hidden = 0.0
    if plan.tp_ub is not None:
        # --tp-comm-overlap: each layer's overlapped GEMMs and collectives, beyond the GEMMs alone
        # (the forward's again in a full recomputation); the serial cost it replaces is reported
        # as hidden.
        at = sharded_at + 4 * len(plan.sharded)
        gemms = tp_overlap.LayerGemms(*vals[at:at + _UB_FIELDS])
        per_f, per_b = tp_overlap.layer_extra_seconds(gemms, lay.tp, plan.tp_ub_slowdown)
        if lay.recompute == "full":
            per_b += per_f
        serial = vals[at + _UB_FIELDS] * (6 if lay.recompute == "full" else 4)   # all-reduces a layer
        for i, n in enumerate(plan.sizes):
            fwd[i] += n * per_f
            bwd[i] += n * per_b
            tp_exposed_f[i], tp_exposed_b[i] = n * per_f, n * per_b
        tp_hidden = max(0.0, max(plan.sizes) * (serial - per_f - per_b))
    zero3_hidden = 0.0
    zero3_f, zero3_b = [0.0] * len(fwd), [0.0] * len(bwd)
    for i, b in enumerate(plan.sharded):
        # ZeRO-3: every micro-batch gathers each layer under the one before it (forward, and
        # again in backward) and reduce-scatters each layer's gradients under the next layer's
        # backward; only what the layers' work does not cover is added.
        c, c_rest, g, g_rest = vals[sharded_at + 4 * i:sharded_at + 4 * i + 4]
        f_i, b_i = fwd[i], bwd[i]
        f_exp = overlap.exposed_gather_seconds(f_i, b.parameters, b.late_parameters, b.bucket, g, g_rest)
        b_exp = overlap.exposed_reduction_seconds(b_i, b.parameters, b.late_parameters, b.bucket, c, c_rest)
        gathers = 2
        if plan.regather_backward:
            b_exp += overlap.exposed_gather_seconds(b_i, b.parameters, b.late_parameters, b.bucket, g, g_rest)
        else:
            gathers = 1        # reshard_after_forward off: the forward's gather serves the backward
        serial = gathers * b.whole_seconds(g, g_rest) + b.whole_seconds(c, c_rest)
        zero3_hidden = max(zero3_hidden, lay.micro_batches * (serial - f_exp - b_exp))
        fwd[i] += f_exp
        bwd[i] += b_exp
        zero3_f[i], zero3_b[i] = f_exp, b_exp
    host_wait = [0.0] * len(fwd)
    for i, h in enumerate(plan.stage_host):
        # The device cannot run ahead of the host that issues its work: a micro-batch's forward
        # and backward on a stage take at least the host's time to issue them.  What the host
        # adds is charged to the backward, which ends the pair.
        host_wait[i] = max(0.0, h - fwd[i] - bwd[i])
        bwd[i] += host_wait[i]
    return _StageSeconds(fwd, bwd, dp, update, mp_comm, p2p, cp_exposed, (tp_exposed_f, tp_exposed_b),
                         tp_hidden, (zero3_f, zero3_b), zero3_hidden, host_wait, off)


def _iteration(plan: _JobPlan, st: _StageSeconds, vals: Sequence[float], plat: Platform,
               breakdown: bool = True) -> tuple[float, Optional[Breakdown], Optional[Details]]:
    """One iteration: the 1F1B schedule over the slowest stage, then each stage's gradient
    reduction against its drain slack, the update and the step overhead."""
    lay = plan.job.layout
    mb, p, v = lay.micro_batches, lay.pp, lay.virtual_stages
    fwd, bwd, dp, update, off = st.forward, st.backward, st.reduction, st.update, st.buckets_at
    F, B = max(fwd), max(bwd)
    crit_f, crit_b = fwd.index(F), bwd.index(B)        # the first slowest stage
    # Each stage reduces its gradients once its own last backward is done: in 1F1B's drain stage i
    # finishes i backward waves (1/v of a device's work each) before stage 0, and every stage
    # meets the others at the optimizer step (the gradient norm is reduced over the whole model).
    # With tied embeddings the last stage first waits for the first's embedding gradient.
    slack = [i * B / v for i in range(p)]
    if p > 1 and plan.job.model.tied_embeddings:
        slack[-1] = 0.0
    reduce_exposed, gather_exposed = list(dp), [0.0] * p
    hidden = st.zero3_hidden                     # communication run under compute, its stage's most
    for i, b in enumerate(plan.buckets):
        # --overlap-grad-reduce: the buckets' reductions run under the last micro-batch's
        # backward, --overlap-param-gather's gathers under the next step's first forward.
        c, c_rest, g, g_rest = vals[off + 4 * i:off + 4 * i + 4]
        reduce_exposed[i] = overlap.exposed_reduction_seconds(bwd[i], b.parameters, b.late_parameters,
                                                              b.bucket, c, c_rest)
        if lay.overlap_param_gather:
            gather_exposed[i] = overlap.exposed_gather_seconds(fwd[i], b.parameters, b.late_parameters,
                                                               b.bucket, g, g_rest)
        serial_gather = b.whole_seconds(g, g_rest) if lay.overlap_param_gather else 0.0
        hidden = max(hidden, dp[i] - reduce_exposed[i] + serial_gather - gather_exposed[i])
    waits = [reduce_exposed[i] - slack[i] for i in range(p)]
    reduce_wait = max(waits)                     # ≥ stage 0's exposed reduction ≥ 0
    if plan.reduce_every_micro_batch:
        # ZeRO-2 under DeepSpeed (pp = 1): the micro-batches before the last reduce theirs too,
        # each on the compute stream after its backward.
        reduce_wait += (mb - 1) * max(dp)
    # The gathers of stage i overlap its first forward, which starts i forward waves into the step.
    gather_wait = max(max(0.0, gather_exposed[i] - i * F / v) for i in range(p)) \
        if lay.overlap_param_gather else 0.0
    update_seconds = max(update) + gather_wait
    bubble = (p - 1) / v * (F + B)
    step_overhead = plat.overheads.step_seconds + plan.engine_step_seconds
    iteration = mb * (F + B) + bubble + reduce_wait + update_seconds + step_overhead
    if not breakdown:
        return iteration, None, None
    waves = mb + (p - 1) / v
    (tp_exposed_f, tp_exposed_b), (zero3_f, zero3_b) = st.tp_exposed, st.zero3_exposed
    mp_comm, p2p = st.mp_comm, st.p2p
    parts = Breakdown(
        forward_seconds=mb * F,
        backward_seconds=mb * B,
        bubble_seconds=bubble,
        gradient_reduce_seconds=reduce_wait,
        optimizer_seconds=update_seconds,
        step_overhead_seconds=step_overhead,
        # Of which (already inside the stage times above), over the whole iteration:
        tp_allreduce_seconds=waves * (mp_comm[crit_f][0] + mp_comm[crit_b][1]
                                      + tp_exposed_f[crit_f] + tp_exposed_b[crit_b]),
        pp_p2p_seconds=waves * (p2p[crit_f][0] + p2p[crit_b][1]),
        # Of which (inside the backward): the device waiting for its host to issue the work.
        host_wait_seconds=mb * st.host_wait[crit_b],
        # Of which (inside the stage times): context-parallel K/V passes the attention did not hide.
        cp_exposed_seconds=mb * st.cp_exposed[crit_b],
        # Of which (inside the stage times): ZeRO-3's gathers and reduce-scatters left exposed.
        dp_exposed_seconds=mb * (zero3_f[crit_f] + zero3_b[crit_b]),
    )
    stages = StageTimes(tuple(plan.sizes), tuple(fwd), tuple(bwd), tuple(st.host_wait))
    return iteration, parts, Details(stages, waves * F, dp_hidden_seconds=hidden,
                                         tp_hidden_seconds=waves * st.tp_hidden)


def _total(job: TrainingJob, iteration: float, fwd_pipeline: float, plat: Platform,
           iterations: int) -> tuple[float, TotalTime]:
    run, ov = job.run, plat.overheads
    evals = iterations // run.eval_interval if run.eval_interval else 0
    eval_s = evals * run.eval_iters * fwd_pipeline
    saves = iterations // run.save_interval if run.save_interval else 0
    # fp16/bf16 weights + fp32 master weights and two Adam moments, written by every node in parallel.
    ckpt_bytes = total_parameters(job.model, job.layout.tp) * (BYTES_PER_ELEMENT[run.precision] + 12)
    nodes = job.nodes(job.cluster.gpus_per_node or plat.gpus_per_node)
    ckpt_s = saves * (ov.checkpoint_fixed_seconds + ckpt_bytes / (ov.checkpoint_gbps_per_node * 1e9 * nodes))
    total = ov.startup_seconds + iterations * iteration + eval_s + ckpt_s
    return total, TotalTime(ov.startup_seconds, iterations * iteration, eval_s, ckpt_s, evals, saves)


class Predictor:
    """Predictions on one loaded platform (scikit-learn-like: ``Predictor(platform).predict(job)``).

    It owns what it remembers: the seconds of every shape it has costed, what the platform alone
    decides (which model costs each operator and collective, each fused attention's cost, the
    forests' arrays for the lists of models a job asks: :class:`_PlatformMemo`) and the interval
    rule from the platform's recorded runs.  Keep one for as long as its platform is loaded (the
    daemon, perf-advise) so the same shape is costed once; a platform changed after the Predictor
    was made needs a new Predictor.
    """

    def __init__(self, platform: Platform, memo_entries: int = MEMO_ENTRIES):
        self.platform = platform
        self.memo_entries = memo_entries
        self._answers: dict[tuple, tuple] = {}     # QuerySet memo key -> answer
        self._platform_memo = _PlatformMemo()
        self._rule: Optional[IntervalRule] = None
        self._kind_rules: dict[str, IntervalRule] = {}    # kind key -> its rule (kind_rule)
        # The platform without its [fitted] scales, or with one kind's: each its own Predictor.
        self._twins: dict[Any, "Predictor"] = {}

    def predict(self, job: TrainingJob) -> Prediction:
        """Seconds per iteration, breakdown, interval and total job time of one job."""
        return self.predict_many([job])[0]

    def predict_many(self, jobs: Sequence[TrainingJob]) -> list[Prediction]:
        """Predict many jobs with one regressor call per model (perf-advise's path).

        A job outside the domain of the platform's ``[fitted]`` scales (the jobs they were fitted
        on, :class:`~predictor.platform.FitDomain`) is predicted without them, and says so.  With a
        per-kind fit (``[[fitted_kind]]``) each job takes its kind's terms (:meth:`_predict_kinds`)."""
        platform = self.platform
        out = self._predict_kinds(jobs) if platform.fitted is not None and platform.fitted.kinds \
            else self._predict_in_domain(jobs)
        for job, p in zip(jobs, out):
            if p.details is not None and p.details.kind is None:
                p.details.kind = {"key": kind_of(job).key, "factors": "platform" if platform.fitted else "none"}
        return out

    def forget_answers(self) -> None:
        """Forget every shape's seconds but keep what the platform alone decides (its
        :class:`_PlatformMemo`, the interval rule): a job never seen, on a platform already used
        (benchmarks/bench_predict.py)."""
        self._answers.clear()
        for twin in self._twins.values():
            twin.forget_answers()

    @property
    def interval_rule(self) -> IntervalRule:
        """The interval rule from the platform's recorded runs (predictor.interval), made once."""
        if self._rule is None:
            self._rule = IntervalRule.for_platform(self.platform)
        return self._rule

    def kind_rule(self, key: str) -> IntervalRule:
        """The interval rule of a job of kind ``key`` (Mondrian conformal: each kind's recorded
        runs calibrate its own jobs).  With a per-kind fit the fit's kind data decide
        (:meth:`IntervalRule.for_platform`); otherwise the platform's recorded runs of that kind,
        with the platform's rule for a kind it has no runs of."""
        rule = self._kind_rules.get(key)
        if rule is None:
            rule = self.interval_rule
            fitted = self.platform.fitted
            if fitted is None or not (fitted.kind or fitted.kinds or fitted.unseen_kind_bound):
                runs = self.platform.validation
                own = [r for r in runs if kind_of(r.job).key == key]
                if own and len(own) < len(runs):      # all of one kind: the platform's rule is theirs
                    rule = rule.for_kind(run_scores(own), 0.0)
            self._kind_rules[key] = rule
        return rule

    def _twin(self, key: Any, make: Callable[[], Platform]) -> "Predictor":
        """The Predictor of a twin of this platform (``make`` builds it), made once and kept."""
        twin = self._twins.get(key)
        if twin is None:
            twin = self._twins[key] = Predictor(make(), self.memo_entries)
        return twin

    def _predict_kinds(self, jobs: Sequence[TrainingJob]) -> list[Prediction]:
        """Each job with the ``[[fitted_kind]]`` terms of its kind (predictor/kinds.py); a job of a
        kind with no runs, or outside its kind's runs, with the partition's ``[fitted]``."""
        platform = self.platform
        fitted = platform.fitted
        groups_: dict[Any, list[int]] = defaultdict(list)
        for i, job in enumerate(jobs):
            kt = fitted.for_kind(kind_of(job).key)
            inside = kt is not None and (kt.domain is None or not kt.domain.outside(job, platform.gpus_per_node))
            groups_[kt if inside else None].append(i)
        out: list[Optional[Prediction]] = [None] * len(jobs)
        for kt, idx in groups_.items():
            pred = self if kt is None else self._twin(
                ("kind", kt.kind), lambda: dataclasses.replace(platform, fitted=kt.terms(fitted)))
            for i, p in zip(idx, pred._predict_in_domain([jobs[i] for i in idx])):
                if p.details.kind is None:       # (set already: outside the fit's domain, no factors)
                    p.details.kind = {"key": kind_of(jobs[i]).key,
                                      "factors": "kind" if kt is not None else "partition",
                                      "runs": kt.runs if kt is not None else 0}
                out[i] = p
        return out  # type: ignore[return-value]

    def _predict_in_domain(self, jobs: Sequence[TrainingJob]) -> list[Prediction]:
        platform = self.platform
        fitted = platform.fitted
        if fitted is None or fitted.domain is None or not jobs:
            return self._predict_batch(jobs)
        gpn = platform.gpus_per_node
        why = [fitted.outside(job, gpn) for job in jobs]
        if not any(why):
            return self._predict_batch(jobs)
        out: list[Optional[Prediction]] = [None] * len(jobs)
        inside = [i for i, w in enumerate(why) if not w]
        outside = [i for i, w in enumerate(why) if w]
        if inside:
            for i, p in zip(inside, self._predict_batch([jobs[i] for i in inside])):
                out[i] = p
        unfitted = self._twin("unfitted", lambda: dataclasses.replace(platform, fitted=fitted.without_scales()))
        for i, p in zip(outside, unfitted._predict_batch([jobs[i] for i in outside])):
            p.warnings.append(f"the fitted scales of platform {platform.name} are not applied: this job has "
                              f"{why[i]}, unlike the runs they were fitted on (predicted from the measured "
                              "models alone)")
            p.details.kind = {"key": kind_of(jobs[i]).key, "factors": "none"}
            out[i] = p
        return out  # type: ignore[return-value]

    def _predict_batch(self, jobs: Sequence[TrainingJob]) -> list[Prediction]:
        """Structure (each job's terms, :func:`_plan`), costing (one regressor call per model for
        all of them), then each job's timeline, interval and totals (:meth:`_prediction`)."""
        q = QuerySet(self.platform, self._answers, self._platform_memo, self.memo_entries)
        plans = [_plan(job, self.platform, q) for job in jobs]
        secs, rel, extra = q.evaluate()
        # Each term at its value, its low and its high end (filled in place: np.column_stack's
        # own cost is most of it for one job).
        columns = np.empty((len(secs), 3))
        columns[:, 0] = secs
        np.multiply(secs, np.maximum(1.0 - rel, 0.05), out=columns[:, 1])
        np.multiply(secs, 1.0 + rel, out=columns[:, 2])
        return [self._prediction(plan, q, columns, extra) for plan in plans]

    def _prediction(self, plan: _JobPlan, q: QuerySet, columns: np.ndarray, extra: np.ndarray) -> Prediction:
        """One job's answer from the costed terms: the timeline with every term at its value and
        at its low and high end, the interval, the whole job's time and the warnings."""
        platform, rule = self.platform, self.kind_rule(kind_of(plan.job).key)
        at, at_lo, at_hi = _term_values(plan, columns)
        iteration, breakdown, details = _assemble(plan, at, platform)
        spread_lo = _iteration_seconds(plan, at_lo, platform)
        spread_hi = _iteration_seconds(plan, at_hi, platform)
        handles = plan.handles
        outside = [h for h, x in zip(handles, extra[handles].tolist()) if x] if handles else []
        extrapolated = bool(outside)
        # The interval: a conformal bound on the platform's measured residuals, widened by the
        # operators' own spread only where the job leaves what those runs cover.
        analytic = not q.analytic.isdisjoint(handles)
        lo, hi = interval_seconds(iteration, spread_lo, spread_hi, rule, extrapolated=extrapolated,
                                  analytic_collectives=analytic)
        details.analytic_collectives = analytic
        details.timeline_ratio = rule.factors
        details.timeline_runs = len(platform.validation)
        details.operator_spread_seconds = (spread_lo, spread_hi)
        details.interval_rule = rule.describe()
        if platform.fitted is not None:
            f = platform.fitted
            details.fitted_scales = {"compute": f.compute_scale, "attention": f.attention_scale,
                                     "host": f.host_scale,
                                     "host_layer": f.host_layer_scale,
                                     "host_micro_batch": f.host_micro_batch_scale,
                                     "host_launch": f.host_launch_scale, "network": f.network_scale}
        warnings = _warnings(plan, q, platform, outside)
        iters = plan.job.iterations
        total, details.total = _total(plan.job, iteration, details.forward_pipeline_seconds, platform, iters)
        if not iters:
            warnings.append("the job gives no train_iters, train_samples or train_tokens: "
                            "total_seconds covers start-up only")
        details.gpus = plan.job.gpus
        details.nodes = plan.job.nodes(plan.job.cluster.gpus_per_node or platform.gpus_per_node)
        return Prediction(
            iteration_seconds=iteration, interval_seconds=(lo, hi), total_seconds=total,
            iterations=iters, breakdown=breakdown, platform=platform.name, bundle=platform.bundle_id,
            warnings=warnings, job=plan.job, extrapolated=extrapolated, details=details)


def _warnings(plan: _JobPlan, q: QuerySet, platform: Platform, extrapolated: list[int]) -> list[str]:
    """The job's own warnings, the platform's, each costed term's (once each), and which terms
    lay outside their samples (``extrapolated``: their handles)."""
    warnings = list(plan.warnings)
    if not platform.calibrated:
        warnings.append(f"platform {platform.name} is uncalibrated (published specs only): "
                        "treat this as an estimate")
    if platform.collectives is None and plan.job.gpus > 1:
        warnings.append(f"no measured collectives on platform {platform.name}: communication "
                        f"from an analytic ring model of its published link speeds (wider interval)")
    seen = set(warnings)
    for h in plan.handles:
        for w in q.warnings.get(h, ()):
            if w not in seen:
                seen.add(w)
                warnings.append(w)
    if extrapolated:
        warnings.append("shape outside the sampled range for " + ", ".join(q.names_of(extrapolated))
                        + "; costed by roofline scaling (wider interval)")
    return warnings


def predict_many(jobs: Sequence[TrainingJob], platform: Platform) -> list[Prediction]:
    """:meth:`Predictor.predict_many` with a new Predictor: nothing remembered between calls
    (keep a :class:`Predictor` to cost many jobs over time)."""
    return Predictor(platform).predict_many(jobs)


def predict(job: TrainingJob, platform: Platform) -> Prediction:
    """Seconds per iteration, breakdown, interval and total job time of one job (a new
    :class:`Predictor` each call)."""
    return Predictor(platform).predict(job)
