"""Sampling plans: which operator shapes and which collectives to measure, and what that costs.

A plan is built from *model points* — (mp, micro-batch, heads, sequence, hidden, vocab) tuples
like the paper's Tables VI and VII — from which every operator's physical shape is derived
exactly as a job's decomposition queries it (``operator_shapes``).  Sampling model points rather
than each operator's features independently keeps the samples where real jobs are: a GEMM's
(m, k, n) move together.

Built-in plans (``PLANS``):

* ``tiny``   — a handful of shapes per operator; the test suite's plan (seconds on a CPU).
* ``smoke``  — small GPT shapes on CPU or GPU; minutes on a laptop CPU; the e2e benchmark's plan.
* ``paper``  — the paper's grids: mp ∈ {1, 2, 4, 8}, b ∈ {1, 2, 4, 8}, head dim ∈ {64, 128}
  (heads 8..64), seq 1024..8192 step 1024, hidden 1024..8192 step 512, vocab ∈ {32000, 50304},
  minus shapes that do not fit the device memory.  Large: thousands of points per operator on a
  GPU node (use ``adaptive`` to bound the cost).
* ``adaptive`` — the same space, budgeted: a space-filling (Halton) first round using half of the
  budget, then rounds that add points to the operators with the highest cross-validated error,
  where the regressor's trees disagree most.  Its cost is stated up front (``estimate_cost``).

A plan can also be a TOML file (``format = 1``, ``name``, ``precisions``, ``[grid]`` lists); a
malformed one is refused with a message naming the key.  This module does not import torch.
"""
from __future__ import annotations

import difflib
import itertools
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from predictor.fp8 import FP8_LINEARS
from predictor.operators import BYTES_PER_ELEMENT, COLLECTIVES, OPERATORS, GpuSpec
from predictor.job import Layout, ModelSpec
from predictor.recipe import gated_ffn_width, layer_parameters, micro_batch_recipe, vocab_per_rank

from .errors import CalibrationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PLAN_FORMAT = 1
#: "fp8" measures the layers' linear GEMMs only (``predictor.fp8.FP8_LINEARS``).
PRECISIONS = ("fp16", "bf16", "fp32", "fp8")


# ------------------------------------------------------------------------------- points
@dataclass(frozen=True, order=True)
class OperatorPoint:
    """One operator at one shape and precision; ``shape`` follows the catalog's feature order."""

    op: str
    precision: str
    shape: tuple[int, ...]

    def shape_dict(self) -> dict[str, int]:
        return dict(zip(OPERATORS[self.op].features, self.shape))


@dataclass(frozen=True, order=True)
class CollectivePoint:
    """One collective on a group of ``nodes`` × ``gpus_per_node`` ranks moving ``entries`` elements."""

    kind: str
    precision: str
    entries: int
    nodes: int
    gpus_per_node: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class ModelPoint:
    """A model configuration from which operator shapes are derived (the paper's sampling unit)."""

    mp: int
    b: int
    heads: int
    seq: int
    hidden: int
    vocab: int = 50304

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def tokens(self) -> int:
        return self.b * self.seq


@dataclass(frozen=True)
class Allocation:
    """What the calibration job holds: nodes × GPUs (or CPU ranks) per node."""

    nodes: int = 1
    gpus_per_node: int = 1

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


def operator_shapes(p: ModelPoint, *, ffn: int | None = None, gated: bool = False) -> dict[str, dict[str, int]]:
    """Physical shape of every operator for one model point (per GPU, tensor parallel ``mp``).

    Read from the predictor's recipe (:func:`predictor.recipe.micro_batch_recipe`), so a plan
    measures exactly the shapes a job of this point will query: one model per attention path
    (fused softmax, unfused, flash), norm and activation, rotary positions.  ``gated`` makes
    linear3 produce gate and up together (2 × ffn / mp).
    """
    f = ffn if ffn is not None else (gated_ffn_width(p.hidden, "llama") if gated else 4 * p.hidden)
    layout = Layout(tp=p.mp, micro_batch=p.b)
    shapes: dict[str, dict[str, int]] = {}
    for attention, norm in (("fused_softmax", "layernorm"), ("unfused", "rmsnorm"), ("flash", "layernorm")):
        model = ModelSpec(layers=1, hidden=p.hidden, heads=p.heads, seq_len=p.seq, ffn_hidden=f,
                          vocab=p.vocab, norm=norm, activation="swiglu" if gated else "gelu",
                          attention=attention, pos_emb="rotary")
        r = micro_batch_recipe(model, layout)
        for call in r.layer + r.embedding + r.head:
            shapes.setdefault(call.name, {k: int(v) for k, v in call.shape.items()})
    # The plain softmax kernel (measured for the unfused path's parts) has the fused one's shape.
    shapes["softmax"] = dict(shapes["scaled_masked_softmax"])
    return shapes


def optimizer_params(p: ModelPoint, layers: int, first_stage: bool) -> int:
    """Parameters the optimizer updates on one GPU of a stage of ``layers`` GPT-NeoX layers (the
    recipe's count: :func:`predictor.recipe.stage_parameters`, without the last stage's head)."""
    model = ModelSpec(layers=max(1, layers), hidden=p.hidden, heads=p.heads, seq_len=p.seq, vocab=p.vocab)
    n = layers * layer_parameters(model, p.mp)
    if first_stage:
        n += vocab_per_rank(p.vocab, p.mp) * p.hidden
    return max(1, n)


def element_bytes(precision: str) -> int:
    return BYTES_PER_ELEMENT[precision]


def bytes_needed(op: str, shape: Mapping[str, int], precision: str) -> int:
    """A generous estimate of the device memory one kernel needs (inputs, outputs, grads, saved)."""
    eb = element_bytes(precision)
    s = {f: float(shape[f]) for f in OPERATORS[op].features}
    kind = OPERATORS[op].kind
    if kind == "gemm":
        return int(3 * (s["m"] * s["k"] + s["k"] * s["n"] + s["m"] * s["n"]) * eb)
    if op in ("baddbmm", "bmm", "fillmask", "softmax", "scaled_masked_softmax"):
        scores = s["batch"] * s["l"] * s["l"]
        acts = s["batch"] * s["l"] * s.get("d", 1.0) * 3
        return int((5 * scores + 3 * acts) * eb + scores)
    if op.startswith("flash_atten"):
        return int(10 * s["b"] * s["heads"] * s["l"] * s["d"] * eb + 64 * s["b"] * s["heads"] * s["l"])
    if op == "optimizer":
        return int(s["params"] * (16 + 2 * eb + 4))
    if op == "cross_entropy":
        return int(s["tokens"] * s["vocab"] * (3 * eb + 16))
    if op == "embedding":
        return int((2 * s["vocab"] * s["dim"] + 3 * s["tokens"] * s["dim"]) * eb + 8 * s["tokens"])
    n = 1.0
    for v in s.values():
        n *= v
    return int(8 * n * eb)


# ------------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """What to measure, how many repetitions, and (for adaptive plans) how to refine."""

    name: str
    description: str
    precisions: tuple[str, ...]
    operators: list[OperatorPoint]
    collectives: list[CollectivePoint]
    warmup: int = 3
    repeats: int = 10
    budget_gpu_minutes: float = 0.0            # > 0: adaptive refinement until spent
    candidates: list[OperatorPoint] = field(default_factory=list)   # adaptive: pool to refine from
    allocation: Allocation = field(default_factory=Allocation)

    @property
    def adaptive(self) -> bool:
        return self.budget_gpu_minutes > 0

    def summary(self) -> str:
        return (f"plan {self.name}: {len(self.operators)} operator points, {len(self.collectives)} "
                f"collective points, precisions {'/'.join(self.precisions)}, "
                f"warm-up {self.warmup}, repeats {self.repeats}")


@dataclass(frozen=True)
class Cost:
    """Estimated cost of a plan on an allocation."""

    operator_seconds: float
    collective_seconds: float
    gpus: int

    @property
    def wall_minutes(self) -> float:
        return (self.operator_seconds + self.collective_seconds) / 60.0

    @property
    def gpu_minutes(self) -> float:
        # The whole allocation is held for the whole job, idle GPUs included.
        return self.wall_minutes * self.gpus

    def __str__(self) -> str:
        return (f"about {self.wall_minutes:.1f} min wall-clock, {self.gpu_minutes:.1f} GPU-minutes "
                f"on {self.gpus} GPU(s) (operators {self.operator_seconds / 60:.1f} min, "
                f"collectives {self.collective_seconds / 60:.1f} min)")


# Achieved fraction of the roofline assumed by the estimate: micro-benchmarks of small shapes
# rarely reach peak, and under-estimating the cost would make a job hit its time limit.
_EFFICIENCY = 0.35
_POINT_OVERHEAD_S = {"cuda": 0.05, "cpu": 0.01}      # allocation, graph building, Python
_LINK_GBPS = {"intra": 100.0, "inter": 12.0, "cpu": 1.0}     # cpu: gloo through host memory
# gloo on CPUs: beyond this many entries a collective only costs time (bandwidth-bound already).
_CPU_MAX_ENTRIES = 1 << 24
_COLLECTIVE_LATENCY_S = 30e-6
_GROUP_SETUP_S = 2.0


def point_seconds(pt: OperatorPoint, spec: GpuSpec, device: str, warmup: int, repeats: int) -> float:
    """Estimated device time to measure one operator point (every direction, every repetition)."""
    import numpy as np

    if pt.precision not in spec.tflops and pt.precision == "fp8":
        # A cost estimate only (the run itself refuses FP8 where the GPU has no FP8 GEMMs): a GPU
        # without a published FP8 peak, or the nominal one, at twice its 16-bit peak as on Hopper.
        spec = replace(spec, tflops={**spec.tflops, "fp8": 2.0 * spec.tflops["fp16"]})
    op = OPERATORS[pt.op]
    shape = {f: np.asarray([float(v)]) for f, v in pt.shape_dict().items()}
    per_call = sum(float(op.roofline_seconds(shape, d, pt.precision, spec)[0]) for d in op.directions)
    return (warmup + repeats + 1) * per_call / _EFFICIENCY + _POINT_OVERHEAD_S.get(device, 0.05)


def collective_seconds(pt: CollectivePoint, warmup: int, repeats: int, device: str = "cuda") -> float:
    gbps = _LINK_GBPS["cpu" if device == "cpu" else "inter" if pt.nodes > 1 else "intra"]
    once = _COLLECTIVE_LATENCY_S + 2.0 * pt.entries * element_bytes(pt.precision) / (gbps * 1e9)
    return (warmup + repeats) * once * 2.0   # barrier + operation


def estimate_cost(plan: Plan, spec: GpuSpec, device: str) -> Cost:
    """What a plan costs on ``spec``; an adaptive plan costs its budget (its rounds stop there)."""
    ops = sum(point_seconds(p, spec, device, plan.warmup, plan.repeats) for p in plan.operators)
    # Operators are shared out over the local ranks of one node (see calibrate.runner).
    ops /= max(1, plan.allocation.gpus_per_node)
    groups = {(c.nodes, c.gpus_per_node) for c in plan.collectives}
    # Collectives get at least 5 warm-ups and 10 repeats (calibrate.runner).
    coll = sum(collective_seconds(c, max(plan.warmup, 5), max(plan.repeats, 10), device)
               for c in plan.collectives)
    coll += _GROUP_SETUP_S * len(groups)
    gpus = max(1, plan.allocation.ranks) if device == "cuda" else 1
    if plan.adaptive:
        # The refinement rounds spend the rest of the budget, so the budget is the cost.
        total_min = plan.budget_gpu_minutes / gpus
        ops = max(ops, total_min * 60.0 - coll)
    return Cost(ops, coll, gpus)


# ------------------------------------------------------------------------------- grids
@dataclass(frozen=True)
class Grid:
    """The sampling space of a plan (all lists; model points are their product, filtered)."""

    mp: tuple[int, ...]
    b: tuple[int, ...]
    head_dim: tuple[int, ...]
    seq: tuple[int, ...]
    hidden: tuple[int, ...]
    vocab: tuple[int, ...]
    optimizer_layers: tuple[int, ...]
    collective_entries: tuple[int, ...]

    def model_points(self) -> list[ModelPoint]:
        out = []
        for mp, b, hd, seq, hidden, vocab in itertools.product(
                self.mp, self.b, self.head_dim, self.seq, self.hidden, self.vocab):
            if hidden % hd:
                continue
            heads = hidden // hd
            if heads % mp or hidden % mp or vocab % mp or heads < mp:
                continue
            out.append(ModelPoint(mp, b, heads, seq, hidden, vocab))
        return out


def _pow2_range(lo: int, hi: int, step: int = 1) -> tuple[int, ...]:
    return tuple(1 << e for e in range(lo, hi + 1, step))


GRIDS: dict[str, Grid] = {
    # Small, but ≥ 8 distinct shapes per operator: the regressors need that many to be fitted.
    "tiny": Grid(mp=(1,), b=(1, 2), head_dim=(32,), seq=(32, 48, 64), hidden=(64, 128), vocab=(256, 512),
                 optimizer_layers=(1, 2), collective_entries=(1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 17,
                                                              1 << 18, 1 << 19, 1 << 20)),
    "smoke": Grid(mp=(1, 2), b=(1, 2, 4), head_dim=(32, 64), seq=(64, 128, 256),
                  hidden=(128, 256, 384, 512), vocab=(1024, 2048, 4096),
                  optimizer_layers=(1, 2, 4), collective_entries=_pow2_range(10, 23)),
    "paper": Grid(mp=(1, 2, 4, 8), b=(1, 2, 4, 8), head_dim=(64, 128),
                  seq=tuple(range(1024, 8193, 1024)), hidden=tuple(range(1024, 8193, 512)),
                  vocab=(32000, 50304), optimizer_layers=(1, 2, 4, 8, 16),
                  collective_entries=_pow2_range(14, 31)),
}
# The adaptive plan samples the paper's space.
GRIDS["adaptive"] = GRIDS["paper"]
PLAN_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {"warmup": 1, "repeats": 4, "description": "a handful of shapes per operator (tests)"},
    "smoke": {"warmup": 2, "repeats": 8, "description": "small GPT shapes; minutes on a laptop CPU"},
    "paper": {"warmup": 3, "repeats": 10, "description": "the paper's grids (Tables VI/VII), memory-filtered"},
    "adaptive": {"warmup": 3, "repeats": 10, "description": "paper space, Halton first round, then "
                 "refinement where validation error is high, within a GPU-minute budget"},
}
PLANS = tuple(PLAN_DEFAULTS)


def _operator_points(models: Iterable[ModelPoint], grid: Grid, precisions: Sequence[str],
                     memory_bytes: float) -> list[OperatorPoint]:
    seen: set[OperatorPoint] = set()
    out: list[OperatorPoint] = []

    def add(op: str, shape: Mapping[str, int], precision: str) -> None:
        if precision == "fp8" and op not in FP8_LINEARS:
            return
        if bytes_needed(op, shape, precision) > memory_bytes:
            return
        pt = OperatorPoint(op, precision, tuple(int(shape[f]) for f in OPERATORS[op].features))
        if pt not in seen:
            seen.add(pt)
            out.append(pt)

    models = list(models)
    for precision in precisions:
        for mpnt in models:
            for gated in (False, True):
                for op, shape in operator_shapes(mpnt, gated=gated).items():
                    add(op, shape, precision)
            for layers in grid.optimizer_layers:
                for first in (False, True):
                    add("optimizer", {"params": optimizer_params(mpnt, layers, first)}, precision)
    return out


def collective_groups(alloc: Allocation) -> list[tuple[int, int]]:
    """Group shapes (nodes, ranks per node) to measure: intra-node, inter-node and mixed.

    TP groups live inside a node (1 × g), DP and PP groups span nodes (n × 1 when one rank per
    node takes part, n × G when whole nodes do).
    """
    shapes: list[tuple[int, int]] = []
    g = 2
    while g <= alloc.gpus_per_node:
        shapes.append((1, g))
        g *= 2
    if alloc.gpus_per_node > 1 and (1, alloc.gpus_per_node) not in shapes:
        shapes.append((1, alloc.gpus_per_node))
    n = 2
    while n <= alloc.nodes:
        shapes.append((n, 1))
        if alloc.gpus_per_node > 1:
            shapes.append((n, alloc.gpus_per_node))
        n *= 2
    if alloc.nodes > 1 and (alloc.nodes, 1) not in shapes:
        shapes.append((alloc.nodes, 1))
        if alloc.gpus_per_node > 1:
            shapes.append((alloc.nodes, alloc.gpus_per_node))
    return shapes


def _collective_points(grid: Grid, alloc: Allocation, precisions: Sequence[str],
                       memory_bytes: float, device: str = "cuda") -> list[CollectivePoint]:
    out = []
    groups = collective_groups(alloc)
    for precision in precisions:
        if precision == "fp8":
            continue      # FP8 jobs communicate in 16 bits (predictor.fp8)
        for nodes, gpn in groups:
            for kind in COLLECTIVES:
                if kind == "p2p" and nodes * gpn != 2:
                    continue      # pipeline send/recv is between two ranks
                for e in grid.collective_entries:
                    if device == "cpu" and e > _CPU_MAX_ENTRIES:
                        continue
                    ranks = nodes * gpn
                    if kind == "allgather":
                        # entries = the per-rank shard; the output is ranks × larger
                        need = e * (ranks + 1)
                    else:
                        need = 2 * e
                    if need * element_bytes(precision) > memory_bytes:
                        continue
                    out.append(CollectivePoint(kind, precision, int(e), nodes, gpn))
    return out


def default_precisions(device: str) -> tuple[str, ...]:
    # fp16 GEMMs on CPU are slow or missing in many builds; CPUs calibrate fp32 by default.
    return ("fp32",) if device == "cpu" else ("fp16",)


def plan_precisions(name: str, device: str, precisions: Sequence[str] | None = None) -> tuple[str, ...]:
    """The precisions a plan will measure: those asked for, else a plan file's own, else the
    device's default (a plan file's ``precisions`` must not be lost to the default)."""
    if precisions:
        return _check_precisions(precisions, name)
    if name.endswith(".toml") or "/" in name:
        try:
            data = tomllib.loads(Path(name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            data = {}   # load_plan_file reports the problem with the file named
        file_precs = data.get("precisions")
        if isinstance(file_precs, list) and file_precs:
            return _check_precisions(file_precs, name)
    return default_precisions(device)


def add_attention_kernels(plan: "Plan", impls: Sequence[str]) -> int:
    """Time each attention kernel of ``impls`` (``model.attention_impl`` names) at the shapes the
    plan times ``flash_atten`` at, as operator ``flash_atten_<impl>``; returns the points added."""
    added = 0
    for impl in impls:
        op = f"flash_atten_{impl}"
        if op not in OPERATORS:
            raise CalibrationError(f"no attention kernel {impl!r} in the operator catalog")
        for attr in ("operators", "candidates"):
            pts = getattr(plan, attr)
            extra = [OperatorPoint(op, p.precision, p.shape) for p in pts if p.op == "flash_atten"]
            pts.extend(extra)
            added += len(extra) if attr == "operators" else 0
    return added


def is_plan_file(name: str) -> bool:
    """Whether a plan name is a file's path (else a built-in plan's name)."""
    return name.endswith(".toml") or "/" in name


def _check_builtin(name: str) -> None:
    if name not in GRIDS:
        raise CalibrationError(f"unknown plan {name!r}; built-in plans: {', '.join(PLANS)} "
                               "(or a plan file ending in .toml)")


def check_plan(name: str, *, device: str = "cuda", precisions: Sequence[str] | None = None) -> None:
    """Refuse a misspelt built-in plan, or a plan file that does not load, before anything is
    asked of Slurm or measured (make_plan raises the same errors later)."""
    if is_plan_file(name):
        load_plan_file(Path(name), device=device, allocation=Allocation(), memory_gib=0.0,
                       precisions=precisions)
    else:
        _check_builtin(name)


def make_plan(name: str, *, device: str = "cpu", precisions: Sequence[str] | None = None,
              allocation: Allocation | None = None, memory_gib: float = 0.0,
              budget_gpu_minutes: float = 0.0, spec: GpuSpec | None = None) -> Plan:
    """Build a built-in plan (``PLANS``) or load a plan file (a path ending in ``.toml``)."""
    alloc = allocation or Allocation()
    if alloc.nodes < 1 or alloc.gpus_per_node < 1:
        raise CalibrationError(f"an allocation needs at least one node and one GPU (or rank) per node, "
                               f"got {alloc.nodes} node(s) × {alloc.gpus_per_node}")
    if is_plan_file(name):
        return load_plan_file(Path(name), device=device, allocation=alloc, memory_gib=memory_gib,
                              precisions=precisions)
    _check_builtin(name)
    precs = _check_precisions(precisions or default_precisions(device), name)
    grid = GRIDS[name]
    defaults = PLAN_DEFAULTS[name]
    mem = (memory_gib or (80.0 if device == "cuda" else 16.0)) * 2**30 * 0.8
    models = grid.model_points()
    colls = _collective_points(grid, alloc, precs, mem, device)
    if name != "adaptive":
        return Plan(name, defaults["description"], precs, _operator_points(models, grid, precs, mem),
                    colls, defaults["warmup"], defaults["repeats"], allocation=alloc)
    if budget_gpu_minutes <= 0:
        raise CalibrationError("the adaptive plan needs a budget: --budget GPU-MINUTES")
    pool = _operator_points(models, grid, precs, mem)
    first = _space_filling(pool, spec, device, defaults, alloc, budget_gpu_minutes / 2.0, colls)
    chosen = set(first)
    return Plan(name, defaults["description"], precs, first, colls, defaults["warmup"],
                defaults["repeats"], budget_gpu_minutes=budget_gpu_minutes,
                candidates=[p for p in pool if p not in chosen], allocation=alloc)


def _check_precisions(precisions: Sequence[str], where: str) -> tuple[str, ...]:
    out = tuple(precisions)
    bad = [p for p in out if p not in PRECISIONS]
    if bad or not out:
        raise CalibrationError(f"{where}: precisions must be among {', '.join(PRECISIONS)}, got {list(out)}")
    return out


def halton(index: int, base: int) -> float:
    """The ``index``-th element of the van der Corput sequence in ``base`` (Halton coordinate)."""
    f, r, i = 1.0, 0.0, index
    while i > 0:
        f /= base
        r += f * (i % base)
        i //= base
    return r


_PRIMES = (2, 3, 5, 7, 11, 13)


def _space_filling(pool: list[OperatorPoint], spec: GpuSpec | None, device: str,
                   defaults: Mapping[str, Any], alloc: Allocation, budget_gpu_minutes: float,
                   colls: list[CollectivePoint]) -> list[OperatorPoint]:
    """Pick points of each operator along a Halton sequence over its log-feature box until the
    budget share of that operator is spent (every operator gets an equal share)."""
    import numpy as np

    spec = spec or _nominal_spec(device)
    gpus = max(1, alloc.ranks) if device == "cuda" else 1
    coll_s = sum(collective_seconds(c, max(defaults["warmup"], 5), max(defaults["repeats"], 10), device)
                 for c in colls)
    # Wall-clock the budget buys, times the local ranks that measure operators side by side.
    wall_s = max(0.0, budget_gpu_minutes * 60.0 / gpus - coll_s / 2.0)
    budget_s = wall_s * max(1, alloc.gpus_per_node)
    by_key: dict[tuple[str, str], list[OperatorPoint]] = {}
    for p in pool:
        by_key.setdefault((p.op, p.precision), []).append(p)
    share = budget_s / max(1, len(by_key))
    chosen: list[OperatorPoint] = []
    for (_op, _prec), pts in sorted(by_key.items()):
        feats = np.log2(np.asarray([p.shape for p in pts], dtype=float))
        lo, hi = feats.min(axis=0), feats.max(axis=0)
        span = np.where(hi > lo, hi - lo, 1.0)
        unit = (feats - lo) / span
        cost = np.asarray([point_seconds(p, spec, device, defaults["warmup"], defaults["repeats"])
                           for p in pts])
        taken: set[int] = set()
        spent = 0.0
        for i in range(1, 4 * len(pts) + 1):
            # Points that no longer fit the share are out: the budget is a promise.
            room = share - spent
            fits = cost <= room
            fits[list(taken)] = False
            if not fits.any():
                break
            target = np.asarray([halton(i, _PRIMES[j % len(_PRIMES)]) for j in range(unit.shape[1])])
            dist = np.where(fits, ((unit - target) ** 2).sum(axis=1), np.inf)
            j = int(np.argmin(dist))
            taken.add(j)
            spent += float(cost[j])
            chosen.append(pts[j])
    return chosen


def known_gpu(name: str) -> str | None:
    """The ``calibrate.env.KNOWN_GPUS`` key a GPU name spells, else None (``calibrate.env.gpu_key``:
    a word of the name, so "h1000" is not taken for an H100)."""
    from .env import gpu_key

    return gpu_key(name)


def resolve_gpu(name: str):
    """The published figures (``calibrate.env.DeviceSpec``) of a GPU given by name; an unknown name
    is a CalibrationError naming the known ones (with the closest as a did-you-mean)."""
    from .env import KNOWN_GPUS, DeviceSpec

    key = known_gpu(name)
    if key is None:
        compact = re.sub(r"[^a-z0-9]+", "", name.lower())
        close = difflib.get_close_matches(compact, sorted(KNOWN_GPUS), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CalibrationError(f"unknown GPU {name!r}{hint}; known: {', '.join(sorted(KNOWN_GPUS))}")
    mem, tflops, gbps = KNOWN_GPUS[key]
    return DeviceSpec(name.strip(), "cuda", mem, dict(tflops), gbps, source="published")


def _nominal_spec(device: str) -> GpuSpec:
    if device == "cuda":
        return GpuSpec("nominal A100", 80.0, {"fp16": 312.0, "bf16": 312.0, "fp32": 19.5}, 2039.0)
    return GpuSpec("nominal CPU", 16.0, {"fp16": 0.05, "bf16": 0.2, "fp32": 0.2}, 10.0)


# ------------------------------------------------------------------------------- plan files
_GRID_KEYS = {f for f in Grid.__dataclass_fields__}


def load_plan_file(path: Path, *, device: str, allocation: Allocation, memory_gib: float,
                   precisions: Sequence[str] | None) -> Plan:
    """Read a plan TOML file; every problem is reported with the file and key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read plan: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CalibrationError(f"{path}: corrupt plan file (not valid TOML): {exc}") from None
    if "format" not in data:
        # A runs file, a platform.toml, any other TOML: not "format None".
        raise CalibrationError(f"{path}: not a plan file (no `format = {PLAN_FORMAT}`; a plan file has "
                               "format, name, precisions and a [grid] table)")
    if data.get("format") != PLAN_FORMAT:
        raise CalibrationError(f"{path}: plan format {data.get('format')!r} is not supported "
                               f"(this perfcast reads plan format {PLAN_FORMAT})")
    unknown = set(data) - {"format", "name", "description", "precisions", "warmup", "repeats", "grid"}
    if unknown:
        raise CalibrationError(f"{path}: unknown plan keys {sorted(unknown)}")
    grid_d = data.get("grid")
    if not isinstance(grid_d, dict):
        raise CalibrationError(f"{path}: a plan needs a [grid] table")
    bad = set(grid_d) - _GRID_KEYS
    if bad:
        raise CalibrationError(f"{path}: unknown [grid] keys {sorted(bad)}; known: {sorted(_GRID_KEYS)}")
    values: dict[str, tuple[int, ...]] = {}
    for key in _GRID_KEYS:
        v = grid_d.get(key, getattr(GRIDS["smoke"], key))
        if not isinstance(v, list) and not isinstance(v, tuple) or not v \
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v):
            raise CalibrationError(f"{path}: grid.{key} must be a non-empty list of positive integers")
        values[key] = tuple(v)
    for key in ("warmup", "repeats"):
        v = data.get(key, PLAN_DEFAULTS["smoke"][key])
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if key == "repeats" else 0) or v > 10_000:
            raise CalibrationError(f"{path}: {key} must be an integer (repeats ≥ 1)")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise CalibrationError(f"{path}: name must be a non-empty string")
    precs_in = precisions or data.get("precisions") or default_precisions(device)
    if not isinstance(precs_in, (list, tuple)):
        raise CalibrationError(f"{path}: precisions must be a list")
    precs = _check_precisions(precs_in, str(path))
    grid = Grid(**values)
    mem = (memory_gib or (80.0 if device == "cuda" else 16.0)) * 2**30 * 0.8
    return Plan(name, str(data.get("description", f"plan file {path}")), precs,
                _operator_points(grid.model_points(), grid, precs, mem),
                _collective_points(grid, allocation, precs, mem, device),
                int(data.get("warmup", 2)), int(data.get("repeats", 8)), allocation=allocation)
