"""What a QA tester acting as an admin found in `harvest --refit`, `status` and the harvest's notes
(QA admin 2, 4-7):

2. a partition whose perfcast.toml platform is a path into the platforms root (what `status`
   shows: `<root>/<name>/current`, or a version under it) joins the refit of that platform; a path
   outside the root is said as such, not "no platform installed for it";
4. a job harvested from sacct whose record names no --error file, with no iteration times in its
   stdout: the note says its stderr was not read, and why;
5. counts are written as everywhere else in perfcast: `1 run`, not `1 runs`;
6. `status --json` names each entry's platform (`platform`) beside `partition`;
7. a refit that changes the interval a kind with no runs gets says so, in its line and in status.

No Slurm: the `site` fixture of test_refit.py (dgx-a100 installed for partition gpu under a
temporary root, a sacct answering no jobs); harvested runs are the platform's predictions x 1.3.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from calibrate.harvest import AccountingClient, HarvestOptions, append_runs, harvest
from predictor import TrainingJob, load_platform
from predictor.estimate import predict_many
from predictor.interval import IntervalRule
from predictor.kinds import kind_of
from predictor.platform import FittedTerms
from predictor.validation import MeasuredRun
from slurm_plugin.records import PredictionRecord

from .test_harvest import JOB, T0, FakeSlurm, _own, cluster, sacct_doc, sacct_job, user_dir  # noqa: F401
from .test_refit import JOBS, _no_real_daemon, site  # noqa: F401  (the fixtures)
from .test_refit_qa import _config, _harvest, _line, _no_shell_platforms, _run  # noqa: F401
from .test_refit_shared import _refit_toml, _versions

# A job of another kind (bf16, no recompute) than JOBS' (fp16, full recompute): a kind of one run.
ODD = TrainingJob.from_dict({"model": {"layers": 8, "hidden": 4096, "heads": 32, "seq_len": 2048},
                             "layout": {"micro_batch": 2, "micro_batches": 8, "recompute": "none", "tp": 2},
                             "run": {"precision": "bf16"}})


def _runs(root: Path, runs_dir: Path, partition: str, jobs, first: int) -> None:
    """Runs of ``partition``: partition gpu's installed platform's predictions x 1.3."""
    truth = dataclasses.replace(load_platform(root / "gpu" / "current"), fitted=FittedTerms(compute_scale=1.3))
    append_runs(runs_dir, partition, [
        MeasuredRun(name=f"slurm job {first + i}", job=j, measured_iteration_seconds=p.iteration_seconds,
                    source="perf-calibrate harvest (synthetic)")
        for i, (j, p) in enumerate(zip(jobs, predict_many(jobs, truth)))])


# ---------------------------------------------------------------- 2. a platform given as a path

def test_a_path_into_the_platforms_root_joins_that_platforms_refit(site, tmp_path, capsys):
    root, base, records, runs_dir = site
    _runs(root, runs_dir, "gpu", JOBS[:4], 1000)
    _runs(root, runs_dir, "gpu-long", JOBS[3:6], 2000)
    _runs(root, runs_dir, "gpu-pinned", JOBS[4:7], 3000)
    pinned = root / "gpu" / "versions" / base
    cfg = _config(tmp_path, records, '[partitions.gpu]\nplatform = "gpu"\n'
                                     f'[partitions.gpu-long]\nplatform = "{root / "gpu" / "current"}"\n'
                                     f'[partitions.gpu-pinned]\nplatform = "{pinned}"\n')
    code, out, err = _harvest(capsys, site, cfg)
    assert code == 0, (out, err)
    lead = _line(out, "gpu")
    assert "installed" in lead and "shared with gpu-long, gpu-pinned" in lead, out
    assert "10 harvested: gpu 4, gpu-long 3, gpu-pinned 3" in lead, lead
    for p in ("gpu-long", "gpu-pinned"):
        assert "reported under gpu" in _line(out, p) and "no platform installed" not in _line(out, p), out
    assert _refit_toml(root / "gpu" / "current")["partitions"] == ["gpu", "gpu-long", "gpu-pinned"]
    assert len(_versions(root / "gpu")) == 2
    # The daemon follows the path to the current version: nothing to note.  A version's path stays on
    # that version: said, with the name that reaches the refit.
    assert "note:" not in _line(out, "gpu-long"), out
    assert f"note: perf-predictd predicts it with '{pinned}' ({pinned}), not with {root / 'gpu' / 'current'}" \
        in _line(out, "gpu-pinned"), out


def test_a_path_outside_the_platforms_root_is_said_as_such(site, tmp_path, capsys):
    root, _, records, runs_dir = site
    _runs(root, runs_dir, "ext", JOBS[:5], 1000)
    own = tmp_path / "calibrated"                  # the fixture's platform before it was installed
    assert (own / "platform.toml").is_file()
    cfg = _config(tmp_path, records, f'[partitions.ext]\nplatform = "{own}"\n')
    code, out, err = _harvest(capsys, site, cfg)
    line = _line(out, "ext")
    assert code == 0 and "no platform installed for it" not in line, (out, err)
    assert (f"perfcast.toml predicts partition ext with the path {own}, which is not under the platforms "
            f"root {root}: a refit installs new versions of a platform kept there") in line, line
    assert not (root / "ext").exists()


# ---------------------------------------------------------------- 5, 6, 7: the line, history.log, status

def _refit_gpu_and_a100(site, tmp_path, capsys) -> str:
    """Partition gpu (its installed platform; JOBS and one run of another kind) and a100 (a site
    overlay of dgx-a100) refitted; gpu's line."""
    root, base, records, runs_dir = site
    _runs(root, runs_dir, "gpu", JOBS[:6] + [ODD], 1000)
    _runs(root, runs_dir, "a100", JOBS[:6], 2000)
    cfg = _config(tmp_path, records, '[partitions.gpu]\nplatform = "gpu"\n'
                                     '[partitions.a100]\nplatform = "dgx-a100"\n')
    code, out, err = _harvest(capsys, site, cfg)
    line = _line(out, "gpu")
    assert code == 0 and "installed" in line and "installed" in _line(out, "a100"), (out, err)
    return line


def test_a_kind_of_one_run_is_1_run(site, tmp_path, capsys):
    root = site[0]
    line = _refit_gpu_and_a100(site, tmp_path, capsys)
    odd = kind_of(ODD).key
    assert f"kind {odd} (1 run, MAPE " in line and "1 runs" not in line, line
    history = (root / "gpu" / "history.log").read_text()
    assert f"kind {odd} (1 run, MAPE " in history and "1 runs" not in history, history
    code, text, _ = _run(capsys, "status", "--root", root)
    assert code == 0 and f"kind {odd} (1 run): " in text and "1 runs" not in text, text


def test_status_json_names_the_platform(site, tmp_path, capsys):
    root = site[0]
    _refit_gpu_and_a100(site, tmp_path, capsys)
    code, js, _ = _run(capsys, "status", "--root", root, "--json")
    rows = {r["partition"]: r for r in json.loads(js)}
    # the directory's name stays `partition`: a partition's (install --partition gpu), or a platform's
    # (the overlay); `platform` is the platform's own name
    assert rows["gpu"]["platform"] == load_platform(root / "gpu" / "current").name == "dgx-a100"
    assert rows["dgx-a100"]["platform"] == "dgx-a100" and rows["dgx-a100"]["base"] == "shipped dgx-a100"


def test_a_refit_says_how_the_interval_of_a_kind_with_no_runs_moved(site, tmp_path, capsys):
    """Before: the installed platform's own rule (no runs recorded); after: the runs' rule, widened to
    the spread across kinds.  Said in the line, history.log and status, at two decimals."""
    root, base = site[0], site[1]
    line = _refit_gpu_and_a100(site, tmp_path, capsys)
    before = IntervalRule.for_platform(load_platform(root / "gpu" / "versions" / base)).factors[1]
    after = IntervalRule.for_platform(load_platform(root / "gpu" / "current")).factors[1]
    assert f"{before:.2f}" != f"{after:.2f}", (before, after)
    said = f"unseen kinds' interval upper end ×{before:.2f} -> ×{after:.2f}"
    assert said in line and said in (root / "gpu" / "history.log").read_text(), line
    assert _refit_toml(root / "gpu" / "current")["unseen_kind_upper"] == [round(before, 4), round(after, 4)]
    code, text, _ = _run(capsys, "status", "--root", root)
    assert code == 0 and said in text, text


# ---------------------------------------------------------------- 4. a record without --error

def test_a_record_without_error_says_stderr_was_not_read(tmp_path, cluster):
    """A record kept in a schema-1 store (no std_err) of a job that had `#SBATCH --error` apart, its
    iteration lines in that file; harvested from sacct (no StdErr): nothing says where to look."""
    store, ids, doc, d, uid, gid, name = cluster
    kw = dict(partition="gpu", platform="dgx-a100", bundle="a100@1", job=JOB, iteration_seconds=2.0,
              iterations=200, total_seconds=400.0, time_limit_minutes=30, action="set", policy="fill",
              std_out="train-%j.out", work_dir=str(d), uid=uid, gid=gid, user=name)
    old, new = store.add(PredictionRecord(**kw)), store.add(PredictionRecord(**kw, std_err="train-%j.err"))
    for job_id in (121, 122):
        (d / f"train-{job_id}.out").write_text("> building GPT model ...\n")
        _own(d / f"train-{job_id}.out", uid, gid)
    jobs = [sacct_job(121, "COMPLETED", f"perfcast:v1 iter_s=2 rec={old}", user=name, work_dir=str(d)),
            sacct_job(122, "COMPLETED", f"perfcast:v1 iter_s=2 rec={new}", user=name, work_dir=str(d))]
    res = harvest(HarvestOptions(records=store.path, out_dir=tmp_path / "runs", since=T0 - 3600),
                  AccountingClient(runner=FakeSlurm(sacct_json=sacct_doc(*jobs))))
    notes = {o.slurm_job_id: o.note for o in res.outcomes}
    assert notes[121].startswith("no iteration times in its log (Megatron, GPT-NeoX, NeMo, DeepSpeed formats); "
                                 "stderr not read: the record names no --error file (if the job had one, it "
                                 "was submitted through an older job_submit.lua or kept before the store's "
                                 "upgrade"), notes[121]
    # A record that names its --error: that file was read (here: missing), nothing to add.
    assert "stderr not read" not in notes[122] and "train-122.err" in notes[122], notes[122]
