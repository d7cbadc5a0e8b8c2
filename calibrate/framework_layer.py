"""How much more host time a framework's own transformer layer takes to issue than perfcast's.

``[host] layer_seconds`` is the issue time of the GPT-shaped reference layer ``perf-calibrate
host`` times (:mod:`calibrate.gpt_model`: plain tensors and functional calls, SDPA attention).  A
framework's layer issues the same GEMMs through its own modules: Megatron's (the layer
Megatron-DeepSpeed and GPT-NeoX run; Megatron-core's "local" spec is the same design without
Transformer Engine) goes through column- and row-parallel linear modules and their autograd
functions, a scale-mask-softmax module on unfused attention scores, three dropouts under an RNG
tracker's fork, and bias-dropout-add functions.  :func:`framework_layer_costs` times both layers
at the same tiny shape (hidden 64, 2 heads, 32 tokens: the work itself microseconds) on one
thread, interleaved, over 1, 2, 4 and 8 layers; the difference of the per-layer slopes, forward +
backward and forward alone, is what a Megatron layer adds to the reference's issue time
(docs/modelling.md §2, ``predictor.host.MEGATRON_LAYER_EXTRA_SECONDS``).

Needs the ``megatron-core`` package (no dependency of perfcast: only this measurement runs it).  On
a CPU it runs as on a GPU but for three CUDA calls it makes around the layer, each given a CPU
equivalent here without patching torch: the RNG tracker's state (a CPU generator's), its fork's
get/set of the device RNG state (the CPU's), and the attention scores' buffer (allocated on the
CPU up front, so the buffer never asks for a CUDA device).  Megatron's fused kernels (scale-mask-
softmax, bias-GeLU, bias-dropout-add) are CUDA-only or TorchScript fusions that fuse on a GPU: on
a CPU their unfused fallbacks issue more operators, counted by :func:`operator_counts`.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
from typing import Iterator, Sequence

import torch
from torch import nn

from .host import _TINY
from .stack_host import _interleaved, _slope, _Wrapped, one_rank_group

LAYERS = (1, 2, 4, 8)
#: Megatron-LM's (and Megatron-DeepSpeed's) defaults for --hidden-dropout and --attention-dropout.
MEGATRON_DROPOUT = 0.1
_RNG = "model-parallel-rng"        # megatron.core.tensor_parallel.random's tracker name


def megatron_modules():  # noqa: ANN202 - the megatron.core package
    """Megatron-core's ``parallel_state`` and ``tensor_parallel.random``; a RuntimeError saying how
    to install it where it is missing."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as e:
        raise RuntimeError("the megatron-core package is not installed (pip install --no-deps "
                           "megatron-core): its transformer layer is what is measured") from e
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mp_random
    return parallel_state, mp_random


@contextlib.contextmanager
def _cpu_rng_fork(mp_random) -> Iterator[None]:  # noqa: ANN001
    """Megatron's tracker swaps the device generator's state in and out around each dropout; on a
    CPU the device generator is the CPU's."""
    saved = (mp_random._get_cuda_rng_state, mp_random._set_cuda_rng_state)
    mp_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    try:
        yield
    finally:
        mp_random._get_cuda_rng_state, mp_random._set_cuda_rng_state = saved


def _setup(device: str):  # noqa: ANN202 - megatron.core.tensor_parallel.random
    """One rank, TP = PP = 1, the tracker seeded and the scores' buffer on ``device``; Megatron's
    RNG module."""
    one_rank_group(device)
    parallel_state, mp_random = megatron_modules()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    tracker = mp_random.get_cuda_rng_tracker()
    if _RNG not in tracker.get_states():
        if device == "cuda":
            mp_random.model_parallel_cuda_manual_seed(1234)
        else:
            tracker.set_states({_RNG: torch.Generator().manual_seed(1234).get_state()})
    if device != "cuda":
        # The fork checks that the CPU generator did not move inside it and logs a warning when it
        # did, which on a CPU (the device generator being the CPU's) every dropout does: the check
        # stays, as on a GPU, and the log line (not written on a GPU) is dropped.
        logging.getLogger(mp_random.__name__).setLevel(logging.ERROR)
        # DotProductAttention takes its scores' buffer from here; one already large enough is reused.
        buf = parallel_state.get_global_memory_buffer().buffer
        buf[("mpu", torch.float32)] = torch.empty(1 << 16, dtype=torch.float32)
    return mp_random


class MegatronLayers(nn.Module):
    """``n`` Megatron-core ``TransformerLayer`` s of the local (non-TE) GPT spec at the reference
    layer's tiny shape, with Megatron's default dropouts and an explicit causal mask (what
    Megatron-DeepSpeed's data loader hands each layer); takes and returns ``(tokens, hidden)``."""

    input_requires_grad = True     # as a layer's input inside a model (as the reference's)

    def __init__(self, n: int, device: str = "cpu", dropout: float = MEGATRON_DROPOUT,
                 forward_only: bool = False):
        super().__init__()
        self._mp_random = _setup(device)
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.spec_utils import build_module
        from megatron.core.transformer.transformer_config import TransformerConfig
        cfg = TransformerConfig(num_layers=n, hidden_size=_TINY.hidden, num_attention_heads=_TINY.heads,
                                use_cpu_initialization=True, params_dtype=torch.float32,
                                hidden_dropout=dropout, attention_dropout=dropout)
        spec = get_gpt_layer_local_spec()
        self.layers = nn.ModuleList(build_module(spec, config=cfg, layer_number=i + 1) for i in range(n)).to(device)
        self.register_buffer("mask", torch.triu(torch.ones(1, 1, _TINY.seq, _TINY.seq, device=device),
                                                diagonal=1).bool())
        self.width = _TINY.hidden
        self.forward_only = forward_only
        self._cpu = device != "cuda"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.view(_TINY.seq, 1, self.width)          # Megatron's [sequence, batch, hidden]
        with _cpu_rng_fork(self._mp_random) if self._cpu else contextlib.nullcontext():
            for layer in self.layers:
                h = layer(h, attention_mask=self.mask)[0]
        return h.view(_TINY.seq, self.width)


def framework_layer_costs(layers: Sequence[int] = LAYERS, repeats: int = 30, rounds: int = 8,
                          device: str = "cpu", dropout: float = MEGATRON_DROPOUT) -> dict:
    """Per-layer slopes (seconds) of forward + backward and of forward alone, the reference layer
    and Megatron-core's, interleaved; ``extra_seconds`` and ``forward_extra_seconds``: Megatron's
    less the reference's; ``ratio`` and ``forward_ratio``: Megatron's over the reference's."""
    import warnings
    torch.manual_seed(0)
    models: dict = {}
    for n in layers:
        models[("reference", n)] = _Wrapped(n, "none", layer="gpt", device=device)
        models[("reference_forward", n)] = _Wrapped(n, "none", forward_only=True, layer="gpt", device=device)
        models[("megatron", n)] = MegatronLayers(n, device, dropout)
        models[("megatron_forward", n)] = MegatronLayers(n, device, dropout, forward_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # Megatron's "no Apex / no fused kernel" notices
        per = _interleaved(models, repeats, rounds, device)
    ns = list(layers)
    slope = {k: _slope(ns, [per[(k, n)] for n in ns])
             for k in ("reference", "reference_forward", "megatron", "megatron_forward")}
    extra = _extra(slope)
    return {"layer_seconds": slope, "dropout": dropout,
            "extra_seconds": extra["extra_seconds"], "forward_extra_seconds": extra["forward_extra_seconds"],
            "ratio": slope["megatron"] / slope["reference"],
            "forward_ratio": slope["megatron_forward"] / slope["reference_forward"],
            "per_config": {f"{k}_{n}": s for (k, n), s in per.items()}}


def operator_counts(device: str = "cpu", dropout: float = MEGATRON_DROPOUT) -> dict[str, int]:
    """ATen operators one layer's forward + backward dispatches, the reference's and Megatron's
    (views included): what the slopes' ratio is made of besides Python."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            self.n += 1
            return func(*args, **(kwargs or {}))

    out = {}
    for name, model in (("reference", _Wrapped(1, "none", layer="gpt", device=device)),
                        ("megatron", MegatronLayers(1, device, dropout))):
        x = torch.randn(_TINY.seq, _TINY.hidden, device=device, requires_grad=True)
        model(x).sum().backward()                       # first call: lazy set-up outside the count
        with _Count() as c:
            model(x).sum().backward()
        out[name] = c.n
    return out


def _extra(slope: dict) -> dict:
    return {"extra_seconds": slope["megatron"] - slope["reference"],
            "forward_extra_seconds": slope["megatron_forward"] - slope["reference_forward"]}


def pooled_extra(runs: Sequence[dict]) -> dict:
    """The shipped figures from committed runs (each :func:`framework_layer_costs`' output): the
    median over runs of each difference of slopes, and of each ratio for reference."""
    if not runs:
        raise ValueError("pooled_extra needs at least one run")
    extras = [_extra(r["layer_seconds"]) for r in runs]
    return {"extra_seconds": statistics.median(e["extra_seconds"] for e in extras),
            "forward_extra_seconds": statistics.median(e["forward_extra_seconds"] for e in extras),
            "ratio": statistics.median(r["ratio"] for r in runs),
            "forward_ratio": statistics.median(r["forward_ratio"] for r in runs), "runs": len(runs)}
