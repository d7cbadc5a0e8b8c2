"""`plan` and `schedule` refuse impossible values, and the default schedule fits MaxTime.

No Slurm: the partition comes from test_schedule's fake client, put where `schedule` looks for
Slurm's (``slurm_plugin.slurm_client.SlurmClient``) for the CLI tests.
"""
from __future__ import annotations

import re

import pytest

from calibrate import schedule as schedule_mod
from calibrate.cli import main
from calibrate.errors import CalibrationError
from calibrate.plans import known_gpu, resolve_gpu
from calibrate.schedule import ScheduleRequest, parse_every, schedule

from .test_schedule import FakePartition, FakeSlurm

TWO_DAYS = 2 * 24 * 60


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def slurm(monkeypatch):
    """The CLI's Slurm: one fake partition `gpu` (8 nodes × 4 A100, MaxTime 2 days); tests may
    replace ``slurm.part``."""
    fake = FakeSlurm(FakePartition(max_time_minutes=TWO_DAYS, raw={"Gres": "gpu:a100:4"}))
    import slurm_plugin.slurm_client as sc
    monkeypatch.setattr(sc, "SlurmClient", lambda: fake)
    return fake


@pytest.fixture
def small_space(monkeypatch):
    """The adaptive plan over the smoke grid: building the paper space takes ~15 s a plan, and
    what these tests check (sizes, refusals) is arithmetic the space does not change."""
    from calibrate import plans
    monkeypatch.setitem(plans.GRIDS, "adaptive", plans.GRIDS["smoke"])


def _one_line_error(code, out, err, *needles):
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


# ------------------------------------------------------------------ 1. the default fits MaxTime
@pytest.mark.parametrize("max_time,nodes,paper_space", [(TWO_DAYS, 8, True), (240, 8, False), (30, 1, False),
                                                        (60, 2, False)])
def test_default_adaptive_schedule_fits_maxtime(tmp_path, request, max_time, nodes, paper_space):
    if not paper_space:
        request.getfixturevalue("small_space")
    part = FakePartition(nodes=nodes, max_time_minutes=max_time, raw={"Gres": "gpu:a100:4"})
    job = schedule(ScheduleRequest(partition="gpu", root=str(tmp_path), dry_run=True), client=FakeSlurm(part))
    assert job.notes == []
    # The estimate itself (not only the capped limit) fits: measuring with its margin, host and
    # fabric, fit and install.
    estimate = (job.cost.wall_minutes * schedule_mod.SAFETY + schedule_mod.HOST_FABRIC_MINUTES
                + schedule_mod.FIT_MINUTES)
    assert estimate <= max_time + 1e-6 and job.time_limit_minutes <= max_time
    # Most of MaxTime is used, and the script's --budget is the one estimated.
    assert job.time_limit_minutes >= max_time - 2
    budget = int(re.search(r"--budget (\d+)", job.script).group(1))
    assert budget == pytest.approx(job.cost.gpu_minutes, abs=1)


def test_default_schedule_cli_prints_no_maxtime_note(capsys, slurm, small_space, tmp_path):
    # An --every longer than the job is taken.
    code, out, err = _run(capsys, "schedule", "--partition", "gpu", "--every", "3d", "--dry-run",
                          "--root", str(tmp_path))
    assert code == 0, err
    assert "exceeds MaxTime" not in err and "time limit 2-00:00:00" in err
    assert f"--begin=now+{3 * 86400}" in out


def test_maxtime_too_short_for_the_fixed_parts_is_one_line(capsys, slurm, tmp_path):
    slurm.part = FakePartition(nodes=1, max_time_minutes=25)
    _one_line_error(*_run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--root", str(tmp_path)),
                    "MaxTime 00:25:00 is too short", "fit and install (15 min)")


def test_collectives_beyond_a_short_maxtime_are_refused_with_the_way_out(capsys, slurm, tmp_path):
    # 30 min on 4 nodes: the collectives (~10 min, ×1.5) and the 20 fixed minutes cannot fit.
    slurm.part = FakePartition(max_time_minutes=30)
    _one_line_error(*_run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--root", str(tmp_path)),
                    "exceeds MaxTime 00:30:00", "fewer --nodes")
    code, _, err = _run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--nodes", "1",
                        "--root", str(tmp_path))
    assert code == 0 and "exceeds" not in err, err


def test_an_explicit_budget_is_kept_and_the_note_stays(tmp_path, small_space):
    part = FakePartition(max_time_minutes=60)
    job = schedule(ScheduleRequest(partition="gpu", root=str(tmp_path), dry_run=True, budget_gpu_minutes=5000),
                   client=FakeSlurm(part))
    assert "--budget 5000" in job.script and job.time_limit_minutes == 60
    assert job.notes and "exceeds MaxTime 01:00:00" in job.notes[0]


# ------------------------------------------------------------------ 2. schedule's values
@pytest.mark.parametrize("argv,needle", [
    (["--nodes", "-3", "--budget", "100"], "argument --nodes"),
    (["--nodes", "-3"], "argument --nodes"),
    (["--nodes", "0"], "argument --nodes"),
    (["--nodes", "two"], "argument --nodes"),
    (["--every", "99999999w"], "at most 366d"),
    (["--every", "9" * 400], "at most 366d"),
    (["--every", "1.5h"], "shorter than the job's own time limit 2-00:00:00"),
    (["--every", "1d", "--recur", "scrontab"], "shorter than the job's own time limit"),
    (["--plan", "paper", "--budget", "100"], "--budget is for the adaptive plan only"),
])
def test_schedule_refuses_impossible_values(capsys, slurm, small_space, tmp_path, argv, needle):
    _one_line_error(*_run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--root", str(tmp_path), *argv),
                    needle)
    assert slurm.submitted == []


def test_schedule_library_refuses_negative_nodes(tmp_path):
    with pytest.raises(CalibrationError, match="--nodes must be 1 or more"):
        schedule(ScheduleRequest(partition="gpu", root=str(tmp_path), nodes=-3, budget_gpu_minutes=100),
                 client=FakeSlurm())


def test_every_bounds():
    assert parse_every("366d") == 366 * 86400 and parse_every("52w") == 52 * 7 * 86400
    for bad in ("367d", "99999999w", "1e9"):
        with pytest.raises(CalibrationError):
            parse_every(bad)



# ------------------------------------------------------------------ 3. plan's values
@pytest.mark.parametrize("argv,needles", [
    (["--nodes", "-2"], ("argument --nodes", "1 or more")),
    (["--nodes", "0"], ("argument --nodes",)),
    (["--gpus-per-node", "0"], ("argument --gpus-per-node",)),
    (["--gpu", "h1000"], ("unknown GPU 'h1000'", "did you mean h100?", "known: a100")),
    (["--gpu", "xyz"], ("unknown GPU 'xyz'", "h100")),
    (["--budget", "10"], ("--budget is for the adaptive plan only", "plan tiny")),
    (["--gpu", "h100", "--device", "cpu"], ("--device cuda",)),
])
def test_plan_refuses_impossible_values(capsys, argv, needles):
    _one_line_error(*_run(capsys, "plan", "tiny", *argv), *needles)


@pytest.mark.parametrize("name,key", [
    ("h100", "h100"), ("H100", "h100"), ("H100 80GB HBM3", "h100"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("h100-sxm5-80gb", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"), ("a100_80gb", "a100"),
    ("NVIDIA GH200 120GB", "gh200"), ("H200", "h200"), ("Tesla V100S-PCIE-32GB", "v100"), ("H 100", "h100"),
    ("h1000", None), ("a1000", None), ("xyz", None), ("", None),
])
def test_gpu_names_known_by_word(name, key):
    assert known_gpu(name) == key


def test_plan_takes_real_gpu_spellings(capsys):
    code, out, err = _run(capsys, "plan", "tiny", "--gpu", "H100 80GB HBM3")
    assert code == 0, err
    assert "(H100 80GB HBM3)" in out
    assert resolve_gpu("H100 80GB HBM3").tflops == resolve_gpu("h100").tflops


def test_plan_counts_what_run_measures(capsys, tiny_store):
    # `run --plan tiny` (cpu, two local ranks by default: conftest's tiny_store) and `plan tiny`
    # with no options describe the same allocation, so the same collective points.
    from predictor.samples import load_samples

    measured = sum(len(t) for t in load_samples(tiny_store).collectives.values())
    code, out, err = _run(capsys, "plan", "tiny")
    assert code == 0, err
    assert f" {measured} collective points" in out and "× 2 (nominal CPU)" in out
