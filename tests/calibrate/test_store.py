from __future__ import annotations

import pytest

from calibrate.env import METHOD_VERSION
from calibrate.errors import CalibrationError, IncompatibleStore
from calibrate.plans import CollectivePoint, OperatorPoint
from calibrate.store import SampleStore, StoreIdentity, read_meta, repair_torn_tail
from predictor.samples import load_samples

ID = StoreIdentity("cpu", "CPU test", METHOD_VERSION)
META = {"plans": ["tiny"], "precisions": ["fp32"], "environment": {"host": "h"}}


def _new(tmp_path, identity=ID):
    return SampleStore.open(tmp_path / "s", identity, META)


def test_create_record_and_resume(tmp_path):
    st = _new(tmp_path)
    a = OperatorPoint("gelu", "fp32", (16, 32))
    c = CollectivePoint("allreduce", "fp32", 1024, 1, 2)
    st.record_operator(a, {"fwd": 1.5, "bwd": 3.0})
    st.record_collective(c, 12.0)
    st2 = _new(tmp_path)
    assert st2.has_operator(a) and st2.has_collective(c)
    assert not st2.has_operator(OperatorPoint("gelu", "fp32", (16, 64)))
    samples = load_samples(tmp_path / "s")
    assert samples.operators[("gelu", "fp32")].rows.tolist() == [[16, 32, 1.5, 3.0]]
    assert read_meta(tmp_path / "s")["plans"] == ["tiny"]


def test_skipped_points_are_not_retried(tmp_path):
    st = _new(tmp_path)
    a = OperatorPoint("linear1", "fp16", (8, 8, 8))
    st.record_skip("operator", a, "out of memory")
    assert _new(tmp_path).has_operator(a)


def test_torn_last_line_is_dropped_on_resume(tmp_path):
    st = _new(tmp_path)
    st.record_operator(OperatorPoint("gelu", "fp32", (16, 32)), {"fwd": 1.0, "bwd": 2.0})
    path = tmp_path / "s" / "operators" / "gelu_fp32.csv"
    with open(path, "a") as fh:
        fh.write("16,64,1.")            # a writer killed mid-row
    st2 = _new(tmp_path)
    assert st2.operator_rows == 1
    assert path.read_text().endswith("\n")
    assert repair_torn_tail(path) is False


@pytest.mark.parametrize("identity, message", [
    (StoreIdentity("cpu", "NVIDIA A100", METHOD_VERSION), "another GPU type"),
    (StoreIdentity("cuda", "CPU test", METHOD_VERSION), "device"),
    (StoreIdentity("cpu", "CPU test", METHOD_VERSION + 1), "method version"),
    # a store of call-timed samples (the key absent: stores before --timing) takes no device-timed ones
    (StoreIdentity("cpu", "CPU test", METHOD_VERSION, host_timing="excluded"), "issue time included"),
])
def test_incompatible_store_refused_untouched(tmp_path, identity, message):
    _new(tmp_path)
    before = (tmp_path / "s" / "samples.toml").read_bytes()
    with pytest.raises(IncompatibleStore, match=message):
        _new(tmp_path, identity)
    assert (tmp_path / "s" / "samples.toml").read_bytes() == before


def test_other_format_and_imported_store_refused(tmp_path):
    _new(tmp_path)
    meta = tmp_path / "s" / "samples.toml"
    meta.write_text(meta.read_text().replace("format = 1", "format = 9"))
    with pytest.raises(IncompatibleStore, match="format 9"):
        _new(tmp_path)
    meta.write_text('format = 1\ngpu = "NVIDIAA100-SXM4-80GB"\nsource = "estimate-train-time"\n')
    with pytest.raises(IncompatibleStore, match="not a calibration store"):
        _new(tmp_path)


def test_corrupt_rows_and_metadata_refused(tmp_path):
    st = _new(tmp_path)
    st.record_operator(OperatorPoint("gelu", "fp32", (16, 32)), {"fwd": 1.0, "bwd": 2.0})
    path = tmp_path / "s" / "operators" / "gelu_fp32.csv"
    path.write_text(path.read_text() + "16,zz,1,2\n")
    with pytest.raises(CalibrationError, match="corrupt sample store"):
        _new(tmp_path)
    (tmp_path / "s" / "samples.toml").write_text("format = [\n")
    with pytest.raises(CalibrationError, match="corrupt"):
        _new(tmp_path)


def test_refuses_to_write_into_a_foreign_directory(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    (d / "precious.txt").write_text("keep")
    with pytest.raises(CalibrationError, match="not empty"):
        SampleStore.open(d, ID, META)
    assert (d / "precious.txt").read_text() == "keep"
