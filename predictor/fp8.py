"""FP8 GEMMs (``run.fp8``): what changes when a job's linear layers compute in FP8.

Transformer Engine (Megatron-LM, NeMo) and torchao's float8 (TorchTitan) run the transformer
layers' four linear GEMMs (QKV, attention output, MLP up and down; forward, data-gradient and
weight-gradient) on FP8 tensor cores; attention, norms, element-wise operators, the output
projection, communication and the optimizer stay in 16 bits.  Where a bundle holds FP8 samples of
the four linears (:func:`measured`; ``perf-calibrate run --precision fp8``; dgx-h100's), those
are read like any operator's and only the casts below are added.  Otherwise (the prior) an FP8
GEMM is costed from the 16-bit measurement of the same shape:

* **Tensor-core time halves, nothing else does.**  Of a measured 16-bit GEMM time ``t16``, the
  part the tensor cores need at their achievable rate, ``tc = FLOPs / (η · peak16)``, runs at the
  FP8 peak instead (``peak16 / peak8`` of it: 1/2 on Hopper, from the data sheet); the rest
  (launch, memory traffic, wave and tile tails) stays.  A kernel measured faster than η is all
  tensor-core time and scales whole.  η = :data:`ACHIEVABLE_TENSOR_FRACTION`.  Never below the
  GEMM's own traffic (FP8 operands, a 16-bit result) at the memory's peak bandwidth.
* **Casts.**  Every GEMM input is cast to FP8 first: the activation in forward, the output
  gradient in backward, each weight once per step (Transformer Engine keeps the FP8 weight across
  a step's micro-batches).  A cast is one memory-bound pass (``fp8_cast`` in the catalogue);
  current scaling reads the tensor once more for its maximum (``amax``).  Both are costed with the
  bundle's measured ``res_add`` efficiency at their own bytes.
* **Uncertainty.**  Between "only the tensor-core part halves" and "the whole kernel speeds up by
  the peak ratio" lies what a real FP8 kernel may do; the gap between the two is added to each
  FP8 GEMM's relative error (a wider interval for a cost nobody measured here).

Checked, not fitted, against torchao's published H100 speedups of one float8 linear
(``python benchmarks/bench_fp8.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .recipe import OperatorCall

if TYPE_CHECKING:
    from .bundle import Bundle

#: The linear GEMMs that run in FP8 (the output projection stays in 16 bits in Megatron-LM's
#: output layer and in torchao's default filter, which skips ``output``).
FP8_LINEARS = frozenset(("linear1", "linear2", "linear3", "linear4"))

#: The fraction of the tensor cores' peak a large GEMM achieves, the same at 16 bits and in FP8:
#: 0.78 on H100 in torchao's roofline model ("based on experimental observation with sample
#: large inputs", torchao/testing/training/roofline_utils.py, used for bf16 and float8 alike);
#: DeepGEMM's "up to 1550 TFLOPS" in FP8 on H800 (dense FP8 peak 1979) is 0.78 too.  The lent H100's own
#: fp16 samples reach 744-759 TFLOP/s at their best shapes, 0.75-0.77 of 989.
ACHIEVABLE_TENSOR_FRACTION = 0.78

#: The precision an FP8 job's 16-bit measurements are read at (models, roofline).
BASE_PRECISION = "bf16"


def measured(bundle: "Bundle") -> bool:
    """Whether a compute bundle holds FP8 samples of every FP8 linear, both directions
    (``perf-calibrate run --precision fp8``): then those are read, not this module's prior."""
    return all(bundle.get(f"{op}.{d}.fp8") is not None for op in FP8_LINEARS for d in ("fwd", "bwd"))


def gemm_bytes(m: float, k: float, n: float, direction: str) -> float:
    """HBM bytes of an FP8 GEMM's pass at its roofline: FP8 operands (1 byte), a 16-bit result.
    Backward is the data-gradient GEMM (M×N by N×K into M×K) and the weight-gradient one (K×M by
    M×N into K×N)."""
    if direction == "fwd":
        return m * k + k * n + 2.0 * m * n
    return 2.0 * m * n + 3.0 * m * k + 3.0 * k * n


def gemm_seconds(t16: np.ndarray, tensor_flops: np.ndarray, fp8_bytes: np.ndarray, peak16_flops: float,
                 peak8_flops: float, memory_bytes_per_second: float) -> tuple[np.ndarray, np.ndarray]:
    """(FP8 seconds, relative gap to the whole-kernel bound) for GEMMs measured at ``t16`` seconds
    in 16 bits that do ``tensor_flops`` FLOPs and move ``fp8_bytes`` in FP8 (module docstring);
    never below that traffic at the memory's peak bandwidth."""
    t16 = np.asarray(t16, dtype=float)
    ratio = peak16_flops / peak8_flops
    tc = np.minimum(np.asarray(tensor_flops, dtype=float) / (ACHIEVABLE_TENSOR_FRACTION * peak16_flops), t16)
    floor = np.asarray(fp8_bytes, dtype=float) / memory_bytes_per_second
    t8 = np.maximum(t16 - tc * (1.0 - ratio), floor)
    whole = np.maximum(t16 * ratio, floor)
    # t8 >= whole > 0 (a measured time is never zero): the gap is in [0, 1 − ratio].
    return t8, 1.0 - whole / t8


@dataclass(frozen=True)
class CastCalls:
    """The casts one layer adds per micro-batch: in forward (inputs, weights) and in backward
    (output gradients), each call counted as :class:`OperatorCall` counts are."""

    forward: tuple[OperatorCall, ...]
    backward: tuple[OperatorCall, ...]

    @property
    def launches_forward(self) -> float:
        return sum(c.count for c in self.forward)

    @property
    def launches_backward(self) -> float:
        return sum(c.count for c in self.backward)


def layer_casts(layer: tuple[OperatorCall, ...], recipe: str, micro_batches: int) -> CastCalls:
    """The FP8 casts of one layer's linears (``layer``: a :class:`MicroBatchRecipe`'s layer) under
    ``recipe`` ("delayed" | "current"), with the weights' once-per-step casts spread over the
    step's ``micro_batches``."""
    passes = ("fp8_cast", "amax") if recipe == "current" else ("fp8_cast",)
    fwd: list[OperatorCall] = []
    bwd: list[OperatorCall] = []
    per_step = 1.0 / max(1, micro_batches)
    for c in layer:
        if c.name not in FP8_LINEARS:
            continue
        m, k, n = (float(c.shape[f]) for f in ("m", "k", "n"))
        for name in passes:
            fwd.append(OperatorCall(name, {"tokens": m, "dim": k}, c.count))               # input
            fwd.append(OperatorCall(name, {"tokens": k, "dim": n}, c.count * per_step))    # weight
            bwd.append(OperatorCall(name, {"tokens": m, "dim": n}, c.count))               # output gradient
    return CastCalls(tuple(fwd), tuple(bwd))
