"""Record measured end-to-end runs on a platform: ``perf-calibrate validate``.

An admin who has real iteration times (from training logs) writes them as a runs file::

    [[run]]
    name = "GPT-20B 4-4-8"
    source = "our job 123456, steady-state minimum"
    measured_iteration_seconds = 17.35
    [run.job.model]      # the job, in the job-file keys (or job_file = "path/to/job.toml")
    ...

and this module predicts every run with the platform's current models and stores measured and
predicted side by side in the platform's ``platform.toml`` (``[[validation]]``).  Runs already
recorded there are predicted again too, so the record always describes the models that are
installed.  The spread of the ratios widens the platform's intervals
(:func:`predictor.validation.ratio_range`); the summary reports the error and a leave-one-out
coverage check of that spread.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from predictor.errors import JobError, RunRecordError
from predictor.job import TrainingJob
from predictor.platform import PLATFORM_FILE, load_platform, resolve_platform, write_platform
from predictor.validation import MeasuredRun, leave_one_out, parse_runs, ratio_range, runs_to_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MAX_RUNS_FILE_BYTES = 4 << 20


@dataclass(frozen=True)
class ValidationSummary:
    platform: str
    platform_file: Path
    runs: list[MeasuredRun]
    inside_loo: list[bool]
    predictions: list[Any]          # predictor.Prediction of each run, in order

    @property
    def mape(self) -> float:
        return sum(abs(r.error) for r in self.runs) / len(self.runs) if self.runs else 0.0

    @property
    def ratio_range(self) -> tuple[float, float]:
        return ratio_range(self.runs)

    def table(self) -> str:
        lines = [f"{'run':<28}{'measured':>10}{'predicted':>11}{'error':>9}  leave-one-out"]
        for r, ok in zip(self.runs, self.inside_loo):
            lines.append(f"{r.name[:27]:<28}{r.measured_iteration_seconds:>9.3g}s"
                         f"{r.predicted_iteration_seconds:>10.3g}s{100 * r.error:>+8.1f}%  "
                         f"{'inside' if ok else 'OUTSIDE'}")
        lo, hi = self.ratio_range
        lines.append(f"{len(self.runs)} runs: MAPE {100 * self.mape:.2f}%; intervals widened by "
                     f"measured/predicted [{lo:.3f}, {hi:.3f}]; leave-one-out coverage "
                     f"{sum(self.inside_loo)}/{len(self.inside_loo)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, "platform_file": str(self.platform_file),
                "mape": self.mape, "ratio_range": list(self.ratio_range),
                "runs": [dict(r.to_dict(), ratio=r.ratio, inside_leave_one_out=ok)
                         for r, ok in zip(self.runs, self.inside_loo)]}


def load_runs(path: "str | os.PathLike[str]") -> list[MeasuredRun]:
    """The ``[[run]]`` entries of a runs file; errors name the file and the entry."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_RUNS_FILE_BYTES:
            raise RunRecordError(f"{p}: larger than {MAX_RUNS_FILE_BYTES >> 20} MiB")
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RunRecordError(f"{p}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RunRecordError(f"{p}: not valid TOML: {exc}") from None
    extra = sorted(set(raw) - {"run"})
    if extra:
        raise RunRecordError(f"{p}: {extra[0]}: unknown key (a runs file holds [[run]] tables)")
    entries = raw.get("run")
    if not entries:
        raise RunRecordError(f"{p}: no [[run]] tables")
    if isinstance(entries, list):
        for i, e in enumerate(entries):
            if isinstance(e, dict) and "job_file" in e:
                e["job"] = _job_file(p, e.pop("job_file"), f"{p}: run[{i}].job_file")
    return parse_runs(entries, f"{p}: run", need_prediction=False)


def _job_file(runs_file: Path, value: Any, where: str) -> dict:
    if not isinstance(value, str) or not value:
        raise RunRecordError(f"{where}: must be a path")
    jp = (runs_file.parent / value) if not os.path.isabs(value) else Path(value)
    try:
        return TrainingJob.from_toml(jp).to_dict()
    except JobError as exc:
        raise RunRecordError(f"{where}: {exc}") from None


def validate_platform(platform: "str | os.PathLike[str]", runs: Sequence[MeasuredRun], *,
                      replace: bool = False, dry_run: bool = False) -> ValidationSummary:
    """Predict ``runs`` (and, unless ``replace``, the runs already recorded) and record them."""
    from predictor.estimate import predict_many
    d = resolve_platform(platform)
    plat = load_platform(d, reload=True)
    all_runs = list(runs) if replace else list(plat.validation) + list(runs)
    if not all_runs:
        raise RunRecordError("no runs to record")
    preds = predict_many([r.job for r in all_runs], plat)
    recorded = [dataclasses.replace(r, predicted_iteration_seconds=p.iteration_seconds)
                for r, p in zip(all_runs, preds)]
    fpath = d / PLATFORM_FILE
    if not dry_run:
        raw = tomllib.loads(fpath.read_text(encoding="utf-8"))
        raw["validation"] = runs_to_toml(recorded)
        write_platform(d, raw)
    # Each prediction's interval without the timeline spread, relative to the prediction.
    bounds = []
    for p in preds:
        r_lo, r_hi = p.details["timeline_ratio"]
        lo, hi = p.interval_seconds
        bounds.append((lo / r_lo / p.iteration_seconds, hi / r_hi / p.iteration_seconds))
    return ValidationSummary(plat.name, fpath, recorded, leave_one_out(recorded, bounds), preds)

