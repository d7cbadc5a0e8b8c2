"""Errors of the calibration package.

They subclass the predictor's :class:`PerfcastError` so that every CLI turns them into one line and
exit code 2, the same way as a bad job or a corrupt bundle.
"""
from __future__ import annotations

from predictor.errors import PerfcastError


class CalibrationError(PerfcastError):
    """A plan, sample store, device or installation that calibration cannot use as it is."""


class IncompatibleStore(CalibrationError):
    """A sample store written on another device / GPU type / perfcast version than the current run."""


class InstallRefused(CalibrationError):
    """A new platform that must not replace the active one (failed, incomplete or worse-validating)."""
