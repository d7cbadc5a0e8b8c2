#!/usr/bin/env python3
"""Speed of the predictor: import, platform load, one prediction, and the trees inside it.

    python benchmarks/bench_predict.py [--runs 200] [--platforms perlmutter-a100,vista-gh200,dgx-h100]

Targets (issue 11): one prediction of examples/gpt20b-perlmutter.toml ≤ 2 ms median, a platform
load ≤ 100 ms.  Per platform it prints:

  load        load_platform(name, reload=True), median of 5 in this process (files in the page
              cache: what a daemon's SIGHUP reload pays; a first start adds the disk)
  predict     one Predictor.predict() with the predictor's memoised operator and collective
              answers forgotten before each call (Predictor.forget_answers()): a job the process
              has not seen, on a platform it has used, which is what the daemon mostly gets.
              What the platform's files alone decide (which model costs each operator, the
              interval rule from its recorded runs) is worked out once per Predictor and kept,
              as in the daemon; --forget-all uses a new Predictor for each call instead
  repeat      the same job again with the memos kept (job arrays, resubmissions)
  trees       Bundle.ratios_rows on the rows one such prediction asks for (compute + collectives):
              the regressors' share of ``predict``

The forest walk is the C one where it was built (``PERFCAST_NUMPY_WALK=1`` measures numpy's).
Timings depend on the machine (the issue's figures: a 2-core VM) and on what else runs on it.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from predictor import Predictor, TrainingJob, load_platform
from predictor import trees as forest
from predictor.bundle import Bundle

ROOT = Path(__file__).resolve().parents[1]

JOB = ROOT / "examples" / "gpt20b-perlmutter.toml"


def import_ms() -> float:
    # A fresh interpreter each time: what a daemon start or a CLI call pays.
    code = "import time; t=time.perf_counter(); import predictor; print((time.perf_counter()-t)*1e3)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 cwd=ROOT, check=True).stdout) for _ in range(5)]
    return statistics.median(runs)


def timed(fn, runs: int, before=None) -> list[float]:
    out = []
    for _ in range(runs):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return sorted(out)


def ms(values: list[float], q: float = 0.5) -> float:
    return 1e3 * values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--platforms", default="perlmutter-a100,vista-gh200,dgx-h100")
    ap.add_argument("--forget-all", action="store_true",
                    help="before each cold call forget the per-platform work too (a daemon's first job)")
    args = ap.parse_args()
    print(f"import predictor          median {import_ms():7.1f} ms (fresh interpreter, 5 runs)")
    print("forest walk               " + ("C (predictor/_walk.c)" if forest._FOREST_SUMS is not None
                                          else "numpy (predictor._walk not built, or PERFCAST_NUMPY_WALK=1)"))
    job = TrainingJob.from_toml(JOB)
    for name in [p for p in args.platforms.split(",") if p]:
        load_platform(name, reload=True)                      # warm the page cache
        loads = timed(lambda: load_platform(name, reload=True), 5)
        plat = load_platform(name)
        held = [Predictor(plat)]                              # the daemon's: one per platform

        def forget() -> None:
            if args.forget_all:
                held[0] = Predictor(plat)
            else:
                held[0].forget_answers()

        def predict() -> None:
            held[0].predict(job)
        predict()                                             # first-use costs (lazy imports)
        cold = timed(predict, args.runs, forget)
        warm = timed(predict, args.runs)
        captured: list = []
        real = Bundle.ratios_rows

        def spy(self, keys, X):
            captured.append((self, list(keys), X))
            return real(self, keys, X)
        Bundle.ratios_rows = spy
        try:
            forget()
            predict()
        finally:
            Bundle.ratios_rows = real
        trees = timed(lambda: [b.ratios_rows(k, X) for b, k, X in captured], args.runs)
        rows = sum(len(k) for _, k, _ in captured)
        print(f"{name:<18} load {ms(loads):6.1f} ms   predict median {ms(cold):5.2f} ms, p90 {ms(cold, 0.9):5.2f} ms"
              f"   repeat {ms(warm):5.2f} ms   trees {ms(trees):5.2f} ms "
              f"({len(captured)} calls, {rows} rows)   [{args.runs} runs]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
