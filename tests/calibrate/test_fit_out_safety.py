"""perf-calibrate fit --out: the samples and unrelated files are never deleted (QA finding 1).

``fit S --out S --force`` removed the sample store it had just fitted, and ``--out victimdir
--force`` removed a directory of notes.  Now an --out that is the samples, inside them or holding
them is refused, and --force replaces only an empty directory or a previous fit (its platform.toml
and calibration.toml).  Every refusal comes before any fitting: no test here depends on speed.
"""
from __future__ import annotations

import os

import pytest

from calibrate.cli import main
from calibrate.errors import CalibrationError
from calibrate.fitting import fit_platform

from .conftest import FAST_LIBRARIES, one_line_error
from .test_fit_host_table import _gpu_store


def _tree(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _fit_cli(samples, out, *extra):
    return main(["fit", str(samples), "--out", str(out), "--libraries", ",".join(FAST_LIBRARIES),
                 "--no-plot", *extra])


def test_out_that_is_the_samples_is_refused_even_with_force(tmp_path, capsys):
    store = _gpu_store(tmp_path)
    before = _tree(store)
    assert _fit_cli(store, store, "--force") == 2
    one_line_error(capsys, f"--out {store}", "is the sample directory")
    assert _tree(store) == before
    # The same directory spelt another way, or through a link, is the same directory.
    assert _fit_cli(store, tmp_path / "x" / ".." / "samples", "--force") == 2
    one_line_error(capsys, "--out", "is the sample directory")
    os.symlink(store, tmp_path / "link")
    assert _fit_cli(store, tmp_path / "link", "--force") == 2
    one_line_error(capsys, "--out", "is the sample directory")
    assert _tree(store) == before


def test_out_inside_or_around_the_samples_is_refused(tmp_path, capsys):
    store = _gpu_store(tmp_path)
    before = _tree(store)
    assert _fit_cli(store, store / "platform") == 2
    one_line_error(capsys, "--out", "inside the sample directory")
    assert _fit_cli(store, tmp_path, "--force") == 2
    one_line_error(capsys, f"--out {tmp_path}", "holds the sample directory")
    assert _tree(store) == before and not (store / "platform").exists()


def test_force_does_not_replace_a_directory_that_is_not_a_fit(tmp_path, capsys):
    store = _gpu_store(tmp_path)
    victim = tmp_path / "victimdir"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "notes.txt").write_text("keep me\n")
    (victim / "a.txt").write_text("keep me too\n")
    assert _fit_cli(store, victim, "--force") == 2
    err = one_line_error(capsys, f"--out {victim}", "not a previous fit", "a.txt", "sub/", "--force")
    assert "platform.toml" in err
    assert (victim / "sub" / "notes.txt").read_text() == "keep me\n" and (victim / "a.txt").exists()
    # A directory with only one of a fit's two files is not a fit either.
    (victim / "platform.toml").write_text("name = 'x'\n")
    assert _fit_cli(store, victim, "--force") == 2
    one_line_error(capsys, "not a previous fit")
    assert (victim / "a.txt").exists()
    # A file named as --out is not replaced either.
    notes = tmp_path / "notes.txt"
    notes.write_text("keep\n")
    assert _fit_cli(store, notes, "--force") == 2
    one_line_error(capsys, f"--out {notes}", "is a file")
    assert notes.read_text() == "keep\n"


def test_without_force_an_existing_out_is_refused(tmp_path):
    store = _gpu_store(tmp_path)
    (tmp_path / "plat").mkdir()
    with pytest.raises(CalibrationError, match=r"--out .*plat: already exists \(pass --force"):
        fit_platform(store, tmp_path / "plat", candidates=FAST_LIBRARIES, plot=False)


def test_force_replaces_a_previous_fit(tmp_path):
    store = _gpu_store(tmp_path)
    out = tmp_path / "plat"
    first = fit_platform(store, out, candidates=FAST_LIBRARIES, plot=False)
    assert (out / "platform.toml").is_file() and (out / "calibration.toml").is_file()
    (out / "stale.txt").write_text("from the previous fit's directory\n")
    again = fit_platform(store, out, candidates=FAST_LIBRARIES, plot=False, overwrite=True)
    assert again.platform_dir == first.platform_dir == out
    assert (out / "platform.toml").is_file() and not (out / "stale.txt").exists()
    assert _tree(store)      # the samples are untouched
    # An empty directory is replaced with --force too (nothing in it to lose).
    (tmp_path / "empty").mkdir()
    fit_platform(store, tmp_path / "empty", candidates=FAST_LIBRARIES, plot=False, overwrite=True)
    assert (tmp_path / "empty" / "calibration.toml").is_file()
