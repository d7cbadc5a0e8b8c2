"""perf-predictd under bursty and hostile load (issue 15), and its memory.

    python benchmarks/bench_daemon.py                  # every check below, with PASS/FAIL lines
    python benchmarks/bench_daemon.py --only load      # one of: load burst50 hostile memory
    python benchmarks/bench_daemon.py --classic        # the older open/hot/cold latency phases
    python benchmarks/bench_daemon.py --fake           # fake backends (tests/daemon/fakes.py)
    python benchmarks/bench_daemon.py --tree /tmp/old --workers 4   # another checkout's daemon

Each check starts the real daemon (python -m slurm_plugin.daemon, as the systemd unit runs it) on
a temporary socket with one partition per platform and drives it from this process (asyncio, one
connection per submission, as job_submit.lua does).  "Answered in time" means: status ok, and the
answer arrived within --client-deadline-ms (300: job_submit.lua's timeout) of the send.

  load     N distinct, uncached submissions sent at once, N = 1, 10, 50, 200 (--rounds times
           each, on one warm daemon): p50/p99 latency, the answers, the share with any answer
           within the deadline (ok, or skip/busy said at once) and the share answered ok in time,
           the daemon's memory before and after
  burst50  on a fresh daemon, 50 distinct uncached submissions at once: target >= 45 answered
           ok in time (--bursts fresh daemons; every one must pass)
  hostile  four scripts each carrying a 1 MiB `#SBATCH --comment=xxx...` line, then ten ordinary
           uncached submissions 0.3 s apart: target every one answered ok in time; then SIGTERM
           while four more 1 MiB scripts and 50 submissions are in flight: target exit < 2 s
           (issue: 1 s)
  memory   --memory-requests submissions (a third repeats, the rest distinct) at 8 in flight,
           twice: a warm-up round, then a measured one: main process RSS and the PSS of daemon +
           workers before and after the measured round (target: flat, i.e. growth < 10 %; and the
           main process at most 150 MB RSS -- issue 11, measured with every shipped platform:
           --platforms all)

Timings depend on the machine: the figures in the issue were taken on a 2-core VM.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from slurm_plugin.daemon.protocol import ask_daemon_async

REPO = Path(__file__).resolve().parents[1]
SCRIPT = (REPO / "tests" / "slurm" / "scripts" / "megatron_gpt.sh").read_text()
MIB = 1 << 20
MAX_MAIN_RSS_MB = 150      # issue 11: a daemon with every shipped platform loaded


# ------------------------------------------------------------------------------------------------
# the daemon under test

TREE = REPO      # --tree: run the daemon from another checkout (before/after comparisons)


class Daemon:
    def __init__(self, platforms: list[str], deadline_ms: int, fake: bool, workers: int = 0):
        self.dir = tempfile.mkdtemp(prefix="pcbench", dir="/tmp")
        self.platforms = platforms
        cfg = Path(self.dir) / "perfcast.toml"
        parts = "".join(f'[partitions.p{i}]\nplatform = "{p}"\n' for i, p in enumerate(platforms))
        cfg.write_text(f'[daemon]\nsocket = "{self.dir}/d.sock"\nslurm_user = "root"\n'
                       f'deadline_ms = {deadline_ms}\n' + (f"workers = {workers}\n" if workers else "")
                       + f'[defaults]\n{parts}')
        mod = "tests.daemon.fakes" if fake else "slurm_plugin.daemon"
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", mod, "--config", str(cfg), "--pid-file", f"{self.dir}/pid",
             "--log-file", f"{self.dir}/log"], cwd=str(TREE),
            env={**os.environ, "MALLOC_ARENA_MAX": "2"})   # as the systemd unit
        while not os.path.exists(f"{self.dir}/pid"):
            if self.proc.poll() is not None:
                print(self.log(), file=sys.stderr)
                raise SystemExit("daemon exited")
            time.sleep(0.02)
        self.ready_s = time.perf_counter() - t0
        self.sock = f"{self.dir}/d.sock"

    def log(self) -> str:
        p = Path(self.dir) / "log"
        return p.read_text() if p.exists() else ""

    def pids(self) -> list[int]:
        kids = []
        try:
            for t in os.listdir(f"/proc/{self.proc.pid}/task"):
                with open(f"/proc/{self.proc.pid}/task/{t}/children") as fh:
                    kids += [int(x) for x in fh.read().split()]
        except OSError:
            pass
        return [self.proc.pid] + kids

    def memory(self) -> dict[str, float]:
        """Main process VmRSS / VmHWM and the PSS of the daemon and its workers together (MB)."""
        out = {"main_rss": _status_mb(self.proc.pid, "VmRSS"),
               "main_hwm": _status_mb(self.proc.pid, "VmHWM")}
        pids = self.pids()
        out["workers"] = len(pids) - 1
        out["total_pss"] = sum(_pss_mb(p) for p in pids)
        out["total_rss"] = sum(_status_mb(p, "VmRSS") for p in pids)
        return {k: round(v, 1) for k, v in out.items()}

    def stop(self) -> float:
        """SIGTERM; seconds until the process has exited."""
        t0 = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.perf_counter() - t0

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _status_mb(pid: int, key: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


# ------------------------------------------------------------------------------------------------
# the client

_seq = iter(range(10**9))


def payload(platforms: list[str], *, iters: Optional[int] = None, extra: str = "") -> bytes:
    """A distinct (uncached) submission unless ``iters`` is given."""
    i = next(_seq)
    n = iters if iters is not None else 100_000 + i
    script = SCRIPT.replace("@ITERS@", str(n))
    if extra:
        script = script.replace("#SBATCH", extra + "\n#SBATCH", 1)
    return (json.dumps({"format": "lines", "script": script, "submit_uid": 0, "submit_gid": 0,
                        "work_dir": "/tmp", "argv": ["/tmp/job.sh"],
                        "partition": f"p{i % len(platforms)}"}) + "\n").encode()


async def one(sock: str, data: bytes, timeout: float = 10.0) -> tuple[float, dict[str, str]]:
    t0 = time.perf_counter()
    answer = await ask_daemon_async(sock, data, timeout)
    return time.perf_counter() - t0, answer


async def burst(sock: str, datas: list[bytes]) -> list[tuple[float, dict[str, str]]]:
    return await asyncio.gather(*(one(sock, d) for d in datas))


def key(ans: dict[str, str]) -> str:
    s = ans.get("status", "?")
    return s if s == "ok" else f"{s}/{ans.get('reason', '')}"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))] if s else float("nan")


def in_time(results, limit_s: float) -> int:
    return sum(1 for dt, a in results if a.get("status") == "ok" and dt <= limit_s)


def counts(results) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, a in results:
        out[key(a)] = out.get(key(a), 0) + 1
    return dict(sorted(out.items()))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ------------------------------------------------------------------------------------------------
# the checks

def check_load(args, platforms) -> bool:
    d = Daemon(platforms, args.deadline_ms, args.fake, args.workers)
    limit = args.client_deadline_ms / 1000
    try:
        asyncio.run(burst(d.sock, [payload(platforms) for _ in platforms]))   # first use per platform
        mem0 = d.memory()
        print(f"load: daemon ready in {d.ready_s:.2f} s, {mem0['workers']} workers; memory before: {mem0}")
        print(f"  {'N':>4} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'answered':>9} {'ok':>7}  answers"
              f"   (answered/ok: share within {args.client_deadline_ms} ms)")
        for n in args.levels:
            results = []
            for _ in range(args.rounds):
                results += asyncio.run(burst(d.sock, [payload(platforms) for _ in range(n)]))
                time.sleep(0.5)
            ms = [dt * 1e3 for dt, _ in results]
            share = in_time(results, limit) / len(results)
            answered = sum(1 for dt, a in results if dt <= limit and a.get("status") in
                           ("ok", "skip", "error")) / len(results)
            print(f"  {n:>4} {pct(ms, 50):8.1f} {pct(ms, 99):8.1f} {max(ms):8.1f} {100 * answered:8.1f}% "
                  f"{100 * share:6.1f}%  {counts(results)}")
        print(f"  memory after: {d.memory()}")
    finally:
        d.close()
    return True


def check_burst50(args, platforms) -> bool:
    limit = args.client_deadline_ms / 1000
    good = True
    for k in range(args.bursts):
        d = Daemon(platforms, args.deadline_ms, args.fake, args.workers)
        try:
            results = asyncio.run(burst(d.sock, [payload(platforms) for _ in range(50)]))
        finally:
            d.close()
        n_ok = in_time(results, limit)
        ms = [dt * 1e3 for dt, _ in results]
        good &= n_ok >= 45
        print(f"burst50 #{k + 1} (fresh daemon): {n_ok}/50 ok within {args.client_deadline_ms} ms "
              f"(p50 {pct(ms, 50):.1f} ms, p99 {pct(ms, 99):.1f} ms, max {max(ms):.1f} ms) "
              f"{counts(results)}  target >= 45: {verdict(n_ok >= 45)}")
    return good


def check_hostile(args, platforms) -> bool:
    limit = args.client_deadline_ms / 1000
    comment = "#SBATCH --comment=" + "x" * MIB
    d = Daemon(platforms, args.deadline_ms, args.fake, args.workers)
    try:
        hostile = asyncio.run(burst(d.sock, [payload(platforms, extra=comment) for _ in range(4)]))
        print(f"hostile: four 1 MiB #SBATCH lines answered in "
              f"{', '.join(f'{dt * 1e3:.0f}' for dt, _ in hostile)} ms: {counts(hostile)}")

        async def spaced() -> list:
            out = []
            for _ in range(10):
                t0 = time.perf_counter()
                out.append(await one(d.sock, payload(platforms)))
                await asyncio.sleep(max(0.0, 0.3 - (time.perf_counter() - t0)))
            return out
        ordinary = asyncio.run(spaced())
        n_ok = in_time(ordinary, limit)
        print(f"  then 10 ordinary submissions 0.3 s apart: {n_ok}/10 ok within "
              f"{args.client_deadline_ms} ms (max {max(dt for dt, _ in ordinary) * 1e3:.1f} ms) "
              f"{counts(ordinary)}  target 10/10: {verdict(n_ok == 10)}")

        async def busy_then_term() -> float:
            tasks = [asyncio.ensure_future(one(d.sock, payload(platforms, extra=comment)))
                     for _ in range(4)]
            tasks += [asyncio.ensure_future(one(d.sock, payload(platforms))) for _ in range(50)]
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            d.proc.send_signal(signal.SIGTERM)
            while d.proc.poll() is None and time.perf_counter() - t0 < 30:
                await asyncio.sleep(0.005)
            took = time.perf_counter() - t0
            await asyncio.gather(*tasks)
            return took
        stop_s = asyncio.run(busy_then_term())
        print(f"  SIGTERM with 54 submissions in flight: exited in {stop_s:.3f} s "
              f"(code {d.proc.returncode})  target < 2 s: {verdict(stop_s < 2.0)}")
        return n_ok == 10 and stop_s < 2.0
    finally:
        d.close()


def check_memory(args, platforms) -> bool:
    d = Daemon(platforms, args.deadline_ms, args.fake, args.workers)
    try:
        asyncio.run(burst(d.sock, [payload(platforms) for _ in platforms]))
        start = d.memory()

        async def run(total: int, clients: int = 8) -> dict:
            seen: dict[str, int] = {}
            it = iter(range(total))

            async def worker():
                for i in it:
                    data = payload(platforms, iters=1000 + i % 50) if i % 3 == 0 else payload(platforms)
                    _, a = await one(d.sock, data)
                    seen[key(a)] = seen.get(key(a), 0) + 1
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(clients)))
            seen["_seconds"] = round(time.perf_counter() - t0, 1)
            return seen
        # A first round fills what is meant to fill once (the answer cache, the allocator's
        # arenas, the workers' copies of touched pages: some 10 MB, whatever the platforms); a
        # leak grows in the second, measured round as well.
        warm = asyncio.run(run(args.memory_requests))
        before = d.memory()
        answers = asyncio.run(run(args.memory_requests))
        after = d.memory()
    finally:
        d.close()
    growth = (after["total_pss"] - before["total_pss"]) / max(1.0, before["total_pss"])
    main_growth = (after["main_rss"] - before["main_rss"]) / max(1.0, before["main_rss"])
    print(f"memory: {args.memory_requests} submissions to warm up {warm}, then {args.memory_requests} "
          f"measured {answers}")
    print(f"  start:  {start}")
    print(f"  before: {before}   (after the warm-up round)")
    print(f"  after:  {after}")
    ok = growth < 0.10 and main_growth < 0.10
    print(f"  growth in the measured round: main RSS {100 * main_growth:+.1f} %, daemon+workers PSS "
          f"{100 * growth:+.1f} %  target < 10 %: {verdict(ok)}")
    small = after["main_rss"] <= MAX_MAIN_RSS_MB
    print(f"  main RSS {after['main_rss']:.1f} MB with {len(platforms)} platforms loaded  "
          f"target <= {MAX_MAIN_RSS_MB} MB: {verdict(small)}")
    return ok and small


# ------------------------------------------------------------------------------------------------
# the older phases (issue 4): latency at N clients in a closed and an open loop

def classic(args, platforms) -> None:
    d = Daemon(platforms, args.deadline_ms, args.fake, args.workers)
    print(f"daemon ready in {d.ready_s:.2f} s with {platforms}; memory after load: {d.memory()}")

    def report(name: str, results, seconds: float) -> None:
        ms = [dt * 1e3 for dt, _ in results]
        print(f"{name:5s} n={len(ms):5d}  p50={pct(ms, 50):7.2f} ms  p90={pct(ms, 90):7.2f} ms  "
              f"p99={pct(ms, 99):7.2f} ms  max={max(ms):7.2f} ms  mean={statistics.fmean(ms):7.2f} ms  "
              f"{seconds:.1f} s  {counts(results)}")

    async def closed(total: int, make: Callable[[int], bytes]) -> tuple[list, float]:
        results: list = []
        it = iter(range(total))

        async def worker():
            for i in it:
                results.append(await one(d.sock, make(i)))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.clients)))
        return results, time.perf_counter() - t0

    try:
        asyncio.run(closed(len(platforms), lambda i: payload(platforms, iters=2000)))
        res, s = asyncio.run(closed(args.requests, lambda i: payload(platforms, iters=2000)))
        report("hot", res, s)
        res, s = asyncio.run(closed(args.cold_requests, lambda i: payload(platforms)))
        report("cold", res, s)
        print(f"memory after the runs: {d.memory()}")
    finally:
        d.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("load", "burst50", "hostile", "memory"), action="append")
    ap.add_argument("--levels", default="1,10,50,200")
    ap.add_argument("--rounds", type=int, default=3, help="load: bursts per level")
    ap.add_argument("--bursts", type=int, default=3, help="burst50: fresh daemons")
    ap.add_argument("--memory-requests", type=int, default=5000)
    ap.add_argument("--platforms", default="perlmutter-a100,dgx-h100",
                    help="comma-separated platform names, or 'all' (every shipped platform)")
    ap.add_argument("--deadline-ms", type=int, default=250, help="the daemon's deadline_ms")
    ap.add_argument("--client-deadline-ms", type=int, default=300, help="job_submit.lua's timeout")
    ap.add_argument("--workers", type=int, default=0, help="0: the default, one per usable core")
    ap.add_argument("--fake", action="store_true", help="fake backends (tests/daemon/fakes.py)")
    ap.add_argument("--classic", action="store_true", help="the hot/cold closed-loop phases")
    ap.add_argument("--tree", help="run the daemon from this checkout instead (e.g. a `git archive "
                                   "HEAD` of an older version, for a before/after comparison)")
    ap.add_argument("--clients", type=int, default=50, help="classic: connections in flight")
    ap.add_argument("--requests", type=int, default=2000, help="classic: hot requests")
    ap.add_argument("--cold-requests", type=int, default=200, help="classic: cold requests")
    args = ap.parse_args()
    args.levels = [int(x) for x in args.levels.split(",") if x]
    if args.tree:
        global TREE
        TREE = Path(args.tree).resolve()
    platforms = [p for p in args.platforms.split(",") if p]
    if platforms == ["all"]:
        shipped = TREE / "predictor" / "platforms"
        platforms = sorted(p.name for p in shipped.iterdir() if (p / "platform.toml").is_file())
    print(f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), platforms {platforms}, "
          f"daemon deadline {args.deadline_ms} ms, in time = ok within {args.client_deadline_ms} ms")
    if args.classic:
        classic(args, platforms)
        return 0
    checks = {"load": check_load, "burst50": check_burst50, "hostile": check_hostile,
              "memory": check_memory}
    results = {name: fn(args, platforms) for name, fn in checks.items()
               if not args.only or name in args.only}
    print("overall:", verdict(all(results.values())))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
