"""An in-process perf-predictd on a temporary socket, with fake predictor and parser backends."""
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
workers = 4

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


class RunningDaemon:
    def __init__(self, deadline_ms: int = 250):
        self.dir = tempfile.mkdtemp(prefix="pcd", dir="/tmp")   # short: AF_UNIX paths <= 107
        os.chmod(self.dir, 0o755)
        self.config_file = os.path.join(self.dir, "perfcast.toml")
        with open(self.config_file, "w") as fh:
            fh.write(CONFIG.format(dir=self.dir, deadline=deadline_ms))
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

    def ask(self, request: dict, timeout: float = 2.0) -> dict:
        return daemon.ask_daemon(self.socket, request, timeout)

    def call(self, coro_fn):
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(10)

    def stop(self):
        self.call(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def running():
    d = RunningDaemon()
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level("INFO", logger="perfcast")
