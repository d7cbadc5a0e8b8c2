"""The harvest loop on a real Slurm: a job submitted without --time gets a limit and a time-min,
runs to the end, and harvest + report show what was predicted next to what its log measured --
once from slurmctld (scontrol, no accounting needed) and once from slurmdbd (sacct, which
``--source auto`` must pick where accounting answers)."""
from __future__ import annotations

import json
import os

from calibrate.cli import main as calibrate_main
from slurm_plugin.slurm_client import parse_slurm_time

# A stand-in for Megatron's pretrain_gpt.py: prints Megatron's log lines, 150 ms per iteration,
# and stops after $STANDIN_ITERS of them (the job is predicted for all --train-iters: long enough
# for a limit well above the point prediction, so that a --time-min is set).
STAND_IN = '''import os, sys, time
iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
for i in range(1, min(iters, int(os.environ.get("STANDIN_ITERS", iters))) + 1):
    print(f" iteration {i:8d}/{iters:8d} | consumed samples: {8 * i:10d} | "
          f"elapsed time per iteration (ms): {150.0 if i > 2 else 900.0:.1f} | learning rate: 1.000E-04 |",
          flush=True)
    time.sleep(0.1)     # the job lasts a couple of seconds: an elapsed time Slurm can count
'''

SCRIPT = """#!/bin/bash
#SBATCH --job-name=e2e-megatron
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:8
#SBATCH --output={out}
export STANDIN_ITERS=20
srun python3 pretrain_gpt.py \\
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 \\
    --num-layers 2 --hidden-size 256 --num-attention-heads 4 \\
    --seq-length 512 --max-position-embeddings 512 \\
    --micro-batch-size 1 --global-batch-size 8 --train-iters 200000 --bf16 --vocab-size 50257
"""


def _run_to_the_end(cluster, name: str) -> tuple[int, int, int, str]:
    """Submit the stand-in without --time; (job id, limit and time-min perfcast set in minutes,
    its log's path) once it COMPLETED."""
    cluster.write_script("pretrain_gpt.py", STAND_IN)
    log = cluster.jobs_dir / f"{name}-%j.out"
    script = cluster.write_script(f"{name}.sh", SCRIPT.format(out=log))
    res = cluster.client.submit(script, cwd=str(cluster.jobs_dir))
    info = cluster.client.wait(res.job_id, timeout=120, poll=0.2)
    assert info.state == "COMPLETED", info
    raw = dict(cluster.client.job(res.job_id).raw)
    limit, time_min = parse_slurm_time(raw["TimeLimit"]), parse_slurm_time(raw["TimeMin"])
    assert 0 < time_min < limit, raw
    assert "perfcast:v1" in raw["AdminComment"] and "action=set" in raw["AdminComment"], raw
    return res.job_id, limit, time_min, str(log).replace("%j", str(res.job_id))


def _harvest_and_report(cluster, runs, capsys, monkeypatch, source: str) -> tuple[dict, dict]:
    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    config = str(cluster.base / "etc" / "perfcast.toml")
    assert calibrate_main(["harvest", "--config", config, "--source", source, "--since", "1d",
                           "--out", str(runs), "--json"]) == 0, capsys.readouterr()
    harvested = json.loads(capsys.readouterr().out)
    assert calibrate_main(["report", "--config", config, "--json"]) == 0
    return harvested, json.loads(capsys.readouterr().out)


def _check_reported(report: dict, job_id: int, limit_min: int, runs) -> None:
    (job,) = [j for j in report["jobs"] if int(j["job_id"]) == job_id]
    assert job["state"] == "COMPLETED"
    assert job["time_limit_seconds"] == limit_min * 60 and job["limit_set_by_perfcast"] is True
    # The stand-in sleeps 20 x 0.1 s: Slurm counts at least a second of it.
    assert job["elapsed_seconds"] >= 1
    assert job["predicted_iteration_seconds"] > 0
    assert abs(job["measured_iteration_seconds"] - 0.150) < 1e-6   # the log's steady state
    assert (runs / "gpu.toml").exists() and f"slurm job {job_id}" in (runs / "gpu.toml").read_text()


def test_submitted_run_harvested_from_scontrol(cluster, tmp_path, capsys, monkeypatch):
    job_id, limit, _, log = _run_to_the_end(cluster, "e2e-scontrol")
    harvested, report = _harvest_and_report(cluster, tmp_path / "runs", capsys, monkeypatch, "scontrol")
    assert harvested["source"] == "scontrol"
    _check_reported(report, job_id, limit, tmp_path / "runs")
    assert os.path.exists(log)


def test_submitted_run_harvested_from_sacct(accounting, tmp_path, capsys, monkeypatch):
    cluster = accounting
    job_id, limit, _, log = _run_to_the_end(cluster, "e2e-sacct")
    # slurmctld hands the job's end to slurmdbd asynchronously: wait for sacct to have it.
    assert cluster.wait_accounted(job_id) == "COMPLETED"
    harvested, report = _harvest_and_report(cluster, tmp_path / "runs", capsys, monkeypatch, "auto")
    assert harvested["source"] == "sacct"           # auto takes accounting where it answers
    mine = [j for j in harvested["jobs"] if int(j["slurm_job_id"]) == job_id]
    assert len(mine) == 1, (job_id, harvested)
    mine = mine[0]
    assert mine["source"] == "sacct" and mine["state"] == "COMPLETED"
    assert mine["time_limit_seconds"] == limit * 60 and mine["end"] and mine["start"] <= mine["end"]
    _check_reported(report, job_id, limit, tmp_path / "runs")
    assert os.path.exists(log)


def test_forced_sacct_source_answers(accounting, tmp_path, capsys, monkeypatch):
    """--source sacct is answered by slurmdbd itself (a failure would be an error, not a fallback)."""
    monkeypatch.setenv("SLURM_CONF", accounting.conf)
    config = str(accounting.base / "etc" / "perfcast.toml")
    assert calibrate_main(["harvest", "--config", config, "--source", "sacct", "--since", "2m",
                           "--out", str(tmp_path / "runs"), "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "sacct"
