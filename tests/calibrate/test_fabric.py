"""perf-calibrate fabric: collectives timed alone and beside the allocation's other groups of
their shape, carried by fit into [fabric], applied by the predictor to collectives between nodes.

Real gloo ranks on this machine measure the CPU path (one host: groups inside a node); the
between-nodes figure is checked from written measurements.  No assertion depends on speed.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from calibrate.cli import main
from calibrate.errors import CalibrationError
from calibrate.fitting.fabric import platform_fabric_table
from predictor import BundleError, load_platform, predict
from predictor.samples import dump_toml
from tests.predictor.conftest import copy_shipped_platform, make_job

from .test_fit_host_table import _fit, _gpu_store

# Only the measurement needs torch (the calibrate extra); the fit and the predictor read its file.
NEEDS_TORCH = "calibrate.fabric measures with torch.distributed (the calibrate extra)"

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_tiles_cover_the_allocation_as_layouts_place_groups():
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.fabric import tiles
    places = [(node, local) for node in range(4) for local in range(2)]      # rank = 2·node + local
    assert tiles(places, 2, 1) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert tiles(places, 2, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert tiles(places, 1, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tiles(places, 3, 1) == [[0, 2, 4], [1, 3, 5]]                     # node 3 left out
    assert tiles(places, 4, 2) == [list(range(8))]


def test_default_shapes_leave_room_for_two_groups():
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    from calibrate.fabric import default_shapes
    assert default_shapes(4, 2) == [(1, 2), (2, 1), (2, 2), (4, 1)]
    assert default_shapes(1, 4) == [(1, 2)]
    assert default_shapes(1, 2) == []
    assert default_shapes(16, 1) == [(2, 1), (4, 1), (8, 1)]


def test_fabric_on_local_ranks_writes_both_timings(tmp_path, capsys):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    out = tmp_path / "fabric.toml"
    assert main(["fabric", "--device", "cpu", "--ranks", "4", "--shapes", "1x2", "--entries", "4096",
                 "--out", str(out)]) == 0
    doc = tomllib.loads(out.read_text(encoding="utf-8"))
    assert doc["fabric"]["device"] == "cpu" and doc["fabric"]["gpus_per_node"] == 4
    (row,) = doc["rows"]
    assert (row["entries"], row["group_nodes"], row["group_gpus_per_node"], row["groups"]) == (4096, 1, 2, 2)
    assert row["alone_us"] > 0 and row["concurrent_us"] > 0
    assert "1x2 x 2 groups" in capsys.readouterr().out


def test_fabric_refuses_what_it_cannot_measure(tmp_path, capsys):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    out = tmp_path / "fabric.toml"
    # Two ranks hold one group of two: nothing beside it.
    assert main(["fabric", "--device", "cpu", "--ranks", "2", "--out", str(out)]) == 2
    assert "no group shape has room for two groups" in capsys.readouterr().err
    assert not out.exists()
    assert main(["fabric", "--device", "cpu", "--ranks", "1", "--out", str(out)]) == 2
    assert "--ranks" in capsys.readouterr().err
    assert main(["fabric", "--device", "cpu", "--shapes", "4", "--out", str(out)]) == 2
    assert "--shapes: shapes are NODESxGPUS" in capsys.readouterr().err


def _rows(*rows):
    return [{"entries": e, "group_nodes": n, "group_gpus_per_node": g, "groups": k, "alone_us": a,
             "concurrent_us": c} for e, n, g, k, a, c in rows]


def _fabric_file(path: Path, rows) -> Path:
    path.write_text(dump_toml({"fabric": {"device": "cuda", "device_name": "NVIDIA GH200 120GB",
                                          "nodes": 16, "gpus_per_node": 1}, "rows": rows}), encoding="utf-8")
    return path


def test_fit_table_is_the_median_of_the_shapes_between_nodes(tmp_path):
    f = _fabric_file(tmp_path / "fabric.toml", _rows(
        (1 << 20, 2, 1, 8, 100.0, 110.0),       # a smaller message of the 2×1 shape: not used
        (1 << 24, 2, 1, 8, 1000.0, 1300.0),     # 2×1 at its largest: ×1.3
        (1 << 24, 4, 1, 4, 2000.0, 3000.0),     # 4×1: ×1.5
        (1 << 24, 1, 4, 4, 500.0, 1500.0)))     # inside a node: not the fabric's
    table = platform_fabric_table(f)
    assert table["between_nodes_slowdown"] == pytest.approx(1.4)
    assert "2x1: x1.300" in table["source"] and "4x1: x1.500" in table["source"]
    # Only groups inside a node: nothing to carry.
    assert platform_fabric_table(_fabric_file(tmp_path / "intra.toml", _rows((1 << 24, 1, 4, 4, 5.0, 9.0)))) is None
    # Faster together is noise: never below 1.
    fast = _fabric_file(tmp_path / "fast.toml", _rows((1 << 24, 2, 1, 8, 1000.0, 950.0)))
    assert platform_fabric_table(fast)["between_nodes_slowdown"] == 1.0
    bad = _fabric_file(tmp_path / "bad.toml", _rows((1 << 24, 2, 1, 8, 0.0, 950.0)))
    with pytest.raises(CalibrationError, match=r"rows\[0\]: alone_us must be a positive number"):
        platform_fabric_table(bad)


def test_fit_carries_fabric_into_the_platform(tmp_path):
    store = _gpu_store(tmp_path)
    _fabric_file(store / "fabric.toml", _rows((1 << 24, 2, 1, 8, 1000.0, 1250.0)))
    res = _fit(store, tmp_path / "plat")
    assert res.returncode == 0, res.stderr
    fabric = load_platform(tmp_path / "plat", reload=True).fabric
    assert fabric is not None and fabric.between_nodes_slowdown == pytest.approx(1.25)
    shutil.rmtree(tmp_path / "plat")
    _fabric_file(store / "fabric.toml", _rows((1 << 24, 1, 4, 2, 1000.0, 1250.0)))
    res = _fit(store, tmp_path / "plat")
    assert res.returncode == 0, res.stderr
    plat = load_platform(tmp_path / "plat", reload=True)
    assert plat.fabric is None and any("no groups between nodes" in n for n in plat.notes)


def _platform_with_fabric(tmp_path, name, fabric):
    return load_platform(copy_shipped_platform(tmp_path, name, fabric=fabric), reload=True)


def test_collectives_between_nodes_take_the_fabric_slowdown(tmp_path):
    plain = _platform_with_fabric(tmp_path / "a", "vista-gh200", None)
    shared = _platform_with_fabric(tmp_path / "b", "vista-gh200", {"between_nodes_slowdown": 1.5, "source": "test"})
    job = make_job(pp=4, tp=4, dp=8)             # Vista: one GPU per node, every group between nodes
    a, b = predict(job, plain), predict(job, shared)
    assert b.breakdown.tp_allreduce_seconds == pytest.approx(1.5 * a.breakdown.tp_allreduce_seconds)
    assert b.breakdown.pp_p2p_seconds == pytest.approx(1.5 * a.breakdown.pp_p2p_seconds)
    assert b.iteration_seconds > a.iteration_seconds
    # A job inside one node uses no fabric: unchanged.
    plain_h, shared_h = (_platform_with_fabric(tmp_path / k, "dgx-h100", f) for k, f in
                         (("c", None), ("d", {"between_nodes_slowdown": 1.5})))
    small = make_job(pp=1, tp=8, dp=1, micro_batch=1, micro_batches=4)
    assert predict(small, shared_h).iteration_seconds == predict(small, plain_h).iteration_seconds


@pytest.mark.parametrize("fabric,match", [({"between_nodes_slowdown": 0.8}, "fabric.between_nodes_slowdown"),
                                          ({"between_nodes_slowdown": "x"}, "fabric.between_nodes_slowdown"),
                                          ({"between_nodes_slowdown": 1.2, "nics": 2}, "unknown \\[fabric\\] keys")])
def test_bad_fabric_table_is_refused_naming_the_key(tmp_path, fabric, match):
    with pytest.raises(BundleError, match=match):
        _platform_with_fabric(tmp_path, "dgx-h100", fabric)
