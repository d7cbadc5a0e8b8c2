"""Shared fixtures: one tiny calibration (CPU, 2 gloo ranks) and one fitted platform per session.

Measuring and fitting are the slow parts (seconds each on a 2-core machine), so every test that
needs a store or a platform shares these; tests that modify one work on a copy.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# LightGBM only: the library choice is calibrate.fitting's business and tested there; here it
# keeps the fit to seconds on a 2-core CI machine.
FAST_LIBRARIES = ("lightgbm",)

TINY_JOB = {
    "model": {"layers": 2, "hidden": 128, "heads": 4, "seq_len": 64, "vocab": 512,
              "attention": "fused_softmax", "pos_emb": "rotary", "norm": "layernorm",
              "activation": "gelu"},
    "layout": {"pp": 1, "tp": 1, "dp": 2, "micro_batch": 2, "micro_batches": 2, "zero_stage": 1,
               "recompute": "none"},
    "run": {"precision": "fp32", "train_iters": 10},
    "cluster": {"gpus_per_node": 2},
}


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory) -> Path:
    # Skipped here, per test that needs it, not for the whole folder: most calibrate tests run
    # without torch (fitting, harvest, install, report, records).
    pytest.importorskip("torch", reason="measuring a calibration store needs torch (the calibrate extra)")
    from calibrate.runner import RunOptions, run_calibration

    out = tmp_path_factory.mktemp("cal") / "samples"
    res = run_calibration(RunOptions(out=out, device="cpu", plan="tiny"))
    assert res.complete, res
    return out


@pytest.fixture(scope="session")
def tiny_platform(tiny_store, tmp_path_factory) -> Path:
    """Fitted through the CLI in a fresh process: it exercises `perf-calibrate fit`, and the
    regressor libraries load there without torch's OpenMP runtime beside theirs."""
    out = tmp_path_factory.mktemp("plat") / "cpu-tiny"
    res = subprocess.run([sys.executable, "-m", "calibrate.cli", "fit", str(tiny_store), "--out", str(out),
                          "--name", "cpu-tiny", "--libraries", ",".join(FAST_LIBRARIES)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "linear1.fwd.fp32" in res.stdout and "perf-predict JOB --platform" in res.stdout
    return out


@pytest.fixture
def store_copy(tiny_store, tmp_path) -> Path:
    dst = tmp_path / "samples"
    shutil.copytree(tiny_store, dst)
    return dst


@pytest.fixture
def one_rank():
    """A one-process gloo group for the test (calibrate.stack_host.one_rank_group), torn down after."""
    pytest.importorskip("torch", reason="a process group needs torch (the calibrate extra)")
    import torch.distributed as dist

    from calibrate import stack_host
    if dist.is_initialized():
        pytest.skip("a process group is already up in this session")
    stack_host.one_rank_group()
    yield
    _destroy_group()


def _destroy_group() -> None:
    """The test's group torn down; where DeepSpeed used it, through DeepSpeed, which then forgets
    the groups it cloned from it (an engine of the next test would broadcast over a dead one)."""
    import sys

    import torch.distributed as dist
    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None and getattr(comm, "cdb", None) is not None and comm.cdb.is_initialized():
        comm.destroy_process_group()
    else:
        dist.destroy_process_group()


def one_line_error(capsys, *needles: str) -> str:
    """The CLI's stderr after a refusal: one line, no traceback, holding every needle."""
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err and len(err.splitlines()) == 1, captured.err
    for n in needles:
        assert n in err, err
    return err
