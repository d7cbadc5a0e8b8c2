"""CPU per new job shape in perf-predictd's request path, in one process, without Slurm.

    python benchmarks/bench_new_shape_cpu.py [--shapes 200] [--rounds 5] [--platform perlmutter-a100]
    python benchmarks/bench_new_shape_cpu.py --profile parse      # cProfile of one stage's calls
    (--profile: parse, predict, worker, or daemon: the daemon process's side of each request)
    python benchmarks/bench_new_shape_cpu.py --idle-ms 10         # each shape after 10 ms idle, as in place

What one submission of a never-seen job shape costs the daemon and its worker (issue 33 item 9:
the worker's CPU per new shape is what lets cli_filter.lua's warm-up predictions keep ahead of
slurmctld's requests in a burst).  The scripts are those of ``bench_sbatch.py --distinct``: the
dev cluster's Megatron script with its own number of layers, hidden size, vocabulary and tag.

Each shape goes through the real code, as a request would: the daemon's side (decode the request,
route, cache key, the worker's JSON, the outcome back, the policy) and the worker's
(:meth:`Engine.run_work`: parse the script, predict).  CPU time (``time.process_time``) is split:

  parse    slurm_plugin.launch.parse_script (the shell interpreter, the launcher's flags)
  predict  the predictor (Predictor.predict) and the facts taken from its answer
  worker   the rest of the worker's run_work (JSON, the user-file reader, the outcome)
  daemon   the daemon process's side of the request

Each round uses shapes no earlier round met (a fresh engine per round, so nothing is remembered);
the figures printed per stage are the median and the least over ``--rounds`` rounds of the mean
per shape.  Only this process's CPU is counted, but other load on the machine still slows it (a
busy sibling core, caches): compare trees by alternating runs, e.g. the base commit's with
``PYTHONPATH=/path/to/worktree python benchmarks/bench_new_shape_cpu.py``.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

# One thread per numerical library, as perf-predictd runs (slurm_plugin/daemon/cli.py): set before
# numpy is imported, else BLAS threads spin beside each small matrix product and count as CPU here.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from slurm_plugin.daemon.engine import Engine, Outcome, Route  # noqa: E402
from slurm_plugin.daemon.protocol import parse_request  # noqa: E402
from slurm_plugin.siteconfig import load_site_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAGES = ("parse", "predict", "worker", "daemon")


def scripts(first: int, count: int, iters: str = "2000") -> list[str]:
    """``count`` batch scripts of distinct shapes, as bench_sbatch.py --distinct writes them."""
    text = (REPO / "tests/slurm/scripts/megatron_gpt.sh").read_text().replace("@ITERS@", iters)
    out = []
    for k in range(first, first + count):
        layers, hidden = 8 + 2 * (k % 24), 2048 + 64 * (k // 24)
        vocab = 50257 + 256 * (1 + k % 4095)
        out.append(text.replace("--num-layers 24", f"--num-layers {layers}")
                   .replace("--hidden-size 2048", f"--hidden-size {hidden}")
                   .replace("--vocab-size 50257", f"--vocab-size {vocab}")
                   .replace("set -euo pipefail", f"# bench run {k}\nset -euo pipefail"))
    return out


def request_bytes(script: str, work_dir: str) -> bytes:
    """job_submit.lua's request for the dev cluster's sbatch of ``script`` (--nodes 4, 4 GPUs)."""
    return json.dumps({"script": script, "submit_uid": os.geteuid(), "submit_gid": os.getegid(),
                       "work_dir": work_dir, "partition": "gpu", "min_nodes": 4,
                       "ntasks_per_node": 4, "tres_per_node": "gres/gpu:4",
                       "argv": [f"{work_dir}/bench_megatron.sh"], "name": "gpt-1.3b"}).encode()


class Timed:
    """Wraps the engine's parse and predict backends to add their CPU to ``totals``."""

    def __init__(self, engine: Engine, totals: dict[str, float]):
        self.totals = totals
        for key, stage in (("parse_script", "parse"), ("predict", "predict")):
            engine.backends[key] = self._wrap(engine.backends[key], stage)

    def _wrap(self, fn, stage: str):
        def timed(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[stage] += time.process_time() - t0
        return timed


def one_round(config, texts: list[str], work_dir: str, profile: str = "",
              idle_s: float = 0.0) -> dict[str, float]:
    """Mean CPU seconds per shape of each stage, over ``texts`` on a fresh engine."""
    eng = Engine(config).load(lookup_partitions=False)
    eng.warm_up()
    # As perf-predictd does before forking its workers: what is loaded is never scanned again by
    # the cyclic collector (else its passes over the platforms land on whichever stage runs).
    gc.collect()
    gc.freeze()
    totals = dict.fromkeys(STAGES + ("all_worker",), 0.0)
    Timed(eng, totals)
    prof = cProfile.Profile() if profile else None
    settings = config.daemon
    for text in texts:
        if idle_s:
            time.sleep(idle_s)     # untimed: perf-predictd idles between submissions
        raw = request_bytes(text, work_dir)
        t0 = time.process_time()
        if prof is not None and profile == "daemon":
            prof.enable()
        req = parse_request(raw, max_script=settings.max_request_bytes)
        routed = eng.route(req)
        if not isinstance(routed, Route):
            raise SystemExit(f"not routed: {routed}")
        eng.cache_key(routed)
        payload = eng.work(routed, time.monotonic() + 5.0)
        if prof is not None and profile == "daemon":
            prof.disable()
        t1 = time.process_time()
        if prof is not None and profile == "worker":
            prof.enable()
        result = eng.run_work(payload)
        if prof is not None and profile == "worker":
            prof.disable()
        t2 = time.process_time()
        if prof is not None and profile == "daemon":
            prof.enable()
        out = Outcome.from_json(result)
        if out.facts is None:
            raise SystemExit(f"no prediction: {out.skip_reason}: {out.skip_why}")
        eng.finish(routed, out)
        if prof is not None and profile == "daemon":
            prof.disable()
        t3 = time.process_time()
        totals["daemon"] += (t1 - t0) + (t3 - t2)
        totals["all_worker"] += t2 - t1
    if prof is not None and profile in ("parse", "predict"):
        # Profile the stage alone on the same scripts again (new shapes: a fresh engine).
        eng2 = Engine(config).load(lookup_partitions=False)
        eng2.warm_up()
        stage_fn = eng2.backends["parse_script" if profile == "parse" else "predict"]

        def hooked(*args, **kwargs):
            prof.enable()
            try:
                return stage_fn(*args, **kwargs)
            finally:
                prof.disable()
        eng2.backends["parse_script" if profile == "parse" else "predict"] = hooked
        for text in [t.replace("# bench run", "# bench run again") for t in texts]:
            req = parse_request(request_bytes(text, work_dir), max_script=settings.max_request_bytes)
            routed = eng2.route(req)
            eng2.run_work(eng2.work(routed, time.monotonic() + 5.0))
        del platform
    gc.unfreeze()
    if prof is not None:
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(40)
    n = len(texts)
    totals["worker"] = totals["all_worker"] - totals["parse"] - totals["predict"]
    return {k: totals[k] / n for k in STAGES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=int, default=200, help="new shapes per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--platform", default="perlmutter-a100")
    ap.add_argument("--idle-ms", type=float, default=0.0,
                    help="sleep this long before each shape (not timed), as the daemon idles between "
                         "submissions: the same work then costs more CPU (caches, the CPU's own state)")
    ap.add_argument("--profile", choices=("parse", "predict", "worker", "daemon"), default="",
                    help="one round under cProfile (its figures then include the profiler's cost)")
    args = ap.parse_args()
    if args.shapes > 24 * 4095:
        ap.error("--shapes: at most 98280")

    with tempfile.TemporaryDirectory(prefix="pcshape") as tmp:
        cfg_path = Path(tmp) / "perfcast.toml"
        cfg_path.write_text(f'[daemon]\nsocket = "{tmp}/d.sock"\nslurm_user = "root"\n'
                            f'[defaults]\npolicy = "fill"\nmargin = 0.15\nstartup_minutes = 5\n'
                            f'[partitions.gpu]\nplatform = "{args.platform}"\n')
        config = load_site_config(str(cfg_path))
        if args.profile:
            one_round(config, scripts(0, args.shapes), tmp, profile=args.profile)
            return 0
        rounds = []
        for r in range(args.rounds):
            rounds.append(one_round(config, scripts(r * args.shapes, args.shapes), tmp,
                                    idle_s=args.idle_ms / 1000.0))
        med = {k: statistics.median(x[k] for x in rounds) * 1e6 for k in STAGES}
        total = [sum(x.values()) * 1e6 for x in rounds]
        print(f"{args.platform}: {args.shapes} new shapes x {args.rounds} rounds "
              f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
              + (f", {args.idle_ms:g} ms idle before each" if args.idle_ms else "") + ")")
        for k in STAGES:
            print(f"  {k:8s} median {med[k]:5.0f} us, least {min(x[k] for x in rounds) * 1e6:5.0f} us "
                  "(rounds: " + " ".join(f"{x[k] * 1e6:.0f}" for x in rounds) + ")")
        # The least round is the one other load on the machine disturbed least.
        print(f"CPU per new shape: median {statistics.median(total):.0f} us, least {min(total):.0f} us "
              f"(rounds: {' '.join(f'{t:.0f}' for t in total)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
