"""A sample store's samples.toml and rows are checked before `perf-calibrate fit` uses them: a table
or key perfcast does not write (a typo) and a value that is not a measurement (NaN, inf, negative,
0 where a time must be > 0, more than an hour for one call) are refused with one line naming the
file, the line and the key or column; never a traceback, never a fit that quietly learnt from it
or dropped it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.cli import main
from calibrate.env import METHOD_VERSION, DeviceSpec
from calibrate.errors import CalibrationError
from calibrate.plans import CollectivePoint, OperatorPoint
from calibrate.store import META_SCHEMA, SampleStore, StoreIdentity, check_meta, read_meta
from predictor.errors import BundleError
from predictor.samples import MAX_SAMPLE_US, load_samples

from .conftest import one_line_error

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.parent for p in (ROOT / "benchmarks" / "data").rglob("samples.toml"))

ID = StoreIdentity("cpu", "CPU test", METHOD_VERSION)
# The keys calibrate.runner writes, as it writes them (values need not be real).
META = {
    "plans": ["tiny"], "precisions": ["fp32"],
    "environment": {"device": "cpu", "gpu_name": "CPU test", "host": "h", "cpu_threads": 1},
    "gpu": DeviceSpec("CPU test", "cpu", 16.0, {"fp32": 0.1}, 20.0).to_dict(),
    "allocation": {"nodes": 1, "gpus_per_node": 2},
    "timing": {"warmup": 2, "repeats": 8, "statistic": "mean of fastest quarter", "clock": "perf_counter",
               "host": "included"},
    "estimated": {"wall_minutes": 1.0, "gpu_minutes": 1.0},
    "flash_atten_impl": "sdpa_flash", "flash_atten_causal": True,
    "attention_impls_measured": ["sdpa_flash"], "attention_impls_missing": [],
}


def _store(tmp_path) -> Path:
    """A small store written through the real writers (SampleStore), complete."""
    d = tmp_path / "samples"
    st = SampleStore.open(d, ID, META)
    # Enough rows for a fit (which the old code ran on a typo'd or absurd store, and finished).
    for t in (16, 32, 64, 128):
        for w in (32, 64, 128):
            st.record_operator(OperatorPoint("gelu", "fp32", (t, w)), {"fwd": 5 + t * w / 200, "bwd": 8 + t * w / 100})
    for e in range(10, 20):
        st.record_collective(CollectivePoint("allreduce", "fp32", 2**e, 1, 2), 30 + 2**e / 500)
    st.mark_complete(True, "tiny")
    return d


def _fit(store: Path, out: Path) -> int:
    return main(["fit", str(store), "--out", str(out), "--libraries", "lightgbm", "--no-plot"])


# ----------------------------------------------------------------------------- writers and checker

def test_a_store_written_by_the_store_and_the_runners_meta_passes(tmp_path):
    d = _store(tmp_path)
    check_meta(read_meta(d), d / "samples.toml")
    assert set(read_meta(d)) <= set(META_SCHEMA)
    # and resuming it (which checks it too) works
    SampleStore.open(d, ID, META)


def test_the_store_a_real_calibration_run_writes_passes(tiny_store):
    """The runner's own samples.toml (calibrate.runner.run_calibration, a tiny CPU run)."""
    check_meta(read_meta(tiny_store), tiny_store / "samples.toml")


def test_an_imported_store_passes(tmp_path):
    """calibrate.importers' samples.toml (gpu as a name, source, license, dropped rows ...)."""
    from calibrate.importers import import_estimate_train_time

    from .test_importers import GPU, _write
    src = tmp_path / "Sys"
    (src / "operator").mkdir(parents=True)
    (src / "nccl").mkdir()
    _write(src / "operator" / f"{GPU}.csv", ["GPU"], [[GPU]])
    _write(src / "operator" / f"{GPU}_linear1_fp16.csv", ["mp", "b", "l", "dim", "F_dur(us)", "B_dur(us)"],
           [[2, 4, 2048, 4096, 100.0, 200.0], [2, 4, 2048, 8192, 300.0, 1.0]])    # an impossible backward
    _write(src / "nccl" / f"{GPU}_allreduce_fp16_2_1.csv", ["shape", "nodes", "GPUsPerNode", "dur(us)"],
           [[1e8, 2, 1, 5000.0]])
    out = tmp_path / "imported"
    import_estimate_train_time(src, out)
    meta = read_meta(out)
    assert meta["dropped_rows"] and meta["source"]
    check_meta(meta, out / "samples.toml")
    load_samples(out)           # the dropped backward is a 0, which a row may hold


@pytest.mark.parametrize("store", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_stores_load_and_pass(store):
    check_meta(read_meta(store), store / "samples.toml")
    samples = load_samples(store)
    assert samples.operators


# ----------------------------------------------------------------------------- samples.toml

@pytest.mark.parametrize("edit, needles", [
    (("[timing]", "[timng]"), ["[timng]", "did you mean 'timing'?"]),
    (("clock = ", "clok = "), ["'clok' in [timing]", "did you mean 'clock'?"]),
    (("host = \"included\"", "hots = \"included\""), ["'hots' in [timing]", "did you mean 'host'?"]),
    (("host = \"included\"", "host = \"exluded\""), ["[timing] host", "'exluded'", "did you mean 'excluded'?"]),
    (("[gpu.tflops]", "[gpu.tflop]"), ["[gpu.tflop]", "did you mean 'tflops'?"]),
    (("fp32 = 0.1", "fp23 = 0.1"), ["'fp23' in [gpu.tflops]", "did you mean 'fp32'?"]),
    (("\ngpu_name = ", "\ngpu_nam = "), ["'gpu_nam'", "did you mean 'gpu_name'?"]),
    (("complete = true", "complete = \"yes\""), ["[progress] complete", "'yes'"]),
    (("[estimated]", "[estimate]"), ["[estimate]", "did you mean 'estimated'?"]),
    (("cpu_threads = 1", "cpu_thread = 1"), ["'cpu_thread' in [environment]", "did you mean 'cpu_threads'?"]),
])
def test_a_typo_in_samples_toml_is_refused_by_fit(capsys, tmp_path, edit, needles):
    d = _store(tmp_path)
    meta = d / "samples.toml"
    text = meta.read_text()
    old, new = edit
    assert old in text, text
    meta.write_text(text.replace(old, new, 1))
    line = next(n for n, s in enumerate(meta.read_text().splitlines(), start=1)
                if s.startswith(new.strip()))
    assert _fit(d, tmp_path / "plat") == 2
    one_line_error(capsys, f"{meta}:{line}: ", *needles)
    assert not (tmp_path / "plat").exists()


def test_a_typo_in_samples_toml_refuses_a_resume(tmp_path):
    d = _store(tmp_path)
    meta = d / "samples.toml"
    meta.write_text(meta.read_text().replace("[timing]", "[timng]"))
    with pytest.raises(CalibrationError, match=r"unknown table \[timng\]"):
        SampleStore.open(d, ID, META)


def test_fit_of_a_typo_in_a_fresh_process_is_one_line(tmp_path):
    d = _store(tmp_path)
    meta = d / "samples.toml"
    meta.write_text(meta.read_text().replace("[timing]", "[timng]"))
    res = subprocess.run([sys.executable, "-m", "calibrate.cli", "fit", str(d), "--out", str(tmp_path / "p"),
                          "--libraries", "lightgbm", "--no-plot"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "unknown table [timng] (did you mean 'timing'?)" in res.stderr


# ----------------------------------------------------------------------------- rows

GELU = "operators/gelu_fp32.csv"              # tokens,width,fwd_us,bwd_us; 12 rows
ALLREDUCE = "collectives/allreduce_fp32.csv"  # entries,nodes,gpus_per_node,us; 10 rows


@pytest.mark.parametrize("file, row, needles", [
    (GELU, "256,64,1e300,20", ["column fwd_us", "1e+300 µs", "more than an hour"]),
    (GELU, "256,64,10,3600000001", ["column bwd_us", "more than an hour"]),
    (GELU, "256,64,-5,20", ["column fwd_us", "-5 µs is negative"]),
    (GELU, "256,64,nan,20", ["column fwd_us", "'nan' is not a finite number"]),
    (GELU, "256,64,10,inf", ["column bwd_us", "'inf' is not a finite number"]),
    (GELU, "256,64,1e-9,20", ["column fwd_us", "under a nanosecond"]),
    (GELU, "256,64,0,0", ["every time (fwd_us, bwd_us) is 0"]),
    (GELU, "0,64,10,20", ["column tokens", "0 is not a size"]),
    (GELU, "256,64,ten,20", ["column fwd_us", "'ten' is not a number"]),
    (ALLREDUCE, "2048,1,2,0", ["column us", "0 µs is not a measured time"]),
    (ALLREDUCE, "2048,1,2,1e300", ["column us", "more than an hour"]),
])
def test_a_row_that_is_not_a_measurement_is_refused_by_fit(capsys, tmp_path, file, row, needles):
    d = _store(tmp_path)
    path = d / file
    path.write_text(path.read_text() + row + "\n")
    line = len(path.read_text().splitlines())
    assert _fit(d, tmp_path / "plat") == 2
    one_line_error(capsys, f"{path}:{line}: ", *needles)
    assert not (tmp_path / "plat").exists()


def test_a_bad_row_refuses_a_resume(tmp_path):
    d = _store(tmp_path)
    path = d / GELU
    path.write_text(path.read_text() + "256,64,1e300,20\n")
    with pytest.raises(CalibrationError, match=r"gelu_fp32.csv:14: column fwd_us"):
        SampleStore.open(d, ID, META)


def test_a_direction_marked_not_measured_and_the_bounds_themselves_are_samples(tmp_path):
    d = _store(tmp_path)
    path = d / GELU
    path.write_text(path.read_text() + f"256,64,10,0\n512,64,{MAX_SAMPLE_US:.0f},1e-3\n")
    table = load_samples(d).operators[("gelu", "fp32")]
    assert len(table) == 14 and table.rows[12, 3] == 0


def test_a_torn_last_line_is_still_repaired_on_resume(tmp_path):
    d = _store(tmp_path)
    path = d / GELU
    with open(path, "a") as fh:
        fh.write("256,64,1")           # a writer killed mid-row
    assert SampleStore.open(d, ID, META).operator_rows == 12
    with pytest.raises(BundleError, match=r"gelu_fp32.csv:14: column bwd_us"):
        path.write_text(path.read_text() + "256,64,10,-1\n")
        load_samples(d)
