"""perf-predictd against an unlucky admin and a hostile user (issue 32): the record store's faults,
kills, orphaned readers, request size.  Each probe prints one line of numbers.

    python benchmarks/bench_faults.py                       # every probe, this checkout
    python benchmarks/bench_faults.py --only kill9 --only lock
    python benchmarks/bench_faults.py --tree /tmp/old       # another checkout's daemon (before/after:
                                                            #   git archive COMMIT | tar -x -C /tmp/old)

The daemon runs as its own process (``python -m tests.daemon.fakes``: the real server, pool, reader
and record store with the fake parser/predictor of tests/daemon/fakes.py, so only the daemon's own
code is measured) with ``[daemon] records`` set, from the checkout under test.  Needs root for the
probes that make the store immutable (chattr +i) or mount it read-only (a bind mount, as systemd's
ProtectSystem=strict does); they are reported as skipped otherwise.

  shm       chattr +i on records.sqlite-shm while the daemon runs, then 300 submissions: is the
            daemon alive, how many answered
  readonly  the store's directory on a read-only bind mount from the start: answers carrying
            rec=<id>, records stored, losses counted
  kill9     --kill9-requests submissions while another process holds the store locked, kill -9
            right after the last answer, restart, SIGTERM: ids answered vs records stored (and log
            lines for the lost ones)
  lock      an exclusive lock on the store for --lock-s seconds while ~270 submissions/s arrive:
            ids answered vs stored
  rate      --rate-s seconds of submissions as fast as 32 clients go, then SIGTERM at once: rate,
            seconds from SIGTERM to exit, ids answered vs stored (after a restart if any were left)
  fifo      a script naming a FIFO: the worker is killed while its reader blocks; `head` processes
            left (after the kill, and after the daemon stopped), over --fifo-rounds rounds
  corrupt   garbage over pages 2-3 of a store of 500 records, then a restart and 50 submissions:
            is it said (log lines), are answers given
  size      a 3.5 MiB script of here-document JSON (4+ MiB once JSON-escaped): the answer
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from slurm_plugin.daemon.protocol import ask_daemon_async


REPO = Path(__file__).resolve().parents[1]
TREE = REPO
JOB = "#!/bin/bash\n#SBATCH -N 2\n# FAKE iters=1000 iter_s=2.4\nsrun python train.py\n"
REC_RE = re.compile(r"\brec=([0-9a-f]{12})\b")


class Daemon:
    def __init__(self, directory: str, *, deadline_ms: int = 250, extra: str = "",
                 records: Optional[str] = None):
        self.dir = directory
        self.records = records or f"{directory}/store/records.sqlite"
        cfg = Path(directory) / "perfcast.toml"
        cfg.write_text(f'[daemon]\nsocket = "{directory}/d.sock"\nslurm_user = "root"\n'
                       f'deadline_ms = {deadline_ms}\nworkers = 2\nrecords = "{self.records}"\n{extra}'
                       '[defaults]\n[partitions.gpu]\nplatform = "perlmutter-a100"\n')
        self.cfg = cfg
        self.sock = f"{directory}/d.sock"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Daemon":
        for p in (f"{self.dir}/pid",):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.daemon.fakes", "--config", str(self.cfg), "--pid-file",
             f"{self.dir}/pid", "--log-file", f"{self.dir}/log"], cwd=str(TREE),
            env={**os.environ, "PYTHONPATH": str(TREE)})
        end = time.monotonic() + 30
        while not os.path.exists(f"{self.dir}/pid"):
            if self.proc.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"daemon did not start:\n{self.log()[-2000:]}")
            time.sleep(0.02)
        return self

    def log(self) -> str:
        p = Path(self.dir) / "log"
        return p.read_text(errors="replace") if p.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def request(script: str = JOB, **kw) -> bytes:
    body = {"format": "lines", "script": script, "submit_uid": 0, "submit_gid": 0,
            "work_dir": "/tmp", "partition": "gpu", **kw}
    return (json.dumps(body) + "\n").encode()


async def ask(sock: str, data: bytes) -> dict[str, str]:
    return await ask_daemon_async(sock, data)


async def closed_loop(sock: str, seconds: float, clients: int, per_s: Optional[float] = None,
                      total: Optional[int] = None) -> list[dict[str, str]]:
    """Submissions from ``clients`` connections in a loop (each a new job: a new record), for
    ``seconds`` or ``total`` answers, at most ``per_s`` per second over all clients."""
    answers: list[dict[str, str]] = []
    end = time.monotonic() + seconds
    gap = clients / per_s if per_s else 0.0

    async def client() -> None:
        while time.monotonic() < end and (total is None or len(answers) < total):
            t = time.monotonic()
            answers.append(await ask(sock, request()))
            if gap:
                await asyncio.sleep(max(0.0, gap - (time.monotonic() - t)))
    await asyncio.gather(*(client() for _ in range(clients)))
    return answers


def ids_of(answers: list[dict[str, str]]) -> list[str]:
    return [m.group(1) for a in answers if (m := REC_RE.search(a.get("admin_comment", "")))]


def stored(store: str, ids: list[str]) -> int:
    if not os.path.exists(store):
        return 0
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    try:
        have = {r[0] for r in con.execute("SELECT record_id FROM records")}
    except sqlite3.Error:
        return 0
    finally:
        con.close()
    return sum(i in have for i in ids)


def losses(store: str) -> dict[str, int]:
    try:
        con = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
        rows = con.execute("SELECT key, value FROM meta WHERE key LIKE 'lost:%'").fetchall()
        con.close()
    except sqlite3.Error:
        return {}
    return {k[5:]: int(v) for k, v in rows}


def lines(log: str, pattern: str) -> int:
    return len(re.findall(pattern, log))


def counts(answers: list[dict[str, str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in answers:
        k = a.get("status", "?") + ("/" + a["reason"] if a.get("status") != "ok" and a.get("reason") else "")
        out[k] = out.get(k, 0) + 1
    return out


def settle(d: Daemon, ids: list[str], within: float = 20.0) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end and stored(d.records, ids) < len(ids):
        time.sleep(0.2)


# --------------------------------------------------------------------------------------------

def probe_shm(tmp: str, args) -> str:
    d = Daemon(tmp).start()
    shm = d.records + "-shm"
    try:
        first = asyncio.run(closed_loop(d.sock, 30, 4, total=30))
        settle(d, ids_of(first), 5)
        if not os.path.exists(shm):
            return "shm: no -shm file (the store is not in WAL mode here)"
        if subprocess.run(["chattr", "+i", shm], capture_output=True).returncode != 0:
            return "shm: skipped (chattr +i not permitted)"
        try:
            after = asyncio.run(closed_loop(d.sock, 10, 4, per_s=150, total=300))
            time.sleep(2.0)
            alive = d.proc.poll() is None
            late = asyncio.run(closed_loop(d.sock, 5, 2, total=20))
        finally:
            subprocess.run(["chattr", "-i", shm], capture_output=True)
        code = d.stop()
        return (f"shm: daemon {'alive' if alive else 'DEAD'} 2 s after chattr +i (exit {code}); "
                f"300 submissions: {counts(after)}; 20 more: {counts(late)}; writer deaths logged "
                f"{lines(d.log(), 'record_writer_died')}")
    finally:
        d.stop(signal.SIGKILL)


def probe_readonly(tmp: str, args) -> str:
    store_dir = Path(tmp) / "store"
    store_dir.mkdir()
    if subprocess.run(["mount", "--bind", str(store_dir), str(store_dir)], capture_output=True).returncode:
        return "readonly: skipped (bind mount not permitted)"
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(store_dir)], check=True, capture_output=True)
        d = Daemon(tmp).start()
        try:
            answers = asyncio.run(closed_loop(d.sock, 20, 4, total=200))
            time.sleep(2.0)
            log = d.log()
        finally:
            d.stop()
            log = d.log()
        ids = ids_of(answers)
        lost = re.findall(r"records_lost=(\d+)", log)
        return (f"readonly: {counts(answers)}; answers with rec=<id>: {len(ids)}; stored: "
                f"{stored(d.records, ids)}; 'Read-only' errors logged: {lines(log, 'Read-only|not writable')}; "
                f"losses counted at stop: {lost[-1] if lost else '-'}")
    finally:
        subprocess.run(["umount", str(store_dir)], capture_output=True)


def _lock_holder(store: str, seconds: float) -> subprocess.Popen:
    """Another process holding an exclusive lock on the store (until killed or ``seconds``)."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2])); "
        "c.execute('COMMIT')"), store, str(seconds)], stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()
    return holder


def probe_kill9(tmp: str, args) -> str:
    d = Daemon(tmp).start()
    warm = asyncio.run(closed_loop(d.sock, 10, 2, total=10))
    settle(d, ids_of(warm), 5)
    # The store is slow (locked by a harvest, say) while the submissions come: records are queued
    # when the kill comes.
    holder = _lock_holder(d.records, 120)
    answers = asyncio.run(closed_loop(d.sock, 60, 32, total=args.kill9_requests))
    d.stop(signal.SIGKILL)
    holder.kill()
    holder.wait()
    ids = ids_of(answers)
    time.sleep(1.0)
    at_kill = stored(d.records, ids)
    log = d.log()
    d.start()
    time.sleep(3.0)
    d.stop()
    got = stored(d.records, ids)
    return (f"kill9: {len(answers)} answered ({len(ids)} with rec=<id>) while the store was locked, "
            f"kill -9; stored before the restart {at_kill}, after restart + SIGTERM {got}; lost "
            f"{len(ids) - got} (log lines before the restart about dropped/lost records: "
            f"{lines(log, 'dropped|records_lost|not stored')}); losses counted in the store: {losses(d.records)}")


def probe_lock(tmp: str, args) -> str:
    d = Daemon(tmp).start()
    try:
        warm = asyncio.run(closed_loop(d.sock, 10, 2, total=10))
        settle(d, ids_of(warm), 5)
        holder = _lock_holder(d.records, args.lock_s)
        answers = asyncio.run(closed_loop(d.sock, args.lock_s, 8, per_s=270))
        holder.wait()
        ids = ids_of(answers)
        settle(d, ids, 20)
        d.stop()
        got = stored(d.records, ids)
        return (f"lock: {args.lock_s:g} s exclusive lock, {len(answers)} answered ({len(ids)} with "
                f"rec=<id>): stored {got}, lost {len(ids) - got}")
    finally:
        d.stop(signal.SIGKILL)


def probe_rate(tmp: str, args) -> str:
    d = Daemon(tmp).start()
    try:
        t0 = time.monotonic()
        answers = asyncio.run(closed_loop(d.sock, args.rate_s, 32))
        took = time.monotonic() - t0
        ids = ids_of(answers)
        t1 = time.monotonic()
        d.stop()                        # SIGTERM right away: whatever is queued is drained or spooled
        stop_s = time.monotonic() - t1
        if len(ids) > stored(d.records, ids):      # spooled: the next start stores it
            d.start()
            settle(d, ids, 30)
            d.stop()
        got = stored(d.records, ids)
        return (f"rate: {len(answers)} answered in {took:.1f} s ({len(answers) / took:.0f}/s), "
                f"{len(ids)} with rec=<id>: stored {got}, lost {len(ids) - got}; "
                f"'dropped' warnings {lines(d.log(), 'dropped')}; SIGTERM to exit {stop_s:.2f} s")
    finally:
        d.stop(signal.SIGKILL)


def _heads(fifo: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if fifo.encode() in argv and argv and argv[0].endswith(b"head"):
            out.append(int(pid))
    return out


def probe_fifo(tmp: str, args) -> str:
    fifo = f"{tmp}/config.fifo"
    os.mkfifo(fifo)
    left_after_kill = left_after_stop = 0
    for r in range(args.fifo_rounds):
        d = Daemon(tmp, deadline_ms=4000, extra="file_read_timeout_ms = 3000\n").start()
        pidfile = f"{tmp}/worker{r}.pid"
        script = JOB + f"# FAKE config={fifo} pidfile={pidfile}\n"

        async def one() -> dict[str, str]:
            return await ask(d.sock, request(script))

        async def kill_worker_while_reading() -> dict[str, str]:
            task = asyncio.ensure_future(one())
            end = time.monotonic() + 10
            while not (os.path.exists(pidfile) and _heads(fifo)) and time.monotonic() < end:
                await asyncio.sleep(0.02)
            os.kill(int(Path(pidfile).read_text()), signal.SIGKILL)
            return await task
        answer = asyncio.run(kill_worker_while_reading())
        time.sleep(0.5)
        left_after_kill += len(_heads(fifo))
        d.stop()
        time.sleep(0.3)
        left = _heads(fifo)
        left_after_stop += len(left)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return (f"fifo: {args.fifo_rounds} worker kills while reading a FIFO (last answer: "
            f"{answer.get('status')}/{answer.get('reason')}): head readers left 0.5 s after the kill "
            f"{left_after_kill}, after the daemon stopped {left_after_stop}")


def probe_size(tmp: str, args) -> str:
    d = Daemon(tmp, deadline_ms=2000, extra="max_request_bytes = 4194304\n").start()
    try:
        line = '{"key": "value\\twith\\ttabs", "n": 1}\n'
        body = "cat > big.json <<EOF\n" + line * (int(3.5 * (1 << 20)) // len(line)) + "EOF\n"
        script = JOB + body
        data = request(script)
        answer = asyncio.run(ask(d.sock, data))
        return (f"size: script {len(script.encode()) / (1 << 20):.2f} MiB, request {len(data) / (1 << 20):.2f} "
                f"MiB on the wire: status={answer.get('status')} reason={answer.get('reason', '-')}")
    finally:
        d.stop()


def probe_corrupt(tmp: str, args) -> str:
    d = Daemon(tmp).start()
    first = asyncio.run(closed_loop(d.sock, 30, 8, total=500))
    settle(d, ids_of(first), 20)
    d.stop()
    with sqlite3.connect(d.records) as con:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(Path(d.records).read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page: 3 * page] = b"\xa5" * (2 * page)        # garbage over pages 2 and 3
    Path(d.records).write_bytes(bytes(data))
    d.start()
    try:
        answers = asyncio.run(closed_loop(d.sock, 10, 4, total=50))
        time.sleep(3.0)
    finally:
        d.stop()
    log = d.log()
    at_start = log[log.rfind("event=ready"):] if "event=ready" in log else log
    return (f"corrupt: garbage over pages 2-3 of a {len(data) >> 10} KiB store, restart, 50 submissions "
            f"{counts(answers)}: lines saying corrupt/malformed after the restart "
            f"{lines(at_start, 'corrupt|malformed')} (first: "
            f"{next((l[:160] for l in at_start.splitlines() if re.search('corrupt|malformed', l)), '-')})")


PROBES = {"shm": probe_shm, "corrupt": probe_corrupt, "readonly": probe_readonly, "kill9": probe_kill9, "lock": probe_lock,
          "rate": probe_rate, "fifo": probe_fifo, "size": probe_size}


def main() -> int:
    global TREE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=sorted(PROBES), action="append")
    ap.add_argument("--tree", help="run the daemon from this checkout instead")
    ap.add_argument("--kill9-requests", type=int, default=3000)
    ap.add_argument("--lock-s", type=float, default=15.0)
    ap.add_argument("--rate-s", type=float, default=15.0)
    ap.add_argument("--fifo-rounds", type=int, default=3)
    args = ap.parse_args()
    if args.tree:
        TREE = Path(args.tree).resolve()
    print(f"tree: {TREE}  python {sys.version.split()[0]}  sqlite {sqlite3.sqlite_version}  "
          f"cpus {os.cpu_count()}  load {os.getloadavg()[0]:.1f}", flush=True)
    for name in args.only or list(PROBES):
        tmp = tempfile.mkdtemp(prefix="pcf", dir="/tmp")
        try:
            print(PROBES[name](tmp, args), flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
