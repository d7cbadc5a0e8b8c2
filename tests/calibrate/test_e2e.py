"""The whole loop on this machine: measure (2 gloo ranks) → resume → fit → predict → train for real."""
from __future__ import annotations

import math
import shutil

import pytest

torch = pytest.importorskip("torch", reason="the whole loop measures and trains with torch (the calibrate extra)")

from calibrate.runner import RunOptions, run_calibration  # noqa: E402
from predictor import TrainingJob, load_platform  # noqa: E402
from predictor.samples import load_samples  # noqa: E402

from .conftest import TINY_JOB  # noqa: E402


def test_store_has_every_operator_and_gloo_collectives(tiny_store):
    samples = load_samples(tiny_store)
    from predictor.operators import CALIBRATED, COLLECTIVES
    assert {op for op, _ in samples.operators} == set(CALIBRATED)
    assert {k for k, _ in samples.collectives} == set(COLLECTIVES)
    for table in samples.collectives.values():
        assert set(table.column("nodes")) == {1.0} and set(table.column("gpus_per_node")) == {2.0}
        assert (table.column("us") > 0).all()
    meta = samples.meta
    assert meta["device"] == "cpu" and meta["progress"]["complete"] is True
    assert meta["environment"]["torch"] == torch.__version__
    assert meta["environment"]["cpu_threads"] >= 1 and meta["gpu"]["tflops"]["fp32"] > 0


def test_resume_skips_points_already_measured(tiny_store, tmp_path):
    out = tmp_path / "s"
    shutil.copytree(tiny_store, out)
    res = run_calibration(RunOptions(out=out, device="cpu", plan="tiny"))
    assert res.complete and res.measured_operators == 0 and res.measured_collectives == 0
    assert res.already_done > 200


def test_interrupted_run_resumes_where_it_stopped(tmp_path):
    out = tmp_path / "s"
    first = run_calibration(RunOptions(out=out, device="cpu", plan="tiny", part="operators", stop_after=40))
    assert not first.complete and not first.part_complete and first.measured_operators == 40
    from calibrate.store import read_meta
    assert read_meta(out)["progress"]["complete"] is False
    second = run_calibration(RunOptions(out=out, device="cpu", plan="tiny", part="operators"))
    assert second.already_done == 40 and second.measured_operators > 0
    rows = sum(len(t) for t in load_samples(out).operators.values())
    assert rows == first.measured_operators + second.measured_operators   # nothing measured twice


def test_platform_files_and_prediction(tiny_platform):
    for rel in ("platform.toml", "calibration.toml", "compute/manifest.toml", "collectives/manifest.toml",
                "validation/report.txt", "validation/validation.toml"):
        assert (tiny_platform / rel).is_file(), rel
    png = tiny_platform / "validation" / "predicted_vs_measured.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "linear1.fwd.fp32" in (tiny_platform / "validation" / "report.txt").read_text()
    from predictor import predict
    plat = load_platform(tiny_platform)
    assert plat.calibrated and plat.collectives is not None and plat.gpus_per_node == 2
    p = predict(TrainingJob.from_dict(TINY_JOB), plat)
    assert math.isfinite(p.iteration_seconds) and p.iteration_seconds > 0
    assert p.breakdown.gradient_reduce_seconds > 0 and p.breakdown.optimizer_seconds > 0
    assert not p.extrapolated, p.warnings
    lo, hi = p.interval_seconds
    assert lo <= p.iteration_seconds <= hi


def test_real_training_step_dp2_gloo():
    from calibrate.gpt_model import measure_training
    m = measure_training(TrainingJob.from_dict(TINY_JOB), steps=3, warmup=1)
    assert m.ranks == 2 and len(m.steps) == 3
    assert math.isfinite(m.iteration_seconds) and m.iteration_seconds > 0
    assert m.params > 400_000


def test_gpt_model_learns_and_refuses_unsupported_layouts():
    from calibrate import kernels as K
    from calibrate.errors import CalibrationError
    from calibrate.gpt_model import FlatGPT
    torch.manual_seed(0)
    job = TrainingJob.from_dict(TINY_JOB)
    model = FlatGPT(job, "cpu", dp=1)
    opt = K.MasterAdam(model.flat, model.flat_grad, lr=3e-3)
    ids = torch.randint(0, 512, (128,))
    losses = []
    for _ in range(6):
        model.flat_grad.zero_()
        loss = model.loss(ids, ids)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    for change in ({"layout": {"tp": 2}}, {"layout": {"recompute": "full"}}, {"layout": {"pp": 2}}):
        with pytest.raises(CalibrationError):
            FlatGPT(job.replace(**change), "cpu", dp=1)


def test_collectives_under_a_launcher_environment(tmp_path):
    """Ranks from RANK/WORLD_SIZE (torchrun; srun's SLURM_* take the same path): rank 0 records."""
    import os
    import subprocess
    import sys

    from calibrate.collectives import free_port
    out = tmp_path / "s"
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-m", "calibrate.cli", "run", "--plan", "tiny",
                                       "--part", "collectives", "--out", str(out), "--no-progress"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    # the part asked for is done (exit 0); the store is not complete (no operators yet)
    assert [p.returncode for p in procs] == [0, 0], outs
    from calibrate.store import read_meta
    assert read_meta(out)["progress"]["complete"] is False
    samples = load_samples(out)
    assert not samples.operators
    assert sum(len(t) for t in samples.collectives.values()) == 32
    assert "32 collective points measured" in outs[0]
