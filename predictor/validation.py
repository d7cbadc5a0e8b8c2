"""Measured end-to-end runs on a platform, and how far the timeline's answers were from them.

The operator regressors carry their own validation error, but the timeline that composes them has
an error of its own (framework overheads, contention, schedule details no micro-benchmark sees).
The only honest measure of it is real runs: a platform records each measured iteration time next
to what its models predicted for the same job, in ``platform.toml``::

    [[validation]]
    name = "GPT-20B 4-4-8"
    source = "Zhang et al., arXiv:2509.22832, Table IV"
    measured_iteration_seconds = 17.35
    predicted_iteration_seconds = 16.78
    [validation.job.model]   # the job, in the job-file keys
    ...

Their residuals, ``log(measured / predicted)`` (:attr:`MeasuredRun.log_ratio`), set the interval
every answer on the platform gives: :mod:`predictor.interval` (split conformal, with a pooled prior
where a platform has fewer than 9 runs).  :func:`ratio_range` and :data:`DEFAULT_TIMELINE_RATIO`
are the earlier rule (the min-max spread of measured / predicted, multiplied onto the operator
spread), kept for what still reads it; ``python benchmarks/bench_intervals.py`` compares the two.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .errors import JobError, RunRecordError
from .job import TrainingJob

# The earlier rule's spread for a platform without runs: measured / predicted over the paper
# platforms' records (Perlmutter 0.96-1.09, Vista 0.98-1.60; tests/predictor/test_validation.py
# checks it still covers them).  Intervals now come from predictor.interval.
DEFAULT_TIMELINE_RATIO = (0.90, 1.61)
MAX_RUNS = 1000


@dataclass(frozen=True)
class MeasuredRun:
    """One real run: the job, its measured seconds per iteration and the platform's prediction."""

    name: str
    job: TrainingJob
    measured_iteration_seconds: float
    predicted_iteration_seconds: float = 0.0     # 0 = not predicted yet (a runs file)
    source: str = ""

    @property
    def ratio(self) -> float:
        """measured / predicted (> 1: the platform under-predicted this run)."""
        return self.measured_iteration_seconds / self.predicted_iteration_seconds

    @property
    def log_ratio(self) -> float:
        """log(measured / predicted): the run's residual, > 0 where under-predicted
        (:mod:`predictor.interval` builds intervals from these)."""
        return math.log(self.measured_iteration_seconds / self.predicted_iteration_seconds)

    @property
    def error(self) -> float:
        """predicted / measured - 1 (the sign of the paper's tables: < 0 is an under-prediction)."""
        return self.predicted_iteration_seconds / self.measured_iteration_seconds - 1.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.source:
            d["source"] = self.source
        d["measured_iteration_seconds"] = self.measured_iteration_seconds
        if self.predicted_iteration_seconds:
            d["predicted_iteration_seconds"] = self.predicted_iteration_seconds
        d["job"] = self.job.to_dict()
        return d


def _seconds(entry: Mapping[str, Any], key: str, where: str, required: bool) -> float:
    if key not in entry:
        if required:
            raise RunRecordError(f"{where}.{key}: missing")
        return 0.0
    v = entry[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v < 1e7:
        raise RunRecordError(f"{where}.{key}: must be a number of seconds > 0, got {v!r}")
    return float(v)


def parse_runs(raw: Any, where: str, *, need_prediction: bool) -> list[MeasuredRun]:
    """Runs from a TOML array of tables; ``where`` names it in errors (``platform.toml: validation``)."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(e, Mapping) for e in raw):
        raise RunRecordError(f"{where}: must be an array of tables ([[...]])")
    if len(raw) > MAX_RUNS:
        raise RunRecordError(f"{where}: {len(raw)} runs, at most {MAX_RUNS}")
    runs = []
    known = {"name", "source", "measured_iteration_seconds", "predicted_iteration_seconds", "job"}
    for i, entry in enumerate(raw):
        at = f"{where}[{i}]"
        extra = sorted(set(entry) - known)
        if extra:
            raise RunRecordError(f"{at}.{extra[0]}: unknown key (known: {', '.join(sorted(known))})")
        name = entry.get("name", f"run {i + 1}")
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise RunRecordError(f"{at}.name: must be a non-empty string of at most 200 characters")
        source = entry.get("source", "")
        if not isinstance(source, str) or len(source) > 1000:
            raise RunRecordError(f"{at}.source: must be a string of at most 1000 characters")
        measured = _seconds(entry, "measured_iteration_seconds", at, True)
        predicted = _seconds(entry, "predicted_iteration_seconds", at, need_prediction)
        if not isinstance(entry.get("job"), Mapping):
            raise RunRecordError(f"{at}.job: missing (a table with the job-file keys)")
        try:
            job = TrainingJob.from_dict(entry["job"])
        except JobError as exc:
            raise RunRecordError(f"{at}.job: {exc}") from None
        runs.append(MeasuredRun(name.strip(), job, measured, predicted, source))
    return runs


def ratio_range(runs: Sequence[MeasuredRun]) -> tuple[float, float]:
    """(low, high): the spread of measured / predicted over ``runs``, always around 1 (no runs:
    :data:`DEFAULT_TIMELINE_RATIO`).  The earlier interval rule; ``perf-calibrate validate``'s
    summary still reports it, and ``benchmarks/bench_intervals.py`` compares against it.
    """
    ratios = [r.ratio for r in runs if r.predicted_iteration_seconds > 0]
    if not ratios:
        return DEFAULT_TIMELINE_RATIO
    return min(1.0, min(ratios)), max(1.0, max(ratios))


def runs_to_toml(runs: Iterable[MeasuredRun]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in runs]
