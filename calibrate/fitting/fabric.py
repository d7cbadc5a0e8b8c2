"""A platform's ``[fabric]`` table from what ``perf-calibrate fabric`` wrote (``SAMPLES/fabric.toml``).

Each row is one group shape and message size, timed on one group alone and on every group of the
allocation at once (calibrate/fabric.py).  The platform carries one figure for collectives between
nodes: for each group shape that spans nodes, concurrent / alone at its largest message (where
bandwidth, and so the sharing, decides the time), and the median over the shapes; never below 1
(sharing cannot speed a collective up: a ratio under 1 is timing noise).  Shapes inside one node
are not carried: the collective bundle measured them on links no other group uses.  No torch here.
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any, Mapping

from predictor.network import MAX_FABRIC_SLOWDOWN

from ..errors import CalibrationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FABRIC_FILE = "fabric.toml"
_ROW_KEYS = ("entries", "group_nodes", "group_gpus_per_node", "groups", "alone_us", "concurrent_us")


def _positive(row: Mapping[str, Any], key: str, where: str) -> float:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise CalibrationError(f"{where}: {key} must be a positive number, got {v!r}")
    return float(v)


def platform_fabric_table(path: Path) -> dict[str, Any] | None:
    """The ``[fabric]`` table of the measurements in ``path``, or None when none of its groups
    spans nodes."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read fabric measurements: {exc}") from None
    meta, rows = raw.get("fabric"), raw.get("rows", [])
    if not isinstance(meta, Mapping) or not isinstance(rows, list):
        raise CalibrationError(f"{path}: not a perf-calibrate fabric file ([fabric] and [[rows]])")
    largest: dict[tuple[float, float], tuple[float, float]] = {}    # shape -> (entries, ratio)
    for i, row in enumerate(rows):
        where = f"{path}: rows[{i}]"
        if not isinstance(row, Mapping):
            raise CalibrationError(f"{where}: must be a table")
        v = {k: _positive(row, k, where) for k in _ROW_KEYS}
        if v["group_nodes"] < 2:
            continue
        shape = (v["group_nodes"], v["group_gpus_per_node"])
        ratio = v["concurrent_us"] / v["alone_us"]
        if v["entries"] >= largest.get(shape, (0.0, 0.0))[0]:
            largest[shape] = (v["entries"], ratio)
    if not largest:
        return None
    ratios = [r for _, r in largest.values()]
    slowdown = min(MAX_FABRIC_SLOWDOWN, max(1.0, statistics.median(ratios)))
    shapes = ", ".join(f"{int(n)}x{int(g)}: x{r:.3f}" for (n, g), (_, r) in sorted(largest.items()))
    return {"between_nodes_slowdown": round(slowdown, 4),
            "source": (f"perf-calibrate fabric on {meta.get('device_name', '?')}, {meta.get('nodes', '?')} nodes "
                       f"x {meta.get('gpus_per_node', '?')}: median over group shapes of concurrent / alone at "
                       f"the largest message ({shapes})")}


__all__ = ["FABRIC_FILE", "platform_fabric_table"]
