"""What a reload (SIGHUP) does with a changed perfcast.toml.

F7: every ``[daemon]`` setting is either applied by the reload (the record store switched, the
sockets' modes, the log level, the workers ...) or, for the socket paths, logged as needing a
restart with its old and new value, the running value kept -- none is silently ignored.
F8: a reload whose new config names a platform that does not load is refused as a whole (as
``--check`` fails it): ``reload_failed`` at ERROR, the running config and engine kept.
F9: at start and after a reload, each configured partition Slurm does not have is a WARNING, with
its near miss among Slurm's partitions.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import stat
import time

from slurm_plugin.daemon import ask_daemon
from slurm_plugin.daemon import server as server_mod
from slurm_plugin.records import parse_admin_comment
from slurm_plugin.siteconfig import DaemonSettings
from slurm_plugin.slurm_client import PartitionInfo, SlurmError

from .fakes import JOB, req, until
from . import conftest, fakes
from .conftest import RunningDaemon


def edit(d: RunningDaemon, old: str, new: str) -> None:
    with open(d.config_file) as fh:
        text = fh.read()
    assert old in text, old
    with open(d.config_file, "w") as fh:
        fh.write(text.replace(old, new, 1))


def events(caplog, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if f"event={name} " in r.getMessage() + " "]


def store_ids(path: str) -> set:
    import contextlib
    import sqlite3
    if not os.path.exists(path):
        return set()
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as con:
        return {r[0] for r in con.execute("SELECT record_id FROM records")}


def rec_id(answer: dict) -> str:
    return parse_admin_comment(answer.get("admin_comment") or "").get("rec")


# --- F7: [daemon] settings on reload ---------------------------------------------------------------

def test_every_daemon_setting_is_applied_or_needs_a_restart():
    names = [f.name for f in dataclasses.fields(DaemonSettings)]
    assert sorted(server_mod.RELOAD_APPLIES + server_mod.RESTART_ONLY) == sorted(names)


def test_a_reload_switches_the_record_store(running, caplog):
    old_store = os.path.join(running.dir, "records.sqlite")
    new_store = os.path.join(running.dir, "moved", "records.sqlite")
    before = rec_id(running.ask(req()))
    assert before
    edit(running, f'records = "{old_store}"', f'records = "{new_store}"')
    running.call(running.server.reload)
    assert events(caplog, "reloaded")
    after = rec_id(running.ask(req(script=JOB + "# FAKE tag=after\n")))
    assert after and after != before
    running.wait_stored()
    assert after in store_ids(new_store)          # perf-calibrate watch/harvest read this one now
    assert before not in store_ids(new_store)
    # the old store got what was spooled before the switch, and nothing after it
    until(lambda: before in store_ids(old_store), what="the old store's writer to drain")
    assert after not in store_ids(old_store)
    applied = events(caplog, "setting_applied")
    assert any("setting=daemon.records" in r.getMessage() and new_store in r.getMessage()
               for r in applied)
    until(lambda: not running.state(lambda: running.server._retired), what="the old writer to exit")
    assert running.state(running.server.summary)["records_kept"] == 2


def test_a_reload_can_turn_records_off(running, caplog):
    store = os.path.join(running.dir, "records.sqlite")
    assert rec_id(running.ask(req()))
    edit(running, f'records = "{store}"', 'records = ""')
    running.call(running.server.reload)
    assert running.state(lambda: running.server.records) is None
    a = running.ask(req(script=JOB + "# FAKE tag=off\n"))
    assert a["status"] == "ok" and not rec_id(a)


def test_socket_paths_change_only_at_restart_and_say_so(running, caplog):
    sock, user = running.socket, running.user_socket
    moved = os.path.join(running.dir, "moved.sock")
    edit(running, f'socket = "{sock}"', f'socket = "{moved}"')
    edit(running, f'user_socket = "{user}"', 'user_socket = ""')
    edit(running, "margin = 0.15", "margin = 0.5")       # the rest of the file is applied
    running.call(running.server.reload)
    lines = [r for r in events(caplog, "restart_needed") if r.levelno == logging.WARNING]
    by_setting = {r.getMessage().split("setting=")[1].split()[0]: r.getMessage() for r in lines}
    assert set(by_setting) == {"daemon.socket", "daemon.user_socket"}
    assert f"old={sock}" in by_setting["daemon.socket"] and f"new={moved}" in by_setting["daemon.socket"]
    assert "at restart" in by_setting["daemon.socket"]
    assert f"old={user}" in by_setting["daemon.user_socket"] and "new=-" in by_setting["daemon.user_socket"]
    assert not os.path.exists(moved)
    assert running.ask(req())["time_limit"] == 70        # 41 min x 1.5 + 5 -> 70: reloaded
    a = ask_daemon(user, {"script": JOB, "submit_uid": 0, "partition": "gpu"}, 30)
    assert a["status"] == "ok"                           # the user socket still served
    assert running.state(lambda: running.server.settings.socket) == sock


def test_modes_log_level_and_workers_are_applied(running, caplog):
    levels = {n: logging.getLogger(n).level for n in ("perfcast", "slurm_plugin", "predictor")}
    try:
        edit(running, 'socket_mode = "0666"', 'socket_mode = "0600"\nlog_level = "warning"')
        edit(running, "workers = 2", "workers = 3")
        running.call(running.server.reload)
        assert stat.S_IMODE(os.stat(running.socket).st_mode) == 0o600
        assert logging.getLogger("predictor").level == logging.WARNING
        assert running.state(lambda: running.server.pool.size) == 3
        assert not events(caplog, "restart_needed")
        assert running.ask(req())["status"] == "ok"
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


# --- F8: a platform that does not load refuses the reload ------------------------------------------

def test_a_misspelt_platform_refuses_the_reload(running, caplog):
    assert running.ask(req())["time_limit"] == 55
    edit(running, 'platform = "perlmutter-a100"', 'platform = "broken-a10"')   # does not load
    edit(running, "margin = 0.15", "margin = 0.5")
    engine = running.server.engine
    running.call(running.server.reload)
    failed = events(caplog, "reload_failed")
    assert failed and failed[-1].levelno == logging.ERROR
    assert "broken-a10" in failed[-1].getMessage()
    assert not events(caplog, "reloaded")
    assert running.server.engine is engine                # the running config kept, as a whole
    a = running.ask(req())
    assert a["status"] == "ok" and a["time_limit"] == 55  # not "platform ... is not available"


def test_a_platform_that_stops_loading_refuses_the_reload(running, caplog, monkeypatch):
    # (a bundle corrupted on disk since the start: the running engine keeps the copy it verified)
    def load(name):
        if name == "perlmutter-a100":
            raise fakes.PerfcastError("perlmutter-a100: linear1.fwd.fp16: sha256 mismatch")
        return fakes.load_platform(name)
    monkeypatch.setitem(fakes.BACKENDS, "load_platform", load)
    running.call(running.server.reload)
    failed = events(caplog, "reload_failed")
    assert failed and "sha256 mismatch" in failed[-1].getMessage()
    assert running.ask(req())["status"] == "ok"


def test_a_platform_that_did_not_load_before_either_does_not_block_a_reload(running, caplog):
    # broken-platform (partition broken) fails in the running engine too: nothing to lose there
    edit(running, "margin = 0.15", "margin = 0.5")
    running.call(running.server.reload)
    done = events(caplog, "reloaded")
    assert done and done[-1].levelno == logging.WARNING and "failed=broken-platform" in done[-1].getMessage()
    assert running.ask(req())["time_limit"] == 70


# --- F9: configured partitions Slurm does not have ----------------------------------------------------

def _slurm(names):
    def lookup():
        return [PartitionInfo(n, max_time_minutes=60, default_time_minutes=None, nodes=1,
                              node_list="dev001", gpus_per_node=4, is_default=(n == names[0]))
                for n in names]
    return lookup


def _unknown(caplog) -> dict:
    return {r.getMessage().split("partition=")[1].split()[0]: r for r in events(caplog, "partition_unknown")}


def test_start_warns_about_partitions_slurm_does_not_have(monkeypatch, caplog):
    monkeypatch.setitem(fakes.BACKENDS, "slurm_partitions", _slurm(["gpu", "h1000", "debug"]))
    d = RunningDaemon()
    try:
        found = until(lambda: len(_unknown(caplog)) == 2 and _unknown(caplog), what="the warnings")
        assert set(found) == {"h100", "broken"}
        assert all(r.levelno == logging.WARNING for r in found.values())
        assert "did_you_mean=h1000" in found["h100"].getMessage()
        assert "where=partitions.h100" in found["h100"].getMessage()
        assert "did_you_mean=-" in found["broken"].getMessage()
    finally:
        d.stop()


def test_a_reload_warns_about_a_misspelt_watch_partition(monkeypatch, caplog):
    monkeypatch.setitem(fakes.BACKENDS, "slurm_partitions",
                        _slurm(["gpu", "h100", "broken", "watch", "watchshort"]))
    d = RunningDaemon()
    try:
        time.sleep(0.2)
        assert not _unknown(caplog)
        with open(d.config_file, "a") as fh:
            fh.write('\n[watch]\nenabled = true\npartitions = ["gpu", "watchshrt"]\n')
        d.call(d.server.reload)
        found = until(lambda: _unknown(caplog), what="the warning")
        msg = found["watchshrt"].getMessage()
        assert "where=watch.partitions" in msg and "did_you_mean=watchshort" in msg
    finally:
        d.stop()


def test_without_a_user_socket_the_daemon_asks_slurm_itself(monkeypatch, caplog):
    monkeypatch.setattr(conftest, "CONFIG", conftest.CONFIG.replace('user_socket = "{dir}/u.sock"\n', ""))
    monkeypatch.setitem(fakes.BACKENDS, "slurm_partitions", _slurm(["gpu", "h100", "brokn"]))
    d = RunningDaemon()
    try:
        assert not d.user_socket
        found = until(lambda: _unknown(caplog), what="the warning")
        assert set(found) == {"broken"} and "did_you_mean=brokn" in found["broken"].getMessage()
    finally:
        d.stop()


def test_an_unreachable_slurm_leaves_names_unchecked(monkeypatch, caplog):
    def down():
        raise SlurmError("scontrol show partition: Unable to contact slurm controller")
    monkeypatch.setitem(fakes.BACKENDS, "slurm_partitions", down)
    d = RunningDaemon()
    try:
        until(lambda: events(caplog, "partitions_unchecked"), what="the note")
        assert not _unknown(caplog)
        assert d.ask(req())["status"] == "ok"
    finally:
        d.stop()
