#!/usr/bin/env python3
"""Speed of the predictor: import, platform load, one prediction (target: median ≤ 5 ms after load).

    python benchmarks/bench_predict.py
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def import_ms() -> float:
    # A fresh interpreter each time: what a daemon start or a CLI call pays.
    code = "import time; t=time.perf_counter(); import predictor; print((time.perf_counter()-t)*1e3)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 cwd=ROOT, check=True).stdout) for _ in range(5)]
    return statistics.median(runs)


def main() -> int:
    print(f"import predictor          median {import_ms():7.1f} ms (fresh interpreter, 5 runs)")
    from predictor import TrainingJob, load_platform, predict
    for name in ("perlmutter-a100", "vista-gh200", "dgx-h100"):
        t = time.perf_counter()
        plat = load_platform(name, reload=True)
        load_s = time.perf_counter() - t
        job = TrainingJob.from_toml(ROOT / "examples" / "gpt20b-perlmutter.toml")
        predict(job, plat)    # warm
        times = []
        for _ in range(200):
            t = time.perf_counter()
            predict(job, plat)
            times.append(time.perf_counter() - t)
        times.sort()
        print(f"{name:<18} load {load_s:5.2f} s   predict median {1e3 * statistics.median(times):5.2f} ms, "
              f"p90 {1e3 * times[179]:5.2f} ms (200 runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
