"""A real Slurm (packaging/dev-cluster) for the whole session, with perfcast's plugin and daemon.

Skips only when slurmctld is not installed (or we are not root); with CI=true it fails instead.
Its own base dir (.dev-cluster/pytest) and a free port keep it apart from a developer's cluster.
PERFCAST_TEST_FAKE_PREDICTOR=1 serves the daemon with tests/daemon/fakes.py backends instead of
the real predictor and parser (for working on the Slurm side alone).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from slurm_plugin.daemon import ask_daemon
from slurm_plugin.slurm_client import SlurmClient

REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "packaging" / "dev-cluster"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/slurm/" in str(item.fspath):
            item.add_marker(pytest.mark.slurm)


def _unavailable() -> Optional[str]:
    if not shutil.which("slurmctld"):
        return "slurmctld is not installed (apt-get install slurmctld slurmd slurm-client munge lua-socket)"
    if os.geteuid() != 0:
        return "the dev cluster runs slurmctld/slurmd/munged as root"
    return None


def _free_port_triple() -> int:
    for port in range(26817, 27817, 3):
        ok = True
        for p in (port, port + 1, port + 2):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no free port for the dev cluster")


@dataclass
class Cluster:
    base: Path
    conf: str
    client: SlurmClient
    socket: str
    dev_env: dict

    @property
    def jobs_dir(self) -> Path:
        return self.base / "jobs"

    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": self.conf}

    def write_script(self, name: str, text: str, mode: int = 0o644) -> Path:
        path = self.jobs_dir / name
        path.write_text(text)
        path.chmod(mode)
        return path

    def sbatch(self, script: Path, *args: str, user: Optional[str] = None,
               cwd: Optional[str] = None, conf: Optional[str] = None):
        """Submit held (so nothing runs), return (job id, sbatch stderr lines, wall seconds)."""
        t0 = time.monotonic()
        res = self.client.submit(script, ["--hold", *args], user=user, cwd=cwd or str(self.jobs_dir),
                                 env={"SLURM_CONF": conf} if conf else None)
        return res.job_id, res.messages, time.monotonic() - t0

    def show(self, job_id: int) -> dict:
        return dict(self.client.job(job_id).raw)

    def ask(self, script_text: str, **fields) -> dict:
        req = {"script": script_text, "submit_uid": 0, "submit_gid": 0, "work_dir": str(self.jobs_dir),
               "partitions": {p.name: {"max_time": p.max_time_minutes or 0xFFFFFFFF,
                                       "default": p.is_default} for p in self.client.partitions()}}
        req.update(fields)
        return ask_daemon(self.socket, req, timeout=5)


@pytest.fixture(scope="session")
def cluster():
    why = _unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the Slurm tests cannot run: {why}")
        pytest.skip(why)
    base = REPO / ".dev-cluster" / "pytest"
    fake = os.environ.get("PERFCAST_TEST_FAKE_PREDICTOR") == "1"
    env = {**os.environ, "PERFCAST_DEV_BASE": str(base), "PERFCAST_DEV_PORT": str(_free_port_triple()),
           "PERFCAST_PYTHON": sys.executable}
    if fake:
        env["PERFCAST_DEV_NO_DAEMON"] = "1"
    subprocess.run([str(DEV / "down.sh")], env=env, capture_output=True, timeout=60)  # leftovers
    up = subprocess.run([str(DEV / "up.sh")], env=env, capture_output=True, text=True, timeout=180)
    if up.returncode != 0:
        pytest.fail(f"up.sh failed:\n{up.stderr[-3000:]}")
    # "export SLURM_CONF=... PERFCAST_CONFIG=...": the line a user evals.
    exported = dict(kv.split("=", 1) for kv in up.stdout.split()[1:])
    conf = exported["SLURM_CONF"]
    assert exported["PERFCAST_CONFIG"] == str(base / "etc" / "perfcast.toml")
    sock = str(base / "run" / "predictd.sock")
    if fake:
        subprocess.Popen([sys.executable, "-m", "tests.daemon.fakes", "--config",
                          str(base / "etc" / "perfcast.toml"), "--pid-file",
                          str(base / "run" / "predictd.pid"), "--log-file",
                          str(base / "log" / "predictd.log")], cwd=str(REPO),
                         env={**os.environ, "SLURM_CONF": conf}, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if (base / "run" / "predictd.pid").exists():
                break
            time.sleep(0.05)
    try:
        yield Cluster(base=base, conf=conf, client=SlurmClient(conf), socket=sock, dev_env=env)
    finally:
        down = subprocess.run([str(DEV / "down.sh")], env=env, capture_output=True, text=True,
                              timeout=120)
        if down.returncode != 0:
            print(down.stderr, file=sys.stderr)


@pytest.fixture
def held_jobs(cluster):
    """Cancel what a test submitted."""
    ids: list[int] = []
    yield ids
    try:
        cluster.client.cancel(ids)
    except Exception:  # noqa: BLE001 - cleanup must not mask the test's result
        pass


def script_text(name: str, **subst: str) -> str:
    text = (SCRIPTS / name).read_text()
    for key, value in subst.items():
        text = text.replace(f"@{key}@", value)
    return text
