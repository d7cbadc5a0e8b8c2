from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from calibrate import install as install_mod
from calibrate.errors import CalibrationError, InstallRefused
from calibrate.install import (ReloadFailed, install_platform, is_predictd, platforms_root,
                               reload_daemon, rollback, signal_daemon, status)
from predictor import load_platform

PACKAGED_PIDFILE = install_mod.DEFAULT_PIDFILE       # before the fixture below moves it


@pytest.fixture(autouse=True)
def _no_real_daemon(monkeypatch, tmp_path):
    """Never reload a perf-predictd that happens to run on this machine."""
    monkeypatch.delenv("PERFCAST_DAEMON_PIDFILE", raising=False)
    monkeypatch.setattr(install_mod, "DEFAULT_PIDFILE", tmp_path / "no-daemon.pid")
    monkeypatch.setattr(install_mod, "_systemd_active", lambda: False)


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
    (tmp_path / "watchshort").mkdir()
    with pytest.raises(CalibrationError, match=r"no installed platform .*\(did you mean 'watchshort'\?\)"):
        rollback("watchshrt", root=tmp_path)


def test_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFCAST_PLATFORMS", f"{tmp_path}/a:{tmp_path}/b")
    assert platforms_root() == tmp_path / "a"
    assert platforms_root(tmp_path / "c") == tmp_path / "c"


_HUP_CODE = ("import signal, sys, time, pathlib\n"
             "flag = pathlib.Path(sys.argv[-1])\n"
             "signal.signal(signal.SIGHUP, lambda *a: flag.write_text('x'))\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")


def _hup_catcher(argv: list) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _wait(path: Path) -> bool:
    for _ in range(200):
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def test_sighup_reaches_the_daemon_only(tmp_path):
    flag = tmp_path / "hup"
    # perf-predictd's console script as pip installs it: `python .../bin/perf-predictd ...`
    script = tmp_path / "bin" / "perf-predictd"
    script.parent.mkdir()
    script.write_text(_HUP_CODE)
    proc = _hup_catcher([sys.executable, str(script), str(flag)])
    pidfile = tmp_path / "d.pid"
    try:
        pidfile.write_text(f"{proc.pid}\n")
        assert signal_daemon(pidfile) == proc.pid
        assert _wait(flag)
    finally:
        proc.kill()
        proc.wait()
    pidfile.write_text(f"{os.getpid()}\n")        # not the daemon: no signal
    assert signal_daemon(pidfile) is None
    assert signal_daemon(tmp_path / "missing.pid") is None


def test_a_process_that_only_mentions_perfcast_is_never_signalled(tmp_path):
    """What the old substring test let through: "perf-predictd" as an argument, a script in a
    directory named perfcast.  They must neither be signalled nor count as a reload."""
    flag1, flag2 = tmp_path / "hup1", tmp_path / "hup2"
    inside = tmp_path / "perfcast" / "slurm_plugin.daemon"
    inside.parent.mkdir()
    inside.write_text(_HUP_CODE)
    procs = [_hup_catcher([sys.executable, "-c", _HUP_CODE, "perf-predictd", str(flag1)]),
             _hup_catcher([sys.executable, str(inside), str(flag2)])]
    try:
        for proc in procs:
            pidfile = tmp_path / "d.pid"
            pidfile.write_text(f"{proc.pid}\n")
            res = reload_daemon(pidfile)
            assert res.status == "failed" and "is not perf-predictd" in res.message
        time.sleep(0.3)
        assert not flag1.exists() and not flag2.exists()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("argv, expect", [
    (["/usr/bin/perf-predictd", "--config", "/etc/perfcast/perfcast.toml"], True),
    (["/usr/bin/python3", "/usr/local/bin/perf-predictd", "--config", "x"], True),
    (["/usr/bin/python3.11", "-u", "-X", "dev", "-m", "slurm_plugin.daemon", "--config", "x"], True),
    (["python3", "-mslurm_plugin.daemon"], True),
    (["/usr/bin/python3", "-c", "print('perf-predictd')", "perf-predictd"], False),
    (["/usr/bin/python3", "-m", "tests.daemon.fakes", "--config", "slurm_plugin.daemon"], False),
    (["/usr/bin/python3", "/home/u/perfcast/train.py"], False),
    (["/bin/bash", "/usr/bin/perf-predictd"], False),
    (["perf-predictd-helper"], False),
    ([], False),
])
def test_is_predictd_reads_program_and_module_from_argv(argv, expect):
    assert is_predictd(argv) is expect


def test_failed_reload_is_an_error_but_the_install_stays(tiny_platform, tmp_path):
    root = tmp_path / "root"
    pidfile = tmp_path / "d.pid"
    pidfile.write_text(f"{os.getpid()}\n")        # a stale pid file naming some other process
    with pytest.raises(ReloadFailed, match="installed .* but perf-predictd was not reloaded: "
                                           "pid \\d+ .* is not perf-predictd"):
        install_platform(tiny_platform, "p", root=root, tag="one", pid_file=pidfile)
    assert os.readlink(root / "p" / "current").endswith("-one")
    with pytest.raises(ReloadFailed, match="does not exist"):
        install_platform(tiny_platform, "p", root=root, tag="two", pid_file=tmp_path / "none.pid")
    with pytest.raises(ReloadFailed, match="rolled back"):
        rollback("p", root=root, pid_file=pidfile)


def test_no_daemon_running_is_only_a_warning(tiny_platform, tmp_path, caplog):
    res = install_platform(tiny_platform, "p", root=tmp_path / "root")
    assert res.reload.status == "not-running" and res.signalled is None
    assert "not running" in caplog.text


def test_install_reloads_the_real_daemon(tiny_platform, tmp_path):
    """perf-predictd as the unit starts it (with a pid file): install makes it reload."""
    d = tempfile.mkdtemp(prefix="pci", dir="/tmp")         # short: AF_UNIX path limit
    cfg = Path(d) / "perfcast.toml"
    cfg.write_text(f'[daemon]\nsocket = "{d}/d.sock"\nworkers = 1\n')
    pidfile, logfile = Path(d) / "perf-predictd.pid", Path(d) / "log"
    proc = subprocess.Popen([sys.executable, "-m", "slurm_plugin.daemon", "--config", str(cfg),
                             "--pid-file", str(pidfile), "--log-file", str(logfile)])
    try:
        assert _wait(pidfile), logfile.read_text() if logfile.exists() else "no log"
        res = install_platform(tiny_platform, "p", root=tmp_path / "root", pid_file=pidfile)
        assert res.reload.status == "signalled" and res.signalled == proc.pid
        for _ in range(400):
            if "event=reloaded" in logfile.read_text():
                break
            time.sleep(0.05)
        assert "event=reloaded" in logfile.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(d, ignore_errors=True)


def test_killed_install_leftovers_are_pruned(tiny_platform, tmp_path):
    root = tmp_path / "root"
    install_platform(tiny_platform, "p", root=root, tag="one")
    versions = root / "p" / "versions"
    (versions / ".20260101T000000Z-dead.tmp" / "compute").mkdir(parents=True)
    os.symlink("versions/x", root / "p" / ".current.tmp4242")
    install_platform(tiny_platform, "p", root=root, tag="two")
    assert not (versions / ".20260101T000000Z-dead.tmp").exists()
    assert not (root / "p" / ".current.tmp4242").is_symlink()
    assert sorted(p.name for p in versions.iterdir() if p.name.startswith(".")) == []


def test_concurrent_install_of_one_partition_is_refused(tiny_platform, tmp_path):
    import fcntl
    root = tmp_path / "root"
    install_platform(tiny_platform, "p", root=root, tag="one")
    with open(root / "p" / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(CalibrationError, match="another install"):
            install_platform(tiny_platform, "p", root=root, tag="two")
    assert os.readlink(root / "p" / "current").endswith("-one")


def test_install_pins_an_unpinned_platform(tiny_platform, tmp_path):
    import tomllib
    old = _copy(tiny_platform, tmp_path / "old")
    f = old / "platform.toml"
    f.write_text("".join(l for l in f.read_text().splitlines(keepends=True) if "_sha256" not in l))
    res = install_platform(old, "p", root=tmp_path / "root")
    raw = tomllib.loads((res.path / "platform.toml").read_text())
    assert len(raw["compute_bundle_sha256"]) == 64
    m = res.path / raw["compute_bundle"] / "manifest.toml"
    m.write_text(m.read_text() + "\n# edited\n")
    from predictor import BundleError
    with pytest.raises(BundleError, match="manifest checksum mismatch"):
        load_platform(res.path, reload=True)


def test_without_a_pid_file_systemd_reloads_it(tiny_platform, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(install_mod, "_systemd_active", lambda: True)
    monkeypatch.setattr(install_mod, "_systemd_reload",
                        lambda: calls.append(1) or install_mod.ReloadResult("systemd", 77, "ok"))
    install_platform(tiny_platform, "p", root=tmp_path / "root", tag="one")
    res = install_platform(tiny_platform, "p", root=tmp_path / "root", tag="two")
    assert len(calls) == 2 and res.reload.status == "systemd" and res.signalled == 77
    monkeypatch.setattr(install_mod, "_systemd_reload",
                        lambda: install_mod.ReloadResult("failed", None, "systemctl reload: denied"))
    with pytest.raises(ReloadFailed, match="systemctl reload: denied"):
        rollback("p", root=tmp_path / "root")


def test_packaged_unit_writes_the_pid_file_install_signals():
    unit = (Path(__file__).resolve().parents[2] / "packaging" / "systemd" /
            "perf-predictd.service").read_text()
    lines = dict(l.split("=", 1) for l in unit.splitlines() if "=" in l and not l.startswith("#"))
    assert f"--pid-file {PACKAGED_PIDFILE}" in lines["ExecStart"]
    assert lines["PIDFile"] == str(PACKAGED_PIDFILE)
    assert is_predictd(lines["ExecStart"].split())
    assert "perfcast" in lines["RuntimeDirectory"]        # systemd creates /run/perfcast


# ------------------------------------------------ kills at any point of a switch (issue 32, item 3)
class _Killed(BaseException):
    """What SIGKILL does to the code after it: nothing runs, no except or finally clause helps."""


def _kill_at(monkeypatch, step: int, reloads: list) -> list:
    """Make the ``step``-th action of a switch (journal writes, link switches, history, reload,
    journal removal) die; record every reload.  Returns the action log."""
    done: list = []

    def wrap(name, fn):
        def inner(*a, **k):
            if len(done) == step:
                raise _Killed(name)
            done.append(name)
            if name == "reload":
                reloads.append(a)
                return install_mod.ReloadResult("not-running", None, "test: no daemon")
            return fn(*a, **k)
        return inner
    for name, attr in (("journal", "_write_journal"), ("switch", "_switch"), ("history", "_history"),
                       ("reload", "reload_daemon")):
        monkeypatch.setattr(install_mod, attr, wrap(name, getattr(install_mod, attr)))
    return done


@pytest.mark.parametrize("step", range(8))
def test_an_install_killed_at_any_point_is_completed_by_the_next_command(tiny_platform, tmp_path, monkeypatch, step):
    root = tmp_path / "root"
    v1 = install_platform(tiny_platform, "p", root=root, tag="one").version
    v2 = install_platform(tiny_platform, "p", root=root, tag="two").version
    reloads: list = []
    with monkeypatch.context() as m:
        done = _kill_at(m, step, reloads)
        try:
            v3 = install_platform(tiny_platform, "p", root=root, tag="three").version
            killed = False
        except _Killed:
            killed = True
    pdir = root / "p"
    v3 = next(p.name for p in (pdir / "versions").iterdir() if p.name.endswith("-three"))
    journalled = "journal" in done
    before = (pdir / "history.log").read_text()
    # The next command (here a rollback) first finishes what the killed one journalled.
    reloads.clear()
    with monkeypatch.context() as m:
        _kill_at(m, 99, reloads)
        rb = rollback("p", root=root)
    history = (pdir / "history.log").read_text()
    if journalled or not killed:
        # The switch happened (or is completed now): exactly one history line for it, a reload for
        # it and one for the rollback, and the rollback goes from three back to two.
        assert history.count(f"installed {v3}") == 1, history
        assert (rb.previous, rb.version) == (v3, v2)
        if killed and f"installed {v3}" not in before:
            assert "completed after an interrupted switch" in history
        assert len(reloads) == (2 if killed else 1)
    else:
        # Killed before anything was written down: nothing switched, three is not active.
        assert f"installed {v3}" not in history
        assert (rb.previous, rb.version) == (v2, v1)
    assert os.readlink(pdir / "current") != os.readlink(pdir / "previous")
    assert not (pdir / install_mod.JOURNAL).exists()


def test_rollback_refuses_to_roll_back_to_the_current_version(tiny_platform, tmp_path):
    root = tmp_path / "root"
    install_platform(tiny_platform, "p", root=root, tag="one")
    two = install_platform(tiny_platform, "p", root=root, tag="two")
    # What a kill between the two link switches used to leave: previous = current.
    prev = root / "p" / "previous"
    prev.unlink()
    os.symlink(os.readlink(root / "p" / "current"), prev)
    with pytest.raises(CalibrationError, match=f"nothing to roll back to: previous and current are both {two.version}"):
        rollback("p", root=root)
    assert os.readlink(root / "p" / "current").endswith(two.version)


def test_versions_of_one_second_order_by_when_they_were_installed(tmp_path):
    """Version names carry their install's second; within one second the name's tag (and a
    ``.10`` against a ``.2``) says nothing of the order, the directory's ctime does."""
    names = ["20260101T000000Z-zzz", "20260101T000000Z-aaa", "20260101T000000Z-aaa.2",
             "20260101T000000Z-aaa.10", "20260101T000001Z-000"]
    for name in names:
        (tmp_path / name).mkdir()
        time.sleep(0.05)       # past the file system's timestamp granularity (a jiffy)
    assert [p.name for p in sorted(tmp_path.iterdir(), key=install_mod.version_order)] == names
    assert sorted(names) != names
