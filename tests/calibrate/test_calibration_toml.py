"""calibration.toml, install's gate: its keys are checked (a typo such as ``gpu_name`` must not skip
the GPU-type check), its values typed and in range; a bad file is one line naming the file and the
key, and install refuses.  No torch: dgx-a100's models with a hand-written calibration.toml."""
from __future__ import annotations

import ast
import inspect
import logging
import sys
from pathlib import Path

import pytest

from calibrate import fitting
from calibrate.cli import main
from calibrate.errors import InstallRefused
from calibrate.install import CALIBRATION_KEYS, calibration_problem, install_platform, status
from predictor.platform import resolve_platform, write_platform
from predictor.samples import dump_toml

from .test_refit import _no_real_daemon  # noqa: F401  (never reload a real daemon)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

A100 = "NVIDIA A100-SXM4-80GB"
GOOD = {"format": 1, "name": "calibrated", "created": "2026-01-01T00:00:00+00:00", "samples_dir": "/s",
        "samples": 500, "complete": True, "device": "cuda", "gpu": A100, "compute_mape": 0.05,
        "collective_mape": 0.08, "plans": ["full"], "environment": {"torch": "2.11.0", "gpus": 8}}


def _platform(d: Path, text: str) -> Path:
    """A platform of its own (dgx-a100's models) with ``text`` as its calibration.toml."""
    src = resolve_platform("dgx-a100")
    raw = tomllib.loads((src / "platform.toml").read_text(encoding="utf-8"))
    raw["compute_bundle"] = str((src / raw["compute_bundle"]).resolve())
    raw.pop("validation", None)
    write_platform(d, raw)
    (d / "calibration.toml").write_text(text, encoding="utf-8")
    return d


def _edited(d: Path, **changes) -> Path:
    """GOOD with ``changes`` (a value of None removes the key; a str is TOML text as it stands)."""
    cal = {k: v for k, v in GOOD.items() if k not in changes}
    extra = "".join(f"{k} = {v}\n" for k, v in changes.items() if v is not None)
    tables = {k: v for k, v in cal.items() if isinstance(v, dict)}
    top = {k: v for k, v in cal.items() if k not in tables}
    return _platform(d, dump_toml(top) + extra + (dump_toml(tables) if tables else ""))


def test_every_key_perf_calibrate_fit_writes_is_known():
    """The keys of fit_platform's ``cal`` dict and of each ``cal[...] =`` after it."""
    tree = ast.parse(inspect.getsource(fitting.fit_platform))
    written = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "cal" for t in node.targets):
            written |= {k.value for k in node.value.keys}
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                                                and t.value.id == "cal" for t in node.targets):
            written |= {t.slice.value for t in node.targets}
    assert {"gpu", "samples", "compute_mape", "collective_mape", "environment"} <= written
    assert written <= CALIBRATION_KEYS, written - CALIBRATION_KEYS
    assert calibration_problem(GOOD, "c.toml") == ""


@pytest.mark.parametrize("changes, match", [
    ({"gpu": None, "gpu_name": f'"{A100}"'}, "gpu_name: unknown key (did you mean 'gpu' or 'name'?)"),
    ({"samples": None, "sampels": "261"}, "sampels: unknown key (did you mean 'samples'?)"),
    ({"samples": '"many"'}, "samples must be a whole number >= 0, got 'many'"),
    ({"samples": "-3"}, "samples must be a whole number >= 0"),
    ({"samples": "2.5"}, "samples must be a whole number >= 0"),
    ({"compute_mape": "-1.0"}, "compute_mape must be a finite number >= 0"),
    ({"compute_mape": "nan"}, "compute_mape must be a finite number >= 0"),
    ({"collective_mape": "inf"}, "collective_mape must be a finite number >= 0"),
    ({"compute_mape": '"5 %"'}, "compute_mape must be a finite number >= 0"),
    ({"compute_mape": None}, "compute_mape: missing"),
    ({"gpu": None}, "gpu: missing"),
    ({"gpu": '""'}, "gpu must be a non-empty string"),
    ({"complete": '"yes"'}, "complete must be true or false"),
    ({"plans": '"full"'}, "plans must be a list of plan names"),
])
def test_a_bad_calibration_file_is_refused_naming_file_and_key(tmp_path, changes, match):
    d = _edited(tmp_path / "cand", **changes)
    with pytest.raises(InstallRefused) as info:
        install_platform(d, "gpu", root=tmp_path / "root")
    msg = str(info.value)
    assert msg.startswith(f"{d / 'calibration.toml'}: ") and match in msg and "\n" not in msg
    assert not (tmp_path / "root" / "gpu" / "current").exists()


def test_the_cli_refuses_with_one_line_and_no_traceback(tmp_path, capsys):
    d = _edited(tmp_path / "cand", samples='"many"')
    assert main(["install", str(d), "--partition", "gpu", "--root", str(tmp_path / "root")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "samples must be a whole number" in err
    assert "Traceback" not in err and "invalid literal" not in err


def test_a_sound_file_installs_and_another_gpu_is_still_refused(tmp_path):
    root = tmp_path / "root"
    install_platform(_edited(tmp_path / "a"), "gpu", root=root, tag="a")
    other = _edited(tmp_path / "h", gpu='"NVIDIA H100 80GB HBM3"')
    with pytest.raises(InstallRefused, match="calibrated on 'NVIDIA H100 80GB HBM3'"):
        install_platform(other, "gpu", root=root, tag="h")
    misspelt = _edited(tmp_path / "m", gpu=None, gpu_name='"NVIDIA H100 80GB HBM3"')
    with pytest.raises(InstallRefused, match="gpu_name: unknown key"):
        install_platform(misspelt, "gpu", root=root, tag="m")


def test_an_installed_version_with_a_bad_file_blocks_comparisons_not_status(tmp_path, caplog):
    """A version installed before the check (its calibration.toml edited here): status still shows
    the partition (with a warning naming the key); an install refuses unless --force."""
    root = tmp_path / "root"
    res = install_platform(_edited(tmp_path / "a"), "gpu", root=root, tag="a")
    cal = res.path / "calibration.toml"
    cal.write_text(cal.read_text().replace("compute_mape = 0.05", "compute_mape = -1.0"))
    with caplog.at_level(logging.WARNING):
        rows = status(root)
    assert [r.partition for r in rows] == ["gpu"] and rows[0].compute_mape is None
    assert "compute_mape must be a finite number >= 0" in caplog.text
    with pytest.raises(InstallRefused, match=r"compute_mape must be .*use --force"):
        install_platform(_edited(tmp_path / "b"), "gpu", root=root, tag="b")
    install_platform(_edited(tmp_path / "c"), "gpu", root=root, tag="c", force=True)
