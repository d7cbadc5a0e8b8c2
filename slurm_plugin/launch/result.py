"""The parse result types shared with the daemon and the CLIs."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from predictor.job import TrainingJob


@dataclass
class SlurmRequest:
    """The Slurm request's final values (``None`` = not asked for); also used by the daemon."""

    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    ntasks: Optional[int] = None
    ntasks_per_node: Optional[int] = None
    partition: Optional[str] = None
    time_limit_minutes: Optional[int] = None
    array: Optional[str] = None
    job_name: Optional[str] = None
    cpus_per_task: Optional[int] = None
    #: the most nodes the job may get: --nodes=N's N, a MIN-MAX range's MAX, 0 for none (MIN-);
    #: None where not known (no --nodes, or a caller that gave only the minimum)
    max_nodes: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ParsedScript:
    """Everything learnt from a batch script: the job (or why not), the request, and provenance."""

    job: Optional[TrainingJob]
    job_dict: dict
    request: SlurmRequest
    provenance: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    framework: str = "unknown"
    error: Optional[str] = None
    # Caps that end the run early without changing the job itself: Megatron's
    # --exit-duration-in-mins. None = no cap found. (Extra to the interface, defaulted.)
    exit_duration_minutes: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job.to_dict() if self.job is not None else None,
            "job_dict": _plain(self.job_dict),
            "request": self.request.to_dict(),
            "provenance": dict(self.provenance),
            "warnings": list(self.warnings),
            "unresolved": list(self.unresolved),
            "framework": self.framework,
            "error": self.error,
            "exit_duration_minutes": self.exit_duration_minutes,
        }


def _plain(obj: Any, depth: int = 0) -> Any:
    """JSON-able copy of the small dicts we build (never user-controlled depth)."""
    if depth > 8:
        return None
    if isinstance(obj, dict):
        return {str(k): _plain(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v, depth + 1) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)
