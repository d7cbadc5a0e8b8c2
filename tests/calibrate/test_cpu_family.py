"""calibrate/cpu_family.py: the CPU ground-truth family's jobs, their runs files, and the data
parallelism its runs train.

Nothing here depends on how fast the machine is: only shapes, counts and file formats.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from calibrate import cpu_family as cf
from calibrate.errors import CalibrationError
from predictor import TrainingJob

PLAN = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "cpu-family" / "plan.toml"


def test_family_covers_the_brief_and_stays_inside_its_plan():
    import tomllib

    from calibrate.plans import Allocation, load_plan_file

    jobs = cf.family()
    names = [cf.name_of(j) for j in jobs]
    assert len(set(names)) == len(names)
    parsed = [TrainingJob.from_dict(j) for j in jobs]
    assert {j.layout.dp for j in parsed} == {1, 2}
    assert {j.layout.recompute for j in parsed} == {"none", "full"}
    assert min(j.layout.micro_batch for j in parsed) == 1 and max(j.layout.micro_batch for j in parsed) == 8
    assert min(j.model.hidden for j in parsed) == 128 and max(j.model.hidden for j in parsed) == 1024
    plan = load_plan_file(PLAN, device="cpu", allocation=Allocation(1, 2), memory_gib=8.0, precisions=None)
    assert plan.operators
    grid = tomllib.loads(PLAN.read_text())["grid"]
    for j in parsed:
        assert j.model.hidden in grid["hidden"] and j.layout.micro_batch in grid["b"]
        assert j.model.seq_len in grid["seq"] and j.model.vocab in grid["vocab"]
        assert j.model.head_dim in grid["head_dim"]


def test_a_job_is_found_by_its_name_and_an_unknown_name_lists_them():
    for j in cf.family():
        assert cf.job_named(cf.name_of(j)) == j
    with pytest.raises(CalibrationError, match=r"unknown job 'dp3 L1'; one of: dp2 L4 h256 mb2, "):
        cf.job_named("dp3 L1")


def test_stack_jobs_are_predicted_as_their_stack_runs():
    base = cf.stack_family()[0]
    launched = {"pytorch": ("", 1), "deepspeed": ("deepspeed", 1), "fsdp": ("torchtitan", 3)}
    assert set(cf.STACKS) == set(launched)
    for stack, (framework, zero) in launched.items():
        sj = TrainingJob.from_dict(cf.stack_job(base, stack))
        assert (sj.run.framework, sj.layout.zero_stage) == (framework, zero)
    assert base["layout"]["zero_stage"] == 1 and "framework" not in base["run"]     # a copy
    with pytest.raises(CalibrationError, match="stack 'jax'"):
        cf.stack_job(base, "jax")
    for jobs in (cf.stack_family(), cf.stack_family_dp1()):
        names = [cf.name_of(j) for j in jobs]
        assert len(set(names)) == len(names)
        for j in jobs:
            TrainingJob.from_dict(j)
    assert {j["layout"]["dp"] for j in cf.stack_family_dp1()} == {1}


def test_the_zero2_family_runs_deepspeed_at_both_stages_with_accumulation():
    base = cf.stack_family_zero2()[1]
    for stack, zero in zip(cf.ZERO2_STACKS, (1, 2)):
        sj = TrainingJob.from_dict(cf.stack_job(base, stack))
        assert (sj.run.framework, sj.layout.zero_stage) == ("deepspeed", zero)
    jobs = cf.stack_family_zero2()
    names = [cf.name_of(j) for j in jobs]
    assert len(set(names)) == len(names)
    # The number of micro-batches is in the name where it is not the families' 2.
    assert names[:3] == ["dp2 L2 h512 mb1 m1", "dp2 L2 h512 mb1 m4", "dp2 L2 h512 mb1 m8"]
    assert all(j["layout"]["dp"] == 2 for j in jobs)
    assert {j["layout"]["micro_batches"] for j in jobs} == {1, 4, 8}
    assert cf.name_of(cf.stack_family()[0]).endswith("mb1")      # unchanged where m = 2


def test_zero2_ratios_pair_each_job_at_both_stages_at_their_fastest():
    from predictor import Predictor, load_platform
    plat = load_platform("dgx-a100")
    jobs = cf.stack_family_zero2()[:2]
    runs = []
    for j, (one, two) in zip(jobs, ((1.0, 1.5), (2.0, 2.2))):
        for stack, secs in zip(cf.ZERO2_STACKS, (one, two)):
            sj = cf.stack_job(j, stack)
            runs.append({"name": f"{stack} {cf.name_of(sj)}", "job": sj, "measured_iteration_seconds": secs})
    # A slower second pass of one run, and a ZeRO-1 run with no ZeRO-2 partner: neither changes a row.
    runs.append({**runs[1], "measured_iteration_seconds": 9.0})
    lone = cf.stack_job(cf.stack_family_zero2()[2], "deepspeed")
    runs.append({"name": f"deepspeed {cf.name_of(lone)}", "job": lone, "measured_iteration_seconds": 1.0})
    rows = cf.zero2_ratio_rows(runs, plat)
    assert [r["name"] for r in rows] == [cf.name_of(j) for j in jobs]
    assert [r["measured_ratio"] for r in rows] == pytest.approx([1.5, 1.1])
    p = Predictor(plat)
    for r, j in zip(rows, jobs):
        z2, z1 = (p.predict(TrainingJob.from_dict(cf.stack_job(j, s))).iteration_seconds
                  for s in reversed(cf.ZERO2_STACKS))
        assert r["predicted_ratio"] == pytest.approx(z2 / z1)
        assert r["error"] == pytest.approx(r["predicted_ratio"] / r["measured_ratio"] - 1)
        assert r["predicted_ratio"] > 1          # ZeRO-2's reductions every micro-batch, and its hooks


def test_runs_file_round_trips_through_validate(tmp_path):
    from calibrate.validate import load_runs

    runs = [{"name": cf.name_of(j), "job": j, "measured_iteration_seconds": 0.1 * (i + 1), "steps": [0.1],
             "load": 1.0, "source": "test"} for i, j in enumerate(cf.family()[:3])]
    cf.write_runs(runs, tmp_path)
    back = load_runs(tmp_path / "runs.toml")
    assert [r.name for r in back] == [r["name"] for r in runs]
    assert [r.measured_iteration_seconds for r in back] == pytest.approx([0.1, 0.2, 0.3])
    assert back[0].job == TrainingJob.from_dict(runs[0]["job"])
    again = cf.read_runs(tmp_path / "runs.toml")
    assert [r["load"] for r in again] == [1.0, 1.0, 1.0]
    assert [r["others_cores"] for r in again] == [None, None, None]
    assert cf.read_runs(tmp_path / "runs.json") == runs


def test_compare_rows_put_each_prediction_beside_its_measurement():
    from predictor import load_platform, predict

    plat = load_platform("perlmutter-a100")
    runs = cf.read_runs(PLAN.parent / "runs.toml")[:2]
    rows = cf.compare_rows(runs, plat)
    assert [r["name"] for r in rows] == [r["name"] for r in runs]
    for run, row in zip(runs, rows):
        pred = predict(TrainingJob.from_dict(run["job"]), plat)
        assert row["predicted_seconds"] == pred.iteration_seconds
        assert row["error"] == pytest.approx(pred.iteration_seconds / run["measured_iteration_seconds"] - 1.0)
        lo, hi = row["interval_seconds"]
        assert row["covered"] == (lo <= row["measured_seconds"] <= hi)
        assert row["breakdown_s"] == pred.breakdown.to_dict()


def test_training_reduces_exactly_what_the_predictor_costs():
    """Every family job: one all-reduce of the model's fp32 parameter count (the predictor's one
    bucket), and a ZeRO-1 all-gather of numel / dp; the trained model holds that many parameters."""
    torch = pytest.importorskip("torch", reason="building the trained model needs torch (the calibrate extra)")
    from calibrate.gpt_model import model_class
    from predictor.estimate import REDUCE_BUCKET_ENTRIES
    from predictor.recipe import stage_parameter_counts

    for jd in cf.family():
        j = TrainingJob.from_dict(jd)
        if j.model.hidden > 256:
            continue                              # same rule, bigger buffers: keep the test light
        (n,) = stage_parameter_counts(j.model, j.layout)
        assert n < REDUCE_BUCKET_ENTRIES          # one all-reduce call, as the model issues
        model = model_class(j)(j, "cpu", j.layout.dp)
        assert model.numel == n, cf.name_of(jd)
        assert model.flat_grad.dtype == torch.float32 and model.padded % j.layout.dp == 0
