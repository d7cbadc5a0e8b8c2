"""A partition's runs file has one writer at a time: the harvest and the watch both read, merge and
rewrite it, under one advisory lock, replacing the file atomically."""
from __future__ import annotations

import multiprocessing
import os
import stat

import pytest

from calibrate import runs_files
from calibrate.runs_files import RunsFileError, lock_path, merge_runs, runs_file, runs_lock
from calibrate.validate import load_runs
from predictor.job import TrainingJob
from predictor.validation import MeasuredRun

JOB = TrainingJob.from_dict({"model": {"layers": 2, "hidden": 256, "heads": 4, "seq_len": 512, "vocab": 50257},
                             "layout": {"micro_batch": 1, "micro_batches": 8}, "run": {"train_iters": 100}})


def run(name: str, seconds: float = 1.0) -> MeasuredRun:
    return MeasuredRun(name=name, job=JOB, measured_iteration_seconds=seconds, predicted_iteration_seconds=0.9,
                       source="test")


def _writer(out_dir: str, prefix: str, count: int, start) -> None:
    start.wait()
    for i in range(count):
        merge_runs(out_dir, "gpu", [run(f"{prefix} {i}")])


def test_two_processes_appending_at_once_lose_nothing(tmp_path):
    """Each process merges its runs one at a time, as the watch does per job; without the lock
    their read-modify-writes interleave and one's rows vanish."""
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    count = 40
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), prefix, count, start))
             for prefix in ("watch", "harvest")]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    names = {r.name for r in load_runs(tmp_path / "gpu.toml")}
    assert names == {f"{p} {i}" for p in ("watch", "harvest") for i in range(count)}
    # Nothing left behind but the lock file.
    assert sorted(f.name for f in tmp_path.iterdir()) == [".gpu.toml.lock", "gpu.toml"]


def test_a_held_lock_is_waited_for_then_named(tmp_path, monkeypatch):
    path = runs_file(tmp_path, "gpu")
    merge_runs(tmp_path, "gpu", [run("slurm job 1")])
    before = path.read_text()
    monkeypatch.setattr(runs_files, "LOCK_WAIT_S", 0.3)
    with runs_lock(path):
        with pytest.raises(RunsFileError) as exc:
            merge_runs(tmp_path, "gpu", [run("slurm job 2")])
    msg = str(exc.value)
    assert str(lock_path(path)) in msg and f"held by pid {os.getpid()}" in msg and "0.3 s" in msg
    assert str(path) in msg and "\n" not in msg
    assert path.read_text() == before                       # nothing written
    merge_runs(tmp_path, "gpu", [run("slurm job 2")])       # released: it goes in
    assert [r.name for r in load_runs(path)] == ["slurm job 1", "slurm job 2"]


def test_replaced_whole_keeping_its_mode_and_old_text_on_failure(tmp_path, monkeypatch):
    path = runs_file(tmp_path, "gpu")
    merge_runs(tmp_path, "gpu", [run("slurm job 1")])
    path.chmod(0o640)
    inode = path.stat().st_ino
    merge_runs(tmp_path, "gpu", [run("slurm job 1", 2.0), run("slurm job 2")])
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and path.stat().st_ino != inode   # a new file, renamed
    runs = load_runs(path)
    assert [(r.name, r.measured_iteration_seconds) for r in runs] == [("slurm job 1", 2.0), ("slurm job 2", 1.0)]
    before = path.read_text()

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(runs_files.os, "replace", full)
    with pytest.raises(RunsFileError, match=r"gpu\.toml: cannot write: No space left on device"):
        merge_runs(tmp_path, "gpu", [run("slurm job 3")])
    assert path.read_text() == before
    assert sorted(f.name for f in tmp_path.iterdir()) == [".gpu.toml.lock", "gpu.toml"]


def test_dry_run_neither_locks_nor_writes(tmp_path):
    path, added, total, merged = merge_runs(tmp_path / "runs", "gpu", [run("slurm job 1")], dry_run=True)
    assert (added, total, [r.name for r in merged]) == (1, 1, ["slurm job 1"])
    assert not (tmp_path / "runs").exists()


def test_a_bad_partition_name_and_a_broken_file_are_one_line(tmp_path):
    with pytest.raises(RunsFileError, match="bad partition name"):
        runs_file(tmp_path, "../etc")
    (tmp_path / "gpu.toml").write_text("[[run]]\nname = \n")
    with pytest.raises(RunsFileError, match="gpu.toml.*move it aside"):
        merge_runs(tmp_path, "gpu", [run("slurm job 1")])
