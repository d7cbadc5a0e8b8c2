from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calibrate.errors import CalibrationError, InstallRefused
from calibrate.install import install_platform, platforms_root, rollback, signal_daemon, status


def _copy(src: Path, dst: Path, **cal_changes) -> Path:
    shutil.copytree(src, dst)
    if cal_changes:
        f = dst / "calibration.toml"
        text = f.read_text()
        for key, value in cal_changes.items():
            lines = [l for l in text.splitlines() if not l.startswith(f"{key} =")]
            # keys before the first table
            idx = next((i for i, l in enumerate(lines) if l.startswith("[")), len(lines))
            lines.insert(idx, f"{key} = {value}")
            text = "\n".join(lines) + "\n"
        f.write_text(text)
    return dst


def test_install_switch_and_rollback(tiny_platform, tmp_path):
    root = tmp_path / "root"
    r1 = install_platform(tiny_platform, "gpu-a", root=root, tag="one")
    cur = root / "gpu-a" / "current"
    assert cur.is_symlink() and (cur / "platform.toml").is_file()
    from predictor import load_platform
    assert load_platform(cur).gpus_per_node == 2
    r2 = install_platform(tiny_platform, "gpu-a", root=root, tag="two")
    assert r2.previous == r1.version
    assert os.readlink(root / "gpu-a" / "previous").endswith(r1.version)
    rows = status(root)
    assert [r.partition for r in rows] == ["gpu-a"]
    assert rows[0].version == r2.version and rows[0].samples > 0 and rows[0].compute_mape is not None
    assert rows[0].age_days is not None and rows[0].age_days < 1
    rb = rollback("gpu-a", root=root)
    assert rb.version == r1.version
    assert os.readlink(cur).endswith(r1.version)
    assert os.readlink(root / "gpu-a" / "previous").endswith(r2.version)
    assert "rolled back" in (root / "gpu-a" / "history.log").read_text()


def test_worse_validating_platform_refused_and_active_untouched(tiny_platform, tmp_path):
    root = tmp_path / "root"
    first = install_platform(tiny_platform, "p", root=root)
    worse = _copy(tiny_platform, tmp_path / "worse", compute_mape=5.0)
    with pytest.raises(InstallRefused, match="validates worse"):
        install_platform(worse, "p", root=root)
    assert os.readlink(root / "p" / "current").endswith(first.version)
    assert not (root / "p" / "previous").exists()
    assert len(list((root / "p" / "versions").iterdir())) == 1
    install_platform(worse, "p", root=root, force=True)


def test_incomplete_calibration_refused(tiny_platform, tmp_path):
    bad = _copy(tiny_platform, tmp_path / "inc", complete="false")
    with pytest.raises(InstallRefused, match="incomplete"):
        install_platform(bad, "p", root=tmp_path / "root")
    assert not (tmp_path / "root" / "p" / "current").exists()


def test_other_gpu_type_refused(tiny_platform, tmp_path):
    root = tmp_path / "root"
    install_platform(tiny_platform, "p", root=root)
    other = _copy(tiny_platform, tmp_path / "other", gpu='"NVIDIA H100"')
    with pytest.raises(InstallRefused, match="another GPU type|runs"):
        install_platform(other, "p", root=root)


def test_corrupt_platform_refused_nothing_touched(tiny_platform, tmp_path):
    root = tmp_path / "root"
    first = install_platform(tiny_platform, "p", root=root)
    broken = _copy(tiny_platform, tmp_path / "broken")
    model = next((broken / "compute" / "models").iterdir())
    model.write_bytes(b"tampered")
    with pytest.raises(InstallRefused, match="does not load"):
        install_platform(broken, "p", root=root)
    assert os.readlink(root / "p" / "current").endswith(first.version)
    with pytest.raises(InstallRefused, match="not a platform"):
        install_platform(tmp_path, "p", root=root)


def test_rollback_without_history_and_bad_names(tmp_path):
    with pytest.raises(CalibrationError, match="no installed platform"):
        rollback("p", root=tmp_path)
    with pytest.raises(CalibrationError, match="bad partition name"):
        rollback("../etc", root=tmp_path)


def test_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFCAST_PLATFORMS", f"{tmp_path}/a:{tmp_path}/b")
    assert platforms_root() == tmp_path / "a"
    assert platforms_root(tmp_path / "c") == tmp_path / "c"


def test_sighup_reaches_the_daemon_only(tmp_path):
    flag = tmp_path / "hup"
    code = ("import signal, sys, time, pathlib\n"
            f"signal.signal(signal.SIGHUP, lambda *a: pathlib.Path({str(flag)!r}).write_text('x'))\n"
            "print('ready', flush=True)\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, "perf-predictd"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        pidfile = tmp_path / "d.pid"
        pidfile.write_text(f"{proc.pid}\n")
        assert signal_daemon(pidfile) == proc.pid
        for _ in range(100):
            if flag.exists():
                break
            time.sleep(0.05)
        assert flag.exists()
        pidfile.write_text(f"{os.getpid()}\n")        # not the daemon: no signal
        assert signal_daemon(pidfile) is None
        assert signal_daemon(tmp_path / "missing.pid") is None
    finally:
        proc.kill()
        proc.wait()
