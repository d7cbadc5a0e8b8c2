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
import time
from typing import Optional

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
                 max_queue: int = 256, extra: str = "", records: Optional[str] = None) -> str:
    """``extra``: more ``[daemon]`` lines; ``records``: the store (default: in ``directory``)."""
    path = os.path.join(directory, "perfcast.toml")
    text = CONFIG.format(dir=directory, deadline=deadline_ms, workers=workers, max_queue=max_queue)
    if records:
        text = text.replace(f'records = "{directory}/records.sqlite"', f'records = "{records}"')
    with open(path, "w") as fh:
        fh.write(text.replace("\n[defaults]", extra + "\n[defaults]", 1))
    return path


class RunningDaemon:
    def __init__(self, deadline_ms: int = GENEROUS_MS, workers: int = 2, max_queue: int = 256,
                 extra: str = "", directory: Optional[str] = None, records: Optional[str] = None):
        self.dir = directory or tempfile.mkdtemp(prefix="pcd", dir="/tmp")   # short: AF_UNIX paths <= 107
        os.chmod(self.dir, 0o755)
        fakes.SEEN_PATH = os.path.join(self.dir, "seen.jsonl")   # inherited by the workers
        self.config_file = write_config(self.dir, deadline_ms, workers, max_queue, extra, records)
        # The record writer (a process of its own) logs here: tests read what it said.
        self.writer_log = os.path.join(self.dir, "writer.log")
        self._writer_log_fd = os.open(self.writer_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        cfg = load_site_config(self.config_file)
        self.socket, self.user_socket = cfg.daemon.socket, cfg.daemon.user_socket
        engine = daemon.Engine(cfg, fakes.BACKENDS).load()
        self.server = daemon.PredictServer(
            engine, config_file=self.config_file,
            engine_factory=lambda c: daemon.Engine(c, fakes.BACKENDS).load(),
            records_log_fd=self._writer_log_fd)
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

    def wait_stored(self, within: float = 30.0) -> None:
        """Until every record answered so far is in the store (the writer process moved the spool)."""
        self.state(self.server.records.flush)
        end = time.monotonic() + within
        while not self.state(self.server.records.stored):
            assert time.monotonic() < end, "records not stored"
            time.sleep(0.02)

    def writer_said(self) -> str:
        with open(self.writer_log, errors="replace") as fh:
            return fh.read()

    def stop(self, keep: bool = False):
        """Stop as SIGTERM does; ``keep``: leave the directory (store, spool) for another daemon."""
        self.call(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        fakes.SEEN_PATH = None
        os.close(self._writer_log_fd)
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def running():
    d = RunningDaemon()
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level("INFO", logger="perfcast")
