"""The estimate-train-time importer, on small files written here in that project's layout."""
import csv

import pytest

from calibrate.importers import ImportError_, import_estimate_train_time, vocab_per_rank
from predictor.samples import load_samples

GPU = "FAKEGPU"


def _write(path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


@pytest.fixture
def system(tmp_path):
    src = tmp_path / "Sys"
    (src / "operator").mkdir(parents=True)
    (src / "nccl").mkdir()
    (tmp_path / "LICENSE").write_text("MIT License\n")
    _write(src / "operator" / f"{GPU}.csv", ["GPU"], [[GPU]])
    _write(src / "operator" / f"{GPU}_linear1_fp16.csv", ["mp", "b", "l", "dim", "F_dur(us)", "B_dur(us)"],
           [[2, 4, 2048, 4096, 100.0, 200.0]])
    _write(src / "operator" / f"{GPU}_flash_atten_fp16.csv", ["mp", "b", "h", "l", "dim", "F_dur(us)", "B_dur(us)"],
           [[2, 4, 32, 2048, 4096, 50.0, 120.0]])
    _write(src / "operator" / f"{GPU}_linear_final_fp16.csv", ["mp", "b", "l", "dim", "F_dur(us)", "B_dur(us)"],
           [[4, 2, 1024, 2048, 10.0, 20.0]])
    _write(src / "operator" / f"{GPU}_firstStage_optimizer_fp16.csv", ["mp", "dim", "encoders", "dur(us)"],
           [[1, 1024, 2, 500.0]])
    _write(src / "nccl" / f"{GPU}_allreduce_large_fp16_2_1.csv", ["shape", "nodes", "GPUsPerNode", "dur(us)"],
           [[1e8, 2, 1, 5000.0], [2e8, 2, 1, 1.0]])   # the second row is physically impossible
    _write(src / "nccl" / f"{GPU}_allreduce_large_fp16.csv", ["shape", "nodes", "GPUsPerNode", "dur(us)"],
           [[1e8, 2, 1, 5000.0]])
    return src


def test_converts_to_physical_shapes(system, tmp_path):
    out = tmp_path / "out"
    summary = import_estimate_train_time(system, out)
    s = load_samples(out)
    lin = s.operators[("linear1", "fp16")]
    assert lin.rows[0].tolist() == [4 * 2048, 4096, 3 * 4096 / 2, 100.0, 200.0]
    fa = s.operators[("flash_atten", "fp16")]
    assert fa.rows[0].tolist() == [4, 16, 2048, 128, 50.0, 120.0]
    lf = s.operators[("linear_final", "fp16")]
    assert lf.rows[0][2] == vocab_per_rank(50257, 4) == 12672
    opt = s.operators[("optimizer", "fp16")]
    assert opt.rows[0][0] == 2 * (12 * 1024 * 1024 + 13 * 1024) + 50304 * 1024
    coll = s.collectives[("allreduce", "fp16")]
    assert coll.rows.tolist() == [[1e8, 2, 1, 5000.0]]        # pooled file skipped, bad row dropped
    assert summary.dropped_rows == {"allreduce": 1}
    assert "MIT" in (out / "LICENSE").read_text()


def test_refuses_non_system_and_existing(system, tmp_path):
    with pytest.raises(ImportError_, match="no operator/ folder"):
        import_estimate_train_time(tmp_path / "nothing", tmp_path / "o1")
    import_estimate_train_time(system, tmp_path / "o2")
    with pytest.raises(ImportError_, match="already exists"):
        import_estimate_train_time(system, tmp_path / "o2")


FLASH_HEADER = ["mp", "b", "h", "l", "dim", "F_dur(us)", "B_dur(us)"]


def test_a_flash_backward_faster_than_its_forward_is_dropped(system, tmp_path):
    # One impossible row of four: only its backward goes (0 = not measured); forwards all stay.
    rows = [[2, 4, 32, 2048, 4096, 50.0, 120.0], [2, 4, 32, 4096, 4096, 200.0, 20.0],
            [4, 4, 32, 2048, 4096, 30.0, 80.0], [4, 4, 32, 4096, 4096, 110.0, 300.0]]
    _write(system / "operator" / f"{GPU}_flash_atten_fp16.csv", FLASH_HEADER, rows)
    summary = import_estimate_train_time(system, tmp_path / "o")
    fa = load_samples(tmp_path / "o").operators[("flash_atten", "fp16")]
    assert fa.column("fwd_us").tolist() == [50.0, 200.0, 30.0, 110.0]
    assert fa.column("bwd_us").tolist() == [120.0, 0.0, 80.0, 300.0]
    assert summary.dropped_rows["flash_atten backward"] == 1


def test_a_mostly_impossible_flash_backward_is_dropped_whole(system, tmp_path):
    # Vista's case: backward ~constant while the forward grows -- the survivors are no better.
    rows = [[2, 4, 32, l, 4096, l / 10, 50.0] for l in (512, 1024, 2048, 4096)]
    rows.append([2, 4, 32, 256, 4096, 20.0, 52.0])
    _write(system / "operator" / f"{GPU}_flash_atten_fp16.csv", FLASH_HEADER, rows)
    summary = import_estimate_train_time(system, tmp_path / "o")
    fa = load_samples(tmp_path / "o").operators[("flash_atten", "fp16")]
    assert fa.column("bwd_us").tolist() == [0.0] * 5
    assert summary.dropped_rows["flash_atten backward"] == 5
