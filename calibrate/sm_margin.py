"""How much longer a GEMM runs when some SMs are kept back for communication.

Transformer Engine's overlapped tensor parallelism keeps ``COMM_SMS`` SMs for a pipelined or bulk
collective (``set_sm_margin``: cuBLASLt's SM-count target is the GPU's SMs less the margin), and
predictor/tp_overlap.py costs the GEMM beside it ``S / (S - margin)`` times as long, or as measured
(``MEASURED_MARGIN_SLOWDOWN``: benchmarks/data/h100-lent/sm-margin.json).  :func:`measure_rows` times
the layers' GEMM shapes (16-bit ``F.linear`` with a bias, which PyTorch sends to cuBLASLt, and FP8
``torch._scaled_mm``) with PyTorch's SM carve-out (``torch._C._set_sm_carveout_experimental``, the
same cuBLASLt attribute) at 0 and at each margin; ``benchmarks/bench_sm_margin.py`` runs it.  torch
is imported by the measurement only: the summaries read rows.
"""
from __future__ import annotations

import statistics
from typing import Callable, Iterable, Optional, Sequence

MARGINS = (8, 16, 32)
# (m, k, n): tokens x input width x output width of the linears of Llama-3 8B (tp 1, 2) and 70B
# (tp 4, 8) at 2,048-16,384 tokens a micro-batch: the shapes the TP overlap chunks.
SHAPES = [(m, k, n) for m in (2048, 8192, 16384)
          for k, n in ((4096, 6144), (4096, 4096), (4096, 7168), (7168, 4096),
                       (8192, 2560), (2048, 8192), (8192, 7168), (3584, 8192))]
PRECISIONS = ("bf16", "fp8")


def measure_rows(shapes: Sequence[tuple[int, int, int]] = SHAPES, margins: Sequence[int] = MARGINS,
                 on_row: Optional[Callable[[dict], None]] = None) -> list[dict]:
    """One row per shape and precision on this process's GPU: ``seconds`` per margin (0 included)
    and ``ratio`` to margin 0 per margin; ``on_row`` sees each row as it is measured."""
    import torch
    import torch.nn.functional as F

    from .timing import measure

    one = torch.ones((), device="cuda")
    rows = []
    for m, k, n in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        b = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        runs = {"bf16": lambda: F.linear(x, w, b),
                "fp8": lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, bias=b,
                                                out_dtype=torch.bfloat16)}
        for prec, fn in runs.items():
            t = {}
            for margin in (0, *margins):
                torch._C._set_sm_carveout_experimental(margin or None)
                t[margin] = measure(fn, "cuda", warmup=3, repeats=20).seconds
            torch._C._set_sm_carveout_experimental(None)
            row = {"m": m, "k": k, "n": n, "precision": prec, "seconds": {str(g): s for g, s in t.items()},
                   "ratio": {str(g): t[g] / t[0] for g in margins}}
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows


def ratio_summary(rows: Iterable[dict], precision: str, margin: int) -> tuple[float, float, float, int]:
    """(median, min, max, count) of the slowdown ratio at ``margin`` over ``precision``'s rows."""
    r = [row["ratio"][str(margin)] for row in rows if row["precision"] == precision]
    if not r:
        raise ValueError(f"no {precision} rows with margin {margin}")
    return statistics.median(r), min(r), max(r), len(r)


def carveout_ignored(rows: Iterable[dict], margins: Sequence[int] = MARGINS) -> bool:
    """Whether every ratio is within 1 % of 1: the build's carve-out did not reach the GEMMs."""
    return all(abs(row["ratio"][str(g)] - 1.0) < 0.01 for row in rows for g in margins)
