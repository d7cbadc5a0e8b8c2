"""Faults a QA pass found in import / fit / run / validate: each is one line naming what is wrong,
exit 2, and nothing half-written or wrongly marked complete is left behind."""
import shutil
from pathlib import Path

import pytest

from calibrate.cli import main

from .test_importers import GPU
from .test_importers import _write as _write_csv

from .conftest import one_line_error

LINEAR_HEADER = ["mp", "b", "h", "l", "dim", "F_dur(us)", "B_dur(us)"]


def _write(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_csv(path, header, rows)


@pytest.fixture
def system(tmp_path):
    src = tmp_path / "Sys"
    _write(src / "operator" / f"{GPU}.csv", ["GPU"], [[GPU]])
    _write(src / "operator" / f"{GPU}_linear1_fp16.csv", LINEAR_HEADER, [[2, 4, 32, 2048, 4096, 100.0, 200.0]])
    _write(src / "nccl" / f"{GPU}_allreduce_fp16_1_4.csv", ["shape", "nodes", "GPUsPerNode", "dur(us)"],
           [[1e6, 1, 4, 500.0]])
    return src


def _import(src, out, *extra):
    return main(["import", "--format", "estimate-train-time", str(src), "--out", str(out), *extra])


LINEAR = f"{GPU}_linear1_fp16.csv"


@pytest.mark.parametrize("name, header, rows, needles", [
    (LINEAR, ["mp", "b", "h", "l", "dimm", "F_dur(us)", "B_dur(us)"], [[2, 4, 32, 2048, 4096, 1.0, 2.0]],
     [f"{LINEAR}:1:", "'dim'"]),
    (LINEAR, LINEAR_HEADER, [[2, 4, 32, 2048, 4096, 1.0, 2.0], [0, 4, 32, 2048, 4096, 1.0, 2.0]],
     [f"{LINEAR}:3:", "'mp'"]),
    (LINEAR, LINEAR_HEADER, [[2, 4, 32, 2048, "x", 1.0, 2.0]], [f"{LINEAR}:2:", "'dim'", "not a number"]),
    (LINEAR, LINEAR_HEADER, [[2, 4, 32, 2048, 4096, 1.0]], [f"{LINEAR}:2:", "fewer values"]),
    (LINEAR, ["mp", "b", "h", "l", "dim", "F_dur(us)"], [[2, 4, 32, 2048, 4096, 1.0]],
     [f"{LINEAR}:1:", "'B_dur(us)'"]),
    (f"{GPU}_allreduce_fp16_1_4.csv", ["size", "dur(us)"], [[1e6, 500.0]],
     [f"{GPU}_allreduce_fp16_1_4.csv:1:", "'shape'"]),
])
def test_malformed_source_is_one_line_and_leaves_no_out(capsys, system, tmp_path, name, header, rows, needles):
    folder = "nccl" if "allreduce" in name else "operator"
    _write(system / folder / name, header, rows)
    out = tmp_path / "out"
    assert _import(system, out) == 2
    one_line_error(capsys, *needles)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["Sys"]       # no temporary sibling either
    # Fixed, the same command works (nothing left behind blocks the retry).
    _write(system / folder / name, *(
        (["shape", "nodes", "GPUsPerNode", "dur(us)"], [[1e6, 1, 4, 500.0]]) if folder == "nccl"
        else (LINEAR_HEADER, [[2, 4, 32, 2048, 4096, 100.0, 200.0]])))
    assert _import(system, out) == 0
    assert (out / "samples.toml").is_file() and (out / "collectives" / "allreduce_fp16.csv").is_file()


def test_a_byte_that_is_not_utf8_names_file_and_line(capsys, system, tmp_path):
    path = system / "operator" / LINEAR
    path.write_bytes(b"mp,b,h,l,dim,F_dur(us),B_dur(us)\n2,4,32,2048,4096,1,2\n2,4,32,\xff,4096,1,2\n")
    assert _import(system, tmp_path / "out") == 2
    one_line_error(capsys, f"{LINEAR}:3:", "UTF-8", "0xff")
    assert not (tmp_path / "out").exists()


def test_a_failed_forced_import_keeps_the_previous_out(capsys, system, tmp_path):
    out = tmp_path / "out"
    assert _import(system, out) == 0
    before = (out / "operators" / "linear1_fp16.csv").read_text()
    _write(system / "nccl" / f"{GPU}_allreduce_fp16_1_4.csv", ["size", "dur(us)"], [[1e6, 500.0]])
    assert _import(system, out, "--force") == 2
    one_line_error(capsys, "'shape'")
    assert (out / "operators" / "linear1_fp16.csv").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Sys", "out"]


@pytest.mark.parametrize("extra", [(), ("--json",), ("--dry-run",)])
def test_validate_an_unknown_platform_exits_2(capsys, tmp_path, monkeypatch, extra):
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(tmp_path / "root"))
    runs = tmp_path / "runs.toml"
    runs.write_text('[[run]]\nname = "a"\nmeasured_iteration_seconds = 2.5\njob_file = "a.toml"\n')
    shutil.copyfile(Path(__file__).parents[2] / "examples" / "gpt20b-perlmutter.toml", tmp_path / "a.toml")
    assert main(["validate", "cpuu", "--runs", str(runs), *extra]) == 2
    one_line_error(capsys, "cpuu")


H100 = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h100-lent"


def _h100_store(tmp_path, header_only=()):
    """A slice of the lent H100's samples (no torch needed); ``header_only``: operators whose CSV
    keeps only its header (a run that measured nothing of them)."""
    d = tmp_path / "samples"
    (d / "operators").mkdir(parents=True)
    shutil.copy(H100 / "samples.toml", d / "samples.toml")
    for name in ("gelu_fp16.csv", "res_add_fp16.csv", "linear1_fp16.csv"):
        text = (H100 / "operators" / name).read_text(encoding="utf-8")
        if name.split("_fp16")[0] in header_only:
            text = text.splitlines(keepends=True)[0]
        (d / "operators" / name).write_text(text, encoding="utf-8")
    return d


def _fit(store, out):
    from calibrate.fitting import fit_platform
    from .conftest import FAST_LIBRARIES
    return fit_platform(store, out, candidates=FAST_LIBRARIES, plot=False)


def test_an_operator_with_only_a_header_leaves_the_fit_incomplete_and_install_refuses_it(tmp_path):
    from calibrate.install import InstallRefused, install_platform
    import tomllib
    res = _fit(_h100_store(tmp_path, header_only=("linear1",)), tmp_path / "px")
    assert not res.complete
    cal = tomllib.loads((tmp_path / "px" / "calibration.toml").read_text(encoding="utf-8"))
    assert cal["complete"] is False
    note = next(n for n in res.notes if "linear1" in n)
    assert "linear1_fp16.csv" in note and "not complete" in note
    with pytest.raises(InstallRefused, match="incomplete calibration"):
        install_platform(tmp_path / "px", "cpu2", root=tmp_path / "root")


def test_a_fit_of_every_measured_operator_stays_complete(tmp_path):
    res = _fit(_h100_store(tmp_path), tmp_path / "px")
    assert res.complete and not any("not complete" in n for n in res.notes)


def _open(d, plan):
    from calibrate.store import SampleStore, StoreIdentity
    return SampleStore.open(d, StoreIdentity("cpu", "cpu", 1), {"plans": [plan], "precisions": ["fp32"]})


def test_a_store_resumed_with_another_plan_is_complete_only_when_every_plan_is(tmp_path):
    from calibrate.store import read_meta
    d = tmp_path / "store"
    assert _open(d, "tiny").mark_complete(False, "tiny") is False        # interrupted
    mini = _open(d, "mini")
    assert mini.mark_complete(True, "mini") is False                     # tiny still is not
    assert mini.incomplete_plans() == ["tiny"]
    meta = read_meta(d)
    assert meta["plans"] == ["mini", "tiny"] and meta["progress"]["complete"] is False
    assert _open(d, "tiny").mark_complete(True, "tiny") is True
    assert read_meta(d)["progress"]["complete"] is True


def test_a_store_complete_before_plans_were_tracked_stays_so(tmp_path):
    from calibrate.store import read_meta, write_meta
    d = tmp_path / "store"
    _open(d, "tiny")
    meta = read_meta(d)
    meta["progress"] = {"complete": True}                                # the older samples.toml
    write_meta(d, {k: v for k, v in meta.items() if k != "format"})
    assert _open(d, "mini").mark_complete(True, "mini") is True
