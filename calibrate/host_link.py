"""The GPU's link to host memory as DeepSpeed's CPU checkpointing uses it, and a synchronize round trip.

DeepSpeed's ``cpu_checkpointing`` copies each kept checkpoint to the host with a blocking
``tensor.cpu()`` (pageable memory) in the forward and back with ``.to(device)`` in the backward
(predictor/checkpointing.py).  :func:`measure` times exactly those two calls on bf16 tensors of each
size and, for reference, the same copies into and out of pinned host memory (``copy_(non_blocking)``
then a synchronize); predictor.checkpointing's ``PAGEABLE_*_GBPS`` are the slowest pageable rates of
benchmarks/data/h100-lent/host-link (:func:`slowest_gbps`).  ``benchmarks/bench_host_link.py`` runs it.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable, Optional, Sequence

import torch

#: The copies timed, as rows name them.
COPIES = ("d2h_pageable", "h2d_pageable", "d2h_pinned", "h2d_pinned")


def median_seconds(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median wall seconds of ``fn`` (synchronized on a GPU) over ``repeats`` after one warm-up."""
    fn()                                    # warm-up: first-touch of host pages, allocator
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _size_rows(device: str, mib: int, repeats: int) -> list[dict]:
    # One size's tensors live in this frame only, so the next size starts with them freed.
    x = torch.randn(mib * 2**20 // 2, device=device, dtype=torch.bfloat16)
    host = x.cpu()
    nbytes = x.numel() * x.element_size()
    pinned = torch.empty_like(host).pin_memory() if device == "cuda" else host
    copies = {"d2h_pageable": lambda: x.cpu(),
              "h2d_pageable": lambda: host.to(device),
              "d2h_pinned": lambda: pinned.copy_(x, non_blocking=True),
              "h2d_pinned": lambda: x.copy_(pinned, non_blocking=True)}
    rows = []
    for name in COPIES:
        seconds = median_seconds(copies[name], device, repeats)
        rows.append({"copy": name, "bytes": nbytes, "seconds": seconds, "gbps": nbytes / seconds / 1e9})
    return rows


def measure(device: str, mib_sizes: Sequence[int], repeats: int,
            on_row: Optional[Callable[[dict, int], None]] = None) -> dict:
    """Rows ``{"copy", "bytes", "seconds", "gbps"}`` per copy and size, and the synchronize round
    trip with an empty queue; ``on_row(row, mib)`` sees each size's rows once they are measured."""
    rows = []
    for mib in mib_sizes:
        for row in _size_rows(device, mib, repeats):
            rows.append(row)
            if on_row is not None:
                on_row(row, mib)
    sync = median_seconds(lambda: torch.cuda.synchronize() if device == "cuda" else None, device, 200)
    return {"rows": rows, "sync_round_trip_seconds": sync}


def slowest_gbps(rows: Iterable[dict]) -> dict[str, float]:
    """Each copy's slowest rate over the sizes (GB/s), to three significant figures: the rate a
    checkpoint of any of the measured sizes can count on."""
    out: dict[str, float] = {}
    for row in rows:
        out[row["copy"]] = min(out.get(row["copy"], float("inf")), float(row["gbps"]))
    return {copy: float(f"{gbps:.3g}") for copy, gbps in out.items()}
