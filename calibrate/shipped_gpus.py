"""The GPUs of the shipped platforms as the operators' roofline sees them (name, memory, peaks).

The peaks come from calibrate.env's table (published dense tensor-core TFLOP/s and HBM GB/s), which
calibration uses too; they only normalise the fitted ratios, so a shipped bundle must be read back
with the same figures it was fitted with (scripts/build_platforms.py, benchmarks/bench_operators.py).
"""
from __future__ import annotations

from predictor.operators import GpuSpec

from .env import KNOWN_GPUS

A100 = GpuSpec("NVIDIA A100-SXM4-80GB", *KNOWN_GPUS["a100"])
GH200 = GpuSpec("NVIDIA GH200 120GB", *KNOWN_GPUS["gh200"])
H100 = GpuSpec("NVIDIA H100-SXM5-80GB", *KNOWN_GPUS["h100"])
