"""perf-calibrate harvest / report with a partition the site does not have, and what a refit says.

A misspelt partition is one line and exit code 2 naming the partitions perfcast.toml manages (with a
did-you-mean), not an empty harvest or report with exit code 0; a partition perfcast.toml no longer
manages but that has records or a runs file is harvested with a warning.  A refit's dry run says
"nothing written" once, and notes only what is true about the platform perf-predictd would use.

No Slurm: sacct is a fake command on PATH answering no jobs (as test_refit.py); the refits run on
the shipped dgx-a100 installed under a temporary root.
"""
from __future__ import annotations


import pytest

from calibrate import install as install_mod
from calibrate.cli import main
from calibrate.harvest import HarvestError, check_partition, rollback_hint
from slurm_plugin.records import PredictionRecord, RecordStore
from slurm_plugin.siteconfig import parse_site_config

from .test_refit import _harvested, site  # noqa: F401  (the fixture: a root with gpu installed)

JOB = {"model": {"layers": 8, "hidden": 4096, "heads": 32, "seq_len": 2048},
       "layout": {"pp": 2, "tp": 4, "dp": 2, "micro_batch": 2, "micro_batches": 8}, "run": {"precision": "fp16"}}


@pytest.fixture(autouse=True)
def _no_real_daemon(monkeypatch, tmp_path):
    """Never reload a perf-predictd that happens to run on this machine (as test_refit.py)."""
    monkeypatch.delenv("PERFCAST_DAEMON_PIDFILE", raising=False)
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    monkeypatch.delenv("PERFCAST_PLATFORMS", raising=False)
    monkeypatch.setattr(install_mod, "DEFAULT_PIDFILE", tmp_path / "no-daemon.pid")
    monkeypatch.setattr(install_mod, "_systemd_active", lambda: False)


def _config(tmp_path, records, body='[partitions.gpu]\nplatform = "dgx-a100"\n'
                                    '[partitions.h100]\nplatform = "dgx-h100"\n'):
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text(f'[daemon]\nrecords = "{records}"\n' + body)
    return cfg


def _record(store: RecordStore, partition: str) -> None:
    store.add(PredictionRecord(partition=partition, platform="dgx-a100", bundle="b", job=JOB,
                               iteration_seconds=1.0, iterations=100, total_seconds=100.0,
                               interval_seconds=(90.0, 120.0), time_limit_minutes=5, time_min_minutes=2,
                               action="set", policy="fill", user="alice"))


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- a partition perfcast does not manage

def test_harvest_of_a_misspelt_partition_is_one_line_naming_the_configured_ones(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    cfg = _config(tmp_path, records)
    for extra in ([], ["--refit", "--root", str(root)]):
        code, out, err = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir),
                              "--partition", "h10", "--since", "5m", *extra)
        assert code == 2 and out == "", (out, err)
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "h10" in err and "gpu, h100" in err and "did you mean h100?" in err, err
    # Far from every configured name: no guess, still the list.
    code, _, err = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--partition", "zzz")
    assert code == 2 and "gpu, h100" in err and "did you mean" not in err
    # A configured partition without any job yet is not an error.
    code, out, err = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--partition", "h100",
                          "--since", "5m")
    assert code == 0 and "harvested 0 finished perfcast jobs" in out and err == ""


def test_a_partition_no_longer_configured_but_with_records_is_harvested_with_a_warning(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    _record(RecordStore(records), "old")
    cfg = _config(tmp_path, records)
    code, out, err = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--partition", "old")
    assert code == 0 and "harvested 0 finished perfcast jobs" in out
    assert err.startswith("perf-calibrate: warning: ") and err.count("\n") == 1
    assert "does not manage partition old" in err and "gpu, h100" in err


def test_defaults_platform_manages_every_partition_so_an_unknown_one_is_only_warned(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    cfg = _config(tmp_path, records, '[defaults]\nplatform = "dgx-a100"\n[partitions.h100]\nplatform = "dgx-h100"\n')
    code, out, err = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--partition", "h10")
    assert code == 0 and "harvested 0" in out
    assert "warning" in err and "no perfcast record" in err and "did you mean h100?" in err


def test_check_partition_without_a_site_config(tmp_path):
    store = RecordStore(tmp_path / "r.sqlite")
    _record(store, "gpu")
    assert check_partition("gpu", None, store=store) == ""
    assert "no site config" in check_partition("gpx", None, store=store)
    with pytest.raises(HarvestError, match="bad partition name"):
        check_partition("a b", None, store=store)
    cfg = parse_site_config({"partitions": {"gpu": {"platform": "dgx-a100"}}}, "/etc/perfcast/perfcast.toml")
    with pytest.raises(HarvestError, match=r"partition gpx: .*/etc/perfcast/perfcast.toml.*did you mean gpu\?"):
        check_partition("gpx", cfg, store=store, what="partition")


def test_report_of_a_misspelt_partition_or_verb_is_one_line(tmp_path, capsys):
    store = RecordStore(tmp_path / "r.sqlite")
    _record(store, "gpu")
    cfg = _config(tmp_path, store.path)
    code, out, err = _run(capsys, "report", "wacth", "--since", "1h", "--config", str(cfg))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "wacth" in err and "gpu, h100" in err and "perf-calibrate watch" in err, err
    code, out, err = _run(capsys, "report", "gpx", "--config", str(cfg))
    assert code == 2 and "did you mean gpu?" in err
    # A configured partition (no harvested jobs yet) is a report, as before.
    code, out, err = _run(capsys, "report", "h100", "--config", str(cfg))
    assert code == 0 and err == ""
    # Without a site config the store's records decide: gpu has some.
    code, out, err = _run(capsys, "report", "gpu", "--records", str(store.path))
    assert code == 0 and err == ""


# ---------------------------------------------------------------- what a refit's dry run says

def test_dry_run_of_a_shipped_platform_overlay_adds_no_false_note(site, tmp_path, capsys, monkeypatch):
    """perfcast.toml predicts `short` with the shipped dgx-a100: the refit would install the overlay
    <root>/dgx-a100, which perf-predictd's lookup finds first -- no note, though `current` does not
    exist yet in a dry run; and "nothing written" is said once."""
    root, _, records, runs_dir = site
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(root))      # where the daemon looks (the --root)
    runs = _harvested(runs_dir, root, 1.3, 6)
    from calibrate.harvest import append_runs
    append_runs(runs_dir, "short", runs)
    cfg = _config(tmp_path, records, '[partitions.short]\nplatform = "dgx-a100"\n')
    code, out, err = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--since", "1d",
                          "--refit", "--partition", "short", "--root", str(root), "--dry-run")
    assert code == 0, err
    assert out.count("nothing written") == 1, out
    line = next(l for l in out.splitlines() if l.startswith("refit of short"))
    assert "dry-run" in line and "note" not in line, line
    assert not (root / "dgx-a100").exists()


def test_a_refit_the_daemon_would_not_load_is_noted_with_true_advice(site, tmp_path, capsys, monkeypatch):
    root, _, records, runs_dir = site
    _harvested(runs_dir, root, 1.3, 6)
    # gpu has its own installed platform (<root>/gpu), but perfcast.toml predicts it with dgx-a100.
    cfg = _config(tmp_path, records, '[partitions.gpu]\nplatform = "dgx-a100"\n')
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(root))
    code, out, _ = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--since", "1d",
                        "--refit", "--root", str(root), "--dry-run")
    line = next(l for l in out.splitlines() if l.startswith("refit of gpu"))
    assert "note: perf-predictd predicts it with 'dgx-a100'" in line and 'platform = "gpu"' in line, line
    # A --root this shell does not search: what the daemon uses depends on its own environment,
    # not this shell's, so the note says what it must run with instead of asserting what it uses.
    monkeypatch.delenv("PERFCAST_PLATFORMS")
    monkeypatch.setattr("predictor.platform.SITE_ROOT", tmp_path / "elsewhere")
    code, out, _ = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--since", "1d",
                        "--refit", "--root", str(root), "--dry-run")
    line = next(l for l in out.splitlines() if l.startswith("refit of gpu"))
    assert "note" in line and "predicts it with" not in line, line
    assert f"only if it runs with PERFCAST_PLATFORMS={root} and perfcast.toml says platform = \"gpu\"" in line, line


def test_dry_run_without_refit_says_nothing_written_once(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    code, out, _ = _run(capsys, "harvest", "--records", str(records), "--out", str(runs_dir), "--dry-run")
    assert code == 0 and out.count("(dry run: nothing written)") == 1


# ---------------------------------------------------------------- rollback takes the platform's name

def test_an_installed_overlay_names_its_rollback_and_the_hint_maps_a_partition(site, tmp_path, capsys, monkeypatch):
    root, _, records, runs_dir = site
    monkeypatch.setenv("PERFCAST_PLATFORMS", str(root))
    runs = _harvested(runs_dir, root, 1.3, 6)
    from calibrate.harvest import append_runs
    append_runs(runs_dir, "short", runs)
    cfg = _config(tmp_path, records, '[partitions.short]\nplatform = "dgx-a100"\n')
    code, out, err = _run(capsys, "harvest", "--config", str(cfg), "--out", str(runs_dir), "--since", "1d",
                          "--refit", "--partition", "short", "--root", str(root))
    line = next(l for l in out.splitlines() if l.startswith("refit of short"))
    assert code == 0 and "installed" in line and "perf-calibrate rollback dgx-a100" in line, (line, err)
    # `rollback short` fails (overlays are kept under the platform's name): the hint names dgx-a100.
    code, _, err = _run(capsys, "rollback", "short", "--root", str(root))
    assert code == 2 and "no installed platform" in err
    code, _, err = _run(capsys, "rollback", "short", "--root", str(root), "--config", str(cfg))
    assert code == 2 and "no installed platform" in err and "perf-calibrate rollback dgx-a100" in err
    assert len(err.strip().splitlines()) == 1
    site_cfg = parse_site_config({"partitions": {"short": {"platform": "dgx-a100"}}}, str(cfg))
    hint = rollback_hint("short", site_cfg, root)
    assert "perf-calibrate rollback dgx-a100" in hint and "short" in hint
    assert main(["rollback", "dgx-a100", "--root", str(root)]) == 0
    assert rollback_hint("gpu", site_cfg, root) == ""            # gpu's own directory exists
    assert rollback_hint("nope", site_cfg, root) == ""           # not managed: nothing to suggest


def test_status_says_when_its_root_does_not_exist(tmp_path, capsys):
    """A misspelt --root read like an empty one; a root absent before the first install is normal."""
    code, out, _ = _run(capsys, "status", "--root", str(tmp_path / "nonexist"))
    assert code == 0 and "nonexist (no such directory yet)" in out
    (tmp_path / "empty").mkdir()
    code, out, _ = _run(capsys, "status", "--root", str(tmp_path / "empty"))
    assert code == 0 and "no calibrated partitions" in out and "no such directory" not in out
