"""perf-calibrate's messages name the right file or flag and give the right reason (QA findings
10, 13 and 14)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from calibrate.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code, err):
    assert code == 2, err
    assert err.startswith("perf-calibrate: ") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def _minimal_store(d):
    """A sample store that loads (fit gets as far as writing the platform)."""
    (d / "operators").mkdir(parents=True)
    (d / "samples.toml").write_text('format = 1\ngpu = "NVIDIA H100 80GB HBM3"\n', encoding="utf-8")
    (d / "operators" / "gelu_fp16.csv").write_text(
        "tokens,width,fwd_us,bwd_us\n" + "".join(f"{i},64,{i},{2 * i}\n" for i in range(1, 12)), encoding="utf-8")
    return d


RUNS_FILE = '[[run]]\nname = "a"\njob = "job.toml"\nseconds = 10.0\n'


# ------------------------------------------------------------------------------ finding 10
def test_fit_of_a_file_says_it_is_not_a_sample_directory(capsys, tmp_path):
    runs = tmp_path / "runs.toml"
    runs.write_text(RUNS_FILE, encoding="utf-8")
    code, _, err = _run(capsys, "fit", str(runs), "--out", str(tmp_path / "p"))
    _one_line(code, err)
    assert f"{runs}: not a sample directory" in err and "no such" not in err
    assert not (tmp_path / "p").exists()


def test_a_runs_file_as_plan_is_not_a_plan_file(capsys, tmp_path):
    runs = tmp_path / "runs.toml"
    runs.write_text(RUNS_FILE, encoding="utf-8")
    code, _, err = _run(capsys, "plan", str(runs))
    _one_line(code, err)
    assert f"{runs}: not a plan file" in err and "format None" not in err


def test_run_with_a_runs_file_as_plan_is_not_a_plan_file(capsys, tmp_path):
    pytest.importorskip("torch", reason="perf-calibrate run imports torch")
    runs = tmp_path / "runs.toml"
    runs.write_text(RUNS_FILE, encoding="utf-8")
    code, _, err = _run(capsys, "run", "--plan", str(runs), "--out", str(tmp_path / "s"), "--no-progress")
    _one_line(code, err)
    assert "not a plan file" in err and "format None" not in err


def test_a_plan_file_of_another_format_still_says_so(capsys, tmp_path):
    f = tmp_path / "p.toml"
    f.write_text('format = 7\nname = "p"\n[grid]\n', encoding="utf-8")
    code, _, err = _run(capsys, "plan", str(f))
    _one_line(code, err)
    assert "plan format 7 is not supported" in err


def test_fit_into_an_unwritable_out_names_out(capsys, tmp_path):
    # (A file where --out's parent should be: refused whoever runs the test, root included.)
    store = _minimal_store(tmp_path / "s")
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    out = blocker / "P"
    code, _, err = _run(capsys, "fit", str(store), "--out", str(out), "--no-plot")
    _one_line(code, err)
    assert f"--out {out}: cannot write the platform there" in err
    assert ".P.fit" not in err                   # not fit's temporary directory


def test_ctrl_c_during_fit_does_not_promise_a_resume(capsys, tmp_path, monkeypatch):
    import calibrate.fitting as fitting

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(fitting, "fit_platform", interrupted)
    (tmp_path / "s").mkdir()
    code, _, err = _run(capsys, "fit", str(tmp_path / "s"), "--out", str(tmp_path / "p"))
    assert code == 130 and err.strip() == "perf-calibrate: interrupted"


def test_ctrl_c_during_run_still_says_it_resumes(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="perf-calibrate run imports torch")
    import calibrate.runner as runner

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "run_calibration", interrupted)
    code, _, err = _run(capsys, "run", "--plan", "tiny", "--out", str(tmp_path / "s"))
    assert code == 130 and err.strip() == "perf-calibrate: interrupted (a run resumes where it stopped)"


# ------------------------------------------------------------------------------ finding 14
class _NoSlurm:
    def __init__(self, *a, **k):
        raise AssertionError("Slurm was asked before the arguments were checked")


def test_schedule_checks_the_plan_before_asking_slurm(capsys, tmp_path, monkeypatch):
    import slurm_plugin.slurm_client as sc
    monkeypatch.setattr(sc, "SlurmClient", _NoSlurm)
    code, _, err = _run(capsys, "schedule", "--partition", "gpu", "--plan", "tinyy", "--dry-run",
                        "--root", str(tmp_path))
    _one_line(code, err)
    assert "--plan" in err and "unknown plan 'tinyy'" in err
    runs = tmp_path / "runs.toml"
    runs.write_text(RUNS_FILE, encoding="utf-8")
    code, _, err = _run(capsys, "schedule", "--partition", "gpu", "--plan", str(runs), "--dry-run",
                        "--root", str(tmp_path))
    _one_line(code, err)
    assert "not a plan file" in err


def test_schedule_still_takes_a_plan_file(capsys, tmp_path, monkeypatch):
    from tests.calibrate.test_schedule import FakeSlurm
    import slurm_plugin.slurm_client as sc
    monkeypatch.setattr(sc, "SlurmClient", lambda *a, **k: FakeSlurm())
    f = tmp_path / "p.toml"
    f.write_text('format = 1\nname = "p"\nprecisions = ["fp16"]\n[grid]\n', encoding="utf-8")
    code, out, err = _run(capsys, "schedule", "--partition", "gpu", "--plan", str(f), "--dry-run",
                          "--root", str(tmp_path / "root"))
    assert code == 0, err
    assert f"--plan {f}" in out


def test_schedule_of_a_cpu_partition_says_what_to_do(capsys, tmp_path, monkeypatch):
    from tests.calibrate.test_schedule import FakePartition, FakeSlurm
    import slurm_plugin.slurm_client as sc
    cpu = FakePartition(name="cpu", gpus_per_node=0, raw={"TRES": "cpu=512"})
    monkeypatch.setattr(sc, "SlurmClient", lambda *a, **k: FakeSlurm(cpu))
    code, out, err = _run(capsys, "schedule", "--partition", "cpu", "--dry-run", "--root", str(tmp_path))
    _one_line(code, err)
    assert "partition cpu" in err and "GPU calibration jobs only" in err
    assert "run --device cpu" in err and "install PLATFORM --partition cpu" in err
    assert "nothing to calibrate" not in err
    assert out == ""


# ------------------------------------------------------------------------------ finding 13
@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("megatron") is None,
                    reason="the warnings come from importing Megatron (with torch)")
def test_megatron_import_warnings_are_silenced_and_ours_kept():
    # A fresh process: Megatron warns once, on its first import.
    code = ("import warnings\n"
            "from calibrate import kernels\n"
            "kernels._fused_upper_triang()\n"
            "warnings.warn('our own warning')\n")
    res = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Transformer Engine and Apex" not in res.stderr, res.stderr
    assert "our own warning" in res.stderr
