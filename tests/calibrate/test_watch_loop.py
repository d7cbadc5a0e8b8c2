"""What a QA tester acting as an admin found in `perf-calibrate watch` (QA admin 1, 3):

1. `watch --every N` re-reads perfcast.toml before a pass when the file changed: `[watch] enabled =
   false` stops it changing limits (the loop goes on, so re-enabling works), a moved `[daemon]
   records` is followed, a file that no longer loads keeps the previous configuration (said once
   per change; the loop then ends with the warnings' exit status), SIGHUP re-reads it, SIGTERM ends
   the loop between passes;
3. a limit set below the job's TimeMin: Slurm takes the TimeMin given with it (or refuses the
   limit) but changes no running job's TimeMin, and the reason says so.

The loop's sleep is the test's: each pass is followed by the next step, so nothing depends on the
machine's speed.  Against the stand-in Slurm client of test_watch.py, a real record store, real logs.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

import calibrate.cli as cli
import calibrate.watch as watch
from calibrate.cli import main
from calibrate.watch import WatchOptions, watch_once

from .test_watch import POLICY, FakeSlurm, megatron_log, record, running, site  # noqa: F401

WATCH = ("[watch]\nenabled = {enabled}\nmargin = 0.1\nmargin_minutes = 1\nshrink_min_minutes = 2\n"
         "min_samples = 3\nmax_growth = 10\n")


class Stop(Exception):
    """Ends a loop from the test's sleep (without a signal)."""


def write_config(path: Path, records: Path, *, enabled: bool = True, text: "str | None" = None) -> None:
    """perfcast.toml, replaced as an editor saving it would; its mtime moved on explicitly, so that a
    change is a change on any file system's timestamp granularity."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text if text is not None else
                   f'[daemon]\nrecords = "{records}"\n' + WATCH.format(enabled=str(enabled).lower()))
    os.utime(tmp, ns=(before + 10**9, before + 10**9))
    os.replace(tmp, path)


@pytest.fixture
def loop(site, monkeypatch):
    """``perf-calibrate watch --every 1`` (the real CLI; records from perfcast.toml) against the
    stand-in Slurm ``slurm``, with ``steps[i]`` run in place of the sleep after pass i."""
    tmp, store = site
    cfg = tmp / "perfcast.toml"
    write_config(cfg, tmp / "records.sqlite")
    monkeypatch.delenv("PERFCAST_CONFIG", raising=False)
    holder: dict = {}
    monkeypatch.setattr(watch, "SlurmClient", lambda *a, **k: holder["slurm"])

    def run(slurm: FakeSlurm, steps) -> int:
        holder["slurm"] = slurm
        todo = iter(steps)
        monkeypatch.setattr(cli._WatchLoop, "nap", staticmethod(lambda seconds: next(todo)()))
        return main(["watch", "--every", "1", "--config", str(cfg), "--out", str(tmp / "runs")])
    return tmp, store, cfg, run


def slow_job(tmp: Path, store, job_id: int = 11):
    """A job 2x slower than predicted under perfcast's 10 minutes: a pass extends it to 19."""
    rid = store.add(record(time_limit_minutes=10))
    megatron_log(tmp / "slow.out", 1.0, 200)
    return running(rid, job_id, tmp / "slow.out", limit_min=10, start=time.time() - 200, run_seconds=200.0)


def send(sig: int) -> None:
    """Signal this process, as systemctl would -- only when the watch handles it (else the test fails
    rather than the signal killing pytest)."""
    assert signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN, None), f"{sig!r} is not handled"
    os.kill(os.getpid(), sig)


def test_the_loop_rereads_perfcast_toml_when_it_changes(loop, capsys):
    tmp, store, cfg, run = loop
    slurm = FakeSlurm([slow_job(tmp, store)])
    seen: list[dict] = []

    def after(write=None):
        def step():
            seen.append(dict(slurm.limits))
            slurm.limits.clear()
            if write:
                write()
        return step

    def stop():
        seen.append(dict(slurm.limits))
        raise Stop()
    with pytest.raises(Stop):
        run(slurm, [after(lambda: write_config(cfg, tmp / "records.sqlite", enabled=False)),  # pass 1: extends
                    after(lambda: write_config(cfg, tmp / "records.sqlite", text="[watch\nenabled = true\n")),
                    after(),                                      # pass 3: the broken file, unchanged
                    after(lambda: write_config(cfg, tmp / "records.sqlite", enabled=True)),
                    stop])                                        # pass 5: enabled again
    # Extended, then not touched while disabled (the broken file kept the disabled configuration),
    # then extended again once re-enabled: each pass after a change worked with the file as it was.
    assert seen == [{11: 19}, {}, {}, {}, {11: 19}], seen
    err = capsys.readouterr().err
    assert err.count(f"re-read {cfg}: [watch] enabled = false: not watching (the loop goes on") == 1, err
    # The file that no longer loads: said once (one change), with what it does instead.
    assert err.count("keeping the configuration read before") == 1, err
    assert f"{cfg}: not valid TOML" in err and f"re-read {cfg}: watching" in err


def test_a_moved_record_store_is_followed(loop, capsys):
    """`[daemon] records` moved (the store with it, the daemon reloaded): the next pass reads the
    store where it is now, not the old path (where every record would be "missing")."""
    tmp, store, cfg, run = loop
    slurm = FakeSlurm([slow_job(tmp, store)])
    store.close()
    moved = tmp / "moved" / "records.sqlite"

    def move():
        moved.parent.mkdir()
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{tmp / 'records.sqlite'}{suffix}").exists():
                shutil.move(f"{tmp / 'records.sqlite'}{suffix}", f"{moved}{suffix}")
        write_config(cfg, moved)

    def stop():
        raise Stop()
    with pytest.raises(Stop):
        run(slurm, [move, stop])
    out = capsys.readouterr()
    assert "from its AdminComment" not in out.out and "record store" not in out.err, (out.out, out.err)
    assert not (tmp / "records.sqlite").exists() and moved.exists()
    assert out.out.count("job 11 (gpu, alice): extend 00:10:00 -> 00:19:00") == 2, out.out


def test_sighup_rereads_and_sigterm_ends_the_loop_with_the_warnings_status(loop, capsys):
    tmp, store, cfg, run = loop
    slurm = FakeSlurm([])
    steps = [lambda: send(signal.SIGHUP),                         # the file unchanged: read again
             lambda: write_config(cfg, tmp / "records.sqlite", text="[watch]\nenabled = maybe\n"),
             lambda: send(signal.SIGTERM)]
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    # A change that does not load stands at the end: the loop exits as a pass with a warning does.
    assert run(slurm, steps) == watch.WARNINGS_EXIT_STATUS == 3
    err = capsys.readouterr().err
    assert f"re-read {cfg} (SIGHUP): watching" in err and "keeping the configuration read before" in err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before   # put back
    # Fixed again before the end: 0.  (A file that does not load at the start stops the watch: 2.)
    write_config(cfg, tmp / "records.sqlite")
    assert run(slurm, [lambda: write_config(cfg, tmp / "records.sqlite", text="[watch\n"),
                       lambda: write_config(cfg, tmp / "records.sqlite"), lambda: send(signal.SIGTERM)]) == 0
    write_config(cfg, tmp / "records.sqlite", text="[watch\n")
    assert run(slurm, []) == 2


def test_one_pass_says_a_disabled_watch_does_nothing(site, capsys, monkeypatch):
    tmp, store = site
    cfg = tmp / "perfcast.toml"
    write_config(cfg, tmp / "records.sqlite", enabled=False)
    slurm = FakeSlurm([slow_job(tmp, store)])
    monkeypatch.setattr(watch, "SlurmClient", lambda *a, **k: slurm)
    assert main(["watch", "--config", str(cfg), "--out", str(tmp / "runs")]) == 0
    assert f"[watch] enabled = false in {cfg}: not watching" in capsys.readouterr().err
    assert not slurm.limits


# ------------------------------------------------------------------------------ 3. TimeMin

def test_a_limit_below_the_time_min_says_that_slurm_keeps_the_time_min(site):
    """Slurm 22.05 (the dev cluster): `scontrol update JobId=N TimeMin=4 TimeLimit=4` of a running
    job with TimeMin 10 sets TimeLimit 4 and leaves TimeMin 10 (slurmctld changes only a pending
    job's); without the TimeMin the limit is refused.  Requeued, the job restarted with its TimeMin
    as its limit (backfill's _reset_job_time_limit: 3 -> 10)."""
    tmp, store = site
    now = time.time()
    fast = store.add(record(time_limit_minutes=60, time_min_minutes=50))
    megatron_log(tmp / "fast.out", 0.1, 200)                  # 5x faster: shrunk far below 50 min
    slurm = FakeSlurm([running(fast, 12, tmp / "fast.out", limit_min=60, start=now - 20, time_min_minutes=50)])
    (rep,) = watch_once(WatchOptions(records=tmp / "records.sqlite", policy=POLICY, out_dir=None), slurm,
                        now=now).jobs
    assert rep.decision.action == "shrink" and rep.applied
    assert slurm.time_mins[12] == slurm.limits[12] < 50          # named in the same update
    assert rep.decision.reason.endswith("; its TimeMin stays 00:50:00 (Slurm changes no running job's TimeMin; "
                                        "requeued, the job restarts with at least it)"), rep.decision.reason
    assert "its TimeMin stays 00:50:00" in slurm.comments[12]
