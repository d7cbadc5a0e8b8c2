"""harvest --refit on a real Slurm with a shipped platform: jobs of partition h100 (the shipped
dgx-h100, which the dev cluster's perfcast.toml names for it) run 40 % slower than dgx-h100
predicts, the harvest collects them, the refit installs a site overlay of dgx-h100 under a
platforms root, a perf-predictd looking there picks it up on the refit's reload (no restart), and
``rollback`` gives the shipped platform back, to the bit.

The dev cluster's own perf-predictd reads the platforms in /var/lib/perfcast, which a test must not
write: a second perf-predictd, on its own socket with PERFCAST_PLATFORMS at the test's root, stands
for the site's daemon; the jobs themselves are predicted and recorded by the cluster's."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calibrate.cli import main as calibrate_main
from slurm_plugin.daemon.protocol import ask_daemon

REPO = Path(__file__).resolve().parents[2]

# Megatron's log lines at $STANDIN_MS per iteration (the first two five times slower: warm-up),
# sleeping as long as each line says, so that the job's elapsed time bears its log out.
STAND_IN = '''import os, sys, time
iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
ms = float(os.environ["STANDIN_MS"])
for i in range(1, 13):
    print(f" iteration {i:8d}/{iters:8d} | consumed samples: {8 * i:10d} | "
          f"elapsed time per iteration (ms): {ms if i > 2 else 5 * ms:.3f} | learning rate: 1.000E-04 |",
          flush=True)
    time.sleep(ms / 1000.0)
'''

SCRIPT = """#!/bin/bash
#SBATCH --job-name=refit-{name}
#SBATCH --partition=h100
#SBATCH --nodes=1
#SBATCH --ntasks-per-node={tp}
#SBATCH --gres=gpu:8
#SBATCH --output={out}
export STANDIN_MS={ms}
srun python3 refit_pretrain_gpt.py \\
    --tensor-model-parallel-size {tp} --pipeline-model-parallel-size 1 \\
    --num-layers {layers} --hidden-size {hidden} --num-attention-heads {heads} \\
    --seq-length 512 --max-position-embeddings 512 \\
    --micro-batch-size {mb} --global-batch-size 8 --train-iters 200000 --bf16 --vocab-size 50257
"""

# (layers, hidden, heads, tp, micro-batch): shapes and layouts of one kind of job (Megatron, flash
# attention as Megatron's auto picks it, bf16, no recompute).
JOBS = [(2, 256, 4, 2, 1), (2, 512, 8, 2, 1), (4, 256, 4, 2, 2), (2, 1024, 16, 2, 1), (4, 512, 8, 1, 1),
        (2, 256, 4, 1, 2), (4, 1024, 16, 2, 2)]
HELD = (3, 512, 8, 2, 1)
SLOWER = 1.4


def _script(cluster, name, shape, ms=1.0) -> str:
    layers, hidden, heads, tp, mb = shape
    return SCRIPT.format(name=name, tp=tp, out=cluster.jobs_dir / f"refit-{name}-%j.out", ms=f"{ms:.4f}",
                         layers=layers, hidden=hidden, heads=heads, mb=mb)


def _ask(socket: str, cluster, text: str) -> dict:
    req = {"script": text, "submit_uid": 0, "submit_gid": 0, "work_dir": str(cluster.jobs_dir),
           "partition": "h100"}
    ans = ask_daemon(socket, req, timeout=10)
    assert ans["status"] == "ok", ans
    return ans["prediction"]


@pytest.fixture
def site_daemon(cluster, tmp_path):
    """A perf-predictd like the site's, its platforms root the test's own."""
    root = tmp_path / "platforms"
    root.mkdir()
    cfg_text = (cluster.base / "etc" / "perfcast.toml").read_text()
    lines, in_daemon = [], False
    for line in cfg_text.splitlines():
        if line.startswith("["):
            in_daemon = line.strip() == "[daemon]"
        if in_daemon and line.split("=")[0].strip() in ("socket", "user_socket", "records"):
            continue
        lines.append(line)
        if line.strip() == "[daemon]":
            lines.append(f'socket = "{tmp_path / "site.sock"}"')
    cfg = tmp_path / "perfcast.toml"
    cfg.write_text("\n".join(lines) + "\n")
    pid = tmp_path / "site.pid"
    env = {**os.environ, "PERFCAST_PLATFORMS": str(root), "SLURM_CONF": cluster.conf, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "slurm_plugin.daemon", "--config", str(cfg), "--pid-file",
                             str(pid), "--log-file", str(tmp_path / "site.log")], cwd=str(REPO), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (pid.exists() and pid.read_text().strip()):
            assert proc.poll() is None, (tmp_path / "site.log").read_text() if (tmp_path / "site.log").exists() else ""
            assert time.monotonic() < deadline, "the site daemon did not start"
            time.sleep(0.1)
        yield root, str(tmp_path / "site.sock"), pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _until(what, predicate, timeout=60.0):
    """Poll ``what()`` until ``predicate`` holds of it (a reload runs in the daemon's background)."""
    deadline = time.monotonic() + timeout
    while True:
        v = what()
        if predicate(v) or time.monotonic() > deadline:
            return v
        time.sleep(0.2)


def test_harvest_refit_overlays_a_shipped_platform_and_rollback_restores_it(cluster, site_daemon, tmp_path,
                                                                            capsys, monkeypatch):
    root, sock, pid = site_daemon
    monkeypatch.setenv("SLURM_CONF", cluster.conf)
    cluster.write_script("refit_pretrain_gpt.py", STAND_IN)
    held_before = _ask(sock, cluster, _script(cluster, "held", HELD))
    # Each job runs SLOWER x what the cluster's daemon (the shipped dgx-h100) predicts for it.
    ids = []
    for i, shape in enumerate(JOBS):
        predicted = _ask(cluster.socket, cluster, _script(cluster, f"j{i}", shape))["iteration_seconds"]
        script = cluster.write_script(f"refit-j{i}.sh", _script(cluster, f"j{i}", shape, SLOWER * predicted * 1e3))
        ids.append(cluster.client.submit(script, cwd=str(cluster.jobs_dir)).job_id)
    for job_id in ids:
        assert cluster.client.wait(job_id, timeout=120, poll=0.2).state == "COMPLETED"

    config = str(cluster.base / "etc" / "perfcast.toml")
    code = calibrate_main(["harvest", "--config", config, "--source", "scontrol", "--since", "1d",
                           "--partition", "h100", "--out", str(tmp_path / "runs"), "--refit",
                           "--root", str(root), "--pid-file", str(pid), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert {f"slurm job {j}" for j in ids} <= set((tmp_path / "runs" / "h100.toml").read_text().split('"'))
    (refit,) = out["refits"]
    assert refit["status"] == "installed", refit
    assert refit["target"] == "dgx-h100" and refit["base_version"] == "shipped dgx-h100"
    assert refit["reload"]["status"] == "signalled", refit["reload"]
    kind = [k for k in refit["kinds"] if k["runs"] == len(JOBS)]
    assert kind and kind[0]["loo_mape_after"] < 0.05 < kind[0]["mape_before"], refit["kinds"]
    overlay = root / "dgx-h100" / "current"
    assert "overlay_of = \"dgx-h100\"" in (overlay / "platform.toml").read_text()

    assert calibrate_main(["status", "--root", str(root), "--json"]) == 0
    (st,) = json.loads(capsys.readouterr().out)
    assert st["partition"] == "dgx-h100" and st["base"] == "shipped dgx-h100" and st["origin"] == "refit"

    # The site daemon reloaded on the refit's SIGHUP: a job of that kind it never saw is now
    # predicted SLOWER x as long, with the kind's own (narrower than unseen) interval.
    held_after = _until(lambda: _ask(sock, cluster, _script(cluster, "held", HELD)),
                        lambda p: p["iteration_seconds"] != held_before["iteration_seconds"])
    assert held_after["iteration_seconds"] == pytest.approx(SLOWER * held_before["iteration_seconds"], rel=0.08)

    assert calibrate_main(["rollback", "dgx-h100", "--root", str(root), "--pid-file", str(pid)]) == 0
    assert "rolled back to the shipped platform" in capsys.readouterr().out
    assert not overlay.exists()
    back = _until(lambda: _ask(sock, cluster, _script(cluster, "held", HELD)),
                  lambda p: p["iteration_seconds"] == held_before["iteration_seconds"])
    assert back == held_before
    history = (root / "dgx-h100" / "history.log").read_text()
    assert "installed" in history and "rolled back" in history and "to the shipped platform" in history
