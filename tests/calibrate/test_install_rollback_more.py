"""Install, rollback, status and validate around a shipped platform: what `previous` records after
a rollback to the shipped platform, runs that `validate` finds already recorded, and install's
options.

No Slurm, no daemon: the shipped dgx-a100 under a temporary platforms root (as test_refit.py and
test_kinds_fit.py); runs are the shipped platform's own predictions with a known scale applied.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from calibrate import install as install_mod
from calibrate.cli import main
from calibrate.install import refit_partition, status
from predictor import load_platform
from predictor.estimate import predict_many
from predictor.platform import FittedTerms
from predictor.samples import dump_toml
from predictor.validation import MeasuredRun

# Device-bound jobs of a few shapes and layouts, and the guard against reloading a real daemon.
from .test_refit import JOBS, _no_real_daemon  # noqa: F401  (the autouse fixture applies here too)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """An empty platforms root that lookups by name search first (the daemon's way)."""
    r = tmp_path / "platforms"
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(r))
    return r


def _harvested(scale: float, n: int = 6, *, first: int = 1000) -> list[MeasuredRun]:
    """n runs named as harvest names them: the shipped dgx-a100's predictions x ``scale``."""
    truth = dataclasses.replace(load_platform("dgx-a100", reload=True), fitted=FittedTerms(compute_scale=scale))
    jobs = JOBS[:n]
    return [MeasuredRun(name=f"slurm job {first + i}", job=j, measured_iteration_seconds=p.iteration_seconds,
                        source="perf-calibrate harvest (synthetic)")
            for i, (j, p) in enumerate(zip(jobs, predict_many(jobs, truth)))]


def _runs_file(path: Path, runs: list[MeasuredRun]) -> Path:
    path.write_text(dump_toml({"run": [r.to_dict() for r in runs]}))
    return path


def _answers(name: str = "dgx-a100") -> list[tuple]:
    """What the platform found by name predicts for JOBS: point and interval, exactly."""
    plat = load_platform(name, reload=True)
    return [(p.iteration_seconds, p.interval_seconds) for p in predict_many(JOBS, plat)]


def _pdir_state(root: Path) -> tuple:
    pdir = root / "dgx-a100"
    link = lambda n: os.path.basename(os.readlink(pdir / n)) if (pdir / n).is_symlink() else None  # noqa: E731
    return link("current"), link("previous")


# ------------------------------------------------------------------ previous after a rollback
def test_validate_fit_after_a_rollback_to_shipped_keeps_shipped_as_previous(root, tmp_path, capsys):
    shipped = _answers()
    a_file = _runs_file(tmp_path / "a.toml", _harvested(1.3))
    assert main(["validate", "dgx-a100", "--runs", str(a_file), "--fit", "--root", str(root)]) == 0
    capsys.readouterr()
    a, prev = _pdir_state(root)
    assert a is not None and prev is None
    a_answers = _answers()
    assert a_answers != shipped
    (st,) = status(root)
    assert st.version == a and st.previous == "shipped dgx-a100"

    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    assert "rolled back to the shipped platform" in capsys.readouterr().out
    assert _pdir_state(root) == (None, a) and _answers() == shipped

    # Installed from the shipped platform: previous is the shipped platform, not A.
    b_file = _runs_file(tmp_path / "b.toml", _harvested(1.5, first=2000))
    assert main(["validate", "dgx-a100", "--runs", str(b_file), "--fit", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "previous: the shipped platform dgx-a100" in out, out
    b, prev = _pdir_state(root)
    assert b not in (None, a) and prev is None
    (st,) = status(root)
    assert st.version == b and st.previous == "shipped dgx-a100"
    assert main(["status", "--root", str(root)]) == 0
    row = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("dgx-a100"))
    assert row.split()[-2:] == ["shipped", "dgx-a100"], row
    assert main(["status", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["previous"] == "shipped dgx-a100"
    b_answers = _answers()
    assert b_answers not in (shipped, a_answers)

    # rollback undoes exactly the last install: the shipped platform, bit for bit.
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "rolled back to the shipped platform" in out and f"(from {b};" in out, out
    assert _pdir_state(root) == (None, b) and _answers() == shipped
    (st,) = status(root)
    assert st.version is None and st.previous == b
    # And again: B, with the shipped platform behind it.
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    capsys.readouterr()
    assert _pdir_state(root) == (b, None) and _answers() == b_answers
    history = (root / "dgx-a100" / "history.log").read_text().splitlines()
    assert [l.split(" ", 1)[1] for l in history[-2:]] == [
        f"rolled back from {b} to the shipped platform dgx-a100",
        f"rolled back from the shipped platform dgx-a100 to {b}"]


def test_refit_after_a_rollback_to_shipped_keeps_shipped_as_previous(root):
    shipped = _answers()
    r1 = refit_partition("dgx-a100", _harvested(1.3), root=root)
    assert r1.status == "installed", r1.message
    assert _pdir_state(root) == (r1.version, None)
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    assert _answers() == shipped
    r2 = refit_partition("dgx-a100", _harvested(1.5, first=2000), root=root)
    assert r2.status == "installed", r2.message
    assert r2.base_version == "shipped dgx-a100"
    assert _pdir_state(root) == (r2.version, None)
    assert status(root)[0].previous == "shipped dgx-a100"
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    assert _pdir_state(root) == (None, r2.version) and _answers() == shipped
    last = (root / "dgx-a100" / "history.log").read_text().splitlines()[-1]
    assert f"rolled back from {r2.version} to the shipped platform dgx-a100" in last


def _calibrated(tmp_path: Path) -> Path:
    """A platform of its own (not an overlay), as `perf-calibrate fit` makes: dgx-a100's models."""
    from predictor.platform import resolve_platform, write_platform
    src = resolve_platform("dgx-a100")
    raw = tomllib.loads((src / "platform.toml").read_text(encoding="utf-8"))
    raw["compute_bundle"] = str((src / raw["compute_bundle"]).resolve())
    raw.pop("validation", None)
    raw["fitted"] = {"compute_scale": 1.2}
    d = tmp_path / "calibrated"
    write_platform(d, raw)
    (d / "calibration.toml").write_text(dump_toml({
        "name": "calibrated", "created": "2026-01-01T00:00:00+00:00", "samples": 500, "complete": True,
        "gpu": "NVIDIA A100-SXM4-80GB", "compute_mape": 0.05}))
    return d


def test_a_calibration_installed_under_a_shipped_name_rolls_back_to_the_shipped_platform(root, tmp_path, capsys):
    shipped = _answers()
    res = main(["install", str(_calibrated(tmp_path)), "--partition", "dgx-a100", "--root", str(root)])
    assert res == 0
    assert "previous: the shipped platform dgx-a100" in capsys.readouterr().out
    v, prev = _pdir_state(root)
    assert prev is None and _answers() != shipped
    assert status(root)[0].previous == "shipped dgx-a100"
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    assert _pdir_state(root) == (None, v) and _answers() == shipped
    # A partition with no shipped platform of its name has nothing before its first install.
    assert main(["install", str(_calibrated(tmp_path / "x")), "--partition", "gpu", "--root", str(root)]) == 0
    assert [s.previous for s in status(root) if s.partition == "gpu"] == [None]
    capsys.readouterr()
    assert main(["rollback", "gpu", "--root", str(root)]) == 2
    assert "no previous platform to roll back to" in capsys.readouterr().err


# ------------------------------------------------------------ runs validate finds recorded
def _recorded(root: Path) -> list[str]:
    raw = tomllib.loads((root / "dgx-a100" / "current" / "platform.toml").read_text())
    return [r["name"] for r in raw["validation"]]


def test_validate_after_a_refit_does_not_record_the_harvested_runs_again(root, tmp_path, capsys):
    runs = _harvested(1.3)
    assert refit_partition("dgx-a100", runs, root=root).status == "installed"
    before = load_platform("dgx-a100", reload=True)
    names = [r.name for r in before.validation]
    assert sorted(names) == [f"slurm job {1000 + i}" for i in range(6)]
    f = _runs_file(tmp_path / "h100.toml", runs)        # what harvest wrote, given to validate

    assert main(["validate", "dgx-a100", "--runs", str(f), "--fit", "--dry-run", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert len(rep["runs"]) == 6 and (rep["new_runs"], rep["already_recorded"]) == (0, 6)
    assert rep["warnings"] == []

    assert main(["validate", "dgx-a100", "--runs", str(f), "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "6 runs: MAPE" in out and "runs given: 0 new, 6 already recorded (not added again)" in out, out
    assert sorted(_recorded(root)) == sorted(names)
    after = load_platform("dgx-a100", reload=True)
    # No new data, no new interval: each run recorded once, with the prediction it had.
    assert [(r.name, r.measured_iteration_seconds) for r in after.validation] == \
        [(r.name, r.measured_iteration_seconds) for r in before.validation]
    assert _answers() == [(p.iteration_seconds, p.interval_seconds) for p in predict_many(JOBS, before)]


def test_a_recorded_run_given_with_another_measured_time_is_named_and_replaced(root, tmp_path, capsys, caplog):
    runs = _harvested(1.3)
    assert refit_partition("dgx-a100", runs, root=root).status == "installed"
    changed = dataclasses.replace(runs[2], measured_iteration_seconds=runs[2].measured_iteration_seconds * 1.1)
    extra = _harvested(1.3, n=7, first=5000)[6]                      # one job not harvested before
    f = _runs_file(tmp_path / "runs.toml", [runs[0], changed, runs[4], extra, runs[0]])
    assert main(["validate", "dgx-a100", "--runs", str(f), "--root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert "runs given: 1 new, 3 already recorded (not added again), 1 given twice (counted once)" in out, out
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "slurm job" in r.getMessage()]
    assert "'slurm job 1002'" in warning and "replace it" in warning
    rec = load_platform("dgx-a100", reload=True).validation
    assert sorted(r.name for r in rec) == sorted([f"slurm job {1000 + i}" for i in range(6)] + ["slurm job 5006"])
    (r2,) = [r for r in rec if r.name == "slurm job 1002"]
    assert r2.measured_iteration_seconds == changed.measured_iteration_seconds


def test_merge_runs_keys_on_name_and_job():
    from calibrate.validate import merge_runs
    a, b = _harvested(1.0, n=2)
    other_job = dataclasses.replace(a, job=b.job)                 # same name, another job: another run
    twice = [a, b, dataclasses.replace(a, source="harvested again")]   # what the old validate left
    m = merge_runs(twice, [a, other_job])
    assert [r.name for r in m.runs] == [a.name, b.name, a.name]
    assert (m.new, m.already, m.repeated) == (1, 1, 0)
    assert any("recorded twice" in w for w in m.warnings)
    assert any(f"{a.name!r} comes with two different jobs" in w for w in m.warnings)
    # --replace: nothing recorded; the given runs once each.
    m = merge_runs([], [a, a, b])
    assert (len(m.runs), m.new, m.already, m.repeated, m.warnings) == (2, 2, 0, 1, ())


# ---------------------------------------------------------------------- install's options
@pytest.mark.parametrize("value", ["-1", "-0.05", "nan", "inf", "ten"])
def test_a_meaningless_tolerance_is_refused_in_one_line(root, tmp_path, capsys, value):
    plat = _calibrated(tmp_path)
    assert main(["install", str(plat), "--partition", "gpu", "--root", str(root), "--tolerance", value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tolerance" in err and repr(value) in err, err
    assert "Traceback" not in err and not root.exists()
    with pytest.raises(install_mod.CalibrationError, match="tolerance must be"):
        install_mod.install_platform(plat, "gpu", root=root, tolerance=-1.0)
    assert not root.exists()


def test_a_zero_tolerance_is_accepted(root, tmp_path, capsys):
    plat = _calibrated(tmp_path)
    assert main(["install", str(plat), "--partition", "gpu", "--root", str(root), "--tolerance", "0"]) == 0
    # A copy with the same error (installing the very same files again adds no version at all).
    again = tmp_path / "again"
    shutil.copytree(plat, again)
    (again / "calibration.toml").write_text((again / "calibration.toml").read_text() + "# again\n")
    assert main(["install", str(again), "--partition", "gpu", "--root", str(root), "--tolerance", "0"]) == 0
    assert "previous:" in capsys.readouterr().out
