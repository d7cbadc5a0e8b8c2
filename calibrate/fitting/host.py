"""A platform's ``[host]`` table from what ``perf-calibrate host`` wrote (``SAMPLES/host.toml``).

``perf-calibrate host`` records microseconds per call (calibrate/host.py); the platform carries
seconds (predictor/host.py).  ``perf-calibrate fit`` carries a store's host.toml into the platform
it fits, and scripts/build_platforms.py the lent H100's into dgx-h100, through
:func:`platform_host_table`.  No torch here: ``perf-calibrate fit`` runs without it.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Mapping

from ..errors import CalibrationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HOST_FILE = "host.toml"

# One transformer layer's forward, operator by operator (the default layer of the reference
# model: LayerNorm, flash attention, GeLU): the forward's share of a layer's issue time, which
# full recomputation issues again.
_LAYER_FORWARD_CALLS = (("layernorm", 2), ("linear1", 1), ("rope", 1), ("flash_atten", 1), ("linear2", 1),
                        ("res_add", 2), ("linear3", 1), ("gelu", 1), ("linear4", 1))


def _us(value: Any, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CalibrationError(f"{where}: {key} must be a number of microseconds >= 0, got {value!r}")
    return float(value)


def platform_host_table(path: Path, *, per_call: bool = True) -> dict[str, Any]:
    """The ``[host]`` table (seconds) of the host costs in ``path``.

    ``per_call``: keep ``[host.operators]``, the per-call issue times the predictor takes half of
    off each call-timed sample; a store timed with ``--timing device`` holds no host time in its
    samples, so its platform must not carry them.  The forward's share of a layer is the sum of
    its operators' forward calls where all were measured, else the measured whole forward.
    """
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CalibrationError(f"{where}: cannot read host costs: {exc}") from None
    h = raw.get("host")
    if not isinstance(h, Mapping):
        raise CalibrationError(f"{where}: no [host] table (write it with perf-calibrate host)")
    ops = h.get("operators", {})
    if not isinstance(ops, Mapping) or not all(isinstance(d, Mapping) for d in ops.values()):
        raise CalibrationError(f"{where}: [host.operators] must be a table of tables")
    per_op = {op: {d: _us(us, where, f"host.operators.{op}.{d}") * 1e-6 for d, us in dirs.items()}
              for op, dirs in ops.items()}
    table: dict[str, Any] = {"layer_seconds": _us(h.get("layer_us"), where, "host.layer_us") * 1e-6}
    if all("fwd" in per_op.get(name, {}) for name, _ in _LAYER_FORWARD_CALLS):
        table["layer_forward_seconds"] = sum(per_op[name]["fwd"] * n for name, n in _LAYER_FORWARD_CALLS)
    elif h.get("layer_forward_us"):
        table["layer_forward_seconds"] = _us(h["layer_forward_us"], where, "host.layer_forward_us") * 1e-6
    table["micro_batch_seconds"] = _us(h.get("model_fixed_us"), where, "host.model_fixed_us") * 1e-6
    table["launch_seconds"] = _us(h.get("launch_us"), where, "host.launch_us") * 1e-6
    if per_call:
        table["operators"] = per_op
    table["source"] = (f"perf-calibrate host on {h.get('device_name', '?')} (torch {h.get('torch', '?')}, "
                       f"{h.get('precision', '?')})")
    return table


__all__ = ["HOST_FILE", "platform_host_table"]
