"""The attention kernels a partition has, each callable alone for ``perf-calibrate run``.

``model.attention_impl`` names a kernel (predictor/attention.py); calibration times every one the
device and the installed packages offer, as operator ``flash_atten_<impl>`` beside the default
``flash_atten`` (whatever SDPA picks), and records which ones it could not run and why, so a
bundle says what was measured and a prediction says what was not.

* ``sdpa_flash``, ``sdpa_efficient``, ``cudnn``: PyTorch's SDPA pinned to one backend with
  ``torch.nn.attention.sdpa_kernel`` (FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION);
* ``flash2``: the flash_attn package (2.x), ``flash_attn_func(..., causal=True)``;
* ``flash3``: FlashAttention-3's ``flash_attn_interface`` (Hopper);
* ``triton``: the Triton FlashAttention kernel that llm-foundry's ``attn_impl: triton`` runs
  (``flash_attn.flash_attn_triton``), where importable.

Every kernel is timed causal on (b, heads, l, d) tensors, as the predictor costs it.
"""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

#: The kernels calibration tries, in the order they are reported.
KERNELS = ("cudnn", "flash2", "flash3", "triton", "sdpa_flash", "sdpa_efficient")

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _sdpa(backend_name: str) -> Attention:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


def _bshd(fn: Callable[..., object]) -> Attention:
    """A flash_attn-style kernel takes (b, l, heads, d); ours are (b, heads, l, d)."""
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        if isinstance(out, tuple):      # FA3 returns (out, softmax_lse)
            out = out[0]
        return out.transpose(1, 2)
    return run


def _import_kernel(impl: str) -> Attention:
    """The callable for ``impl``; raises ImportError / AttributeError where it is not installed."""
    if impl == "sdpa_flash":
        return _sdpa("FLASH_ATTENTION")
    if impl == "sdpa_efficient":
        return _sdpa("EFFICIENT_ATTENTION")
    if impl == "cudnn":
        return _sdpa("CUDNN_ATTENTION")
    if impl == "flash2":
        mod = importlib.import_module("flash_attn")
        if not str(getattr(mod, "__version__", "0")).startswith("2"):
            raise ImportError(f"flash_attn {getattr(mod, '__version__', '?')} is not FlashAttention-2")
        return _bshd(mod.flash_attn_func)
    if impl == "flash3":
        return _bshd(importlib.import_module("flash_attn_interface").flash_attn_func)
    if impl == "triton":
        fn = importlib.import_module("flash_attn.flash_attn_triton").flash_attn_func

        def triton_run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # Positional (q, k, v, bias, causal): this kernel takes no keyword arguments.
            return fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, True).transpose(1, 2)
        return triton_run
    raise KeyError(impl)


@dataclass
class KernelSurvey:
    """Which kernels run here (with their callables) and which do not (with the reason)."""

    available: dict[str, Attention] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    default: str = ""          # the kernel SDPA picks on its own (what ``flash_atten`` times)

    def missing_lines(self) -> list[str]:
        return [f"{impl}: {why}" for impl, why in self.missing.items()]


# torch._fused_sdp_choice's answer, by SDPBackend value, as model.attention_impl names it.
_SDPA_CHOICE = {1: "sdpa_flash", 2: "sdpa_efficient", 3: "cudnn", 0: "math"}


def survey(device: str, dtype: torch.dtype = torch.float16) -> KernelSurvey:
    """Try every kernel of :data:`KERNELS` once, forward and backward, at a tiny causal shape."""
    out = KernelSurvey()
    dev = torch.device(device)
    if dev.type == "cpu":
        dtype = torch.float32        # torch's CPU kernels; half precision adds nothing here
    q, k, v = (torch.randn(1, 2, 128, 64, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    try:
        out.default = _SDPA_CHOICE.get(int(torch._fused_sdp_choice(q, k, v, is_causal=True)), "")
    except (AttributeError, RuntimeError):   # a torch without the private chooser
        out.default = ""
    for impl in KERNELS:
        try:
            fn = _import_kernel(impl)
            with warnings.catch_warnings():
                # SDPA warns about each backend it turns down before it fails; the reason is kept.
                warnings.simplefilter("ignore")
                fn(q, k, v).float().sum().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        except (ImportError, AttributeError) as exc:
            out.missing[impl] = f"not installed ({exc})"
        except (RuntimeError, TypeError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            out.missing[impl] = f"does not run on {device} ({first[:160]})"
        else:
            out.available[impl] = fn
    return out


def kernel(impl: str) -> Attention:
    """The callable of one kernel (CalibrationError-free: the survey decides what is asked for)."""
    return _import_kernel(impl)
