"""`schedule` sizes its job for the GPU the partition names, exactly, or says what it assumed.

A GPU type in the partition's gres that perfcast has no figures for used to be sized silently as
whatever its name contained ("h1000" as an H100, "a1000" as an A100) or as a nominal A100 ("l40",
"mi300x"); now it is refused with the known names, and the nominal A100 of a partition that names
no type at all is said.  No Slurm: test_schedule's fake client.
"""
from __future__ import annotations

import pytest

from calibrate.env import KNOWN_GPUS, gpu_key, published_spec
from calibrate.errors import CalibrationError
from calibrate.plans import known_gpu
from calibrate.schedule import ScheduleRequest, _gpu_types, schedule

from .test_schedule import FakePartition, FakeSlurm
from .test_schedule_values import _one_line_error, _run


@pytest.fixture
def small_space(monkeypatch):
    """The smoke grid as the adaptive space (the paper's takes ~15 s to build a plan)."""
    from calibrate import plans
    monkeypatch.setitem(plans.GRIDS, "adaptive", plans.GRIDS["smoke"])


def _slurm(raw: dict) -> FakeSlurm:
    return FakeSlurm(FakePartition(nodes=2, max_time_minutes=240, raw=raw))


def _schedule(tmp_path, raw: dict, **kw):
    return schedule(ScheduleRequest(partition="gpu", root=str(tmp_path), dry_run=True, **kw), client=_slurm(raw))


@pytest.fixture
def cli_slurm(monkeypatch, small_space):
    """The CLI's Slurm: a fake partition whose ``raw`` a test sets."""
    fake = _slurm({})
    import slurm_plugin.slurm_client as sc
    monkeypatch.setattr(sc, "SlurmClient", lambda: fake)
    return fake


# ------------------------------------------------------------------ the names
@pytest.mark.parametrize("name,key", [
    ("h100", "h100"), ("H100", "h100"), ("NVIDIA H100 80GB HBM3", "h100"), ("nvidia_h100_80gb_hbm3", "h100"),
    ("a100-sxm4-80gb", "a100"), ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA GH200 120GB", "gh200"),
    ("Tesla V100S-PCIE-32GB", "v100"), ("h100nvl", "h100"), ("AMD Instinct MI250X", "mi250x"),
    # near misses: no longer taken for the GPU whose name they contain
    ("h1000", None), ("a1000", None), ("NVIDIA RTX A1000", None), ("l40", None), ("mi300x", None),
    ("rtx_a6000", None), ("", None),
])
def test_gpu_key_is_a_word_of_the_name_in_any_case(name, key):
    assert gpu_key(name) == key
    assert known_gpu(name) == key           # the rule `plan --gpu` uses: the same answers
    spec = published_spec(name)
    assert (spec is None) if key is None else (spec.tflops == KNOWN_GPUS[key][1] and spec.name == name)


@pytest.mark.parametrize("raw,types", [
    ({"Gres": "gpu:a100:4(S:0-1)"}, ["a100"]),
    ({"TRES": "cpu=512,mem=2T,gres/gpu:h100=32"}, ["h100"]),
    ({"TRESBillingWeights": "CPU=1.0,GRES/gpu:H100=2.0"}, ["H100"]),
    ({"Gres": "gpu:a100:2,gpu:h100:2", "TRES": "gres/gpu:a100=16,gres/gpu:h100=16"}, ["a100", "h100"]),
    ({"TRES": "cpu=512,gres/gpu=32"}, []),
    ({"Gres": "gpu:4(S:0-1)"}, []),
])
def test_gpu_types_read_from_gres_tres_and_billing(raw, types):
    assert _gpu_types(FakePartition(raw=raw)) == types


# ------------------------------------------------------------------ schedule()
@pytest.mark.parametrize("gres", ["gpu:h100:4", "gpu:H100:4", "gpu:nvidia_h100_80gb_hbm3:4"])
def test_a_known_gpu_type_sizes_the_job_without_a_note(tmp_path, small_space, gres):
    job = _schedule(tmp_path, {"Gres": gres})
    ref = _schedule(tmp_path, {}, gpu="h100")
    assert job.notes == [] and job.cost == ref.cost


@pytest.mark.parametrize("gres,typo,hint", [
    ("gpu:h1000:4", "'h1000'", "did you mean 'h100'?"),     # was sized as an H100
    ("gpu:a1000:4", "'a1000'", "did you mean 'a100'?"),     # was sized as an A100
    ("gpu:l40:4", "'l40'", "did you mean 'l40s'?"),         # was a nominal A100, unsaid
    ("gpu:rtx_a6000:4", "'rtx_a6000'", ""),
    ("gpu:a100:2,gpu:mi300x:2", "'mi300x'", ""),            # one unknown type of two
])
def test_an_unknown_gpu_type_is_refused_with_the_known_ones(tmp_path, small_space, gres, typo, hint):
    with pytest.raises(CalibrationError) as err:
        _schedule(tmp_path, {"Gres": gres})
    msg = str(err.value)
    assert "\n" not in msg and f"partition gpu: GPU type {typo}" in msg and hint in msg
    assert "known: a100, a40, gh200, h100, h200, l40s, mi250x, v100" in msg and "--gpu" in msg


def test_no_gpu_type_is_a_nominal_a100_and_says_so(tmp_path, small_space):
    job = _schedule(tmp_path, {"TRES": "cpu=512,gres/gpu=8"})
    assert len(job.notes) == 1
    assert "names no GPU type" in job.notes[0] and "nominal A100" in job.notes[0] and "--gpu" in job.notes[0]


def test_gpu_option_sizes_the_job_and_names_what_it_overrides(tmp_path, small_space):
    job = _schedule(tmp_path, {"Gres": "gpu:mi300x:8"}, gpu="H100")
    assert job.cost == _schedule(tmp_path, {"Gres": "gpu:h100:4"}).cost
    assert job.notes == ["partition gpu's gres names GPU type mi300x; the job is sized for --gpu H100"]
    # --gpu on a partition that names the same GPU: nothing to say
    assert _schedule(tmp_path, {"Gres": "gpu:h100:4"}, gpu="h100").notes == []


def test_several_known_types_say_which_one_sized_the_job(tmp_path, small_space):
    job = _schedule(tmp_path, {"Gres": "gpu:a100:2,gpu:h100:2"})
    assert job.notes == ["partition gpu has GPU types a100, h100: the job is sized for a100 (--gpu NAME for another)"]
    assert job.cost == _schedule(tmp_path, {"Gres": "gpu:a100:4"}).cost


def test_a_misspelt_gpu_option_is_refused_before_slurm_is_asked(tmp_path):
    class NoSlurm(FakeSlurm):
        def partition(self, name=None):
            raise AssertionError("Slurm asked about a partition for a request refused on its face")
    with pytest.raises(CalibrationError, match=r"--gpu: unknown GPU 'h1000' \(did you mean h100\?\)"):
        schedule(ScheduleRequest(partition="gpu", root=str(tmp_path), dry_run=True, gpu="h1000"), client=NoSlurm())


# ------------------------------------------------------------------ the CLI
def test_cli_refuses_an_unknown_gpu_type_in_one_line(capsys, tmp_path, cli_slurm):
    cli_slurm.part.raw = {"Gres": "gpu:h1000:4"}
    _one_line_error(*_run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--root", str(tmp_path)),
                    "perf-calibrate: partition gpu: GPU type 'h1000'", "did you mean 'h100'?", "known: a100")


def test_cli_says_on_stderr_when_it_assumes_a_nominal_a100(capsys, tmp_path, cli_slurm):
    cli_slurm.part.raw = {"TRES": "cpu=512,gres/gpu=8"}
    code, out, err = _run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--root", str(tmp_path))
    assert code == 0, err
    assert "note: partition gpu: its gres names no GPU type" in err and "nominal A100" in err
    assert "nominal A100" not in out            # stdout: the script alone (--dry-run)


def test_cli_gpu_option(capsys, tmp_path, cli_slurm):
    cli_slurm.part.raw = {"Gres": "gpu:mi300x:8"}
    code, out, err = _run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--root", str(tmp_path),
                          "--gpu", "h100")
    assert code == 0 and "sized for --gpu h100" in err, err
    _one_line_error(*_run(capsys, "schedule", "--partition", "gpu", "--dry-run", "--root", str(tmp_path),
                          "--gpu", "xyz"), "--gpu: unknown GPU 'xyz'", "known: a100")
