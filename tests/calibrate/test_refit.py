"""perf-calibrate harvest --refit: a partition's harvested runs refit its installed platform's
end-to-end terms, installed through the atomic rollout only when leave-one-out improves.

No Slurm: the platform is the shipped dgx-a100 installed under a temporary root; the harvested
runs are that platform's own predictions with a known compute scale applied (as in test_fit.py),
written where the harvest writes them; sacct is a fake command on PATH answering no new jobs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

from calibrate import install as install_mod
from calibrate.cli import main
from calibrate.harvest import AccountingClient, HarvestOptions, append_runs, harvest
from calibrate.install import install_platform, refit_partition, status
from calibrate.validate import load_runs
from predictor import TrainingJob, load_platform
from predictor.estimate import predict_many
from predictor.kinds import kind_of
from predictor.platform import FittedTerms, resolve_platform, write_platform
from predictor.samples import dump_toml
from predictor.validation import MeasuredRun
from slurm_plugin.records import PredictionRecord, RecordStore

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _job(layers=8, hidden=4096, heads=32, seq=2048, pp=1, tp=1, dp=1, mb=2, mbs=8):
    return TrainingJob.from_dict({"model": {"layers": layers, "hidden": hidden, "heads": heads, "seq_len": seq},
                                  "layout": {"pp": pp, "tp": tp, "dp": dp, "micro_batch": mb,
                                             "micro_batches": mbs, "recompute": "full"},
                                  "run": {"precision": "fp16"}})


# Device-bound jobs of a few shapes and layouts (test_fit.py's A100 set, one more).
JOBS = [_job(), _job(hidden=2048, heads=16), _job(tp=2, dp=2), _job(pp=2, tp=4, mbs=16),
        _job(layers=16, hidden=5120, heads=40, tp=4), _job(seq=4096, mb=1, tp=2),
        _job(layers=12, hidden=3072, heads=24, pp=2, tp=2, dp=2, mbs=12)]


@pytest.fixture(autouse=True)
def _no_real_daemon(monkeypatch, tmp_path):
    """Never reload a perf-predictd that happens to run on this machine (as test_install.py)."""
    monkeypatch.delenv("PERFCAST_DAEMON_PIDFILE", raising=False)
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    monkeypatch.setattr(install_mod, "DEFAULT_PIDFILE", tmp_path / "no-daemon.pid")
    monkeypatch.setattr(install_mod, "_systemd_active", lambda: False)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A platforms root with dgx-a100 installed (as a calibration would be) for partition gpu, an
    empty record store, a runs directory and a sacct on PATH that knows no jobs."""
    src = resolve_platform("dgx-a100")
    raw = tomllib.loads((src / "platform.toml").read_text(encoding="utf-8"))
    raw["compute_bundle"] = str((src / raw["compute_bundle"]).resolve())
    raw.pop("validation", None)
    plat_dir = tmp_path / "calibrated"
    write_platform(plat_dir, raw)
    (plat_dir / "calibration.toml").write_text(dump_toml({
        "name": "calibrated", "created": "2026-01-01T00:00:00+00:00", "samples": 500, "complete": True,
        "gpu": "NVIDIA A100-SXM4-80GB", "compute_mape": 0.05}))
    root = tmp_path / "platforms"
    base = install_platform(plat_dir, "gpu", root=root, tag="calibrated")
    records = tmp_path / "records.sqlite"
    RecordStore(records).count()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text('#!/bin/sh\necho \'{"errors": [], "jobs": []}\'\n')
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return root, base.version, records, tmp_path / "runs"


def _harvested(runs_dir: Path, root: Path, scale: float, n: int, *, first: int = 1000) -> list[MeasuredRun]:
    """n harvested runs of partition gpu: the installed platform's predictions x ``scale``."""
    plat = load_platform(root / "gpu" / "current")
    truth = dataclasses.replace(plat, fitted=FittedTerms(compute_scale=scale))
    jobs = JOBS[:n]
    runs = [MeasuredRun(name=f"slurm job {first + i}", job=j, measured_iteration_seconds=p.iteration_seconds,
                        source="perf-calibrate harvest (synthetic)")
            for i, (j, p) in enumerate(zip(jobs, predict_many(jobs, truth)))]
    append_runs(runs_dir, "gpu", runs)
    return runs


def _refit(capsys, site, *extra):
    root, _, records, runs_dir = site
    code = main(["harvest", "--records", str(records), "--out", str(runs_dir), "--since", "1d",
                 "--refit", "--root", str(root), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _tree(root: Path) -> dict:
    """Every file and link under the root with its content or target (what "nothing changed" means)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = "-> " + os.readlink(p)
        elif p.is_file() and p.name != ".lock":
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def test_accepted_refit_installs_a_new_version_and_rollback_restores(site, capsys):
    root, base, records, runs_dir = site
    base_toml = (root / "gpu" / "versions" / base / "platform.toml").read_bytes()
    _harvested(runs_dir, root, 1.3, 6)
    code, out, err = _refit(capsys, site)
    assert code == 0, err
    assert "refit of gpu: installed" in out and "leave-one-out MAPE" in out

    cur = root / "gpu" / "current"
    new = os.path.basename(os.readlink(cur))
    assert new != base and new.endswith("-refit")
    assert os.path.basename(os.readlink(root / "gpu" / "previous")) == base
    plat = load_platform(cur)
    assert plat.fitted.for_kind(kind_of(JOBS[0]).key).scale("compute_scale") == pytest.approx(1.3, rel=0.02)
    assert plat.fitted.loo_mape_after < 0.01 < plat.fitted.loo_mape_before
    assert "harvest --refit" in plat.fitted.source
    assert sorted(r.name for r in plat.validation) == [f"slurm job {1000 + i}" for i in range(6)]
    # The active version was copied, never edited.
    assert (root / "gpu" / "versions" / base / "platform.toml").read_bytes() == base_toml
    assert not [p for p in (root / "gpu" / "versions").iterdir() if p.name.endswith(".tmp")]
    last = (root / "gpu" / "history.log").read_text().splitlines()[-1]
    assert f"installed {new}" in last and f"refit of {base}" in last and "leave-one-out MAPE" in last

    (row,) = status(root)
    assert row.version == new and row.previous == base and row.origin == "refit"
    assert row.refit["base_version"] == base and row.refit["runs"] == 6
    assert row.refit["loo_mape_after"] < row.refit["loo_mape_before"]
    assert main(["status", "--root", str(root)]) == 0
    text = capsys.readouterr().out
    assert new in text and f"refit of {base} on 6 harvested runs" in text
    assert main(["status", "--root", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["origin"] == "refit"

    assert main(["rollback", "gpu", "--root", str(root)]) == 0
    capsys.readouterr()
    assert os.path.basename(os.readlink(cur)) == base
    (row,) = status(root)
    assert row.version == base and row.origin == "calibration" and row.refit is None
    assert load_platform(cur).fitted is None


def test_declined_refit_changes_nothing(site, capsys):
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.0, 6)          # the platform already predicts these exactly
    before = _tree(root)
    code, out, err = _refit(capsys, site, "--json")
    assert code == 0, err
    (r,) = json.loads(out)["refits"]
    assert r["status"] == "declined" and "nothing changed" in r["message"]
    assert r["loo_mape_after"] >= r["loo_mape_before"] and r["version"] is None
    assert _tree(root) == before
    assert status(root)[0].version == base and status(root)[0].origin == "calibration"


def test_too_few_runs_skip_the_refit(site, capsys):
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 3)
    before = _tree(root)
    code, out, _ = _refit(capsys, site)
    assert code == 0
    assert "refit of gpu: skipped: 3 harvested runs, a refit needs at least 5" in out
    assert _tree(root) == before
    # The minimum is the admin's: 3 is enough when they say so (leave-one-out needs 3).
    code, out, _ = _refit(capsys, site, "--refit-min-runs", "3")
    assert code == 0 and "refit of gpu: installed" in out


def test_no_new_runs_no_refit_and_new_runs_replace_the_harvested_ones(site, capsys):
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    assert _refit(capsys, site)[0] == 0
    first = os.readlink(root / "gpu" / "current")
    code, out, _ = _refit(capsys, site)
    assert code == 0 and "no runs harvested since" in out
    assert os.readlink(root / "gpu" / "current") == first
    # One more job, slower still: refitted on the 7, each harvested run recorded once.
    _harvested(runs_dir, root, 1.45, 7, first=1000)
    code, out, _ = _refit(capsys, site)
    assert code == 0 and "refit of gpu: installed" in out
    plat = load_platform(root / "gpu" / "current")
    names = [r.name for r in plat.validation]
    assert sorted(names) == [f"slurm job {1000 + i}" for i in range(7)]
    assert plat.fitted.for_kind(kind_of(JOBS[0]).key).scale("compute_scale") > 1.3
    assert status(root)[0].refit["base_version"] == os.path.basename(first)


def test_dry_run_fits_but_writes_nothing(site, capsys):
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    before = _tree(root)
    code, out, _ = _refit(capsys, site, "--dry-run")
    assert code == 0 and "refit of gpu: dry-run" in out and "would install" in out
    assert _tree(root) == before


def test_a_partition_on_a_shipped_platform_gets_a_site_overlay_and_rollback_restores_it(
        site, capsys, tmp_path, monkeypatch):
    root, base, records, runs_dir = site
    runs = _harvested(runs_dir, root, 1.3, 6)
    append_runs(runs_dir, "short", runs)
    append_runs(runs_dir, "other", runs)
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text(f'[daemon]\nrecords = "{records}"\n[partitions.gpu]\nplatform = "{root}/gpu/current"\n'
                   '[partitions.short]\nplatform = "dgx-a100"\n[partitions.other]\nplatform = "no-such"\n')
    shipped_toml = (resolve_platform("dgx-a100") / "platform.toml").read_bytes()
    before = [p.iteration_seconds for p in predict_many(JOBS, load_platform("dgx-a100"))]
    code, out, _ = _refit(capsys, site, "--config", str(cfg))
    # `other` names a platform that exists nowhere: a configuration error (exit 2), the others refitted.
    assert code == 2
    assert any(l.startswith("error: refit of other: ") and "'no-such' is neither installed" in l
               for l in out.splitlines()), out
    lines = {l.split(":")[0]: l for l in out.splitlines() if l.startswith("refit of")}
    assert "installed" in lines["refit of gpu"] and "note" not in lines["refit of gpu"]
    # The shipped platform the site config names gets an overlay where the daemon looks it up.
    short = lines["refit of short"]
    assert "installed" in short and f"under {root / 'dgx-a100'}" in short, short
    assert not (root / "short").exists() and not (root / "other").exists()
    assert (resolve_platform("dgx-a100") / "platform.toml").read_bytes() == shipped_toml   # untouched
    overlay = root / "dgx-a100" / "current"
    raw = tomllib.loads((overlay / "platform.toml").read_text())
    assert raw["overlay_of"] == "dgx-a100" and "compute_bundle" not in raw and raw["fitted_kind"]
    (st,) = [s for s in status(root) if s.partition == "dgx-a100"]
    assert st.base == "shipped dgx-a100" and st.origin == "refit" and st.previous == "shipped dgx-a100"
    assert not (root / "dgx-a100" / "previous").exists()       # no link: rollback's shipped platform
    # Looked up by name (the daemon's way), the overlay answers; the harvested kind moves to the truth.
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(root))
    plat = load_platform("dgx-a100", reload=True)
    assert plat.path == overlay.resolve() and plat.fitted.kinds
    after = [p.iteration_seconds for p in predict_many(JOBS, plat)]
    assert all(a == pytest.approx(1.3 * b, rel=0.03) for a, b in zip(after, before))
    # Rolled back: the shipped platform itself again, bit for bit; rolled back again: the overlay.
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    assert "rolled back to the shipped platform" in capsys.readouterr().out
    assert not (root / "dgx-a100" / "current").exists()
    assert [p.iteration_seconds for p in predict_many(JOBS, load_platform("dgx-a100", reload=True))] == before
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    assert load_platform("dgx-a100", reload=True).path == overlay.resolve()
    history = (root / "dgx-a100" / "history.log").read_text()
    assert "to the shipped platform dgx-a100" in history and history.count("rolled back") == 2


def test_failed_reload_exits_non_zero_and_the_refit_stays(site, capsys, tmp_path):
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    code, out, err = _refit(capsys, site, "--pid-file", str(tmp_path / "missing.pid"))
    assert code == 1
    assert "refit of gpu" in err and "not reloaded" in err and "missing.pid" in err
    assert status(root)[0].origin == "refit"


def test_a_broken_runs_file_is_named_and_other_partitions_go_on(site, capsys):
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    (runs_dir / "short.toml").write_text("[[run]]\nname = 3\n")
    code, out, err = _refit(capsys, site)
    assert code == 1 and "Traceback" not in err
    assert "refit of short" in err and str(runs_dir / "short.toml") in err
    assert "refit of gpu: installed" in out


@pytest.mark.parametrize("argv, needle", [
    (["--refit", "--refit-min-runs", "2"], "at least 3"),
    (["--refit-min-runs", "5"], "go with --refit"),
    (["--root", "/tmp"], "go with --refit"),
])
def test_bad_refit_options_are_one_line(site, capsys, argv, needle):
    root, base, records, runs_dir = site
    assert main(["harvest", "--records", str(records), "--out", str(runs_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_runs_harvested_in_the_same_dry_run_count_towards_the_refit(site, tmp_path):
    """A dry run writes no runs file; its refit sees the runs as the harvest would have left them."""
    from .test_harvest import FakeSlurm, megatron_log, sacct_doc, sacct_job
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 5)
    store = RecordStore(records)
    job = JOBS[6]
    rid = store.add(PredictionRecord(
        partition="gpu", platform="dgx-a100", bundle="a100@1", job=job.to_dict(), iteration_seconds=1.0,
        iterations=200, total_seconds=300.0, interval_seconds=(0.9, 1.5), time_limit_minutes=30,
        time_min_minutes=15, recommended_minutes=30, action="set", policy="fill", std_out="t-%j.out",
        work_dir=str(tmp_path), job_name="t", uid=os.geteuid(), gid=os.getegid(), user=""))
    (tmp_path / "t-501.out").write_text(megatron_log(40, 900.0))
    doc = sacct_doc(sacct_job(501, "COMPLETED", f"perfcast:v1 iter_s=1 rec={rid}", user="", elapsed=100,
                              work_dir=str(tmp_path)))
    before = (runs_dir / "gpu.toml").read_bytes()
    res = harvest(HarvestOptions(records=records, out_dir=runs_dir, since=1.0, dry_run=True, refit=True,
                                 platforms_root=root), AccountingClient(runner=FakeSlurm(sacct_json=doc)))
    assert [o.slurm_job_id for o in res.outcomes] == [501]
    (r,) = res.refits
    assert r.runs == 6 and r.status in ("dry-run", "declined"), r
    assert (runs_dir / "gpu.toml").read_bytes() == before and len(load_runs(runs_dir / "gpu.toml")) == 5


def test_refit_partition_refuses_a_minimum_below_leave_one_out(site):
    root, *_ = site
    with pytest.raises(Exception, match="at least 3"):
        refit_partition("gpu", [], root=root, min_runs=2)


def test_an_install_holding_the_partition_lock_fails_the_refit_cleanly(site, capsys):
    import fcntl
    root, base, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    before = _tree(root)
    fd = os.open(root / "gpu" / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, out, err = _refit(capsys, site)
    finally:
        os.close(fd)
    assert code == 1 and "another install or rollback" in err and "Traceback" not in err
    assert _tree(root) == before
