"""An in-process perf-predictd on a temporary socket, with fake predictor and parser backends.

The server runs in a thread of the test process; its workers are processes forked from it (so
they run the fakes too).  The default deadline is generous: tests whose outcome must not depend
on the machine's speed never come near it; tests of the deadline make their own daemon.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading

import pytest

from slurm_plugin import daemon
from slurm_plugin.siteconfig import load_site_config

from . import fakes

CONFIG = """
[daemon]
socket = "{dir}/d.sock"
socket_mode = "0666"
user_socket = "{dir}/u.sock"
slurm_user = "root"
deadline_ms = {deadline}
max_request_bytes = 65536
max_file_bytes = 4096
workers = {workers}
max_queue = {max_queue}
records = "{dir}/records.sqlite"

[defaults]
margin = 0.15
startup_minutes = 5

[partitions.gpu]
platform = "perlmutter-a100"

[partitions.h100]
platform = "dgx-h100"
policy = "enforce"

[partitions.broken]
platform = "broken-platform"
"""


GENEROUS_MS = 5000


def write_config(directory: str, deadline_ms: int = GENEROUS_MS, workers: int = 2,
                 max_queue: int = 256) -> str:
    path = os.path.join(directory, "perfcast.toml")
    with open(path, "w") as fh:
        fh.write(CONFIG.format(dir=directory, deadline=deadline_ms, workers=workers,
                               max_queue=max_queue))
    return path


class RunningDaemon:
    def __init__(self, deadline_ms: int = GENEROUS_MS, workers: int = 2, max_queue: int = 256):
        self.dir = tempfile.mkdtemp(prefix="pcd", dir="/tmp")   # short: AF_UNIX paths <= 107
        os.chmod(self.dir, 0o755)
        fakes.SEEN_PATH = os.path.join(self.dir, "seen.jsonl")   # inherited by the workers
        self.config_file = write_config(self.dir, deadline_ms, workers, max_queue)
        cfg = load_site_config(self.config_file)
        self.socket, self.user_socket = cfg.daemon.socket, cfg.daemon.user_socket
        engine = daemon.Engine(cfg, fakes.BACKENDS).load()
        self.server = daemon.PredictServer(
            engine, config_file=self.config_file,
            engine_factory=lambda c: daemon.Engine(c, fakes.BACKENDS).load())
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run():
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(5)

    def ask(self, request: dict, timeout: float = 30.0) -> dict:
        return daemon.ask_daemon(self.socket, request, timeout)

    def call(self, coro_fn):
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(10)

    def state(self, fn):
        """``fn()`` evaluated on the daemon's loop (pool state is only consistent there)."""
        async def run():
            return fn()
        return self.call(run)

    def stop(self):
        self.call(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        fakes.SEEN_PATH = None
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def running():
    d = RunningDaemon()
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level("INFO", logger="perfcast")
