"""Which kernel runs a job's fused attention, and how its time relates to the kernel a bundle timed.

``model.attention_impl`` names the kernel ("" = the framework's default, :func:`default_impl`).
A compute bundle's ``flash_atten`` samples timed one kernel (:func:`measured_impl`); a bundle may
also hold samples of other kernels as operators of their own (``flash_atten_<impl>``, timed by
``perf-calibrate run`` where the partition has them).  A job whose kernel was measured is costed
from its own samples; one whose kernel was not is costed from the measured kernel's time times
the ratio of the two kernels' published throughputs (:func:`relative_seconds`), and the answer
says so.  Every figure here is a kernel micro-benchmark of that mechanism (docs/modelling.md §1,
"Attention kernels").
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
# (backward; the paper plots it without the causal mask).  "triton" is the paper's Triton
# FlashAttention-2 kernel; it has no backward figure.
_FIGURE_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
_H100_TFLOPS = {
    "fwd": {"flash2": (191, 260, 298, 319, 333, 335), "triton": (146, 273, 323, 353, 369, 378),
            "cudnn": (315, 410, 484, 518, 529, 539), "flash3": (292, 423, 521, 579, 602, 616)},
    "bwd": {"flash2": (214, 260, 291, 310, 318, 322), "cudnn": (305, 408, 465, 499, 518, 516),
            "flash3": (316, 424, 501, 542, 559, 561)},
}
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


def _interp(seq: float, values: tuple) -> float:
    """A figure's value at ``seq`` (log-linear between its sequence lengths, its ends held)."""
    x = math.log2(max(seq, 1.0))
    xs = [math.log2(s) for s in _FIGURE_SEQ]
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
    figure: bool            # False: no published figure compares the two (costed at 1.0)
    note: str


def _speed(impl: str, direction: str, seq: float, hopper: bool) -> Optional[float]:
    """TFLOP/s of ``impl`` relative to FlashAttention-2's at ``seq`` (None: no figure)."""
    impl = SAME_KERNEL.get(impl, impl)
    if impl == "flash2":
        return 1.0
    if hopper:
        if impl not in _H100_TFLOPS[direction]:
            direction = "fwd"        # no backward figure (Triton): the forward's ratio
        table = _H100_TFLOPS[direction].get(impl)
        if table is None:
            return None
        return _interp(seq, table) / _interp(seq, _H100_TFLOPS[direction]["flash2"])
    if impl == "cudnn":
        return _A100_CUDNN_SPEED_VS_FLASH2
    return None


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
        notes.append(f"no published kernel figure relates {impl} to {measured.impl} on this GPU; "
                     f"costed as {measured.impl}")
        return Relative(ratio, False, "; ".join(notes))
    if direction == "bwd" and SAME_KERNEL.get(impl, impl) not in _H100_TFLOPS["bwd"] and hopper:
        notes.append(f"{impl}'s backward has no published figure; its forward ratio is used")
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
               "(published kernel figures, docs/modelling.md §1)") if fwd.figure else fwd.note
        notes.append(f"attention kernel {impl} was not measured on bundle {bundle_name} (its "
                     f"flash_atten samples timed {measured.impl}); costed {how}")
        if bwd.note and bwd.figure:
            notes.append(bwd.note)
    return AttentionCost(impl, "flash_atten", fwd.ratio, bwd.ratio, tuple(notes))
