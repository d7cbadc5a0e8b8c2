"""Host-side costs: what the CPU spends issuing each operator, apart from what the device spends.

A GPU runs asynchronously: the host (Python, the framework's dispatcher, autograd, the kernel
launch) queues work and the device executes it.  When the host issues a micro-batch's operators
more slowly than the device executes them, the device waits, and the operator samples (device
time between CUDA events) miss that time.  This module measures the host side on its own:

* per operator and direction, the wall-clock the host spends *issuing* one call at a tiny shape,
  with the device idle enough that the launch queue never fills (so nothing blocks the host);
* ``launch_us``: issuing one trivial kernel (``add_`` on a one-element tensor), no autograd;
* ``sync_us``: one ``synchronize`` round trip with an empty queue (what a blocking p2p,
  a loss-scale check or an ``.item()`` costs at least);
* ``device_floor_us``: device time of one trivial kernel between CUDA events (a launch floor);
* ``layer_us`` / ``model_fixed_us``: host time to issue the forward and backward of one whole
  transformer layer of the GPT-shaped model (calibrate/gpt_model.py) at a tiny shape, as the
  slope over 1 and 4 layers, and the intercept (embedding, head, loss, autograd engine entry);
  ``layer_forward_us`` / ``model_fixed_forward_us`` the same for the forward alone.

On a CPU device the host *is* the device: the figures are the whole tiny-op cost there.
The result is written into a sample store's ``host.toml`` and carried into the fitted platform's
``[host]`` table, with where and how it was measured.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from predictor.fp8 import FP8_LINEARS
from predictor.operators import CALIBRATED

from .kernels import build_kernel
from .plans import ModelPoint, operator_shapes
from .timing import synchronize

# A shape small enough that every kernel is launch-bound on any GPU (≈ 1–10 µs of device work).
_TINY = ModelPoint(mp=1, b=1, heads=2, seq=32, hidden=64, vocab=256)
_TINY_OPTIMIZER_PARAMS = 4096


@dataclass
class HostCosts:
    """Host issue time per operator direction (µs per call) and the launch/sync figures."""

    device: str
    device_name: str
    precision: str
    operators: dict[str, dict[str, float]] = field(default_factory=dict)   # op -> direction -> µs
    launch_us: float = 0.0
    sync_us: float = 0.0
    device_floor_us: float = 0.0
    layer_us: float = 0.0
    model_fixed_us: float = 0.0
    layer_forward_us: float = 0.0
    model_fixed_forward_us: float = 0.0
    calls: int = 0
    torch_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "device_name": self.device_name, "precision": self.precision,
                "launch_us": round(self.launch_us, 3), "sync_us": round(self.sync_us, 3),
                "device_floor_us": round(self.device_floor_us, 3), "layer_us": round(self.layer_us, 3),
                "model_fixed_us": round(self.model_fixed_us, 3),
                "layer_forward_us": round(self.layer_forward_us, 3),
                "model_fixed_forward_us": round(self.model_fixed_forward_us, 3), "calls": self.calls,
                "torch": self.torch_version,
                "operators": {op: {d: round(us, 3) for d, us in dirs.items()}
                              for op, dirs in sorted(self.operators.items())}}


def _issue_us(fn: Callable[[], object], device: str, calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the host wall-clock per call for ``calls`` back-to-back calls.

    The queue is drained before each round, and ``calls`` is kept well under the CUDA launch
    queue's depth (about 1,000 kernels), so the host never blocks on the device while timed.
    """
    per_round = []
    for _ in range(rounds):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - t0) / calls)
    synchronize(device)
    return statistics.median(per_round) * 1e6


def _shapes() -> dict[str, dict[str, int]]:
    shapes = dict(operator_shapes(_TINY))
    shapes.update(operator_shapes(_TINY, gated=True))
    shapes["optimizer"] = {"params": _TINY_OPTIMIZER_PARAMS}
    return shapes


def measure_host_costs(device: str, precision: str, *, ops: Sequence[str] | None = None,
                       calls: int = 50, rounds: int = 9, warmup: int = 5, fp8: bool = False) -> HostCosts:
    """Measure host issue time of every catalog operator (or ``ops``) at a tiny shape; with ``fp8``
    also the FP8 linear GEMMs' calls (``operators["linear1.fp8"]`` ...), whose samples are direct
    ``_scaled_mm`` calls with no autograd (calibrate.kernels), so their host share differs."""
    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    out = HostCosts(device, dev_name, precision, calls=calls, torch_version=torch.__version__)
    shapes = _shapes()
    todo = [(op, precision, op) for op in (ops or sorted(CALIBRATED)) if op in shapes]
    if fp8:
        todo += [(op, "fp8", f"{op}.fp8") for op in sorted(FP8_LINEARS) if not ops or op in ops]
    for op, prec, key in todo:
        kernel = build_kernel(op, shapes[op], prec, device)
        costs = {}
        for direction, fn in kernel.runs.items():
            for _ in range(warmup):
                fn()
            costs[direction] = _issue_us(fn, device, calls, rounds)
        out.operators[key] = costs
        del kernel
    one = torch.zeros(1, device=device)
    out.launch_us = _issue_us(lambda: one.add_(1.0), device, calls, rounds)
    if device == "cuda":
        syncs = []
        for _ in range(rounds * calls // 5):
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            syncs.append(time.perf_counter() - t0)
        out.sync_us = statistics.median(syncs) * 1e6
        floors = []
        for _ in range(rounds * 5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            one.add_(1.0)
            end.record()
            end.synchronize()
            floors.append(start.elapsed_time(end) * 1e3)
        out.device_floor_us = statistics.median(floors)
    for backward in (True, False):
        t1, t4 = (_model_issue_us(layers, device, precision, rounds, backward) for layers in (1, 4))
        slope = max(0.0, (t4 - t1) / 3.0)
        if backward:
            out.layer_us, out.model_fixed_us = slope, max(0.0, t1 - slope)
        else:
            out.layer_forward_us, out.model_fixed_forward_us = slope, max(0.0, t1 - slope)
    return out


def _model_issue_us(layers: int, device: str, precision: str, rounds: int, backward: bool) -> float:
    """Host time to issue one micro-batch's forward (+ backward) of the GPT-shaped model."""
    from predictor.job import TrainingJob

    from .gpt_model import FlatGPT

    job = TrainingJob.from_dict({
        "model": {"layers": layers, "hidden": _TINY.hidden, "heads": _TINY.heads, "seq_len": _TINY.seq,
                  "vocab": _TINY.vocab, "attention": "flash", "pos_emb": "rotary"},
        "layout": {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 1, "micro_batches": 1, "zero_stage": 0,
                   "recompute": "none"},
        "run": {"precision": precision}, "cluster": {"gpus_per_node": 1}})
    model = FlatGPT(job, device, 1)
    ids = torch.randint(0, _TINY.vocab, (_TINY.seq,), device=device)
    if backward:
        return _issue_us(lambda: model.loss(ids, ids).backward(), device, 3, rounds * 2)
    # Forward alone, graph recorded as in training (then dropped): what a stage issues before
    # its backward is due.
    return _issue_us(lambda: model.loss(ids, ids), device, 3, rounds * 2)


__all__ = ["HostCosts", "measure_host_costs"]
