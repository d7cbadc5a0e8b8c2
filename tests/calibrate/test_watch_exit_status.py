"""``perf-calibrate watch``'s exit status: a pass that had a record-store warning (a record it
could not read, a corrupt store, a locked one) exits 3, so that the systemd timer's unit shows it;
a pass without one exits 0, even when it could not extend a job (a normal outcome)."""
from __future__ import annotations

import logging
import sqlite3
import time

import pytest

import calibrate.watch as watch
import calibrate.watch_log as watch_log
from calibrate.cli import main
from calibrate.watch_log import WatchLog

from .test_watch import FakeSlurm, megatron_log, record, running, site  # noqa: F401

CONFIG = ("[watch]\nenabled = true\nmargin = 0.1\nmargin_minutes = 1\nshrink_min_minutes = 2\n"
          "min_samples = 3\nmax_growth = 10\n")


@pytest.fixture
def cli(site, monkeypatch):
    """``perf-calibrate watch`` (one pass, the real CLI) against the stand-in Slurm ``slurm``; runs
    files under the test's directory, never /var/lib/perfcast."""
    tmp, store = site
    (tmp / "perfcast.toml").write_text(CONFIG)
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    holder: dict = {}
    monkeypatch.setattr(watch, "SlurmClient", lambda *a, **k: holder["slurm"])

    def run(slurm: FakeSlurm, *extra: str) -> int:
        holder["slurm"] = slurm
        return main(["watch", "--config", str(tmp / "perfcast.toml"), "--records", str(tmp / "records.sqlite"),
                     "--out", str(tmp / "runs"), *extra])
    return tmp, store, run


def test_a_pass_without_warnings_exits_0_even_when_it_cannot_extend(cli, capsys, caplog):
    tmp, store, run = cli
    now = time.time()
    rid, short = store.add(record(time_limit_minutes=20)), store.add(record(time_limit_minutes=4))
    megatron_log(tmp / "slow.out", 1.0, 200)
    # A limit the user lowered (not extended: user-limit), and one Slurm's MaxTime keeps short of
    # even the next checkpoint (no-fit): normal outcomes, no failure.
    slurm = FakeSlurm([running(rid, 11, tmp / "slow.out", limit_min=3, start=now - 200),
                       running(short, 12, tmp / "slow.out", limit_min=4, start=now - 200)], max_time=4)
    assert run(slurm) == 0
    out = capsys.readouterr()
    assert "user set this limit" in out.out and "will time out" in out.out and not slurm.limits
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_pass_with_a_corrupt_store_exits_3(cli, capsys, caplog):
    tmp, store, run = cli
    now = time.time()
    rid = store.add(record(time_limit_minutes=10))
    comment = f"perfcast:v1 iter_s=0.5 iters=1000 total_min=8.7 action=set rec_min=10 rec={rid}"
    store.close()
    (tmp / "records.sqlite").write_bytes(b"not a database" * 100)
    megatron_log(tmp / "slow.out", 1.0, 200)
    slurm = FakeSlurm([running(rid, 21, tmp / "slow.out", limit_min=10, start=now - 200, admin_comment=comment)])
    assert run(slurm, "--json") == watch.WARNINGS_EXIT_STATUS == 3
    out = capsys.readouterr()
    # The pass still protected the job, and said what failed (log and --json).
    assert set(slurm.limits) == {21}
    assert '"warnings": [' in out.out and "corrupt or not a perfcast record store" in out.out
    assert any("corrupt or not a perfcast record store" in r.getMessage() for r in caplog.records)
    assert "Traceback" not in out.err


def test_a_pass_with_a_locked_store_exits_3(cli, monkeypatch, caplog):
    tmp, store, run = cli
    now = time.time()
    rid = store.add(record(time_limit_minutes=10))
    WatchLog(tmp / "records.sqlite").job(0)
    monkeypatch.setattr(watch_log, "BUSY_TIMEOUT_S", 0.2)
    megatron_log(tmp / "ok.out", 0.5, 200)
    slurm = FakeSlurm([running(rid, 31, tmp / "ok.out", limit_min=10, start=now - 100)])
    holder = sqlite3.connect(str(tmp / "records.sqlite"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        assert run(slurm) == 3
    finally:
        holder.rollback()
        holder.close()
    assert any("database is locked" in r.getMessage() for r in caplog.records)
    # The lock gone, the next pass has nothing to say: 0.
    assert run(slurm) == 0


def test_the_help_names_the_exit_statuses(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["watch", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "0 it ran (jobs it could not extend included)" in text
    assert "3 it ran with a record store warning" in text
