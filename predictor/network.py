"""The analytic collective model: ring algorithms over intra-node and inter-node links.

Used alone for topologies that were never measured (and for spec-only platforms), and as the
normaliser the measured-collective regressors learn a ratio against.  For a calibrated platform
the link figures are *effective* ones fitted from its own measured collectives
(:func:`fit_links`), so "analytic" still means "scaled by this machine's measured link speeds".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

import numpy as np

from .errors import BundleError


@dataclass(frozen=True)
class Links:
    """Link figures of one platform's network.

    ``intra_gbps`` is the bus bandwidth one GPU reaches inside a node (GB/s); ``nic_gbps`` the
    bandwidth of one network adapter, of which a node has ``nics_per_node``; a ring that leaves a
    node with g of its GPUs can use min(g, nics_per_node) adapters at once.
    """

    intra_gbps: float
    intra_latency_us: float
    nic_gbps: float
    nics_per_node: int
    inter_latency_us: float
    source: str = "spec"          # spec | fitted

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Links":
        return cls(**{k: d[k] for k in ("intra_gbps", "intra_latency_us", "nic_gbps",
                                         "nics_per_node", "inter_latency_us")},
                   source=str(d.get("source", "spec")))


# A slowdown past this is a mis-measurement (a failing link, a unit mistake), not sharing.
MAX_FABRIC_SLOWDOWN = 10.0


@dataclass(frozen=True)
class FabricSharing:
    """``[fabric]``: how much longer a collective between nodes takes beside the job's other groups
    than alone, as calibration times it (``perf-calibrate fabric``: the median over group shapes,
    at the largest messages, of concurrent / alone)."""

    between_nodes_slowdown: float
    source: str = ""

    @classmethod
    def from_dict(cls, d: Mapping, where: str) -> "FabricSharing":
        if not isinstance(d, Mapping):
            raise BundleError(f"{where}: [fabric] must be a table")
        unknown = sorted(set(d) - {"between_nodes_slowdown", "source"})
        if unknown:
            raise BundleError(f"{where}: unknown [fabric] keys {unknown} (known: between_nodes_slowdown, source)")
        v = d.get("between_nodes_slowdown")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1.0 <= v <= MAX_FABRIC_SLOWDOWN:
            raise BundleError(f"{where}: fabric.between_nodes_slowdown must be a number in "
                              f"[1, {MAX_FABRIC_SLOWDOWN:g}], got {v!r}")
        source = d.get("source", "")
        if not isinstance(source, str):
            raise BundleError(f"{where}: fabric.source must be a string")
        return cls(float(v), source)


def _traffic(kind: str, entries: np.ndarray, n: np.ndarray, bytes_per_entry: float) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each rank sends and the number of latency-bound steps, per ring algorithm."""
    size = entries * bytes_per_entry
    if kind == "allreduce":
        return 2.0 * (n - 1) / n * size, 2.0 * (n - 1)
    if kind == "allgather":          # entries = the per-rank shard
        return (n - 1) * size, n - 1.0
    if kind == "reduce_scatter":     # entries = the full tensor
        return (n - 1) / n * size, n - 1.0
    if kind == "p2p":
        return size, 0.0 * n + 1.0
    raise ValueError(f"unknown collective {kind!r}")


def ring_seconds(links: Links, kind: str, entries: float, nodes: float, gpus_per_node: float,
                 bytes_per_entry: float = 2.0) -> float:
    """Ring-model time of one collective over ``nodes`` × ``gpus_per_node`` ranks, in plain floats
    (a prediction costs a few collectives; numpy's per-call cost would be most of the time).

    p2p between two ranks is intra-node when nodes == 1, else one adapter's bandwidth.
    """
    n = nodes * gpus_per_node if kind != "p2p" else 2.0
    sent, steps = _traffic(kind, float(entries), n, bytes_per_entry)     # (refuses an unknown kind)
    if n <= 1:
        return 0.0
    if nodes > 1:
        adapters = 1.0 if kind == "p2p" else min(float(gpus_per_node), float(links.nics_per_node))
        bw, lat = min(links.intra_gbps, links.nic_gbps * adapters) * 1e9, links.inter_latency_us * 1e-6
    else:
        bw, lat = links.intra_gbps * 1e9, links.intra_latency_us * 1e-6
    return sent / bw + steps * lat


def collective_seconds(links: Links, kind: str, entries, nodes, gpus_per_node,
                       bytes_per_entry: float = 2.0) -> np.ndarray:
    """:func:`ring_seconds` of many collectives (arrays, broadcast): the one ring model, so that
    what the collective regressors were fitted against is what a prediction scales."""
    entries = np.asarray(entries, dtype=float)
    nodes = np.broadcast_to(np.asarray(nodes, dtype=float), entries.shape)
    gpn = np.broadcast_to(np.asarray(gpus_per_node, dtype=float), entries.shape)
    out = [ring_seconds(links, kind, e, a, g, bytes_per_entry)
           for e, a, g in zip(entries.ravel().tolist(), nodes.ravel().tolist(), gpn.ravel().tolist())]
    return np.array(out, dtype=float).reshape(entries.shape)


# fit_links reads a latency only from messages below this: at 4 MiB a ring step's transfer takes
# ~40 µs even at 100 GB/s, several times a link's few µs of latency, which its noise would hide.
SMALL_MESSAGE_BYTES = 4 << 20


def fit_links(samples: Mapping[str, np.ndarray], nics_per_node: int, bytes_per_entry: float = 2.0) -> Links:
    """Effective link figures from measured collectives: rows of (entries, nodes, gpn, us) per kind.

    Intra-node: least squares of t = steps·lat + sent/bw over single-node rows.  Inter-node: the
    same over multi-node rows with sent divided by the adapters a ring can use.  Each fit is done
    in relative terms (rows weighted by 1/t) so small messages pin the latency and large ones the
    bandwidth.
    """
    rows = {True: [], False: []}
    # All-reduce is what NCCL is tuned for and what every platform measures; other kinds only
    # when there is no all-reduce at all.
    use = {"allreduce": samples["allreduce"]} if "allreduce" in samples else samples
    for kind, table in use.items():
        entries, nodes, gpn, us = (table[:, i] for i in range(4))
        n = np.where(kind == "p2p", 2.0, nodes * gpn)
        sent, steps = _traffic(kind, entries, n, bytes_per_entry)
        inter = nodes > 1
        adapters = 1.0 if kind == "p2p" else np.minimum(gpn, nics_per_node)
        sent = np.where(inter, sent / adapters, sent)
        for is_inter in (True, False):
            m = inter == is_inter
            if m.any():
                rows[is_inter].append(np.column_stack([steps[m], sent[m], us[m] * 1e-6]))

    def solve(parts: list[np.ndarray], default: tuple[float, float]) -> tuple[float, float]:
        # Bandwidth from the largest tenth of the messages (where latency no longer matters),
        # latency from the smallest tenth once their transfer time is taken off: a plain least
        # squares over both lets a few noisy large rows drive the latency negative.
        if not parts:
            return default
        a = np.vstack(parts)
        steps, sent, t = a[:, 0], a[:, 1], a[:, 2]
        big = sent >= np.quantile(sent, 0.9)
        bw = float(np.median(sent[big] / t[big]))
        small = sent <= np.quantile(sent, 0.1)
        if np.median(sent[small]) > SMALL_MESSAGE_BYTES:
            return default[0], bw      # no small messages measured: latency cannot be told apart
        lat = float(np.median((t[small] - sent[small] / bw) / np.maximum(steps[small], 1.0)))
        return max(lat, 1e-7), bw

    intra_lat, intra_bw = solve(rows[False], (5e-6, 100e9))
    inter_lat, inter_bw = solve(rows[True], (10e-6, 10e9))
    return Links(intra_gbps=float(intra_bw / 1e9), intra_latency_us=float(intra_lat * 1e6),
                 nic_gbps=float(inter_bw / 1e9), nics_per_node=int(nics_per_node),
                 inter_latency_us=float(inter_lat * 1e6), source="fitted")
