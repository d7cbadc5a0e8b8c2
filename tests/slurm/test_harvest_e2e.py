"""Issue 13's loop on a real Slurm: a job submitted without --time gets a limit and a time-min,
runs to the end, and harvest + report show what was predicted next to what its log measured."""
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


def test_submitted_run_harvested_reported(cluster, tmp_path, capsys, monkeypatch):
    cluster.write_script("pretrain_gpt.py", STAND_IN)
    log = cluster.jobs_dir / "e2e-%j.out"
    script = cluster.write_script("e2e.sh", SCRIPT.format(out=log))
    res = cluster.client.submit(script, cwd=str(cluster.jobs_dir))
    info = cluster.client.wait(res.job_id, timeout=120, poll=0.2)
    assert info.state == "COMPLETED", info
    raw = dict(cluster.client.job(res.job_id).raw)
    limit, time_min = parse_slurm_time(raw["TimeLimit"]), parse_slurm_time(raw["TimeMin"])
    assert 0 < time_min < limit, raw

    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    config = str(cluster.base / "etc" / "perfcast.toml")
    runs = tmp_path / "runs"
    assert calibrate_main(["harvest", "--config", config, "--source", "scontrol", "--since", "1d",
                           "--out", str(runs), "--json"]) == 0, capsys.readouterr()
    capsys.readouterr()
    assert calibrate_main(["report", "--config", config, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (job,) = [j for j in report["jobs"] if int(j["job_id"]) == res.job_id]
    assert job["state"] == "COMPLETED"
    assert job["time_limit_seconds"] == limit * 60 and job["elapsed_seconds"] >= 1
    assert job["predicted_iteration_seconds"] > 0
    assert abs(job["measured_iteration_seconds"] - 0.150) < 1e-6   # the log's steady state
    assert (runs / "gpu.toml").exists() and f"slurm job {res.job_id}" in (runs / "gpu.toml").read_text()
    assert os.path.exists(str(log).replace("%j", str(res.job_id)))
