"""`harvest --refit` of partitions that share one platform directory (`gpu` and `gpu-long` both on
`dgx-a100`, or `gpu-long` on partition `gpu`'s installed platform): one fit on all their runs, one
version, `refit.toml` keeping each partition's runs; "nothing new" and a rollback judged on all.

Refitted one by one, the second partition's fit (on its runs only) replaced the first's, and the
next harvest refitted the first again: neither partition's jobs were learnt from properly.

No Slurm: the `site` fixture of test_refit.py (a root with dgx-a100 installed for partition gpu, a
sacct answering no jobs); the harvested runs are the platform's predictions with a known factor.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from calibrate.harvest import HarvestOptions, append_runs, refit_partitions
from calibrate.install import _pooled_runs, status
from predictor import load_platform
from predictor.estimate import predict_many
from predictor.platform import FittedTerms
from predictor.validation import MeasuredRun

from .test_refit import JOBS, _no_real_daemon, _tree, site  # noqa: F401  (the fixtures)
from .test_refit_qa import _config, _harvest, _line, _no_shell_platforms, _run  # noqa: F401

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TWO = '[partitions.a100]\nplatform = "dgx-a100"\n[partitions.a100-long]\nplatform = "dgx-a100"\n'


def _runs(runs_dir: Path, partition: str, jobs, first: int, scale: float = 1.3) -> list[MeasuredRun]:
    """Runs of ``partition`` named ``slurm job <first + i>``: dgx-a100's predictions x ``scale``."""
    truth = dataclasses.replace(load_platform("dgx-a100"), fitted=FittedTerms(compute_scale=scale))
    runs = [MeasuredRun(name=f"slurm job {first + i}", job=j, measured_iteration_seconds=p.iteration_seconds,
                        source="perf-calibrate harvest (synthetic)")
            for i, (j, p) in enumerate(zip(jobs, predict_many(jobs, truth)))]
    append_runs(runs_dir, partition, runs)
    return runs


def _refit_toml(link: Path) -> dict:
    return tomllib.loads((link / "refit.toml").read_text())


def _versions(d: Path) -> list[str]:
    return sorted(p.name for p in (d / "versions").iterdir() if not p.name.startswith("."))


def test_two_partitions_on_one_shipped_platform_are_refitted_together(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    _runs(runs_dir, "a100", JOBS[:5], 1000)
    _runs(runs_dir, "a100-long", JOBS[2:7], 2000)
    shipped = len(load_platform("dgx-a100").validation)
    cfg = _config(tmp_path, records, TWO)
    code, out, err = _harvest(capsys, site, cfg, "--json")
    assert code == 0, (out, err)
    refits = {r["partition"]: r for r in json.loads(out)["refits"]}
    a, b = refits["a100"], refits["a100-long"]
    # One version, reported for both: the same outcome, each naming the other.
    assert a["status"] == b["status"] == "installed" and a["version"] == b["version"], (a, b)
    assert a["shared_with"] == ["a100-long"] and b["shared_with"] == ["a100"]
    assert a["runs"] == 10 and a["fit_runs"] == shipped + 10
    assert "shared with a100-long" in a["message"] and "10 harvested: a100 5, a100-long 5" in a["message"]
    assert b["message"].startswith("platform dgx-a100, shared with a100 (one refit on the runs of both, "
                                   f"reported under a100): installed {a['version']}"), b["message"]
    assert "`perf-calibrate rollback dgx-a100` undoes it" in b["message"]
    overlay = root / "dgx-a100"
    assert _versions(overlay) == [a["version"]]
    assert len([l for l in (overlay / "history.log").read_text().splitlines() if " installed " in l]) == 1
    refit = _refit_toml(overlay / "current")
    assert refit["partitions"] == ["a100", "a100-long"] and "partition" not in refit
    assert refit["partition_runs"] == {"a100": 5, "a100-long": 5} and refit["runs"] == 10
    assert refit["harvested_runs_by_partition"] == {
        "a100": [f"slurm job {1000 + i}" for i in range(5)],
        "a100-long": [f"slurm job {2000 + i}" for i in range(5)]}
    plat = load_platform(overlay / "current")
    assert sorted(n for n in plat.fitted.runs if n.startswith("slurm job")) == sorted(
        [f"slurm job {1000 + i}" for i in range(5)] + [f"slurm job {2000 + i}" for i in range(5)])
    assert "partitions a100, a100-long" in plat.fitted.source
    # status names both partitions' runs; the run names themselves stay out of its JSON.
    code, out, _ = _run(capsys, "status", "--root", root)
    assert code == 0 and "10 harvested runs of partitions a100 (5), a100-long (5)" in out, out
    (st,) = [s for s in status(root) if s.partition == "dgx-a100"]
    assert "harvested_runs_by_partition" not in st.refit and "harvested_runs" not in st.refit

    # Nothing new in either partition: neither refits (one by one, each replaced the other's fit).
    before = _tree(root)
    code, out, err = _harvest(capsys, site, cfg)
    assert code == 0, err
    for part in ("a100", "a100-long"):
        assert "skipped" in _line(out, part), out
    assert "no runs harvested since" in _line(out, "a100")
    assert _tree(root) == before

    # One new job in one partition: one refit again, on both partitions' runs.  (The jobs run
    # slower since, measured again under the same names: something to learn; names decide what
    # is new, so only a100-long's new job makes this refit.)
    _runs(runs_dir, "a100", JOBS[:5], 1000, scale=1.45)
    _runs(runs_dir, "a100-long", JOBS[2:7] + JOBS[:1], 2000, scale=1.45)
    code, out, err = _harvest(capsys, site, cfg)
    assert code == 0 and "installed" in _line(out, "a100") and "installed" in _line(out, "a100-long"), out
    assert len(_versions(overlay)) == 2
    refit = _refit_toml(overlay / "current")
    assert refit["partition_runs"] == {"a100": 5, "a100-long": 6} and refit["runs"] == 11
    assert refit["base_version"] == a["version"]
    assert refit["harvested_runs_by_partition"]["a100-long"][-1] == "slurm job 2005"


def test_a_partition_on_another_partitions_installed_platform_and_partition_option(site, tmp_path, capsys):
    """`gpu-long` predicted with partition gpu's installed platform: `--partition gpu-long` refits
    gpu's platform with both partitions' runs on disk, and a rollback stands for both."""
    root, base, records, runs_dir = site
    _runs(runs_dir, "gpu", JOBS[:5], 1000)
    _runs(runs_dir, "gpu-long", JOBS[2:7], 2000)
    cfg = _config(tmp_path, records, '[partitions.gpu]\nplatform = "gpu"\n'
                                     '[partitions.gpu-long]\nplatform = "gpu"\n')
    code, out, err = _harvest(capsys, site, cfg, "--partition", "gpu-long")
    assert code == 0, (out, err)
    lead, other = _line(out, "gpu-long"), _line(out, "gpu")
    assert "installed" in lead and "shared with gpu" in lead and "a refit needs" not in lead, out
    assert out.index("refit of gpu-long:") < out.index("refit of gpu:")       # the one asked for first
    assert "reported under gpu-long" in other
    assert not (root / "gpu-long").exists() and len(_versions(root / "gpu")) == 2
    refit = _refit_toml(root / "gpu" / "current")
    assert refit["partitions"] == ["gpu-long", "gpu"] and refit["base_version"] == base
    assert refit["partition_runs"] == {"gpu-long": 5, "gpu": 5}

    # Rolled back: no runs since, so neither partition undoes the admin's rollback.
    assert _run(capsys, "rollback", "gpu", "--root", root)[0] == 0
    before = _tree(root)
    code, out, _ = _harvest(capsys, site, cfg)
    assert code == 0 and "was rolled back on" in _line(out, "gpu"), out
    assert "skipped" in _line(out, "gpu-long") and _tree(root) == before
    # A new job of gpu alone: refitted again, on both partitions' runs (measured slower since:
    # something to learn).
    _runs(runs_dir, "gpu", JOBS[:6], 1000, scale=1.45)
    _runs(runs_dir, "gpu-long", JOBS[2:7], 2000, scale=1.45)
    code, out, _ = _harvest(capsys, site, cfg)
    assert code == 0 and "installed" in _line(out, "gpu"), out
    assert _refit_toml(root / "gpu" / "current")["partition_runs"] == {"gpu": 6, "gpu-long": 5}


def test_a_shared_platform_is_not_refitted_without_a_partition_whose_runs_file_is_broken(site, tmp_path):
    root, _, records, runs_dir = site
    _runs(runs_dir, "a100", JOBS[:6], 1000)
    (runs_dir / "a100-long.toml").write_text("[[run]]\nname = 3\n")
    cfg = tmp_path / "perfcast.toml"
    opts = HarvestOptions(records=records, out_dir=runs_dir, refit=True, platforms_root=root,
                          site_platform=lambda p: "dgx-a100" if p.startswith("a100") else None,
                          site_path=str(cfg))
    before = _tree(root)
    res = {r.partition: r for r in refit_partitions(opts)}
    assert res["a100-long"].status == "failed" and str(runs_dir / "a100-long.toml") in res["a100-long"].message
    assert res["a100"].status == "skipped" and "shared with a100-long" in res["a100"].message
    assert _tree(root) == before and not (root / "dgx-a100").exists()


def test_pooled_run_names_stay_apart_between_partitions():
    """Slurm job ids are unique in a cluster, but count again after slurmctld lost its state: two
    partitions' `slurm job 7` are then two jobs, and neither may replace the other in the fit."""
    a = MeasuredRun("slurm job 7", JOBS[0], 1.0)
    b = MeasuredRun("slurm job 7", JOBS[1], 2.0)
    c = MeasuredRun("slurm job 3", JOBS[2], 3.0)
    pooled = _pooled_runs({"gpu": [a], "gpu-long": [b, c]})
    assert [r.name for r in pooled] == ["slurm job 3", "slurm job 7 (gpu)", "slurm job 7 (gpu-long)"]
    assert [r.measured_iteration_seconds for r in pooled] == [3.0, 1.0, 2.0]
    # The same run in both files (one job moved to the other partition) counts once.
    assert [r.name for r in _pooled_runs({"gpu": [a], "gpu-long": [a]})] == ["slurm job 7"]
    # One partition: its runs as given.
    assert _pooled_runs({"gpu": [b, c]}) == [b, c]
