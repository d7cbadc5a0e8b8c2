#!/usr/bin/env python3
"""The GPU's link to host memory as DeepSpeed's CPU checkpointing uses it, and a synchronize round trip.

    python benchmarks/bench_host_link.py --device cuda --out DIR [--mib 64 256] [--repeats 10]

DeepSpeed's ``cpu_checkpointing`` copies each kept checkpoint to the host with a blocking
``tensor.cpu()`` (pageable memory) in the forward and back with ``.to(device)`` in the backward
(predictor/checkpointing.py).  This times exactly those two calls on bf16 tensors of each size,
and, for reference, the same copies into and out of pinned host memory (``copy_(non_blocking)``
then a synchronize), and ``torch.cuda.synchronize()`` with an empty queue.  Prints GB/s per
direction (the median of the repeats after one warm-up) and writes ``host-link.json`` with the
device, date and software.  The measurement is calibrate/host_link.py's.  A benchmark: its figures
depend on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from calibrate.host_link import measure


def _print_row(row: dict, mib: int) -> None:
    print(f"{row['copy']:13} {mib:5} MiB {1e3 * row['seconds']:8.3f} ms {row['gbps']:7.2f} GB/s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mib", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    if args.repeats < 1 or any(m < 1 for m in args.mib):
        ap.error("--repeats and --mib must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_host_link: no CUDA device here", file=sys.stderr)
        return 2
    prov = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
            "python": platform.python_version(), "host_threads": os.cpu_count(), "device": args.device}
    if args.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        prov.update(gpu=p.name, cuda=torch.version.cuda)
    link = measure(args.device, args.mib, args.repeats, on_row=_print_row)
    print(f"synchronize round trip (empty queue) {1e6 * link['sync_round_trip_seconds']:.2f} us", flush=True)
    result = {"provenance": prov, "repeats": args.repeats, **link}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host-link.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
