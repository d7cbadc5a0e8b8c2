"""The CPU ground-truth family (benchmarks/bench_cpu_family.py) and the full-recomputation model.

Nothing here depends on how fast the machine is: only shapes, gradients and file formats.
"""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from predictor import TrainingJob  # noqa: E402

from .conftest import benchmark_module  # noqa: E402


def _bench():
    return benchmark_module("bench_cpu_family")


def _tiny(recompute: str) -> TrainingJob:
    return TrainingJob.from_dict({
        "model": {"layers": 2, "hidden": 64, "heads": 2, "seq_len": 32, "vocab": 256,
                  "attention": "fused_softmax", "pos_emb": "rotary"},
        "layout": {"pp": 1, "tp": 1, "dp": 1, "micro_batch": 2, "micro_batches": 1, "zero_stage": 0,
                   "recompute": recompute},
        "run": {"precision": "fp32"}, "cluster": {"gpus_per_node": 1}})


def test_full_recomputation_gives_the_same_loss_and_gradients():
    from calibrate.errors import CalibrationError
    from calibrate.gpt_model import FlatGPT, RecomputeGPT, model_class

    assert model_class(_tiny("full")) is RecomputeGPT and model_class(_tiny("none")) is FlatGPT
    with pytest.raises(CalibrationError):
        FlatGPT(_tiny("full"), "cpu", 1)        # the plain model still refuses it
    with pytest.raises(CalibrationError):
        RecomputeGPT(_tiny("selective"), "cpu", 1)
    ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0))
    out = []
    for model in (FlatGPT(_tiny("none"), "cpu", 1), RecomputeGPT(_tiny("full"), "cpu", 1)):
        loss = model.loss(ids, ids)
        loss.backward()
        out.append((float(loss.detach()), model.flat_grad.clone()))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-6)
    assert torch.allclose(out[0][1], out[1][1], atol=1e-6)
    assert float(out[1][1].abs().max()) > 0


def test_measure_training_runs_full_recomputation():
    from calibrate.gpt_model import measure_training

    m = measure_training(_tiny("full"), steps=2, warmup=0, threads=1)
    assert len(m.steps) == 2 and math.isfinite(m.iteration_seconds) and m.iteration_seconds > 0


def test_family_covers_the_brief_and_stays_inside_its_plan():
    from calibrate.plans import load_plan_file, Allocation

    b = _bench()
    jobs = b.family()
    names = [b.name_of(j) for j in jobs]
    assert len(set(names)) == len(names)
    parsed = [TrainingJob.from_dict(j) for j in jobs]
    assert {j.layout.dp for j in parsed} == {1, 2}
    assert {j.layout.recompute for j in parsed} == {"none", "full"}
    assert min(j.layout.micro_batch for j in parsed) == 1 and max(j.layout.micro_batch for j in parsed) == 8
    assert min(j.model.hidden for j in parsed) == 128 and max(j.model.hidden for j in parsed) == 1024
    plan = load_plan_file(b.PLAN, device="cpu", allocation=Allocation(1, 2), memory_gib=8.0, precisions=None)
    assert plan.operators
    import tomllib
    grid = tomllib.loads(b.PLAN.read_text())["grid"]
    for j in parsed:
        assert j.model.hidden in grid["hidden"] and j.layout.micro_batch in grid["b"]
        assert j.model.seq_len in grid["seq"] and j.model.vocab in grid["vocab"]
        assert j.model.head_dim in grid["head_dim"]


def test_runs_file_round_trips_through_validate(tmp_path):
    from calibrate.validate import load_runs

    b = _bench()
    runs = [{"name": b.name_of(j), "job": j, "measured_iteration_seconds": 0.1 * (i + 1), "steps": [0.1],
             "load": 1.0, "source": "test"} for i, j in enumerate(b.family()[:3])]
    b.write_runs(runs, tmp_path)
    back = load_runs(tmp_path / "runs.toml")
    assert [r.name for r in back] == [r["name"] for r in runs]
    assert [r.measured_iteration_seconds for r in back] == pytest.approx([0.1, 0.2, 0.3])
    assert back[0].job == TrainingJob.from_dict(runs[0]["job"])
    again = b.read_runs(tmp_path / "runs.toml")
    assert [r["load"] for r in again] == [1.0, 1.0, 1.0]
