"""Which kernel runs a job's fused attention, and how its time relates to the kernel a bundle timed.

``model.attention_impl`` names the kernel ("" = the framework's default, :func:`default_impl`).
A compute bundle's ``flash_atten`` samples timed one kernel (:func:`measured_impl`); a bundle may
also hold samples of other kernels as operators of their own (``flash_atten_<impl>``, timed by
``perf-calibrate run`` where the partition has them).  A job whose kernel was measured is costed
from its own samples; one whose kernel was not is costed from the measured kernel's time times
the ratio of the two kernels' throughputs (:func:`relative_seconds`: published figures and the
lent H100's), and the answer says so.  Every figure here is a kernel micro-benchmark of that
mechanism (docs/modelling.md §1, "Attention kernels").
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

#: SDPA's math backend is the unfused computation: costed with the unfused operators.
UNFUSED_IMPLS = frozenset(("math",))
#: Kernels that exist on Hopper (sm90) only.
HOPPER_ONLY = frozenset(("flash3",))

# Throughput (TFLOP/s) of each kernel on an H100 SXM5, FP16, head dim 128, by sequence length:
# FlashAttention-3 paper (Shah et al., arXiv:2407.08608), Fig. 5 (forward, causal) and Fig. 6
# (backward; the paper plots it without the causal mask), 16k tokens per batch (b = 16,384 / s).
# "triton" is the paper's Triton FlashAttention-2 kernel; it has no backward figure.
_FIGURE_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
_H100_TFLOPS = {
    "fwd": {"flash2": (191, 260, 298, 319, 333, 335), "triton": (146, 273, 323, 353, 369, 378),
            "cudnn": (315, 410, 484, 518, 529, 539), "flash3": (292, 423, 521, 579, 602, 616)},
    "bwd": {"flash2": (214, 260, 291, 310, 318, 322), "cudnn": (305, 408, 465, 499, 518, 516),
            "flash3": (316, 424, 501, 542, 559, 561)},
}
# Milliseconds per causal call on the lent H100 (benchmarks/data/h100-lent/stacks/attention.json,
# 2026-11-26, torch 2.11.0+cu130: SDPA pinned to each backend, and "triton" timed as
# flex_attention, the Triton kernel Inductor generates), bf16, b = 1, 32 heads of 128.  They reach
# 2k-32k and measure what the paper lacks: SDPA's memory-efficient kernel, and a Triton backward
# (flex's forward ratio to FlashAttention-2, 1.05-1.16x at 8k-32k, is the paper's Triton one).
_LENT_SEQ = (2048, 4096, 8192, 16384, 32768)
_H100_LENT_MS = {
    "fwd": {"flash2": (0.2518, 0.6008, 1.815, 6.588, 24.74), "cudnn": (0.2136, 0.3838, 1.007, 3.783, 14.06),
            "sdpa_efficient": (0.3249, 0.9574, 3.398, 12.58, 48.6), "triton": (0.2788, 0.6671, 1.722, 5.705, 21.41)},
    "bwd": {"flash2": (0.5806, 1.732, 5.097, 18.04, 70.69), "cudnn": (0.3727, 0.8931, 2.737, 10.67, 40.35),
            "sdpa_efficient": (1.11, 3.306, 11.57, 42.11, 165.5), "triton": (0.4751, 1.205, 3.8, 14.27, 54.19)},
}
# At b = 1 a call fills the GPU from 8k on (32 heads x 64 query tiles; the measured TFLOP/s have
# levelled off there); below, one call leaves SMs idle, which a training job's batch would not,
# and the paper's full-batch figures hold.  Between 2k and 8k the two are blended (log length).
_LENT_FULL_FROM_SEQ, _FIGURE_FULL_TO_SEQ = 8192, 2048
# FlashAttention-2 on the same H100 without the causal mask (same paper, Fig. 5): with the mask
# the kernel skips the upper half of the blocks but still pays the diagonal blocks, so a causal
# call takes 0.5 × (non-causal TFLOP/s / causal TFLOP/s) of a non-causal one's time.
_H100_FLASH2_NONCAUSAL_FWD = (309, 350, 362, 368, 370, 370)
# cuDNN's SDPA against PyTorch's flash backend (FlashAttention-2) on an A100, training shapes:
# 0.82× the speed (huggingface/transformers PR 48163, its six-GPU benchmark); on Hopper the same
# benchmark found cuDNN 1.7–2.3× faster, in line with the paper's figures above.
_A100_CUDNN_SPEED_VS_FLASH2 = 0.82
#: PyTorch's SDPA flash backend runs FlashAttention-2's kernels (vendored in ATen since 2.2).
SAME_KERNEL = {"sdpa_flash": "flash2", "flash2": "flash2"}
#: Frameworks whose ``triton`` is FlashAttention in pre-MLIR Triton: llm-foundry's
#: ``flash_attn_triton.py`` imports ``triton_pre_mlir`` (Triton 2.0.0.dev20221202, "only tested
#: on A100"; installed from a ``triton_pre_mlir_sm90`` branch that lets the old backend build for
#: sm90), whose code generator predates Triton's Hopper support (wgmma, TMA): its matrix
#: products are Ampere's mma.sync on every GPU, as FlashAttention-2's are.  The Triton figures
#: above are of Hopper-aware Triton (the paper's, and Inductor's flex_attention).
PRE_HOPPER_TRITON_FRAMEWORKS = frozenset(("llm-foundry",))

#: Shipped bundles whose manifests predate the ``flash_atten_impl`` source key: what their
#: flash_atten samples timed (docs/modelling.md §1).  The seed paper's sampler (Zhang et al.,
#: estimate-train-time ``Kernel_sampling/target_functions.py``) calls ``flash_attn_func(Q, K, V)``
#: from the flash_attn 2 package without ``causal=True``; the lent H100 ran torch 2.11's SDPA,
#: which prefers cuDNN's kernel on sm90 (``check_prefer_cudnn_attention``), causal.
SHIPPED_BUNDLE_ATTENTION = {
    "a100-sxm4-80gb": ("flash2", False),
    "gh200-120gb": ("flash2", False),
    "h100-80gb-hbm3": ("cudnn", True),
}


@dataclass(frozen=True)
class Measured:
    """What a bundle's ``flash_atten`` samples timed: the kernel and whether the mask was causal."""

    impl: str
    causal: bool = True


def measured_impl(bundle_name: str, source: Mapping[str, object]) -> Optional[Measured]:
    """The kernel a bundle's ``flash_atten`` samples timed: its manifest's ``[source]``
    ``flash_atten_impl`` / ``flash_atten_causal`` (written by ``perf-calibrate run``), else the
    record of the shipped bundles; None when nobody said."""
    impl = source.get("flash_atten_impl")
    if isinstance(impl, str) and impl:
        return Measured(impl, bool(source.get("flash_atten_causal", True)))
    known = SHIPPED_BUNDLE_ATTENTION.get(bundle_name)
    return Measured(*known) if known else None


def default_impl(framework: str, hopper: bool) -> str:
    """The kernel a framework runs for fused attention when the job does not say ("" = the
    framework is not known: whatever the platform's bundle timed).

    Megatron-LM and NeMo run Transformer Engine's DotProductAttention, which prefers cuDNN's fused
    attention on Hopper and newer and FlashAttention-2 before (NeMo's docs); GPT-NeoX, DeepSpeed
    and Megatron-DeepSpeed call the flash_attn package (FlashAttention-2), as llm-foundry's default
    ``attn_impl: flash`` does; TorchTitan calls SDPA
    limited to its flash, efficient and math backends (flash first).
    """
    if framework in ("megatron", "nemo"):
        return "cudnn" if hopper else "flash2"
    if framework in ("neox", "deepspeed", "megatron-deepspeed", "llm-foundry"):
        return "flash2"
    if framework == "torchtitan":
        return "sdpa_flash"
    return ""


def _interp(seq: float, values: tuple, seqs: tuple = _FIGURE_SEQ) -> float:
    """A table's value at ``seq`` (log-linear between its sequence lengths, its ends held)."""
    x = math.log2(max(seq, 1.0))
    xs = [math.log2(s) for s in seqs]
    if x <= xs[0]:
        return float(values[0])
    if x >= xs[-1]:
        return float(values[-1])
    i = bisect.bisect_right(xs, x) - 1
    f = (x - xs[i]) / (xs[i + 1] - xs[i])
    return float(values[i] + f * (values[i + 1] - values[i]))


def causal_fraction(seq: float) -> float:
    """A causal FlashAttention-2 call's time over a non-causal one's at ``seq``."""
    return 0.5 * _interp(seq, _H100_FLASH2_NONCAUSAL_FWD) / _interp(seq, _H100_TFLOPS["fwd"]["flash2"])


@dataclass(frozen=True)
class Relative:
    """``impl``'s time over the measured kernel's at one shape, and what the answer should say."""

    ratio: float
    figure: bool            # False: no kernel figure compares the two (costed at 1.0)
    note: str


def _figure_speed(impl: str, direction: str, seq: float) -> Optional[float]:
    """The paper's TFLOP/s of ``impl`` over FlashAttention-2's on an H100 (None: no figure)."""
    table = _H100_TFLOPS[direction].get(impl)
    if table is None:
        return None
    return _interp(seq, table) / _interp(seq, _H100_TFLOPS[direction]["flash2"])


def _lent_speed(impl: str, direction: str, seq: float) -> Optional[float]:
    """FlashAttention-2's time over ``impl``'s on the lent H100 (None: not measured there)."""
    table = _H100_LENT_MS[direction].get(impl)
    if table is None:
        return None
    return _interp(seq, _H100_LENT_MS[direction]["flash2"], _LENT_SEQ) / _interp(seq, table, _LENT_SEQ)


def _speed(impl: str, direction: str, seq: float, hopper: bool) -> Optional[float]:
    """Throughput of ``impl`` relative to FlashAttention-2's at ``seq`` (None: no figure)."""
    impl = SAME_KERNEL.get(impl, impl)
    if impl == "flash2":
        return 1.0
    if not hopper:
        return _A100_CUDNN_SPEED_VS_FLASH2 if impl == "cudnn" else None
    figure, lent = _figure_speed(impl, direction, seq), _lent_speed(impl, direction, seq)
    if figure is None or lent is None:
        return lent if figure is None else figure
    w = (math.log2(max(seq, 1.0)) - math.log2(_FIGURE_FULL_TO_SEQ)) / (
        math.log2(_LENT_FULL_FROM_SEQ) - math.log2(_FIGURE_FULL_TO_SEQ))
    w = min(max(w, 0.0), 1.0)
    return (1.0 - w) * figure + w * lent


def relative_seconds(impl: str, measured: Measured, direction: str, seq: float, hopper: bool) -> Relative:
    """``impl``'s causal time over the time ``measured``'s samples give at sequence ``seq``."""
    ratio = 1.0
    notes = []
    if not measured.causal:
        ratio *= causal_fraction(seq)
    if SAME_KERNEL.get(impl, impl) == SAME_KERNEL.get(measured.impl, measured.impl):
        return Relative(ratio, True, "")
    mine, theirs = _speed(impl, direction, seq, hopper), _speed(measured.impl, direction, seq, hopper)
    if mine is None or theirs is None:
        notes.append(f"no kernel figure relates {impl} to {measured.impl} on this GPU; "
                     f"costed as {measured.impl}")
        return Relative(ratio, False, "; ".join(notes))
    return Relative(ratio * theirs / mine, True, "; ".join(notes))


def is_hopper_or_newer(gpu_tflops: Mapping[str, float]) -> bool:
    """Hopper and newer carry FP8 tensor cores; the A100 does not (its bundle has no fp8 peak)."""
    return "fp8" in gpu_tflops


@dataclass(frozen=True)
class AttentionCost:
    """How a job's fused attention is costed on one bundle: the operator whose samples answer,
    each direction's multiplier of that operator's time, and what the answer should say."""

    impl: str                # the kernel the job runs ("" = nobody said: the bundle's own)
    operator: str            # flash_atten, or flash_atten_<impl> where the bundle timed it
    forward_ratio: float
    backward_ratio: float
    warnings: tuple[str, ...] = ()


def own_operator(impl: str) -> str:
    """The operator a bundle's samples of ``impl`` itself are filed under."""
    return f"flash_atten_{impl}"


def attention_cost(impl_key: str, framework: str, seq: float, bundle_name: str,
                   source: Mapping[str, object], has_model: Callable[[str], bool],
                   gpu_tflops: Mapping[str, float], gpu_name: str) -> AttentionCost:
    """Cost rule for a job's fused attention (``impl_key``: ``model.attention_impl``) at sequence
    length ``seq`` per attention block on a bundle; ``has_model(operator)`` says whether the bundle
    holds that operator's samples.  Raises ValueError for a kernel the GPU cannot run."""
    hopper = is_hopper_or_newer(gpu_tflops)
    impl = impl_key or default_impl(framework, hopper)
    if impl in HOPPER_ONLY and not hopper:
        raise ValueError(f"{impl} (FlashAttention-3) runs on Hopper GPUs only; this platform's GPU "
                         f"is {gpu_name}")
    if impl == "triton" and hopper and framework in PRE_HOPPER_TRITON_FRAMEWORKS:
        # No kernel figure has the pre-MLIR kernel; the nearest measured one is the same algorithm
        # with the same instructions.  (Off Hopper nothing changes: no figure relates Triton to
        # the measured kernel there, so it is costed as that kernel.)
        cost = attention_cost("flash2", "", seq, bundle_name, source, has_model, gpu_tflops, gpu_name)
        said = (f"attention kernel triton of {framework} is FlashAttention in pre-MLIR Triton "
                "(triton_pre_mlir), which has no Hopper instructions: costed as FlashAttention-2, "
                "the same algorithm without them")
        return AttentionCost(impl, cost.operator, cost.forward_ratio, cost.backward_ratio,
                             (said,) + cost.warnings)
    if impl and has_model(own_operator(impl)):
        return AttentionCost(impl, own_operator(impl), 1.0, 1.0)
    measured = measured_impl(bundle_name, source)
    if measured is None:
        notes = ()
        if impl:
            notes = (f"bundle {bundle_name} does not say which attention kernel its flash_atten samples "
                     f"timed; {impl} (model.attention_impl) costed as those samples",)
        return AttentionCost(impl, "flash_atten", 1.0, 1.0, notes)
    impl = impl or measured.impl
    fwd = relative_seconds(impl, measured, "fwd", seq, hopper)
    bwd = relative_seconds(impl, measured, "bwd", seq, hopper)
    notes = []
    if SAME_KERNEL.get(impl, impl) != SAME_KERNEL.get(measured.impl, measured.impl):
        how = (f"× {fwd.ratio:.2f} forward, × {bwd.ratio:.2f} backward of {measured.impl}'s time "
               "(kernel figures, docs/modelling.md §1)") if fwd.figure else fwd.note
        notes.append(f"attention kernel {impl} was not measured on bundle {bundle_name} (its "
                     f"flash_atten samples timed {measured.impl}); costed {how}")
        if bwd.note and bwd.figure:
            notes.append(bwd.note)
    return AttentionCost(impl, "flash_atten", fwd.ratio, bwd.ratio, tuple(notes))
