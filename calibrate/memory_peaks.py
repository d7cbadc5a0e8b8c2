"""Measured peak memory of real training steps against the memory model (predictor.memory).

A row is what ``benchmarks/bench_gpu_stacks.py`` writes per trained job: ``stack``, ``name``,
``job`` (a job dict) and ``peak_allocated_bytes`` (``torch.cuda.max_memory_allocated`` over the
job's steps).  The model is asked about the job *as the stack ran it* (:data:`MEMORY_STACKS`, calibrate/stack_runs.py): the
calibration's own loop and SDPA's memory-efficient kernel run the recorded job; ``fsdp`` is
FSDP2 ``fully_shard`` as TorchTitan runs it (ZeRO-3, fp32 reduction).

The model's formulas (:attr:`MemoryEstimate.formula_bytes`) are compared with the allocator's
peak; the framework reserve is not, since ``max_memory_allocated`` sees neither the CUDA context
nor fragmentation, which the reserve is for.  ``covered`` says whether the total with the
reserve is at least the measured peak.

Nothing here imports torch: the comparison runs wherever the rows are.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Any, Iterable, Mapping, Optional

from predictor.errors import JobError
from predictor.job import TrainingJob
from predictor.memory import GIB, MemoryEstimate, estimate_job

from .errors import CalibrationError
from .stack_runs import row_label, stack_job


#: Stacks whose peaks the model is asked about, each job as its launch reveals it
#: (calibrate/stack_runs.py: SDPA's memory-efficient kernel keeps what flash attention keeps;
#: FSDP2 is ZeRO-3 under TorchTitan, FSDP1 under llm-foundry).  The one-rank DDP module is left
#: out: its rows' peaks hold earlier jobs' memory (benchmarks/data/h100-lent/stacks/README.md).
MEMORY_STACKS = ("pytorch", "sdpa_efficient", "fsdp", "fsdp1")


@dataclass(frozen=True)
class PeakComparison:
    """One measured job: its peak and the model's estimate for it."""

    stack: str
    name: str
    measured_bytes: int
    estimate: MemoryEstimate

    @property
    def predicted_bytes(self) -> float:
        return self.estimate.formula_bytes

    @property
    def error(self) -> float:
        """(predicted − measured) / measured: negative when the model counts too little."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def covered(self) -> bool:
        """Whether the estimate with its reserve holds the measured peak."""
        return self.estimate.total >= self.measured_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"stack": self.stack, "name": self.name,
                "measured_gib": round(self.measured_bytes / GIB, 3),
                "predicted_gib": round(self.predicted_bytes / GIB, 3),
                "error": round(self.error, 4), "covered": self.covered,
                "estimate": self.estimate.to_dict()}


@dataclass(frozen=True)
class PeakSummary:
    """The comparisons of one stack: mean and largest absolute error, and the mean signed error
    (bias; negative = the model counts too little)."""

    stack: str
    rows: int
    mean_abs_error: float
    max_abs_error: float
    bias: float
    covered: int


def compare_peaks(rows: Iterable[Mapping[str, Any]],
                  stacks: Optional[Iterable[str]] = None) -> list[PeakComparison]:
    """The model against every row that measured a peak (rows that failed carry none and are
    left out); ``stacks`` keeps only those stacks (as :func:`calibrate.stack_runs.row_label` names
    them: ``"fsdp+selective"`` apart from ``"fsdp"``).  A row of a stack not in :data:`MEMORY_STACKS`,
    a bad job or a peak that is not a positive byte count raises :class:`CalibrationError`
    naming the row."""
    keep = None if stacks is None else set(stacks)
    out: list[PeakComparison] = []
    for i, row in enumerate(rows):
        stack, name = str(row.get("stack", "")), str(row.get("name", f"row {i}"))
        try:
            label = row_label(row) if "stack" in row else stack
        except CalibrationError as exc:
            raise CalibrationError(f"row {i} ({stack} {name!r}): {exc}") from None
        if keep is not None and label not in keep:
            continue
        if "peak_allocated_bytes" not in row:
            continue
        where = f"row {i} ({stack} {name!r})"
        if stack not in MEMORY_STACKS:
            raise CalibrationError(f"{where}: stack {stack!r} has no memory description "
                                   f"(known: {', '.join(MEMORY_STACKS)})")
        peak = row["peak_allocated_bytes"]
        if isinstance(peak, bool) or not isinstance(peak, int) or peak <= 0:
            raise CalibrationError(f"{where}: peak_allocated_bytes must be a positive integer, got {peak!r}")
        # What earlier jobs left allocated stays so through this job: its own peak is the rest.
        start = row.get("start_allocated_bytes", 0)
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < peak:
            raise CalibrationError(f"{where}: start_allocated_bytes must be an integer in [0, peak), got {start!r}")
        peak -= start
        try:
            job = TrainingJob.from_dict(stack_job(row["job"], stack))
            est = estimate_job(job)
        except (JobError, KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(f"{where}: job: {exc}") from exc
        out.append(PeakComparison(label, name, peak, est))
    return out


def summarize(comparisons: Iterable[PeakComparison]) -> list[PeakSummary]:
    """One :class:`PeakSummary` per stack, in the order the stacks first appear."""
    by_stack: dict[str, list[PeakComparison]] = {}
    for c in comparisons:
        by_stack.setdefault(c.stack, []).append(c)
    out = []
    for stack, cs in by_stack.items():
        errors = [c.error for c in cs]
        out.append(PeakSummary(stack, len(cs), mean(abs(e) for e in errors), max(abs(e) for e in errors),
                               mean(errors), sum(c.covered for c in cs)))
    return out
