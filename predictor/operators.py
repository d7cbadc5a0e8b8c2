"""The operator catalog: every operator the predictor costs, its shape features and its roofline.

Samples (from calibration or an importer) and queries (from the decomposition of a job) describe
an operator by the same *physical* shape features: a GEMM by (m, k, n), attention by
(batch, l, d), an element-wise op by (tokens, width).  Regressors learn the ratio of measured time
to the roofline time of that shape, so a shape beyond the sampled range still scales with its
FLOPs and bytes while the trees capture the kernel-selection steps inside the range.

Feature names here are the column names of a sample file (``operators/<name>_<precision>.csv``);
calibration must measure exactly these shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

Shape = Mapping[str, np.ndarray]  # feature name -> column of values (one row per query)

#: fp8: an FP8 GEMM's operands (its 16-bit result is not counted: the roofline only normalises
#: the measured FP8 samples, fitted and queried alike).
BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1}


@dataclass(frozen=True)
class GpuSpec:
    """Published peak figures: only the roofline normaliser, never the prediction itself."""

    name: str
    memory_gib: float
    tflops: Mapping[str, float]      # dense tensor-core peak per precision
    memory_gbps: float               # HBM bandwidth, GB/s

    def peak_flops(self, precision: str) -> float:
        return self.tflops[precision] * 1e12


def _gemm_flops(s: Shape) -> np.ndarray:
    return 2.0 * s["m"] * s["k"] * s["n"]


def _gemm_elems(s: Shape) -> np.ndarray:
    return s["m"] * s["k"] + s["k"] * s["n"] + s["m"] * s["n"]


def _bmm_flops(s: Shape) -> np.ndarray:
    return 2.0 * s["batch"] * s["l"] * s["l"] * s["d"]


def _bmm_elems(s: Shape) -> np.ndarray:
    return s["batch"] * (2.0 * s["l"] * s["d"] + s["l"] * s["l"])


def _scores_elems(s: Shape) -> np.ndarray:
    return s["batch"] * s["l"] * s["l"]


def _flash_flops(s: Shape) -> np.ndarray:
    # QKᵀ and PV, causal: half of the l×l square is skipped.
    return 2.0 * 2.0 * s["b"] * s["heads"] * s["l"] * s["l"] * s["d"] * 0.5


def _flash_elems(s: Shape) -> np.ndarray:
    return 4.0 * s["b"] * s["heads"] * s["l"] * s["d"]


def _zero(s: Shape) -> np.ndarray:
    # Works on a column (array) or on one row (floats): the predictor costs a few rows in Python.
    return 0.0 * next(iter(s.values()))


@dataclass(frozen=True)
class Operator:
    """One operator of the catalog.

    ``flops``/``elements`` give forward work; backward is ``bwd_factor`` times that.  ``elements``
    counts tensor elements read + written once.  The factors only set the roofline the regressors'
    ratios are taken against (they cancel inside a model's sampled range, not beyond it), and each
    comes from counting the backward kernel's work (docs/modelling.md §7): GEMMs 2 (the input- and
    weight-gradient GEMMs, each the forward's FLOPs); FlashAttention 2.5 (five matmuls against the
    forward's two, as the FlashAttention benchmarks count); element-wise ops the backward's reads
    and writes over the forward's.
    """

    name: str
    features: tuple[str, ...]
    kind: str                                  # gemm | attention | memory | optimizer
    flops: Callable[[Shape], np.ndarray]
    elements: Callable[[Shape], np.ndarray]
    bwd_factor: float = 2.0
    directions: tuple[str, ...] = ("fwd", "bwd")
    bytes_per_element: float | None = None     # None = the precision's; optimizer state is fp32
    bwd_elements: Callable[[Shape], np.ndarray] | None = None   # when backward traffic is not a multiple
    calibrated: bool = True       # False: not in every calibration (FP8 casts: never, costed through
                                  # a substitute; attention kernels: where the partition has them)

    def roofline_seconds(self, shape: Shape, direction: str, precision: str, gpu: GpuSpec) -> np.ndarray:
        """max(FLOPs / peak, bytes / bandwidth) for each row of ``shape`` (columns of values), or
        for one row when ``shape`` holds plain numbers (then a float)."""
        scale = 1.0 if direction in ("fwd", "step") else self.bwd_factor
        eb = self.bytes_per_element or BYTES_PER_ELEMENT[precision]
        t_flops = scale * self.flops(shape) / gpu.peak_flops(precision)
        if direction == "bwd" and self.bwd_elements is not None:
            t_bytes = self.bwd_elements(shape) * eb / (gpu.memory_gbps * 1e9)
        else:
            t_bytes = scale * self.elements(shape) * eb / (gpu.memory_gbps * 1e9)
        if isinstance(t_flops, np.ndarray) or isinstance(t_bytes, np.ndarray):
            return np.maximum(np.maximum(t_flops, t_bytes), 1e-7)
        return max(t_flops, t_bytes, 1e-7)    # one row of floats (see predictor.estimate)

    def row_roofline(self, direction: str, precision: str, gpu: GpuSpec) -> Callable[[Mapping[str, float]], float]:
        """:meth:`roofline_seconds` of one row of plain numbers, with what depends on the direction,
        the precision and the GPU alone taken once (a predictor costs a few rows per job): the
        same operations in the same order, so the same bits."""
        scale = 1.0 if direction in ("fwd", "step") else self.bwd_factor
        eb = self.bytes_per_element or BYTES_PER_ELEMENT[precision]
        peak, bandwidth = gpu.peak_flops(precision), gpu.memory_gbps * 1e9
        flops, elements, bwd_elements = self.flops, self.elements, self.bwd_elements
        if direction == "bwd" and bwd_elements is not None:
            return lambda s: max(scale * flops(s) / peak, bwd_elements(s) * eb / bandwidth, 1e-7)
        return lambda s: max(scale * flops(s) / peak, scale * elements(s) * eb / bandwidth, 1e-7)


def _ew(*cols: str, factor: float = 2.0) -> Callable[[Shape], np.ndarray]:
    """Element-wise traffic: read + write of a tensor of prod(cols) elements, times ``factor``/2."""

    def elems(s: Shape) -> np.ndarray:
        out = 1.0
        for c in cols:
            out = out * s[c]
        return factor * out
    return elems


_GEMM = ("m", "k", "n")
OPERATORS: dict[str, Operator] = {op.name: op for op in [
    # Linear1: QKV projection (column parallel); Linear2: attention output (row parallel);
    # Linear3: MLP up (column parallel; gated MLPs: gate and up together); Linear4: MLP down.
    Operator("linear1", _GEMM, "gemm", _gemm_flops, _gemm_elems),
    Operator("linear2", _GEMM, "gemm", _gemm_flops, _gemm_elems),
    Operator("linear3", _GEMM, "gemm", _gemm_flops, _gemm_elems),
    Operator("linear4", _GEMM, "gemm", _gemm_flops, _gemm_elems),
    Operator("linear_final", _GEMM, "gemm", _gemm_flops, _gemm_elems),
    # Attention: batch = micro_batch × heads per GPU, d = head dim.
    Operator("baddbmm", ("batch", "l", "d"), "attention", _bmm_flops, _bmm_elems),
    Operator("bmm", ("batch", "l", "d"), "attention", _bmm_flops, _bmm_elems),
    # baddbmm + causal mask fill + softmax as one measured block (the unfused attention path).
    Operator("fillmask", ("batch", "l", "d"), "attention", _bmm_flops,
             lambda s: _bmm_elems(s) + 4.0 * _scores_elems(s)),
    # Softmax, GeLU: forward reads x and writes y (2 passes), backward reads y (x) and dy and
    # writes dx (3): 1.5.
    Operator("softmax", ("batch", "l"), "memory", _zero, lambda s: 2.0 * _scores_elems(s), 1.5),
    Operator("scaled_masked_softmax", ("batch", "l"), "memory", _zero,
             lambda s: 2.0 * _scores_elems(s), 1.5),
    Operator("flash_atten", ("b", "heads", "l", "d"), "attention", _flash_flops, _flash_elems, 2.5),
    # One attention kernel by name (model.attention_impl; predictor.attention): same shapes and
    # work as flash_atten, timed only where the partition has that kernel (calibrate/attention.py),
    # so not among the operators every calibration measures.
    *[Operator(f"flash_atten_{impl}", ("b", "heads", "l", "d"), "attention", _flash_flops, _flash_elems, 2.5,
               calibrated=False)
      for impl in ("cudnn", "flash2", "flash3", "triton", "sdpa_flash", "sdpa_efficient")],
    Operator("rope", ("tokens", "heads", "d"), "memory", _zero, _ew("tokens", "heads", "d", factor=4.0)),
    Operator("gelu", ("tokens", "width"), "memory", _zero, _ew("tokens", "width"), 1.5),
    # SwiGLU: forward reads gate and up, writes out (3); backward reads gate, up and d_out, writes
    # d_gate and d_up (5): 5/3.
    Operator("swiglu", ("tokens", "width"), "memory", _zero, _ew("tokens", "width", factor=3.0), 1.67),
    Operator("layernorm", ("tokens", "dim"), "memory", _zero, _ew("tokens", "dim"), 2.0),
    Operator("rmsnorm", ("tokens", "dim"), "memory", _zero, _ew("tokens", "dim"), 2.0),
    Operator("res_add", ("tokens", "dim"), "memory", _zero, _ew("tokens", "dim", factor=3.0), 1.0),
    # Embedding backward zeroes and scatters into a whole vocab × dim gradient, whatever the tokens
    # (bwd_elements); it has no FLOPs, so its factor 3.0 changes nothing.
    Operator("embedding", ("tokens", "dim", "vocab"), "memory", _zero, _ew("tokens", "dim"), 3.0,
             bwd_elements=lambda s: 2.0 * s["tokens"] * s["dim"] + 2.0 * s["vocab"] * s["dim"]),
    Operator("cross_entropy", ("tokens", "vocab"), "memory", _zero, _ew("tokens", "vocab", factor=3.0), 1.0),
    # FP8 GEMM inputs (predictor.estimate, run.fp8): a cast reads the 16-bit tensor once and
    # writes it in FP8 twice, row- and column-major (the second feeds the weight-gradient GEMM):
    # 2 + 1 + 1 bytes per element, i.e. 2 elements at 16 bits.  Current scaling first reads the
    # tensor for its maximum (amax): 2 bytes per element.  Neither is calibrated: both are costed
    # with res_add's measured efficiency (another memory-bound pass) at their own bytes.
    Operator("fp8_cast", ("tokens", "dim"), "memory", _zero, _ew("tokens", "dim"), 1.0, ("fwd",),
             calibrated=False),
    Operator("amax", ("tokens", "dim"), "memory", _zero, _ew("tokens", "dim", factor=1.0), 1.0, ("fwd",),
             calibrated=False),
    # Adam on the fp32 master copy: read p, g, m, v; write p, m, v and the half-precision copy.
    Operator("optimizer", ("params",), "optimizer", _zero, lambda s: 8.0 * s["params"], 1.0,
             ("step",), bytes_per_element=4.0),
]}

#: The operators calibration measures (the others are costed through a substitute).
CALIBRATED = frozenset(name for name, op in OPERATORS.items() if op.calibrated)

# Collective kinds and the features of their samples (collectives/<kind>_<precision>.csv).
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "p2p")
COLLECTIVE_FEATURES = ("entries", "nodes", "gpus_per_node")


def operator(name: str) -> Operator:
    try:
        return OPERATORS[name]
    except KeyError:
        raise KeyError(f"unknown operator {name!r}; known: {', '.join(sorted(OPERATORS))}") from None


def log2_features(raw: np.ndarray) -> np.ndarray:
    """Shape values as the regressors read them: log2, with sizes below 1 read as 1."""
    return np.log2(np.maximum(np.asarray(raw, dtype=float), 1.0))


def regressor_features(op: Operator, shape: Shape) -> np.ndarray:
    """The regressors' input: log2 of each shape feature (rows × features).

    Logs make the trees split on ratios of sizes, which is how GEMM tiling and wave quantisation
    behave; raw values would leave large shapes in one bucket.
    """
    cols = [log2_features(shape[f]) for f in op.features]
    return np.column_stack(cols)
