"""perfcast's CPU-only predictor: operator-level model of distributed LLM training time.

Never imports torch or Slurm: it runs inside a daemon next to slurmctld and must import fast.
The regressor libraries are never imported here: bundles carry their trees as flat arrays
(``forest.bin``) that :mod:`predictor.trees` walks with numpy; fitting lives in :mod:`calibrate.fitting`.

    from predictor import Predictor, TrainingJob, load_platform
    Predictor(load_platform("perlmutter-a100")).predict(TrainingJob.from_dict(d)).iteration_seconds

A :class:`Predictor` remembers the shapes it has costed: keep one per loaded platform to predict
many jobs over time.  ``predict(job, platform)`` and ``predict_many(jobs, platform)`` are the
one-off conveniences (a new Predictor each call).
"""
from __future__ import annotations

from .errors import BundleError, JobError, PerfcastError, PlatformNotFound
from .job import ClusterSpec, Layout, ModelSpec, RunSpec, TrainingJob, load_job

__all__ = [
    "TrainingJob", "ModelSpec", "Layout", "RunSpec", "ClusterSpec", "load_job",
    "PerfcastError", "JobError", "BundleError", "PlatformNotFound",
    "load_platform", "list_platforms", "Predictor", "predict", "predict_many", "Prediction", "Platform",
]


def __getattr__(name: str):  # PEP 562: keep `import predictor` light
    if name in ("load_platform", "list_platforms", "Platform"):
        from . import platform
        return getattr(platform, name)
    if name in ("Predictor", "predict", "predict_many", "Prediction"):
        from . import estimate as _p
        return getattr(_p, name)
    raise AttributeError(f"module 'predictor' has no attribute {name!r}")
