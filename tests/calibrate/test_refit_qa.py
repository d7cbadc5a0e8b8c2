"""What a QA run of `harvest --refit` on a shipped platform found (a site overlay, rollback, status):

1. a rollback stands: the next refit does not reinstall from the runs the rolled-back fit saw;
2. the refit's line and `status` list every factor the fit wrote that is not 1, per kind;
3. a refit says that perf-predictd reloads (as install and rollback do);
4. with a --root the shell's environment does not resolve to, the note says what perf-predictd
   must run with instead of asserting what it uses (and, where its environment is readable, what it uses);
5. a platform in perfcast.toml that exists nowhere is an error with a did-you-mean (exit 2);
6. rollback's wording (a platform name is not a partition; one form for every rollback);
7. the dev cluster passes PERFCAST_DEV_PLATFORMS to its perf-predictd as PERFCAST_PLATFORMS.

No Slurm: the `site` fixture of test_refit.py (a root with dgx-a100 installed for partition gpu, a
sacct answering no jobs); the harvested runs are a platform's predictions with known factors.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate import install as install_mod
from calibrate.cli import main
from calibrate.harvest import append_runs
from predictor import load_platform
from predictor.estimate import predict_many
from predictor.kinds import kind_of
from predictor.platform import FittedTerms
from predictor.validation import MeasuredRun
from tests.predictor.conftest import small_job

from .test_refit import JOBS, _harvested, _no_real_daemon, _tree, site  # noqa: F401  (the fixtures)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_shell_platforms(monkeypatch):
    """The shell's PERFCAST_PLATFORMS is each test's to set (test_refit.py's _no_real_daemon, used
    here too, keeps any real perf-predictd out of reach)."""
    monkeypatch.delenv("PERFCAST_PLATFORMS", raising=False)


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _line(out: str, partition: str) -> str:
    return next(l for l in out.splitlines() if l.startswith(f"refit of {partition}:"))


def _config(tmp_path, records, body: str) -> Path:
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text(f'[daemon]\nrecords = "{records}"\n' + body)
    return cfg


def _harvest(capsys, site, cfg, *extra):
    root, _, records, runs_dir = site
    return _run(capsys, "harvest", "--config", cfg, "--out", runs_dir, "--since", "1d", "--refit",
                "--root", root, *extra)


_HUP_CODE = ("import signal, sys, time\n"
             "signal.signal(signal.SIGHUP, lambda *a: None)\n"
             "print('ready', flush=True)\n"
             "time.sleep(120)\n")


@pytest.fixture
def fake_daemon(tmp_path):
    """A process that is perf-predictd by its command line (`python .../perf-predictd`), survives
    SIGHUP, and runs with the environment given: (pid file, its pid)."""
    procs = []

    def start(env_platforms: "str | None") -> tuple[Path, int]:
        script = tmp_path / f"bin{len(procs)}" / "perf-predictd"
        script.parent.mkdir()
        script.write_text(_HUP_CODE)
        env = {k: v for k, v in os.environ.items() if k != "PERFCAST_PLATFORMS"}
        if env_platforms is not None:
            env["PERFCAST_PLATFORMS"] = env_platforms
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env,
                                cwd="/")
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        pid_file = tmp_path / f"predictd{len(procs)}.pid"
        pid_file.write_text(f"{proc.pid}\n")
        return pid_file, proc.pid

    yield start
    for p in procs:
        p.kill()
        p.wait()


# ---------------------------------------------------------------- 1. a rollback stands

def test_a_rollback_to_the_shipped_platform_is_not_undone_by_the_next_refit(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    runs = _harvested(runs_dir, root, 1.3, 6)
    append_runs(runs_dir, "short", runs)
    cfg = _config(tmp_path, records, '[partitions.short]\nplatform = "dgx-a100"\n')
    code, out, err = _harvest(capsys, site, cfg, "--partition", "short")
    assert code == 0 and "installed" in _line(out, "short"), (out, err)
    first = os.path.basename(os.readlink(root / "dgx-a100" / "current"))
    assert _run(capsys, "rollback", "dgx-a100", "--root", root)[0] == 0
    before = _tree(root)
    today = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    # No new runs: the timer's next refit (and its dry run) leaves the admin's rollback alone.
    for extra in ((), ("--dry-run",)):
        code, out, err = _harvest(capsys, site, cfg, "--partition", "short", *extra)
        line = _line(out, "short")
        assert code == 0, err
        assert f"skipped: {first} was rolled back on {today}; no runs harvested since {first} was fitted: " \
               "not refitting (`perf-calibrate rollback dgx-a100` restores it)" in line, line
        assert _tree(root) == before
    # A job harvested after the rolled-back fit: refitted and installed again, on all 7.
    more = _harvested(runs_dir, root, 1.3, 7)
    append_runs(runs_dir, "short", more)
    code, out, err = _harvest(capsys, site, cfg, "--partition", "short")
    assert code == 0 and "installed" in _line(out, "short"), (out, err)
    now = os.path.basename(os.readlink(root / "dgx-a100" / "current"))
    assert now != first and len(load_platform(root / "dgx-a100" / "current").fitted.runs) == 7


def test_a_rollback_to_an_older_refit_stands_too(site, capsys):
    """The newest refit ever installed decides, not the active one: rolled back from the refit on 7
    runs to the one on 6, the 7 runs are no reason to refit (the active version never saw the 7th)."""
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    assert _run(capsys, "harvest", "--records", records, "--out", runs_dir, "--since", "1d", "--refit",
                "--root", root)[0] == 0
    r1 = os.path.basename(os.readlink(root / "gpu" / "current"))
    _harvested(runs_dir, root, 1.45, 7)
    code, out, _ = _run(capsys, "harvest", "--records", records, "--out", runs_dir, "--since", "1d", "--refit",
                        "--root", root)
    r2 = os.path.basename(os.readlink(root / "gpu" / "current"))
    assert code == 0 and r2 != r1, out
    assert _run(capsys, "rollback", "gpu", "--root", root)[0] == 0
    assert os.path.basename(os.readlink(root / "gpu" / "current")) == r1
    code, out, _ = _run(capsys, "harvest", "--records", records, "--out", runs_dir, "--since", "1d", "--refit",
                        "--root", root)
    assert code == 0 and f"skipped: {r2} was rolled back on " in _line(out, "gpu"), out
    assert os.path.basename(os.readlink(root / "gpu" / "current")) == r1


def test_a_refit_whose_fit_kept_fewer_runs_than_it_was_given_is_not_repeated(site, tmp_path, capsys,
                                                                             monkeypatch):
    """The fit keeps at most MAX_RUNS runs (the platform's own first): the runs it was given, not
    the ones it kept, decide whether a later refit has anything new, before and after a rollback."""
    root, _, records, runs_dir = site
    shipped = len(load_platform("dgx-a100").validation)
    monkeypatch.setattr(install_mod, "MAX_RUNS", shipped + 4)       # room for 4 of the 6 harvested
    append_runs(runs_dir, "short", _harvested(runs_dir, root, 1.3, 6))
    cfg = _config(tmp_path, records, '[partitions.short]\nplatform = "dgx-a100"\n')
    code, out, err = _harvest(capsys, site, cfg, "--partition", "short")
    assert code == 0 and "installed" in _line(out, "short"), (out, err)
    first = os.path.basename(os.readlink(root / "dgx-a100" / "current"))
    assert len(load_platform(root / "dgx-a100" / "current").fitted.runs) < shipped + 6
    code, out, _ = _harvest(capsys, site, cfg, "--partition", "short")
    assert code == 0 and "skipped: no runs harvested since" in _line(out, "short"), out
    assert _run(capsys, "rollback", "dgx-a100", "--root", root)[0] == 0
    code, out, _ = _harvest(capsys, site, cfg, "--partition", "short")
    assert code == 0 and f"skipped: {first} was rolled back on " in _line(out, "short"), out


# ---------------------------------------------------------------- 2. every factor that moved

def test_the_refit_line_and_status_list_every_factor_that_is_not_1(site, tmp_path, capsys):
    """Host-bound jobs whose per-micro-batch host cost is 1.6x dgx-h100's: the kind's host factor is
    what moves their predictions, and the line and status say so (not only `compute`, `host scale 1`)."""
    root, _, records, runs_dir = site
    small = dict(seq=1024, mb=1, recompute="none", attention="flash", vocab=32000)
    jobs = [small_job(layers=L, hidden=h, heads=h // 64, mbs=m, **small)
            for L, h, m in ((2, 512, 2), (4, 512, 8), (4, 1024, 2), (8, 768, 4), (8, 1024, 16), (6, 512, 3),
                            (2, 768, 12), (4, 768, 6), (6, 1024, 8), (2, 1024, 4))]
    truth = dataclasses.replace(load_platform("dgx-h100"), fitted=FittedTerms(host_micro_batch_scale=1.6))
    runs = [MeasuredRun(f"slurm job {2000 + i}", j, p.iteration_seconds, source="synthetic")
            for i, (j, p) in enumerate(zip(jobs, predict_many(jobs, truth)))]
    append_runs(runs_dir, "h100", runs)
    cfg = _config(tmp_path, records, '[partitions.h100]\nplatform = "dgx-h100"\n')
    code, out, err = _harvest(capsys, site, cfg, "--partition", "h100")
    line = _line(out, "h100")
    assert code == 0 and "installed" in line, (out, err)
    plat = load_platform(root / "dgx-h100" / "current")
    kind = plat.fitted.for_kind(kind_of(jobs[0]).key)       # (the shipped runs are kinds of their own)
    moved = {f: round(v, 3) for f, v in kind.scales if round(v, 3) != 1.0}
    # (pooled with the shipped runs' kinds, the factor comes out below the truth's 1.6; what it is,
    # with the other factors that moved, is what the line must show)
    assert moved.get("host_micro_batch_scale", 1.0) > 1.1 and len(moved) >= 2, moved
    shown = ", ".join(f"{lbl} ×{moved[f]:.3f}" for f, lbl in (
        ("compute_scale", "compute"), ("attention_scale", "attention"), ("host_layer_scale", "host per layer"),
        ("host_micro_batch_scale", "host per micro-batch"), ("host_launch_scale", "host per launch"),
        ("network_scale", "network between nodes")) if f in moved)
    assert f"kind {kind.kind} ({kind.runs} runs, MAPE " in line and f"): {shown}" in line, line
    assert "fitted factors: partition " in line and "host scale" not in line, line
    # status: the same factors, from the version's refit.toml
    code, out, _ = _run(capsys, "status", "--root", root)
    assert code == 0 and f"kind {kind.kind} ({kind.runs} runs): {shown}" in out, out
    assert "host scale" not in out
    # --json: the keys it had, and the factors besides
    code, out, _ = _run(capsys, "status", "--root", root, "--json")
    (st,) = [s for s in json.loads(out) if s["partition"] == "dgx-h100"]
    assert {"compute_scale", "host_scale", "network_scale", "kinds"} <= set(st["refit"])
    (kf,) = [k for k in st["refit"]["kind_factors"] if k["kind"] == kind.kind]
    assert kf["factors"] == moved


# ---------------------------------------------------------------- 3. the reload is said

def test_a_refit_says_that_perf_predictd_reloads(site, capsys, fake_daemon):
    root, _, records, runs_dir = site
    pid_file, pid = fake_daemon(None)
    _harvested(runs_dir, root, 1.3, 6)
    code, out, err = _run(capsys, "harvest", "--records", records, "--out", runs_dir, "--since", "1d", "--refit",
                          "--root", root, "--pid-file", pid_file)
    line = _line(out, "gpu")
    assert code == 0 and "installed" in line and f"perf-predictd (pid {pid}) reloads" in line, (line, err)


def test_a_refit_says_why_no_daemon_reloads(site, capsys):
    root, _, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    code, out, _ = _run(capsys, "harvest", "--records", records, "--out", runs_dir, "--since", "1d", "--refit",
                        "--root", root)
    line = _line(out, "gpu")
    assert code == 0 and "perf-predictd is not running" in line and "loads the new platform when it starts" in line


# ---------------------------------------------------------------- 4. the daemon's environment is its own

def test_a_root_the_shell_does_not_resolve_says_what_the_daemon_needs(site, tmp_path, capsys, monkeypatch,
                                                                        fake_daemon):
    root, _, records, runs_dir = site
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(tmp_path / "the-shells-root"))
    runs = _harvested(runs_dir, root, 1.3, 6)
    append_runs(runs_dir, "short", runs)
    cfg = _config(tmp_path, records, '[partitions.short]\nplatform = "dgx-a100"\n')
    overlay = root / "dgx-a100" / "current"
    code, out, _ = _harvest(capsys, site, cfg, "--partition", "short", "--dry-run")
    line = _line(out, "short")
    assert code == 0 and f"note: perf-predictd uses {overlay} only if it runs with PERFCAST_PLATFORMS={root}" in line
    assert "predicts it with" not in line, line          # the shell's lookup is not the daemon's
    # The daemon's own environment, where it can be read, is the fact.
    pid_file, pid = fake_daemon(str(root))
    code, out, _ = _harvest(capsys, site, cfg, "--partition", "short", "--dry-run", "--pid-file", pid_file)
    assert code == 0 and "note" not in _line(out, "short"), out
    pid_file, pid = fake_daemon(None)
    code, out, _ = _harvest(capsys, site, cfg, "--partition", "short", "--dry-run", "--pid-file", pid_file)
    line = _line(out, "short")
    assert f"note: perf-predictd (pid {pid}, no PERFCAST_PLATFORMS) predicts it with 'dgx-a100'" in line, line
    assert f"not with {overlay}; it uses the refitted one once started with PERFCAST_PLATFORMS={root}" in line


# ---------------------------------------------------------------- 5. a misspelt platform

def test_a_misspelt_platform_in_perfcast_toml_is_an_error_and_the_others_go_on(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    runs = _harvested(runs_dir, root, 1.3, 6)
    append_runs(runs_dir, "h100", runs)
    cfg = _config(tmp_path, records, f'[partitions.gpu]\nplatform = "{root}/gpu/current"\n'
                                     '[partitions.h100]\nplatform = "dgx-h10"\n')
    before = _tree(root)
    code, out, err = _harvest(capsys, site, cfg, "--dry-run")
    assert code == 2 and "Traceback" not in err
    (error,) = [l for l in out.splitlines() if "h100" in l]
    assert error.startswith(f"error: refit of h100: {cfg}: partition h100's platform 'dgx-h10' is neither "
                            f"installed under {root} nor shipped with perfcast (did you mean 'dgx-h100'?)"), error
    assert "dry-run" in _line(out, "gpu")                # the other partition was refitted all the same
    assert "refit of h100" in err and len(err.strip().splitlines()) == 1
    assert _tree(root) == before
    code, out, _ = _harvest(capsys, site, cfg, "--dry-run", "--json")
    r = next(r for r in json.loads(out)["refits"] if r["partition"] == "h100")
    assert code == 2 and r["status"] == "failed" and r["config_error"] is True and "dgx-h100" in r["message"]


# ---------------------------------------------------------------- 6. rollback's words

def test_rollback_names_a_platform_as_a_platform_and_says_every_rollback_alike(site, tmp_path, capsys):
    root, base, records, runs_dir = site
    code, _, err = _run(capsys, "rollback", "dgx-h100", "--root", root)
    assert code == 2 and err.strip() == (f"perf-calibrate: platform dgx-h100 has no installed version under "
                                         f"{root} (it runs as shipped)"), err
    code, _, err = _run(capsys, "rollback", "nosuch", "--root", root)
    assert code == 2 and "partition nosuch has no installed platform" in err
    # A partition's rollback and an overlay's start alike: "<name>: rolled back to ...".
    _harvested(runs_dir, root, 1.3, 6)
    assert _run(capsys, "harvest", "--records", records, "--out", runs_dir, "--since", "1d", "--refit",
                "--root", root)[0] == 0
    code, out, _ = _run(capsys, "rollback", "gpu", "--root", root)
    assert code == 0 and out.startswith(f"gpu: rolled back to {base} (from "), out
    runs = _harvested(runs_dir, root, 1.3, 6)
    append_runs(runs_dir, "short", runs)
    cfg = _config(tmp_path, records, '[partitions.short]\nplatform = "dgx-a100"\n')
    assert _harvest(capsys, site, cfg, "--partition", "short")[0] == 0
    code, out, _ = _run(capsys, "rollback", "dgx-a100", "--root", root)
    assert code == 0 and out.startswith("dgx-a100: rolled back to the shipped platform"), out
    code, out, _ = _run(capsys, "rollback", "dgx-a100", "--root", root)
    assert code == 0 and out.startswith("dgx-a100: rolled back to "), out


# ---------------------------------------------------------------- 7. the dev cluster's daemon

def _daemon_start(tmp_path: Path, extra_env: dict) -> str:
    """Run up.sh's own lines that start perf-predictd, with `setsid` a stand-in that writes the
    environment the daemon would get: what PERFCAST_PLATFORMS it runs with."""
    text = (REPO / "packaging" / "dev-cluster" / "up.sh").read_text()
    lines = text.splitlines()
    first = next(i for i, l in enumerate(lines) if l.lstrip().startswith('"${CLEAN_ENV[@]}" PYTHONPATH='))
    last = next(i for i in range(first, len(lines)) if lines[i].rstrip().endswith("2>&1 &"))
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "log").mkdir(exist_ok=True)
    (bin_dir / "setsid").write_text(f'#!/bin/sh\n/usr/bin/env > "{tmp_path}/daemon.env"\n')
    (bin_dir / "setsid").chmod(0o755)
    script = "\n".join(["set -euo pipefail", f'CLEAN_ENV=(env -i PATH="{bin_dir}")',
                        f'REPO="{REPO}" BASE="{tmp_path}" CONF=/dev/null PY=/bin/true'] + lines[first:last + 1]
                       + ["wait"])
    env = {"PATH": os.environ["PATH"], **extra_env}
    subprocess.run(["bash", "-c", script], check=True, env=env, cwd=tmp_path, timeout=30)
    return (tmp_path / "daemon.env").read_text()


def test_the_dev_cluster_gives_its_daemon_a_platforms_root_when_asked(tmp_path):
    got = _daemon_start(tmp_path, {"PERFCAST_DEV_PLATFORMS": "/tmp/devr/platforms"})
    assert "PERFCAST_PLATFORMS=/tmp/devr/platforms\n" in got, got
    got = _daemon_start(tmp_path, {})                     # unset: as before, none at all
    assert "PERFCAST_PLATFORMS" not in got and f"PYTHONPATH={REPO}\n" in got, got
    header = (REPO / "packaging" / "dev-cluster" / "up.sh").read_text().split("set -euo pipefail")[0]
    assert re.search(r"PERFCAST_DEV_PLATFORMS=DIR", header)
