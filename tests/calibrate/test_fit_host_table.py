"""perf-calibrate fit carries the store's host costs (perf-calibrate host's host.toml) into the
platform it fits: without them a site's own platform had no host term at all.

The GPU store is a slice of the lent H100's samples (two operators) with its host.toml; fits run
in a fresh process, as conftest's do.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.errors import CalibrationError
from calibrate.fitting.host import platform_host_table
from predictor import load_platform
from predictor.samples import dump_toml

from .conftest import FAST_LIBRARIES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "benchmarks" / "data" / "h100-lent"


def _gpu_store(tmp_path: Path, *, host_timing: str = "", host: bool = True) -> Path:
    d = tmp_path / "samples"
    (d / "operators").mkdir(parents=True)
    meta = tomllib.loads((H100 / "samples.toml").read_text(encoding="utf-8"))
    if host_timing:
        meta["timing"]["host"] = host_timing
    (d / "samples.toml").write_text(dump_toml(meta), encoding="utf-8")
    for name in ("gelu_fp16.csv", "res_add_fp16.csv"):
        shutil.copy(H100 / "operators" / name, d / "operators" / name)
    if host:
        shutil.copy(H100 / "host.toml", d / "host.toml")
    return d


def _fit(store: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "calibrate.cli", "fit", str(store), "--out", str(out),
                           "--libraries", ",".join(FAST_LIBRARIES), "--no-plot"],
                          capture_output=True, text=True, timeout=600)


def _h100_host() -> dict:
    return tomllib.loads((H100 / "host.toml").read_text(encoding="utf-8"))["host"]


def test_fit_carries_the_stores_host_costs(tmp_path):
    res = _fit(_gpu_store(tmp_path), tmp_path / "plat")
    assert res.returncode == 0, res.stderr
    host = load_platform(tmp_path / "plat", reload=True).host
    raw = _h100_host()
    assert host is not None
    assert host.layer_seconds == pytest.approx(raw["layer_us"] * 1e-6)
    assert host.micro_batch_seconds == pytest.approx(raw["model_fixed_us"] * 1e-6)
    assert host.launch_seconds == pytest.approx(raw["launch_us"] * 1e-6)
    # Call-timed samples: the per-call issue times travel, for the predictor to take half of off.
    assert host.operators["linear1"]["bwd"] == pytest.approx(raw["operators"]["linear1"]["bwd"] * 1e-6)
    assert "perf-calibrate host on NVIDIA H100 80GB HBM3" in host.source


def test_device_timed_samples_keep_no_per_call_host_times(tmp_path):
    # perf-calibrate run --timing device: the samples hold no host time to take off.
    res = _fit(_gpu_store(tmp_path, host_timing="excluded"), tmp_path / "plat")
    assert res.returncode == 0, res.stderr
    host = load_platform(tmp_path / "plat", reload=True).host
    assert host is not None and host.layer_seconds == pytest.approx(_h100_host()["layer_us"] * 1e-6)
    assert dict(host.operators) == {}


def test_a_gpu_store_without_host_costs_says_how_to_add_them(tmp_path):
    res = _fit(_gpu_store(tmp_path, host=False), tmp_path / "plat")
    assert res.returncode == 0, res.stderr
    plat = load_platform(tmp_path / "plat", reload=True)
    assert plat.host is None
    assert any("perf-calibrate host --device cuda" in n for n in plat.notes)


def test_a_cpu_store_ignores_host_costs_and_says_so(store_copy, tmp_path):
    shutil.copy(H100 / "host.toml", store_copy / "host.toml")
    res = _fit(store_copy, tmp_path / "plat")
    assert res.returncode == 0, res.stderr
    plat = load_platform(tmp_path / "plat", reload=True)
    assert plat.host is None
    assert any("host.toml not used" in n for n in plat.notes)


def test_bad_host_costs_are_refused_naming_file_and_key(tmp_path):
    store = _gpu_store(tmp_path)
    text = (store / "host.toml").read_text(encoding="utf-8").replace("layer_us = 1828.594", 'layer_us = "fast"')
    (store / "host.toml").write_text(text, encoding="utf-8")
    with pytest.raises(CalibrationError, match="host.toml: host.layer_us must be a number"):
        platform_host_table(store / "host.toml")
    res = _fit(store, tmp_path / "plat")
    assert res.returncode != 0
    assert "host.layer_us" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "plat").exists()
