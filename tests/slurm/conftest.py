"""A real Slurm (packaging/dev-cluster) for the whole session, with perfcast's plugin and daemon.

Skips only when slurmctld is not installed (or we are not root); with CI=true it fails instead.
The cluster has real accounting (slurmdbd + a private MariaDB) unless PERFCAST_DEV_NO_ACCOUNTING=1;
tests that need ``sacct`` take the ``accounting`` fixture, which skips without it (fails under
CI=true, where up.sh refuses to run without accounting anyway).
Its own base dir (.dev-cluster/pytest, or PERFCAST_TEST_DEV_BASE) and a free port (or
PERFCAST_TEST_DEV_PORT) keep it apart from a developer's cluster and from other test runs.
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
        return ("slurmctld is not installed (apt-get install slurmctld slurmd slurm-client munge lua-socket "
                "slurmdbd mariadb-server)")
    if os.geteuid() != 0:
        return "the dev cluster runs slurmctld/slurmd/munged as root"
    return None


def _free_ports() -> int:
    """The first of 5 free ports: slurmctld, slurmd, the dead nodes', slurmdbd, MariaDB (up.sh)."""
    for port in range(26817, 27817, 5):
        ok = True
        for p in range(port, port + 5):
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

    def sacctmgr(self, *args: str, check: bool = True) -> str:
        """``sacctmgr -i ARGS`` on this cluster's accounting; a failure fails the test (check)."""
        out = subprocess.run(["sacctmgr", "-i", *args], env=self.env(), capture_output=True, text=True,
                             timeout=60)
        if check and out.returncode != 0:
            raise AssertionError(f"sacctmgr {' '.join(args)}: {out.stderr or out.stdout}")
        return out.stdout

    def show(self, job_id: int) -> dict:
        return dict(self.client.job(job_id).raw)

    @property
    def accounting(self) -> bool:
        """Whether up.sh configured slurmdbd (it does unless PERFCAST_DEV_NO_ACCOUNTING=1)."""
        return "AccountingStorageType=accounting_storage/slurmdbd" in Path(self.conf).read_text()

    def sacct_state(self, job_id: int, since: float) -> tuple[str, str]:
        """(State, End) of a job in the listing the harvest asks for (every user's jobs since
        ``since``, up to now); ("", "") while slurmdbd's answer does not have it yet."""
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        out = subprocess.run(["sacct", "-a", "-X", "-n", "-P", "-S", start, "-E", "now",
                              "-o", "JobIDRaw,State,End"],
                             env=self.env(), capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines() if out.returncode == 0 else []:
            jid, _, rest = line.partition("|")
            if jid == str(job_id):
                state, _, end = rest.partition("|")
                return state.split(" ")[0], end
        return "", ""

    def wait_accounted(self, job_id: int, timeout: float = 120.0) -> str:
        """Poll sacct until slurmdbd's listing has the job's final record; its state.  slurmctld
        sends records asynchronously, and a listing up to "now" may leave out a job that ended
        that very second (seen on 22.05), so this asks exactly what the harvest asks.  The bound
        is generous, not a guess at speed."""
        deadline = time.monotonic() + timeout
        since = time.time() - 86400
        while True:
            state, end = self.sacct_state(job_id, since)
            if state and state not in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "COMPLETING") \
                    and end not in ("", "Unknown", "None"):
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"sacct has no final record of job {job_id} after {timeout:.0f} s "
                                     f"(last: {state or 'nothing'!r}, end {end!r}); see "
                                     f"{self.base}/log/slurmdbd.log")
            time.sleep(0.5)

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
    # Several checkouts' (or agents') test runs on one machine each take their own base and ports.
    base = Path(os.environ.get("PERFCAST_TEST_DEV_BASE") or REPO / ".dev-cluster" / "pytest")
    port = os.environ.get("PERFCAST_TEST_DEV_PORT") or str(_free_ports())
    fake = os.environ.get("PERFCAST_TEST_FAKE_PREDICTOR") == "1"
    env = {**os.environ, "PERFCAST_DEV_BASE": str(base), "PERFCAST_DEV_PORT": port,
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
def accounting(cluster):
    """The cluster, for a test that needs sacct: skips without accounting (fails under CI=true)."""
    if not cluster.accounting:
        why = "the dev cluster runs without accounting (PERFCAST_DEV_NO_ACCOUNTING=1)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    return cluster


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
