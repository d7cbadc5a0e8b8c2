"""`perf-calibrate run` stopped by Ctrl-C or SIGTERM: one clean line, what was measured kept.

Ctrl-C reaches every process of the terminal's foreground group, and `scancel` or a Slurm time
limit signals every process of the step: the spawned workers get the signal too.  A worker that
was still importing torch printed a KeyboardInterrupt traceback, and SIGTERM killed the run at once
(exit 143 from the signal itself, the queues' semaphores reported leaked, workers left to
themselves).  Real runs of the tiny plan in a subprocess of their own session (what a terminal or
Slurm signals); every wait is for something the run shows (a worker process, a sample row), not a
fixed time, so a slow machine only makes them slower.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("torch", reason="measuring needs torch (the calibrate extra)")
if not Path("/proc/self/stat").exists() or not hasattr(os, "killpg"):
    pytest.skip("finds the run's workers in /proc and signals process groups (Linux)", allow_module_level=True)

INTERRUPTED = "perf-calibrate: interrupted (a run resumes where it stopped)"
TERMINATED = "perf-calibrate: terminated (SIGTERM; a run resumes where it stopped)"
WAIT_S = 300.0      # for a run to show progress; the tiny plan takes ~30 s on 2 shared cores


class Run:
    """One `perf-calibrate run --plan tiny` in a session of its own, its output in files."""

    def __init__(self, out: Path, logs: Path, name: str):
        self.out = out
        self.stdout_path, self.stderr_path = logs / f"{name}.out", logs / f"{name}.err"
        with open(self.stdout_path, "w") as so, open(self.stderr_path, "w") as se:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "calibrate.cli", "run", "--plan", "tiny", "--out", str(out), "--no-progress"],
                stdout=so, stderr=se, start_new_session=True)
        self.pid = self.proc.pid       # also its session's and process group's id

    def output(self) -> tuple[str, str]:
        return self.stdout_path.read_text(), self.stderr_path.read_text()

    def wait_for(self, what: str, cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not cond():
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before {what}: {self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {WAIT_S:.0f} s: {self.output()}")
            time.sleep(0.02)

    def finish(self, timeout: float = WAIT_S) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout:.0f} s: {self.output()}")
        return (code, *self.output())

    def kill_all(self) -> None:
        """Whatever is left of the session (a failed test's), so that nothing outlives it."""
        for pid in _session_processes(self.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, parent pid, session id) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()     # after "pid (comm) "
    return fields[0], int(fields[1]), int(fields[3])


def _alive(pid: int) -> bool:
    st = _stat(str(pid))
    return st is not None and st[0] != "Z"


def _session_processes(sid: int) -> list[int]:
    """Live processes of the session (zombies awaiting their reaper are not)."""
    out = []
    for d in os.listdir("/proc"):
        st = _stat(d) if d.isdigit() else None
        if st is not None and st[2] == sid and st[0] != "Z":
            out.append(int(d))
    return out


def _spawned_workers(parent: int) -> list[int]:
    """The parent's children started by multiprocessing's spawn (not its resource tracker)."""
    out = []
    for d in os.listdir("/proc"):
        st = _stat(d) if d.isdigit() else None
        if st is None or st[1] != parent or st[0] == "Z":
            continue
        try:
            if b"spawn_main" in Path(f"/proc/{d}/cmdline").read_bytes():
                out.append(int(d))
        except OSError:
            pass
    return out


def _importing_torch(pid: int) -> bool:
    """torch's libraries are mapped: the process is in torch's import, which takes seconds more
    (earlier, the interpreter is starting up and a SIGINT kills it without a word)."""
    try:
        return b"libtorch" in Path(f"/proc/{pid}/maps").read_bytes()
    except OSError:
        return False


def _rows(out: Path, kind: str) -> int:
    """Sample rows in the store's ``kind`` CSVs (operators, collectives), headers not counted."""
    n = 0
    for f in (out / kind).glob("*.csv") if (out / kind).is_dir() else ():
        n += max(0, sum(1 for line in f.read_text().splitlines() if line.strip()) - 1)
    return n


def _assert_clean(code: int, err: str, want_code: int, line: str, run: Run) -> None:
    assert code == want_code, (code, err)
    for bad in ("Traceback", "KeyboardInterrupt", "leaked semaphore", "resource_tracker", "torn"):
        assert bad not in err, err
    lines = err.strip().splitlines()
    assert lines[-1] == line and err.count(line) == 1, err
    # Before it only the plan and its cost (announced at the start), nothing from the workers.
    assert all(x.startswith(("plan tiny:", "estimated cost:")) for x in lines[:-1]), err
    # The workers ignore the signal and are stopped by the run: none is left once it has ended.
    deadline = time.monotonic() + 60
    while _session_processes(run.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _session_processes(run.pid), "processes of the run outlived it"


def test_ctrl_c_and_sigterm_stop_cleanly_and_the_run_resumes(tmp_path):
    out = tmp_path / "samples"
    runs: list[Run] = []
    try:
        # 1. Ctrl-C (SIGINT to the whole group) while the operator workers start: they import
        #    torch for seconds, and that is where a worker's KeyboardInterrupt traceback came from.
        a = Run(out, tmp_path, "ctrl-c")
        runs.append(a)
        a.wait_for("operator worker importing torch",
                   lambda: any(_importing_torch(w) for w in _spawned_workers(a.pid)))
        # The run kills its workers as soon as it sees the interrupt, which often hid what a
        # worker did with it; a run slower to act (a busy node) showed it.  So the workers get
        # theirs first, and a moment (they live on: they leave it to the run), then the group.
        workers = _spawned_workers(a.pid)
        for w in workers:
            os.kill(w, signal.SIGINT)
        deadline = time.monotonic() + 2.0
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            os.killpg(a.pid, signal.SIGINT)
        except ProcessLookupError:      # the run already ended (a worker's death ended it)
            pass
        code, _, err = a.finish()
        _assert_clean(code, err, 130, INTERRUPTED, a)

        # 2. Resumed, then SIGTERM to the whole group (scancel, a time limit) while collectives are
        #    measured, by workers of the collectives' own (calibrate.collectives).
        b = Run(out, tmp_path, "sigterm")
        runs.append(b)
        b.wait_for("collective sample", lambda: _rows(out, "collectives") > 0)
        os.killpg(b.pid, signal.SIGTERM)
        code, _, err = b.finish()
        _assert_clean(code, err, 143, TERMINATED, b)
        kept = _rows(out, "operators") + _rows(out, "collectives")
        assert _rows(out, "operators") > 0 and kept > 0

        # 3. Resumed to the end: what the two runs measured is kept, nothing is measured twice.
        c = Run(out, tmp_path, "resume")
        runs.append(c)
        code, stdout, err = c.finish()
        assert code == 0, (stdout, err)
        assert "Traceback" not in err and "torn" not in err, err
        m = re.search(r"(\d+) operator and (\d+) collective points measured, (\d+) already there", stdout)
        assert m and stdout.rstrip().endswith("complete"), stdout
        measured, already = int(m.group(1)) + int(m.group(2)), int(m.group(3))
        assert already == kept > 0
        assert _rows(out, "operators") + _rows(out, "collectives") == measured + already
    finally:
        for r in runs:
            r.kill_all()


def test_sigterm_to_the_run_alone_stops_its_workers(tmp_path):
    """`kill PID` (systemd, a shell): only the run gets SIGTERM; it stops the workers itself."""
    out = tmp_path / "samples"
    run = Run(out, tmp_path, "kill")
    try:
        run.wait_for("operator sample", lambda: _rows(out, "operators") > 0)
        os.kill(run.pid, signal.SIGTERM)
        code, _, err = run.finish()
        _assert_clean(code, err, 143, TERMINATED, run)
        from predictor.samples import load_samples
        assert sum(len(t) for t in load_samples(out).operators.values()) == _rows(out, "operators") > 0
    finally:
        run.kill_all()
