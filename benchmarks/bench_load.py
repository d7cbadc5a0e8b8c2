#!/usr/bin/env python3
"""Platform load time and the memory loaded platforms hold (issue 11).

    python benchmarks/bench_load.py [--runs 5] [--config packaging/perfcast.toml.example]

Every figure comes from fresh interpreters, so nothing is shared with this process:

  load      per shipped platform: load_platform(name) in a fresh interpreter that has already
            imported predictor.platform (target ≤ 100 ms); median of --runs, files in the page
            cache (the first run warms it)
  rss       that interpreter's RSS after the load, and the libraries it imported: the predictor
            must never import xgboost, lightgbm, scikit-learn, scipy or torch
  all       every shipped platform loaded in one interpreter: RSS and peak RSS (a daemon that
            serves them all: target ≤ 150 MB)
  check     peak RSS of ``perf-predictd --check --config CONFIG`` (target ≤ 120 MB)

Memory is machine-independent to a few MB (allocator, numpy build); times are not.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("xgboost", "lightgbm", "sklearn", "scipy", "torch", "pandas", "matplotlib")

_PROBE = r"""
import json, sys, time
import predictor.platform as P
names = {names!r}
t = time.perf_counter()
for n in names:
    P.load_platform(n)
ms = (time.perf_counter() - t) * 1e3
status = {{l.split(':')[0]: int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(('VmRSS', 'VmHWM'))}}
heavy = sorted(set({heavy!r}) & {{m.split('.')[0] for m in sys.modules}})
print(json.dumps({{"ms": ms, "rss_mb": status['VmRSS'] / 1024, "hwm_mb": status['VmHWM'] / 1024, "heavy": heavy}}))
"""


def probe(names: list[str]) -> dict:
    code = _PROBE.format(names=names, heavy=HEAVY)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise SystemExit(f"loading {names} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def check_peak_mb(config: Path) -> float:
    """Peak RSS of ``perf-predictd --check`` (its own process: RUSAGE_CHILDREN of a wrapper)."""
    code = ("import resource, subprocess, sys; "
            f"r = subprocess.run([sys.executable, '-m', 'slurm_plugin.daemon', '--check', '--config', {str(config)!r}], "
            "capture_output=True, text=True); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.stderr.write(r.stdout + r.stderr)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    rc, kb = res.stdout.split()
    if rc != "0":
        raise SystemExit(f"perf-predictd --check failed:\n{res.stderr}")
    return int(kb) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--config", default=str(ROOT / "packaging" / "perfcast.toml.example"))
    args = ap.parse_args()
    from predictor.platform import SHIPPED_DIR
    names = sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / "platform.toml").is_file())
    ok = True
    for name in names:
        probe([name])                                     # page cache
        runs = [probe([name]) for _ in range(args.runs)]
        load = statistics.median(r["ms"] for r in runs)
        heavy = sorted({m for r in runs for m in r["heavy"]})
        ok &= load <= 100 and not heavy
        print(f"{name:<18} load {load:6.1f} ms (median of {args.runs} fresh interpreters)   "
              f"RSS {runs[-1]['rss_mb']:6.1f} MB   heavy imports: {', '.join(heavy) or 'none'}")
    every = probe(names)
    ok &= every["rss_mb"] <= 150 and not every["heavy"]
    print(f"{'all ' + str(len(names)):<18} load {every['ms']:6.1f} ms   RSS {every['rss_mb']:6.1f} MB, "
          f"peak {every['hwm_mb']:6.1f} MB (target ≤ 150 MB)")
    peak = check_peak_mb(Path(args.config))
    ok &= peak <= 120
    print(f"perf-predictd --check --config {Path(args.config).name}: peak RSS {peak:6.1f} MB (target ≤ 120 MB)")
    print("overall:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
