"""perf-predictd alone: latency at N concurrent clients, and memory with two platforms loaded.

    python benchmarks/bench_daemon.py [--clients 50] [--requests 2000] [--platforms a,b] [--fake]

Starts the real daemon (python -m slurm_plugin.daemon) on a temporary socket with one partition
per platform, waits until it listens, then drives it from one asyncio client process with
``--clients`` connections in flight at all times (closed loop), in two phases:

  open: each client sends one request every 1/--rate s on average (Poisson arrivals): the daemon
        busy but not saturated (200 submissions/s at the defaults, far beyond any slurmctld)
  hot:  closed loop, --clients requests always in flight, the same batch script every time (what resubmissions and job arrays look like; the
        daemon's prediction cache answers after the first)
  cold: every request a different job (train iters vary), so every request runs predict()

and prints p50/p90/p99/max latency per phase and the daemon's RSS (VmRSS, VmHWM).
Targets (issue 4): p99 <= 10 ms at 50 clients; RSS <= 300 MB with two platforms.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = (REPO / "tests" / "slurm" / "scripts" / "megatron_gpt.sh").read_text()


def rss_mb(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    return out


async def one(sock: str, payload: bytes) -> tuple[float, dict]:
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_unix_connection(sock)
    writer.write(payload)
    await writer.drain()
    data = await reader.read()
    writer.close()
    dt = time.perf_counter() - t0
    return dt, json.loads(data)


async def phase(sock: str, clients: int, total: int, payload_for) -> tuple[list[float], dict]:
    lat: list[float] = []
    statuses: dict[str, int] = {}
    counter = iter(range(total))

    async def worker():
        for i in counter:
            dt, ans = await one(sock, payload_for(i))
            lat.append(dt)
            key = ans.get("status", "?") + ("/" + ans.get("reason", "") if ans.get("status") != "ok" else "")
            statuses[key] = statuses.get(key, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    statuses["_seconds"] = round(time.perf_counter() - t0, 2)
    return lat, statuses


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def open_loop(sock: str, clients: int, rate_per_client: float, seconds: float,
                    payload_for) -> tuple[list[float], dict]:
    """``clients`` users, each sending one request every 1/rate s on average (Poisson): the
    latency a request sees when the daemon is busy but not saturated."""
    import random
    lat: list[float] = []
    statuses: dict[str, int] = {}
    end = time.perf_counter() + seconds
    rng = random.Random(1)

    async def user(k: int):
        i = k
        await asyncio.sleep(rng.random() / rate_per_client)
        while time.perf_counter() < end:
            dt, ans = await one(sock, payload_for(i))
            lat.append(dt)
            statuses[ans.get("status", "?")] = statuses.get(ans.get("status", "?"), 0) + 1
            i += clients
            await asyncio.sleep(max(0.0, rng.expovariate(rate_per_client) - dt))

    await asyncio.gather(*(user(k) for k in range(clients)))
    statuses["_seconds"] = seconds
    return lat, statuses


def report(name: str, lat: list[float], statuses: dict) -> None:
    ms = [x * 1e3 for x in lat]
    print(f"{name:5s} n={len(ms):5d}  p50={pct(ms, 50):7.2f} ms  p90={pct(ms, 90):7.2f} ms  "
          f"p99={pct(ms, 99):7.2f} ms  max={max(ms):7.2f} ms  mean={statistics.fmean(ms):7.2f} ms  "
          f"answers={statuses}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=2000, help="per phase")
    ap.add_argument("--cold-requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=4.0, help="open loop: requests/s per client")
    ap.add_argument("--seconds", type=float, default=5.0, help="open loop duration")
    ap.add_argument("--platforms", default="perlmutter-a100,dgx-h100")
    ap.add_argument("--deadline-ms", type=int, default=250)
    ap.add_argument("--fake", action="store_true", help="fake backends (tests/daemon/fakes.py)")
    args = ap.parse_args()

    d = tempfile.mkdtemp(prefix="pcbench", dir="/tmp")
    platforms = [p for p in args.platforms.split(",") if p]
    cfg = Path(d) / "perfcast.toml"
    parts = "".join(f'[partitions.p{i}]\nplatform = "{p}"\n' for i, p in enumerate(platforms))
    cfg.write_text(f'[daemon]\nsocket = "{d}/d.sock"\nslurm_user = "root"\n'
                   f'deadline_ms = {args.deadline_ms}\nworkers = 4\n[defaults]\n{parts}')
    mod = "tests.daemon.fakes" if args.fake else "slurm_plugin.daemon"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", mod, "--config", str(cfg), "--pid-file",
                             f"{d}/pid", "--log-file", f"{d}/log"], cwd=str(REPO),
                            env={**os.environ, "MALLOC_ARENA_MAX": "2"})   # as the systemd unit
    try:
        while not os.path.exists(f"{d}/pid"):
            if proc.poll() is not None:
                print(open(f"{d}/log").read() if os.path.exists(f"{d}/log") else "", file=sys.stderr)
                raise SystemExit("daemon exited")
            time.sleep(0.05)
        print(f"daemon ready in {time.perf_counter() - t0:.2f} s with {platforms}; "
              f"RSS after load: {rss_mb(proc.pid)}")
        sock = f"{d}/d.sock"

        def payload(i: int, iters: int = 2000) -> bytes:
            return (json.dumps({"script": SCRIPT.replace("@ITERS@", str(iters)), "submit_uid": 0,
                                "submit_gid": 0, "work_dir": "/tmp", "argv": ["/tmp/job.sh"],
                                "partition": f"p{i % len(platforms)}"}) + "\n").encode()

        # warm: the first prediction per platform fills the cache
        asyncio.run(phase(sock, 1, len(platforms), payload))
        c0 = cpu_seconds(proc.pid)
        lat, st = asyncio.run(open_loop(sock, args.clients, args.rate, args.seconds, payload))
        report("open", lat, st)
        print(f"      ({args.clients} clients x {args.rate:g} req/s each; daemon CPU "
              f"{(cpu_seconds(proc.pid) - c0) / max(1, len(lat)) * 1e3:.2f} ms per request)")
        lat, st = asyncio.run(phase(sock, args.clients, args.requests, payload))
        report("hot", lat, st)
        lat, st = asyncio.run(phase(sock, args.clients, args.cold_requests,
                                    lambda i: payload(i, 10_000 + i)))
        report("cold", lat, st)
        lat, st = asyncio.run(phase(sock, 1, min(50, args.cold_requests),
                                    lambda i: payload(i, 500_000 + i)))
        report("cold1", lat, st)
        print(f"RSS after the runs: {rss_mb(proc.pid)}")
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
