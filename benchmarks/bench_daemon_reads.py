"""CPU per socket read in perf-predictd: a fresh 256 KiB buffer per read against a reused one.

    python benchmarks/bench_daemon_reads.py [--reads 20000] [--bytes 1606] [--rounds 5]

perf-predictd reads every request from its client and every answer from its workers as a few
KiB.  ``sock.recv(262144)`` (asyncio's default read size for a transport, and the daemon's until
2026-11-27) allocates a 256 KiB object and shrinks it for each read; ``sock.recv_into`` a buffer
kept across reads allocates nothing.  This times both on a Unix socket pair, one message written
and read per step (the write is in both figures), and prints CPU microseconds per step: the
median and the least over ``--rounds``.  ``--bytes``: the message size (1,606 is a worker's
answer for the dev cluster's Megatron script; 977 is job_submit.lua's request for it).
"""
from __future__ import annotations

import argparse
import socket
import statistics
import time

BIG = 256 * 1024      # asyncio's _SelectorSocketTransport.max_size
CHUNK = 64 * 1024     # perf-predictd's READ_CHUNK / READ_BYTES


def per_step_us(reads: int, message: bytes, reuse: bool) -> float:
    a, b = socket.socketpair()
    try:
        buf = memoryview(bytearray(CHUNK))
        t0 = time.process_time()
        if reuse:
            for _ in range(reads):
                a.send(message)
                n = b.recv_into(buf)
                bytes(buf[:n])         # the copy the daemon keeps
        else:
            for _ in range(reads):
                a.send(message)
                b.recv(BIG)
        return (time.process_time() - t0) / reads * 1e6
    finally:
        a.close()
        b.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reads", type=int, default=20000)
    ap.add_argument("--bytes", type=int, default=1606)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if not 1 <= args.bytes <= CHUNK:
        ap.error(f"--bytes: 1 to {CHUNK}")
    message = b"x" * args.bytes
    fresh, reused = [], []
    for _ in range(args.rounds):       # alternated, so that drift hits both alike
        fresh.append(per_step_us(args.reads, message, reuse=False))
        reused.append(per_step_us(args.reads, message, reuse=True))
    for name, xs in (("recv(256 KiB), a new object per read", fresh),
                     ("recv_into a reused 64 KiB buffer", reused)):
        print(f"{name:38s} median {statistics.median(xs):6.2f} us, least {min(xs):6.2f} us per "
              f"{args.bytes}-byte message (send + read)")
    print(f"saved per read: {statistics.median(fresh) - statistics.median(reused):.2f} us (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
