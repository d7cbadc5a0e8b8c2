"""The host as a resource of its own: what the CPU spends issuing a micro-batch's work.

The operator regressors give device time.  A GPU cannot run ahead of the host that issues its
kernels (Python, the framework's module code, autograd, kernel and collective launches), so a
micro-batch on a stage takes at least as long as its host takes to issue it.  Small layers,
small micro-batches and fast GPUs make training host-bound: the time per micro-batch then barely
changes with the micro-batch size.

A platform carries the measured host costs in ``platform.toml``::

    [host]
    layer_seconds = 1.83e-3            # issue forward + backward of one transformer layer
    layer_forward_seconds = 3.2e-4     # of which the forward (what full recomputation repeats)
    micro_batch_seconds = 1.39e-3      # per micro-batch and stage: embedding/head/loss, engine entry
    launch_seconds = 9.6e-6            # one more kernel or collective launch (TP all-reduces)
    source = "perf-calibrate host on ..., torch ..., date"
    [host.operators.linear1]           # one isolated call's host issue time, per direction
    fwd = 1.9e-5
    bwd = 1.2e-4

The operator samples were timed between CUDA events around one isolated call, so at small shapes
they measure the host's issue time, not the device's work (the device waits for the launch).
A sample is max(host issue, host lead-in + device work), the lead-in (what the host does before
the first kernel starts) lying between nothing and the whole call's host time.  With
``[host.operators]`` the predictor takes an operator's device time as its sample time less half
that call's host time, never below its roofline (the physical floor), with both ends in the
interval, and lets the host model above account for the issuing once, per micro-batch.

(``perf-calibrate host`` measures them; ``calibrate/host.py`` says how).  A platform without a
``[host]`` table has no host term: its device time stands alone, as before the table existed.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from .errors import BundleError

if TYPE_CHECKING:
    from .platform import FittedTerms

_KEYS = ("layer_seconds", "layer_forward_seconds", "micro_batch_seconds", "launch_seconds")
_OPTIONAL = {"launch_seconds": 0.0, "layer_forward_seconds": -1.0}
# Host costs are per-call overheads of microseconds to milliseconds; a value past this is a unit
# mistake (µs written as seconds), not a slow CPU.
_MAX_SECONDS = 1.0


@dataclass(frozen=True)
class HostCosts:
    """Measured host issue costs, in seconds (see the module docstring)."""

    layer_seconds: float
    micro_batch_seconds: float
    launch_seconds: float = 0.0
    layer_forward_seconds: float = -1.0     # < 0: not measured apart from the whole layer
    source: str = ""
    operators: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # op -> direction -> s

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "HostCosts":
        if not isinstance(d, Mapping):
            raise BundleError(f"{where}: [host] must be a table")
        unknown = set(d) - set(_KEYS) - {"source", "operators"}
        if unknown:
            raise BundleError(f"{where}: unknown [host] keys {sorted(unknown)} (known: {', '.join(_KEYS)}, source)")
        values = {}
        for key in _KEYS:
            v = d.get(key, _OPTIONAL.get(key))
            if key in _OPTIONAL and v == _OPTIONAL[key]:
                values[key] = float(v)
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or not 0.0 <= v <= _MAX_SECONDS:
                raise BundleError(f"{where}: host.{key} must be a number of seconds in [0, {_MAX_SECONDS}]"
                                  f", got {v!r}")
            values[key] = float(v)
        source = d.get("source", "")
        if not isinstance(source, str):
            raise BundleError(f"{where}: host.source must be a string")
        ops = d.get("operators", {})
        if not isinstance(ops, Mapping):
            raise BundleError(f"{where}: [host.operators] must be a table of tables")
        per_op: dict[str, dict[str, float]] = {}
        for op, dirs in ops.items():
            if not isinstance(dirs, Mapping):
                raise BundleError(f"{where}: host.operators.{op} must be a table of directions")
            for direction, v in dirs.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                        or not 0.0 <= v <= _MAX_SECONDS:
                    raise BundleError(f"{where}: host.operators.{op}.{direction} must be a number of "
                                      f"seconds in [0, {_MAX_SECONDS}], got {v!r}")
                per_op.setdefault(str(op), {})[str(direction)] = float(v)
        return cls(source=source, operators=per_op, **values)

    def call_seconds(self, op: str, direction: str, precision: str = "") -> float:
        """Host time of one isolated call of ``op`` (0 when not measured).  FP8 GEMM samples are
        direct calls with no autograd, measured apart as ``operators["<op>.fp8"]``."""
        key = f"{op}.fp8" if precision == "fp8" else op
        return self.operators.get(key, {}).get(direction, 0.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["operators"] = {op: dict(dirs) for op, dirs in self.operators.items()}
        return d

    def stage_seconds(self, layers: int, collectives: float, recompute: str,
                      fitted: "FittedTerms | None" = None) -> float:
        """Host time to issue one micro-batch's forward and backward on a stage of ``layers``.

        ``collectives`` counts the launches beyond a plain layer's kernels (TP all-reduces);
        full recomputation issues every layer's forward a second time, in the backward.
        ``fitted``: the platform's ``[fitted]`` terms (perf-calibrate validate --fit), if any: the
        per-layer, per-micro-batch and launch costs each times its own scale, all times ``host_scale``.
        """
        layer = self.layer_seconds
        if recompute == "full":
            # Without a forward figure of its own, the whole layer bounds what the repeat adds.
            layer += self.layer_forward_seconds if self.layer_forward_seconds >= 0 else self.layer_seconds
        if fitted is None:
            return layers * layer + self.micro_batch_seconds + collectives * self.launch_seconds
        # [fitted] (perf-calibrate validate --fit): each measured cost its own scale, and the one
        # host scale of files written before the costs were fitted apart over all of it.
        return fitted.host_scale * (layers * layer * fitted.host_layer_scale
                                    + self.micro_batch_seconds * fitted.host_micro_batch_scale
                                    + collectives * self.launch_seconds * fitted.host_launch_scale)


__all__ = ["HostCosts"]
