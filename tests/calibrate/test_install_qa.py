"""QA findings on install, status and harvest (perf-calibrate QA of a CPU partition): the same folder
installed twice, history.log's source path, status of a version whose files are bad, and messages
that gave the wrong reason.  No torch, no fitting: a shipped platform's copy is the platform."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.cli import main
from calibrate.errors import CalibrationError, InstallRefused
from calibrate.harvest import AccountingClient, HarvestError, finished_jobs
from calibrate.install import install_platform, rollback, status, status_problems
from predictor.platform import SHIPPED_DIR
from predictor.samples import dump_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .test_refit import _no_real_daemon  # noqa: E402,F401  (autouse: no real perf-predictd reloaded)

CALIBRATION = 'gpu = "NVIDIA A100-SXM4-80GB"\nsamples = 100\ncompute_mape = 0.05\ncomplete = true\n'


@pytest.fixture(autouse=True)
def _no_shell_platforms(monkeypatch):
    """The shell's PERFCAST_PLATFORMS is no test's (test_refit's _no_real_daemon does the rest)."""
    monkeypatch.delenv("PERFCAST_PLATFORMS", raising=False)


def _site(where: Path, samples: int = 100) -> Path:
    """A fitted-looking platform: the shipped dgx-a100 in a folder of its own, with calibration.toml."""
    raw = tomllib.loads((SHIPPED_DIR / "dgx-a100" / "platform.toml").read_text())
    raw["compute_bundle"] = str(SHIPPED_DIR / "_bundles" / "a100-sxm4-80gb")
    where.mkdir(parents=True)
    (where / "platform.toml").write_text(dump_toml(raw))
    (where / "calibration.toml").write_text(CALIBRATION.replace("samples = 100", f"samples = {samples}"))
    return where


def _versions(root: Path, partition: str) -> list[str]:
    return sorted(p.name for p in (root / partition / "versions").iterdir() if not p.name.startswith("."))


# ------------------------------------------------------------------- finding 8: installed twice
def test_installing_the_same_folder_again_adds_no_version(tmp_path):
    """The second install used to add a byte-identical version, made it `previous` (so rollback
    changed nothing) and pushed the real previous one towards pruning."""
    root = tmp_path / "root"
    a, b = _site(tmp_path / "A"), _site(tmp_path / "B", samples=200)
    first = install_platform(a, "p", root=root)
    second = install_platform(b, "p", root=root)
    again = install_platform(b, "p", root=root)
    assert again.version == second.version and again.path == second.path
    assert f"already installed as version {second.version}" in again.message
    assert "nothing changed" in again.message
    assert again.signalled is None and again.reload is not None and again.reload.status == "unchanged"
    assert _versions(root, "p") == sorted([first.version, second.version])
    assert (root / "p" / "current").resolve().name == second.version
    assert (root / "p" / "previous").resolve().name == first.version
    assert "nothing changed" in (root / "p" / "history.log").read_text().splitlines()[-1]
    # rollback still undoes the install before: back to A
    assert rollback("p", root=root).version == first.version


def test_install_cli_of_the_same_folder_twice_says_so_and_exits_0(tmp_path, capsys):
    root = tmp_path / "root"
    a = _site(tmp_path / "A")
    assert main(["install", str(a), "--partition", "p", "--root", str(root)]) == 0
    capsys.readouterr()
    assert main(["install", str(a), "--partition", "p", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "already installed as version" in out and "nothing changed" in out, out
    assert len(_versions(root, "p")) == 1


def test_a_changed_folder_is_still_installed(tmp_path):
    """Only the same files count as the same: one changed byte installs a new version."""
    root = tmp_path / "root"
    a = _site(tmp_path / "A")
    first = install_platform(a, "p", root=root)
    (a / "calibration.toml").write_text(CALIBRATION + "# refitted\n")
    second = install_platform(a, "p", root=root)
    assert second.version != first.version and second.previous == first.version
    assert len(_versions(root, "p")) == 2


def test_an_explicit_tag_still_asks_for_a_version_of_its_own(tmp_path):
    """The API's tag (the CLI passes none) names the version wanted: it is made even for the same files."""
    root = tmp_path / "root"
    a = _site(tmp_path / "A")
    one = install_platform(a, "p", root=root, tag="one")
    two = install_platform(a, "p", root=root, tag="two")
    assert two.version.endswith("-two") and two.previous == one.version


# ------------------------------------------------------------ finding 15: history's source path
def test_history_log_names_the_absolute_source(tmp_path, monkeypatch):
    root = tmp_path / "root"
    _site(tmp_path / "P1")
    monkeypatch.chdir(tmp_path)
    install_platform(Path("P1"), "p", root=root)
    install_platform(Path("P1") / ".." / "P1", "p", root=root)             # the same files
    worse = _site(tmp_path / "W")
    (worse / "calibration.toml").write_text(CALIBRATION.replace("0.05", "0.5"))
    with pytest.raises(InstallRefused):
        install_platform(Path("W"), "p", root=root)
    lines = (root / "p" / "history.log").read_text().splitlines()
    assert lines[0].endswith(f" from {tmp_path.resolve() / 'P1'}"), lines[0]
    assert f"install of {tmp_path.resolve() / 'P1'}:" in lines[1], lines[1]
    assert f"refused {tmp_path.resolve() / 'W'}:" in lines[2], lines[2]


# ------------------------------------------------------------------- finding 10: wrong reasons
def test_install_of_platform_toml_names_the_folder_to_give(tmp_path, capsys):
    site = _site(tmp_path / "P1")
    root = tmp_path / "root"
    with pytest.raises(InstallRefused, match=r"a file, not a platform directory \(give the directory that "
                                             rf"holds it: {site}\)"):
        install_platform(site / "platform.toml", "p", root=root)
    assert main(["install", str(site / "platform.toml"), "--partition", "p", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "no platform.toml" not in err, err
    assert f"give the directory that holds it: {site}" in err
    other = tmp_path / "runs.toml"
    other.write_text("[[run]]\n")
    with pytest.raises(InstallRefused, match="runs.toml: a file, not a platform directory"):
        install_platform(other, "p", root=root)
    with pytest.raises(InstallRefused, match="nope: no such platform directory"):
        install_platform(tmp_path / "nope", "p", root=root)
    assert not (root / "p").exists()


def test_status_of_a_root_that_is_a_file_says_so(tmp_path, capsys):
    f = tmp_path / "runs.toml"
    f.write_text("[[run]]\n")
    with pytest.raises(CalibrationError, match=r"runs.toml: not a directory"):
        status(f)
    assert main(["status", "--root", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a directory" in err and "--root" in err and "no such directory" not in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    # An absent root is still normal before the first install.
    assert status(tmp_path / "absent") == []


def test_harvest_source_scontrol_does_not_blame_sacct():
    def runner(argv, **kw):
        assert argv[0] != "sacct", "sacct must not be asked with --source scontrol"
        return subprocess.CompletedProcess(argv, 1, b"", b"slurm_load_jobs error: Unable to contact slurm controller\n")

    with pytest.raises(HarvestError) as exc:
        finished_jobs(AccountingClient(runner=runner), 1.0e9, source="scontrol")
    msg = str(exc.value)
    assert "sacct" not in msg and "--source scontrol" in msg and "Unable to contact" in msg, msg


# ---------------------------------------------------------- finding 11: status of bad versions
def test_status_problems_lists_an_active_version_that_does_not_load(tmp_path):
    root = tmp_path / "root"
    install_platform(_site(tmp_path / "A"), "p", root=root)
    install_platform(_site(tmp_path / "B"), "q", root=root)
    assert status_problems(status(root)) == []
    plat = root / "q" / "current" / "platform.toml"
    plat.write_text(plat.read_text() + 'descripton = "x"\n')
    problems = status_problems(status(root))
    assert len(problems) == 1 and problems[0].startswith("q: ") and "descripton" in problems[0]


def test_status_shows_unknown_samples_of_a_bad_calibration_toml_as_unknown(tmp_path, capsys):
    """A typo'd key used to show 0 samples, a count that looks measured."""
    root = tmp_path / "root"
    install_platform(_site(tmp_path / "A"), "p", root=root)
    cal = root / "p" / "current" / "calibration.toml"
    cal.write_text(cal.read_text().replace("samples = 100", "sampels = 100"))
    row = status(root)[0]
    assert row.samples == "?" and "sampels" in row.calibration_problem
    assert row.to_dict()["samples"] is None
    assert main(["status", "--root", str(root), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)[0]
    assert shown["samples"] is None and "sampels" in shown["calibration_problem"]
    assert main(["status", "--root", str(root)]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("p "))
    assert line.split()[3] == "?", line
    # Not valid TOML at all: unknown too, and said.
    cal.write_text("samples = \n")
    row = status(root)[0]
    assert row.samples == "?" and "not valid TOML" in row.calibration_problem
    # No calibration.toml at all (as a site overlay has none): no samples of its own, not unknown.
    os.remove(cal)
    assert status(root)[0].samples == 0
