"""perf-calibrate validate: record measured runs on a platform (no torch needed)."""
from __future__ import annotations

import json
import sys

import pytest

from calibrate.cli import main
from predictor.validation import ratio_range
from predictor import load_platform
from predictor.platform import SHIPPED_DIR
from predictor.samples import dump_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

JOB = {"model": {"layers": 8, "hidden": 4096, "heads": 32, "seq_len": 2048},
       "layout": {"pp": 2, "tp": 4, "dp": 2, "micro_batch": 2, "micro_batches": 8, "recompute": "full"},
       "run": {"precision": "fp16"}}


@pytest.fixture
def platform_dir(tmp_path):
    """A site platform: the shipped dgx-a100 (no runs of its own) in a writable directory."""
    raw = tomllib.loads((SHIPPED_DIR / "dgx-a100" / "platform.toml").read_text())
    raw["compute_bundle"] = str(SHIPPED_DIR / "_bundles" / "a100-sxm4-80gb")
    d = tmp_path / "site-a100"
    d.mkdir()
    (d / "platform.toml").write_text(dump_toml(raw))
    return d


def _runs_file(tmp_path, *measured, name="runs.toml"):
    runs = [{"name": f"run {i}", "source": "job log", "measured_iteration_seconds": m, "job": JOB}
            for i, m in enumerate(measured)]
    f = tmp_path / name
    f.write_text(dump_toml({"run": runs}))
    return f


def test_validate_records_runs_and_widens_the_interval(capsys, tmp_path, platform_dir):
    before = load_platform(platform_dir)
    assert before.validation == []
    base = ratio_range(before.validation)
    from predictor import predict, TrainingJob
    point = predict(TrainingJob.from_dict(JOB), before).iteration_seconds
    f = _runs_file(tmp_path, point * 1.25, point * 1.10)
    assert main(["validate", str(platform_dir), "--runs", str(f)]) == 0
    out = capsys.readouterr().out
    assert "recorded 2 runs" in out and "leave-one-out coverage of the interval 2/2" in out
    after = load_platform(platform_dir)
    assert [r.name for r in after.validation] == ["run 0", "run 1"]
    assert after.validation[0].predicted_iteration_seconds == pytest.approx(point)
    assert ratio_range(after.validation) == (1.0, pytest.approx(1.25)) != base
    # Again without --replace: the old runs are kept (and predicted again), the same runs not
    # recorded twice; with it, dropped.
    assert main(["validate", str(platform_dir), "--runs", str(f)]) == 0
    assert "runs given: 0 new, 2 already recorded" in capsys.readouterr().out
    assert len(load_platform(platform_dir).validation) == 2
    g = _runs_file(tmp_path, point * 0.8, name="one.toml")
    assert main(["validate", str(platform_dir), "--runs", str(g), "--replace"]) == 0
    assert ratio_range(load_platform(platform_dir).validation) == (pytest.approx(0.8), 1.0)


def test_dry_run_writes_nothing_and_json_reports(capsys, tmp_path, platform_dir):
    import json
    text = (platform_dir / "platform.toml").read_text()
    f = _runs_file(tmp_path, 3.0, 4.0, 5.0)
    assert main(["validate", str(platform_dir), "--runs", str(f), "--dry-run", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert len(rep["runs"]) == 3 and all("inside_leave_one_out" in r for r in rep["runs"])
    assert (platform_dir / "platform.toml").read_text() == text


def test_job_file_is_read_relative_to_the_runs_file(capsys, tmp_path, platform_dir):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "a.toml").write_text(dump_toml(JOB))
    f = tmp_path / "runs.toml"
    f.write_text('[[run]]\nname = "a"\nmeasured_iteration_seconds = 2.5\njob_file = "jobs/a.toml"\n')
    assert main(["validate", str(platform_dir), "--runs", str(f)]) == 0
    assert load_platform(platform_dir).validation[0].job.layout.tp == 4


@pytest.mark.parametrize("text, needle", [
    ("[[run]]\nname = \"a\"\n", "run[0].measured_iteration_seconds: missing"),
    ("[[run]]\nmeasured_iteration_seconds = 2.0\n", "run[0].job: missing"),
    ("[[run]]\nmeasured_iteration_seconds = 2.0\njob_file = \"nope.toml\"\n", "run[0].job_file"),
    ("run = 3\n", "must be an array of tables"),
    ("[[runs]]\n", "runs: unknown key"),
    ("", "no [[run]] tables"),
    ("[[run]\n", "not valid TOML"),
])
def test_bad_runs_file_is_one_line_naming_file_and_entry(capsys, tmp_path, platform_dir, text, needle):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    before = (platform_dir / "platform.toml").read_text()
    assert main(["validate", str(platform_dir), "--runs", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(f) in err and needle in err, err
    assert "Traceback" not in err
    assert (platform_dir / "platform.toml").read_text() == before


@pytest.fixture
def installed_site(capsys, tmp_path, platform_dir, monkeypatch):
    """platform_dir installed as partition "site" under a root of its own (found by name), no
    perf-predictd signalled."""
    from calibrate import install as install_mod
    monkeypatch.delenv("PERFCAST_DAEMON_PIDFILE", raising=False)
    monkeypatch.setattr(install_mod, "DEFAULT_PIDFILE", tmp_path / "no-daemon.pid")
    monkeypatch.setattr(install_mod, "_systemd_active", lambda: False)
    (platform_dir / "calibration.toml").write_text(
        'gpu = "NVIDIA A100-SXM4-80GB"\nsamples = 100\ncompute_mape = 0.05\ncomplete = true\n')
    root = tmp_path / "root"
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(root))
    assert main(["install", str(platform_dir), "--partition", "site", "--root", str(root)]) == 0
    capsys.readouterr()
    return root


def test_validate_of_an_installed_version_installs_a_new_one_that_rollback_undoes(capsys, tmp_path,
                                                                                  installed_site):
    """It used to record the runs into the installed version in place: no new version, no history
    line, nothing `rollback` could undo."""
    root = installed_site
    first = (root / "site" / "current").resolve()
    before = (first / "platform.toml").read_bytes()
    from predictor import predict, TrainingJob
    point = predict(TrainingJob.from_dict(JOB), load_platform("site")).iteration_seconds
    f = _runs_file(tmp_path, point * 1.25, point * 1.10)
    assert main(["validate", "site", "--runs", str(f)]) == 0
    out = capsys.readouterr().out
    second = (root / "site" / "current").resolve()
    assert second != first and "installed platform site: installed" in out
    assert (first / "platform.toml").read_bytes() == before          # the old version untouched
    assert [r.name for r in load_platform("site", reload=True).validation] == ["run 0", "run 1"]
    assert "validate" in (root / "site" / "history.log").read_text()
    assert main(["rollback", "site", "--root", str(root)]) == 0
    assert (root / "site" / "current").resolve() == first
    assert load_platform("site", reload=True).validation == []
    # An installed version that is not the active one is refused, not edited.
    capsys.readouterr()
    assert main(["validate", str(second), "--runs", str(f)]) == 2
    assert "not the active version of site" in capsys.readouterr().err


def test_status_says_when_the_active_version_does_not_load(capsys, installed_site):
    """status used to look normal while perf-predict refused the active version."""
    root = installed_site
    assert main(["status", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["problem"] == ""
    plat = root / "site" / "current" / "platform.toml"
    plat.write_text(plat.read_text() + 'descripton = "x"\n')
    # Exit code 1: monitoring that runs status sees it too.
    assert main(["status", "--root", str(root), "--json"]) == 1
    assert "descripton" in json.loads(capsys.readouterr().out)[0]["problem"]
    assert main(["status", "--root", str(root)]) == 1
    assert "DOES NOT LOAD" in capsys.readouterr().out
