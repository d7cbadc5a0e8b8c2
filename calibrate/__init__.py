"""perfcast calibration: measure operators and collectives, fit them into a platform, install it.

Importing this package (and the modules the CLI needs for ``fit``, ``import``, ``status`` and
``rollback``) must not import torch: torch is an optional extra, needed only to *measure*.
Modules that need it (kernels, timing, collectives, runner, gpt_model) import it at their top and
are imported lazily by the CLI.
"""
from __future__ import annotations

from .errors import CalibrationError

__all__ = ["CalibrationError"]
