"""perf-calibrate: measure, fit, import, install and schedule platforms.

    perf-calibrate run --device cpu|cuda --plan NAME --out DIR [--precision fp32] [--budget GPU-MIN]
    perf-calibrate host --device cpu|cuda --out FILE.toml [--precision bf16]
    perf-calibrate fabric --device cpu|cuda --out FILE.toml [--ranks N] [--entries N,...] [--shapes NxG,...]
    perf-calibrate plan NAME [--device cpu|cuda] [--gpu h100] [--nodes N --gpus-per-node G] [--budget GPU-MIN]
    perf-calibrate fit DIR --out PLATFORM_DIR [--name NAME]
    perf-calibrate import --format estimate-train-time SRC --out DIR
    perf-calibrate install PLATFORM_DIR --partition P [--root ROOT] [--force]
    perf-calibrate schedule --partition P [--every 30d] [--recur begin|scrontab] [--gpu h100] [--dry-run]
    perf-calibrate status [--root ROOT] [--json]
    perf-calibrate rollback NAME [--root ROOT] [--config FILE]   (NAME: a partition's, or a site overlay's platform)
    perf-calibrate validate PLATFORM --runs RUNS.toml [--fit] [--replace] [--dry-run] [--json]
    perf-calibrate harvest [--partition P] [--since 7d] [--config FILE] [--records DB] [--out DIR]
                           [--refit [--refit-min-runs 5] [--root ROOT] [--pid-file FILE]]
    perf-calibrate report [PARTITION] [--json] [--plot FILE.png] [--config FILE] [--records DB]

Errors a user can cause print one line and exit with code 2 (no traceback); ``harvest --refit``
exits 1 when a partition's refit failed or perf-predictd missed the reload after one, and 2 when
perfcast.toml names a platform for a refitted partition that exists nowhere (the other partitions
are refitted all the same).  ``fit``, ``import``, ``install``, ``status``, ``rollback``,
``schedule``, ``validate``, ``harvest``, ``report`` and ``plan`` never import torch; ``run``,
``host`` and ``fabric`` do.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

from predictor.errors import OneLineParser, PerfcastError, error_document, wants_json

from .env import quiet_worker_signals


def _quiet_if_spawned_worker() -> None:
    """A worker that ``run``, ``host`` or ``fabric`` spawns (multiprocessing's spawn) imports
    this module first, as its parent's main module, seconds before it imports torch: Ctrl-C is
    left to the parent from here on, so a worker never prints a KeyboardInterrupt traceback."""
    mp_process = sys.modules.get("multiprocessing.process")
    # ``_inheriting``: set by multiprocessing while a spawned child unpickles its parent's state.
    if mp_process is not None and getattr(mp_process.current_process(), "_inheriting", False):
        quiet_worker_signals()


# Before the imports below: they take a worker's first second (numpy among them).
_quiet_if_spawned_worker()

from slurm_plugin.policy import slurm_duration  # noqa: E402
from slurm_plugin.records import RecordStoreError  # noqa: E402

from .plans import PRECISIONS  # noqa: E402

log = logging.getLogger("perf-calibrate")


def _precisions(text: str, allowed: tuple[str, ...] = PRECISIONS) -> tuple[str, ...]:
    out = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in out if p not in allowed]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"precisions are {', '.join(allowed)} (comma-separated), got {text!r}")
    return out


def _tensor_precisions(text: str) -> tuple[str, ...]:
    # Host costs are timed on tiny tensors of one dtype: FP8 exists only inside GEMMs.
    return _precisions(text, tuple(p for p in PRECISIONS if p != "fp8"))


def _int_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers, comma-separated, got {text!r}") from None
    if not out or any(v < 1 or v > 1 << 34 for v in out):
        raise argparse.ArgumentTypeError(f"expected sizes from 1 to 2^34 elements, got {text!r}")
    return out


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        try:
            n, g = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"shapes are NODESxGPUS (e.g. 4x1,1x4), got {part!r}") from None
        if n < 1 or g < 1 or n * g < 2:
            raise argparse.ArgumentTypeError(f"a group of {part!r} has fewer than two ranks")
        out.append((n, g))
    if not out:
        raise argparse.ArgumentTypeError("no shapes given")
    return tuple(out)


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _count(text: str) -> int:
    """A count of nodes, GPUs or ranks: a whole number of 1 or more."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, got {text!r}")
    return v


# A platform's name is looked up as a directory (``perf-predict --platform NAME``, a site overlay
# under the platforms root): one path component, spelt as install's partition names are.
_PLATFORM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _platform_name(text: str) -> str:
    """fit's --name: letters, digits, '.', '_', '-' (no path separator, no '..'), as typed."""
    if not _PLATFORM_NAME.match(text) or ".." in text:
        raise argparse.ArgumentTypeError(
            f"a platform name is letters, digits, '.', '_' and '-', starting with a letter or digit "
            f"(it names a directory; no '/' or '..'), got {text!r}")
    return text


def _gpu(text: str):
    """A GPU model with published figures (calibrate.env.KNOWN_GPUS); unknown: the known ones."""
    from .plans import resolve_gpu
    try:
        return resolve_gpu(text)
    except PerfcastError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tolerance(text: str) -> float:
    """install's --tolerance: how much worse (relative) than the active platform's validation
    error a new one may be; 0 or more (0.10: 10 % worse)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"the accepted relative worsening of the validation error, a number of 0 or "
                                         f"more (0.10: 10 % worse), got {text!r}")
    return v


def _min_refit_runs(text: str) -> int:
    from .validate import MIN_FIT_RUNS
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < MIN_FIT_RUNS:
        raise argparse.ArgumentTypeError(f"at least {MIN_FIT_RUNS} (leave-one-out fits on all runs "
                                         f"but one), got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="perf-calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=OneLineParser)

    r = sub.add_parser("run", help="measure operators and collectives into a (resumable) sample store")
    r.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    r.add_argument("--plan", default="smoke", help="tiny | smoke | paper | adaptive | a plan .toml file")
    r.add_argument("--out", required=True, help="sample directory (created, or resumed)")
    r.add_argument("--precision", type=_precisions, default=None,
                   help="comma-separated precisions (default: fp32 on cpu, fp16 on cuda; fp8: the "
                        "layers' linear GEMMs only)")
    r.add_argument("--budget", type=_positive, default=0.0, help="GPU-minutes (adaptive plan only)")
    r.add_argument("--part", choices=("all", "operators", "collectives"), default="all")
    r.add_argument("--timing", choices=("call", "device"), default="call",
                   help="call: one isolated call between CUDA events (the host's issue time included "
                        "where it is the slower); device: each call queued behind a device-side sleep, "
                        "the device's time alone (CUDA only)")
    r.add_argument("--ops", default="", help="comma-separated operators: only these of the plan")
    r.add_argument("--ranks", type=_count, default=0,
                   help="local ranks for collectives when not under srun/torchrun (default: 2 on cpu, "
                        "every GPU on cuda)")
    r.add_argument("--threads", type=_count, default=0, help="CPU threads per rank (default: cores / ranks)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")

    h = sub.add_parser("host", help="measure host-side issue costs (dispatch, autograd, launch, sync)")
    h.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    h.add_argument("--out", required=True, help="TOML file to write (e.g. SAMPLES_DIR/host.toml)")
    h.add_argument("--precision", type=_tensor_precisions, default=None,
                   help="precision of the tiny tensors (default: fp32 on cpu, bf16 on cuda)")

    fb = sub.add_parser("fabric", help="time all-reduces on one group alone and beside the allocation's "
                                       "other groups of its shape (run under srun across nodes)")
    fb.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    fb.add_argument("--out", required=True, help="TOML file to write (SAMPLES_DIR/fabric.toml: fit reads it)")
    fb.add_argument("--ranks", type=_count, default=0, help="local processes without srun/torchrun "
                                                        "(default: the local GPUs, 2 on a CPU)")
    fb.add_argument("--entries", type=_int_list, default=None,
                    help="all-reduce sizes in elements (default: 2^20, 2^24, 2^26)")
    fb.add_argument("--shapes", type=_shapes, default=None,
                    help="group shapes NODESxGPUS, comma-separated (default: whole nodes and one GPU "
                         "per node over 1, 2, 4 … nodes)")
    fb.add_argument("--precision", type=_tensor_precisions, default=None,
                    help="default: fp32 on cpu, bf16 on cuda")

    p = sub.add_parser("plan", help="show a plan and its estimated cost (GPU-minutes)")
    p.add_argument("name")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda with --gpu, else cpu (run's default)")
    p.add_argument("--nodes", type=_count, default=1)
    p.add_argument("--gpus-per-node", type=_count, default=None,
                   help="GPUs (cpu: ranks) per node; default 4 on cuda, 2 on cpu (run's --ranks)")
    p.add_argument("--precision", type=_precisions, default=None)
    p.add_argument("--budget", type=_positive, default=0.0, help="GPU-minutes (adaptive plan only)")
    p.add_argument("--gpu", type=_gpu, default=None,
                   help="GPU model for the estimate (a100, h100, …; default: a nominal A100)")

    f = sub.add_parser("fit", help="fit a sample store into a platform (+ validation report)")
    f.add_argument("samples")
    f.add_argument("--out", required=True, help="platform directory to write")
    f.add_argument("--name", type=_platform_name, default=None,
                   help="platform name: letters, digits, '.', '_', '-' (default: the directory name)")
    f.add_argument("--gpus-per-node", type=_count, default=None,
                   help="GPUs (cpu: ranks) per node (default: the sample store's allocation)")
    f.add_argument("--nics-per-node", type=_count, default=1)
    f.add_argument("--libraries", default="",
                   help="comma-separated regressor libraries to choose from "
                        "(random_forest,xgboost,lightgbm; default all)")
    f.add_argument("--no-plot", action="store_true")
    f.add_argument("--force", action="store_true", help="replace an existing --out")

    i = sub.add_parser("import", help="import third-party samples into a sample store")
    i.add_argument("--format", required=True, choices=("estimate-train-time",))
    i.add_argument("src")
    i.add_argument("--out", required=True)
    i.add_argument("--force", action="store_true")

    n = sub.add_parser("install", help="install a fitted platform as a partition's active one")
    n.add_argument("platform")
    n.add_argument("--partition", required=True)
    n.add_argument("--root", default=None)
    n.add_argument("--tolerance", type=_tolerance, default=0.10,
                   help="accepted relative worsening of the validation error (default 0.10)")
    n.add_argument("--force", action="store_true", help="install even if it validates worse")
    n.add_argument("--pid-file", default=None, help="perf-predictd's pid file (SIGHUP after the switch)")

    s = sub.add_parser("schedule", help="submit a calibration job for a partition (admins)")
    s.add_argument("--partition", required=True)
    s.add_argument("--every", default=None,
                   help="recur every DURATION (30d, 2w, 12h): at least the job's time limit, at most 366d")
    s.add_argument("--recur", choices=("begin", "scrontab", "none"), default="begin")
    s.add_argument("--plan", default="adaptive")
    s.add_argument("--budget", type=_positive, default=0.0,
                   help="GPU-minutes for the adaptive plan (default: fill MaxTime, less fit, host and fabric)")
    s.add_argument("--precision", type=_precisions, default=("fp16",))
    s.add_argument("--nodes", type=_count, default=0,
                   help="nodes to calibrate on (default: up to 4 of the partition's)")
    s.add_argument("--gpu", default="",
                   help="GPU model the job is sized for (a100, h100, …; default: the type the partition's "
                        "gres names, a nominal A100 if it names none)")
    s.add_argument("--root", default=None)
    s.add_argument("--account", default="")
    s.add_argument("--command", default="", help="how compute nodes run perf-calibrate")
    s.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")

    st = sub.add_parser("status", help="each partition's platform, age, samples, validation error")
    st.add_argument("--root", default=None)
    st.add_argument("--json", action="store_true")

    va = sub.add_parser("validate", help="record measured end-to-end runs on a platform "
                        "(their spread widens its intervals)")
    va.add_argument("platform", help="platform name or directory (its platform.toml is rewritten)")
    va.add_argument("--runs", required=True, help="TOML file of [[run]] tables")
    va.add_argument("--replace", action="store_true", help="drop the runs recorded before")
    va.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    va.add_argument("--json", action="store_true")
    va.add_argument("--fit", action="store_true",
                    help="also fit [fitted] factors per kind of job; written only if leave-one-out improves")
    va.add_argument("--root", default=None, help="a shipped platform's site overlay goes under ROOT/NAME "
                    "(default $PERFCAST_PLATFORMS's first entry, /var/lib/perfcast/platforms)")
    va.add_argument("--pid-file", default=None, help="perf-predictd's, reloaded after a site overlay is installed")

    hv = sub.add_parser("harvest", help="finished perfcast jobs -> outcomes + measured runs per partition")
    hv.add_argument("--partition", default=None)
    hv.add_argument("--since", default=None, help="7d, 12h, 2w or YYYY-MM-DD[THH:MM[:SS]] (default 7d)")
    hv.add_argument("--config", default=None, help="site config (default $PERFCAST_CONFIG, "
                    "/etc/perfcast/perfcast.toml)")
    hv.add_argument("--records", default=None, help="the daemon's record store (default: [daemon] "
                    "records of the site config, else /var/lib/perfcast/records.sqlite)")
    hv.add_argument("--out", default=None, help="directory of the per-partition runs files "
                    "(default /var/lib/perfcast/runs)")
    hv.add_argument("--source", choices=("auto", "sacct", "scontrol"), default="auto")
    hv.add_argument("--rescan", action="store_true", help="read jobs harvested before again")
    hv.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    hv.add_argument("--json", action="store_true")
    hv.add_argument("--refit", action="store_true",
                    help="then fit each partition's installed platform on its runs (validate --fit) and "
                         "install the result when leave-one-out improves (rollback undoes it)")
    hv.add_argument("--refit-min-runs", type=_min_refit_runs, default=None,
                    help="harvested runs a partition needs before a refit (default 5, at least 3)")
    hv.add_argument("--root", default=None, help="platforms root of the installed platforms "
                    "(default $PERFCAST_PLATFORMS, /var/lib/perfcast/platforms)")
    hv.add_argument("--pid-file", default=None, help="perf-predictd's pid file (reload after a refit)")

    rp = sub.add_parser("report", help="predicted vs actual per job, errors, timeouts and over-reservation "
                        "per partition")
    rp.add_argument("partition", nargs="?", default=None)
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--plot", default=None, help="also draw FILE.png (needs matplotlib)")
    rp.add_argument("--since", default=None, help="only jobs predicted since (7d, YYYY-MM-DD, ...)")
    rp.add_argument("--config", default=None)
    rp.add_argument("--records", default=None)

    wa = sub.add_parser("watch", help="correct running perfcast jobs' time limits from their logs' "
                        "progress (one pass; --every to repeat)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="exit status of one pass: 0 it ran (jobs it could not extend included); 2 it "
                               "could not run (a bad\nconfig, Slurm not answering); 3 it ran with a record "
                               "store warning (records missing or\nunreadable, a corrupt page, a lock held): "
                               "logged, and in --json's \"warnings\" (docs/watch.md).")
    wa.add_argument("--every", type=_positive, default=None, metavar="SECONDS",
                    help="repeat a pass every SECONDS until stopped (the timer runs one pass); perfcast.toml "
                    "is read again when it changes or on SIGHUP; SIGTERM ends the loop between passes")
    wa.add_argument("--config", default=None, help="site config with the [watch] policy")
    wa.add_argument("--records", default=None)
    wa.add_argument("--out", default=None, help="runs files of running jobs' measured rates "
                    "(default /var/lib/perfcast/runs)")
    wa.add_argument("--dry-run", action="store_true", help="decide and say; change no job, record nothing")
    wa.add_argument("--json", action="store_true")

    rb = sub.add_parser("rollback", help="switch an installed platform back to its previous version "
                        "(NAME: the partition given to install, or the platform a refit overlaid)")
    rb.add_argument("partition", metavar="NAME")
    rb.add_argument("--root", default=None)
    rb.add_argument("--pid-file", default=None)
    rb.add_argument("--config", default=None, help="site config, to name the platform of a partition "
                    "(default $PERFCAST_CONFIG, /etc/perfcast/perfcast.toml)")
    return ap


# ------------------------------------------------------------------------------- commands
def _check_budget(plan: str, budget: float) -> None:
    """--budget only sizes the adaptive plan: with another plan it would be ignored without a word."""
    from .plans import GRIDS
    if budget and plan != "adaptive":
        what = "a fixed set of points" if plan in GRIDS else "the points its file lists"
        raise PerfcastError(f"--budget is for the adaptive plan only: plan {plan} measures {what}")


def cmd_run(args: argparse.Namespace) -> int:
    _check_budget(args.plan, args.budget)
    try:
        from .runner import RunOptions, run_calibration
    except ImportError as exc:
        raise PerfcastError(f"perf-calibrate run needs torch (pip install 'perfcast[calibrate]'): {exc}") from None
    opts = RunOptions(out=Path(args.out), device=args.device, plan=args.plan, precisions=args.precision,
                      part=args.part, ranks=args.ranks, threads=args.threads, timing=args.timing,
                      ops=tuple(o.strip() for o in args.ops.split(",") if o.strip()),
                      budget_gpu_minutes=args.budget, progress=not args.no_progress and sys.stderr.isatty()
                      or (not args.no_progress and args.verbose),
                      announce=lambda plan, cost: print(f"{plan.summary()}\nestimated cost: {cost}",
                                                        file=sys.stderr, flush=True))
    res = run_calibration(opts)
    state = "complete" if res.complete else (
        f"--part {args.part} done, store not complete yet" if res.part_complete
        else "INCOMPLETE (run again to resume)")
    print(f"{res.out}: {res.measured_operators} operator and {res.measured_collectives} collective "
          f"points measured, {res.already_done} already there, {res.skipped} skipped; "
          f"{res.seconds:.0f} s (estimated {res.cost.wall_minutes * 60:.0f} s); {state}")
    for note in res.notes:
        print(f"note: {note}")
    # Exit 1 only when what was asked for is unfinished: a batch script's `set -e` then stops.
    return 0 if res.part_complete else 1


def cmd_host(args: argparse.Namespace) -> int:
    try:
        from .host import measure_host_costs
        from .kernels import fp8_gemms_supported
        from .runner import _check_device
    except ImportError as exc:
        raise PerfcastError(f"perf-calibrate host needs torch (pip install 'perfcast[calibrate]'): {exc}") from None
    from predictor.samples import dump_toml
    _check_device(args.device)
    precision = (args.precision or (("fp32",) if args.device == "cpu" else ("bf16",)))[0]
    # FP8 GEMMs' own calls too, where the GPU has them (their samples are timed apart: run --precision fp8).
    costs = measure_host_costs(args.device, precision,
                               fp8=args.device == "cuda" and fp8_gemms_supported(args.device))
    Path(args.out).write_text("# Host issue costs measured by perf-calibrate host (µs per call)\n"
                              + dump_toml({"host": costs.to_dict()}), encoding="utf-8")
    print(f"{args.out}: host costs of {len(costs.operators)} operators on {costs.device_name}: "
          f"launch {costs.launch_us:.1f} µs, sync {costs.sync_us:.1f} µs, "
          f"device floor {costs.device_floor_us:.1f} µs")
    return 0


def cmd_fabric(args: argparse.Namespace) -> int:
    try:
        from .fabric import DEFAULT_ENTRIES, run_fabric
    except ImportError as exc:
        raise PerfcastError(f"perf-calibrate fabric needs torch (pip install 'perfcast[calibrate]'): {exc}") from None
    from predictor.samples import dump_toml
    if args.ranks < 0 or args.ranks == 1:
        raise PerfcastError("--ranks: 2 or more local processes (two groups of one rank cannot all-reduce)")
    rows, doc = run_fabric(args.device, ranks=args.ranks, shapes=args.shapes or (),
                           entries=args.entries or DEFAULT_ENTRIES,
                           precision=(args.precision or ("",))[0])
    if not doc:
        return 0                     # not rank 0 of an srun allocation
    if not rows:
        raise PerfcastError("no group shape has room for two groups in this allocation: nothing measured "
                            "(more ranks, or --shapes)")
    Path(args.out).write_text("# Collectives alone and beside each other, by perf-calibrate fabric (µs)\n"
                              + dump_toml(doc), encoding="utf-8")
    print(f"{args.out}: {len(rows)} rows")
    for r in rows:
        print(f"  {r.group_nodes}x{r.group_gpus_per_node} x {r.groups} groups, {r.entries} entries: "
              f"alone {r.alone_us:.1f} µs, together {r.concurrent_us:.1f} µs "
              f"(x{r.concurrent_us / r.alone_us:.2f})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .plans import Allocation, _nominal_spec, estimate_cost, make_plan
    spec_d = args.gpu
    # The defaults are run's: cpu unless a GPU is named, and on cpu run's two local ranks.
    device = args.device or ("cuda" if spec_d else "cpu")
    if spec_d and device != "cuda":
        raise PerfcastError(f"--gpu {spec_d.name} is for --device cuda")
    _check_budget(args.name, args.budget)
    gpn = args.gpus_per_node or (4 if device == "cuda" else 2)
    spec = spec_d.to_gpu_spec() if spec_d else _nominal_spec(device)
    alloc = Allocation(args.nodes, gpn)
    plan = make_plan(args.name, device=device, precisions=args.precision, allocation=alloc,
                     memory_gib=spec_d.memory_gib if spec_d else 0.0,
                     budget_gpu_minutes=args.budget, spec=spec)
    cost = estimate_cost(plan, spec, device)
    print(plan.summary())
    print(f"on {alloc.nodes} node(s) × {alloc.gpus_per_node} ({spec.name}): {cost}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    # The candidates' libraries are the fit extra, not the predictor's: say so before any work.
    missing = [m for m in ("sklearn", "xgboost", "lightgbm") if importlib.util.find_spec(m) is None]
    if missing:
        raise PerfcastError(f"perf-calibrate fit needs scikit-learn, XGBoost and LightGBM "
                            f"(pip install 'perfcast[fit]'); missing: {', '.join(missing)}")
    src = Path(args.samples)
    if src.exists() and not src.is_dir():
        raise PerfcastError(f"{src}: not a sample directory (a file; fit reads the directory that `run` or "
                            "`import` wrote)")
    from .fitting import fit_platform
    kw = {}
    if args.libraries:
        libs = tuple(x.strip() for x in args.libraries.split(",") if x.strip())
        bad = [x for x in libs if x not in ("random_forest", "xgboost", "lightgbm")]
        if bad or not libs:
            raise PerfcastError(f"--libraries: unknown {bad or args.libraries!r}")
        kw["candidates"] = libs
    try:
        res = fit_platform(args.samples, args.out, name=args.name, gpus_per_node=args.gpus_per_node,
                           nics_per_node=args.nics_per_node, overwrite=args.force, plot=not args.no_plot, **kw)
    except OSError as exc:
        # The platform is written beside --out first (.OUT.fitPID, renamed at the end): a failure
        # there is --out's, and the admin never typed the temporary name.
        if _is_out_path(exc.filename, Path(args.out)):
            raise PerfcastError(f"--out {args.out}: cannot write the platform there: "
                                f"{exc.strerror or exc}") from None
        raise
    print(res.report.table())
    print(f"\nplatform {res.name} written to {res.platform_dir} ({res.samples} samples); "
          f"validation report in {res.platform_dir / 'validation'}")
    print(f"use it: perf-predict JOB --platform {res.platform_dir}")
    for note in res.notes:
        print(f"note: {note}")
    return 0


def _is_out_path(filename: object, out: Path) -> bool:
    """Whether an OSError's file is ``out``, a directory above it, or fit's temporary directory
    beside it (or a file in it)."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        return False
    f = Path(os.path.abspath(os.fsdecode(filename)))
    o = Path(os.path.abspath(out))
    if f == o or o in f.parents or f in o.parents:
        return True
    return any(p.parent == o.parent and p.name.startswith(f".{o.name}.fit") for p in (f, *f.parents))


def cmd_import(args: argparse.Namespace) -> int:
    from . import importers
    summary = importers.import_estimate_train_time(args.src, args.out, overwrite=args.force)
    ops = sum(summary.operator_rows.values())
    colls = sum(summary.collective_rows.values())
    print(f"imported {ops} operator and {colls} collective samples of {summary.gpu} into {summary.out_dir}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from .install import install_platform
    res = install_platform(args.platform, args.partition, root=args.root, tolerance=args.tolerance,
                           force=args.force, pid_file=args.pid_file)
    print(res.message + (f"; perf-predictd (pid {res.signalled}) reloads" if res.signalled else ""))
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from .schedule import ScheduleRequest, schedule
    req = ScheduleRequest(partition=args.partition, every=args.every, recur=args.recur, plan=args.plan,
                          budget_gpu_minutes=args.budget, precisions=args.precision, nodes=args.nodes,
                          root=args.root, command=args.command, account=args.account,
                          dry_run=args.dry_run, gpu=args.gpu)
    job = schedule(req)
    if args.dry_run:
        print(job.script, end="")
    print(f"partition {args.partition}: {job.nodes} node(s) × {job.gpus_per_node} GPUs, time limit "
          f"{slurm_duration(job.time_limit_minutes * 60.0)}; {job.cost}", file=sys.stderr if args.dry_run else sys.stdout)
    if job.job_id is not None:
        print(f"submitted calibration job {job.job_id} ({job.script_path}); recurrence: {job.recurrence}")
    elif not args.dry_run:
        print(f"wrote {job.script_path}; recurrence: {job.recurrence}")
    for note in job.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Exit code 1 when an active version does not load (its jobs get no prediction), so that
    monitoring that runs ``status`` sees it."""
    from .install import platforms_root, status, status_problems
    rows = status(args.root)
    broken = 1 if status_problems(rows) else 0
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return broken
    if not rows:
        # A root absent before the first install is normal; said, so that a misspelt --root shows.
        absent = "" if platforms_root(args.root).is_dir() else " (no such directory yet)"
        print(f"no calibrated partitions under {platforms_root(args.root)}{absent}")
        return 0
    # NAME: the partition an install named, or the shipped platform a site overlay sits on.
    print(f"{'name':<16} {'version':<28} {'age':>7} {'samples':>8} {'compute':>8} {'colls':>7}  previous")
    for r in rows:
        age = f"{r.age_days:.1f}d" if r.age_days is not None else "-"
        cm = f"{100 * r.compute_mape:.1f}%" if r.compute_mape is not None else "-"
        cc = f"{100 * r.collective_mape:.1f}%" if r.collective_mape is not None else "-"
        print(f"{r.partition:<16} {r.version or '(none)':<28} {age:>7} {r.samples:>8} {cm:>8} {cc:>7}  "
              f"{r.previous or '-'}")
        if r.base:
            print(f"{'':<16} site overlay of the {r.base} platform" if r.version else
                  f"{'':<16} the {r.base} platform (its site overlay rolled back; `rollback` restores it)")
        if r.origin == "refit" and r.refit:
            print(f"{'':<16} {_refit_line(r.refit)}")
        if r.problem:
            print(f"{'':<16} DOES NOT LOAD (jobs get no prediction): {r.problem}")
    return broken


def _refit_line(refit: dict) -> str:
    """One line on where a refitted version came from (its refit.toml)."""
    def pct(key: str) -> str:
        v = refit.get(key)
        return f"{100 * v:.2f} %" if isinstance(v, (int, float)) else "?"
    from .install import count_of, describe_fitted_factors, describe_unseen_kind_upper
    # Partitions refitted together (one platform): each one's harvested runs.
    shared = refit["partition_runs"] if isinstance(refit.get("partition_runs"), dict) else {}
    of = f" of partitions {', '.join(f'{p} ({n})' for p, n in shared.items())}" if len(shared) > 1 else ""
    head = (f"refit of {refit.get('base_version', '?')} on {count_of(refit.get('runs'), 'harvested run')}{of} "
            f"({refit.get('fit_runs', '?')} fitted): leave-one-out MAPE {pct('loo_mape_before')} -> "
            f"{pct('loo_mape_after')}, ")
    if isinstance(refit.get("factors"), dict):
        # Every factor the refit wrote that is not 1, the partition's and each kind's (the summary
        # scales hid the host and attention factors that moved the predictions).
        kinds = refit.get("kind_factors") if isinstance(refit.get("kind_factors"), list) else []
        unseen = describe_unseen_kind_upper(refit.get("unseen_kind_upper"))
        return (head + describe_fitted_factors({"partition": refit["factors"], "kinds": kinds})
                + (f"; {unseen}" if unseen else "") + f"; refitted {refit.get('refitted_at', '?')}")
    # A refit.toml written before the factors were kept: what it has.
    return (head + f"compute scale {refit.get('compute_scale', '?')}, host scale "
            f"{refit.get('host_scale', '?')}, network scale {refit.get('network_scale', 1.0)}, "
            + (f"{refit['kinds']} kind(s) with factors of their own, " if refit.get("kinds") else "")
            + f"{refit.get('refitted_at', '')}")


def cmd_rollback(args: argparse.Namespace) -> int:
    from .errors import CalibrationError
    from .harvest import rollback_hint
    from .install import rollback
    try:
        res = rollback(args.partition, root=args.root, pid_file=args.pid_file)
    except CalibrationError as exc:
        # A refit's overlay is kept under its platform's name, not the partition's.
        try:
            hint = rollback_hint(args.partition, _site_config(args), args.root)
        except PerfcastError:
            hint = ""
        if not hint:
            raise
        raise CalibrationError(f"{exc}; {hint}") from None
    print(res.message + (f"; perf-predictd (pid {res.signalled}) reloads" if res.signalled else ""))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from predictor.platform import is_shipped, resolve_platform

    from .install import overlay_of, validate_as_new_version
    from .validate import load_runs, validate_platform
    runs = load_runs(args.runs)
    d = resolve_platform(args.platform)
    inst = None
    # Neither a shipped platform nor an installed version is rewritten in place: the runs and
    # factors go into a new version (a site overlay of a shipped one), installed under the
    # platforms root like a calibration, so that rollback undoes them.  A platform directory of
    # one's own (a fit's output) is recorded in place.
    version = d.resolve()
    installed = version.parent.name == "versions"
    shipped = d.name if is_shipped(d) else overlay_of(d) if installed else ""
    name = shipped or (version.parent.parent.name if installed else "")
    root = args.root if shipped or not installed else str(version.parent.parent.parent)
    if installed and not shipped:
        from .install import current_version
        cur = current_version(Path(root), name)
        if cur is None or cur.path.resolve() != version:
            raise PerfcastError(f"{d}: not the active version of {name} (validate records runs on the active "
                                "one, as a new version; install this one first)")
    if name:
        res, inst = validate_as_new_version(name, runs, root=root, fit=args.fit, replace=args.replace,
                                            pid_file=args.pid_file, dry_run=args.dry_run)
    else:
        res = validate_platform(d, runs, replace=args.replace, dry_run=args.dry_run, fit=args.fit)
    if args.json:
        out = res.to_dict()
        if name and not args.dry_run:
            out["installed"] = None if inst is None else {"version": inst.version, "path": str(inst.path),
                                                          "previous": inst.previous}
        print(json.dumps(out, indent=2))
        return 0
    print(res.table())
    if name and not args.dry_run:
        what = f"site overlay of the shipped platform {shipped}" if shipped else f"installed platform {name}"
        print(f"{what}: " + (
            inst.message + (f"; perf-predictd (pid {inst.signalled}) reloads" if inst.signalled else "")
            if inst is not None else "nothing installed (the fit was not written)"))
        return 0
    print(res.outcome)     # (what was done, or with --dry-run what would be)
    return 0


def _site_config(args: argparse.Namespace):
    """The site config named by --config or $PERFCAST_CONFIG (it must load), else the default one
    when it exists, else None."""
    from slurm_plugin.siteconfig import DEFAULT_PATH as CONFIG_DEFAULT, ENV_VAR, SiteConfigError, load_site_config
    named = args.config or os.environ.get(ENV_VAR)
    if not named and not os.path.exists(CONFIG_DEFAULT):
        return None
    try:
        return load_site_config(named)
    except SiteConfigError as exc:
        raise PerfcastError(str(exc)) from None


def _records_path(args: argparse.Namespace) -> str:
    """--records, else the site config's ``[daemon] records`` (when the config has that key), else
    the default path.  A config named by --config or $PERFCAST_CONFIG must load."""
    return args.records or _records_of(_site_config(args))


def _records_of(cfg) -> str:
    """The site config's ``[daemon] records`` (the default path without a config or that key)."""
    from slurm_plugin.records import DEFAULT_PATH
    return (getattr(cfg.daemon, "records", "") if cfg is not None else "") or DEFAULT_PATH


def cmd_harvest(args: argparse.Namespace) -> int:
    from slurm_plugin.records import RecordStore
    from .harvest import (DEFAULT_OUT, DEFAULT_REFIT_MIN_RUNS, HarvestOptions, check_partition, harvest,
                          parse_since)
    if not args.refit and (args.refit_min_runs is not None or args.root or args.pid_file):
        raise PerfcastError("--refit-min-runs, --root and --pid-file go with --refit")
    cfg = _site_config(args) if args.refit or args.partition else None
    out_dir = Path(args.out) if args.out else DEFAULT_OUT
    if args.partition is not None:
        warning = check_partition(args.partition, cfg, store=RecordStore(_records_path(args), create=False),
                                  runs_dir=out_dir)
        if warning:
            print(f"perf-calibrate: warning: {warning}", file=sys.stderr)

    def site_platform(name: str) -> "str | None":
        """The platform perfcast.toml predicts partition ``name`` with (None: not managed)."""
        pol = cfg.partition(name) if cfg is not None else None
        return pol.platform if pol is not None and pol.platform else None

    opts = HarvestOptions(records=Path(_records_path(args)), out_dir=out_dir,
                          partition=args.partition, since=parse_since(args.since), source=args.source,
                          rescan=args.rescan, dry_run=args.dry_run, refit=args.refit,
                          refit_min_runs=args.refit_min_runs or DEFAULT_REFIT_MIN_RUNS,
                          platforms_root=Path(args.root) if args.root else None,
                          pid_file=Path(args.pid_file) if args.pid_file else None,
                          site_platform=site_platform if cfg is not None and args.refit else None,
                          site_path=str(cfg.path) if cfg is not None else "")
    res = harvest(opts)
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        print(res.summary())
    # A refit that failed, or a daemon that missed the reload, is a failed run (a timer shows it):
    # exit 1; perfcast.toml naming a platform that exists nowhere is the admin's to fix: exit 2.
    if not res.ok:
        for r in res.refits:
            if not r.ok:
                print(f"perf-calibrate: refit of {r.partition}: {r.message}", file=sys.stderr)
    return res.exit_status


def cmd_report(args: argparse.Namespace) -> int:
    from slurm_plugin.records import RecordStore
    from .harvest import check_partition, parse_since
    from .report import build_report, plot_report
    from .watch_log import read_actions
    path = _records_path(args)
    store = RecordStore(path, create=False)
    if args.partition is not None:
        warning = check_partition(args.partition, _site_config(args), store=store, what="partition",
                                  verbs=[v for v in COMMANDS if v != "report"])
        if warning:
            print(f"perf-calibrate: warning: {warning}", file=sys.stderr)
    since = parse_since(args.since) if args.since else None
    pairs = store.outcomes(partition=args.partition, since=since)
    actions = read_actions(path)
    harvested = {o.slurm_job_id for _, o in pairs}
    watched = {a.record_id: store.get(a.record_id) for a in actions if a.slurm_job_id not in harvested}
    watched = {k: v for k, v in watched.items() if v is not None and (since is None or v.created >= since)}
    rep = build_report(pairs, args.partition, watch_actions=actions, watched_records=watched)
    rep.record_losses = store.losses()      # what perf-predictd answered but could not keep
    if args.plot:
        plot_report(rep, args.plot)
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        print(rep.table())
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from .harvest import DEFAULT_OUT
    from .watch import WARNINGS_EXIT_STATUS, WatchError, WatchOptions, watch_once
    conf = _WatchConfig(args)
    loop = _WatchLoop() if args.every is not None else None
    status = 0
    with loop or contextlib.nullcontext():
        while True:
            if loop is not None:
                conf.refresh(loop.take_hup())
            cfg = conf.cfg
            opts = WatchOptions(records=Path(args.records or _records_of(cfg)), policy=cfg.watch,
                                out_dir=Path(args.out) if args.out else DEFAULT_OUT, dry_run=args.dry_run)
            try:
                res = watch_once(opts)
                if res.jobs or args.every is None:      # a loop's idle passes stay out of its log
                    print(json.dumps(res.to_dict(), indent=2) if args.json else res.summary(), flush=True)
                # A pass the store let down ran, but a timer's unit must not show success: the admin
                # would never see the warning (the loop goes on; its log has each warning).
                status = WARNINGS_EXIT_STATUS if res.warnings else 0
            except (WatchError, RecordStoreError, PerfcastError, OSError) as exc:
                if loop is None:
                    raise
                print(f"perf-calibrate: watch: {exc}", file=sys.stderr, flush=True)
                status = 2
            if loop is None:
                return status
            if loop.sleep(args.every):
                # Stopped (SIGTERM): as a pass would exit; a change of perfcast.toml that did not load
                # is a warning that stands until the file is fixed.
                return status or (WARNINGS_EXIT_STATUS if conf.problem else 0)


class _WatchConfig:
    """The site config a watch works with.  ``--every`` re-reads it before a pass when its file
    changed (inode, size, mtime) or after a SIGHUP; one that no longer loads leaves the previous one
    in force, said once per change.  The first read must load (exit 2 otherwise)."""

    def __init__(self, args: argparse.Namespace):
        from slurm_plugin.siteconfig import config_path
        self.path = config_path(args.config)
        self.stamp = _file_stamp(self.path)          # (before the read: a change during it is seen)
        cfg = _site_config(args)
        if cfg is None:
            raise PerfcastError("no site config (--config, $PERFCAST_CONFIG or /etc/perfcast/perfcast.toml): "
                                "the [watch] policy is what allows changing limits")
        self.cfg, self.problem = cfg, ""
        if not cfg.watch.enabled:
            self._say(f"[watch] enabled = false in {self.path}: not watching"
                      + ("" if args.every is None else " (the loop goes on, and reads the file again when it "
                         "changes)"))

    def refresh(self, hup: bool = False) -> None:
        from slurm_plugin.siteconfig import SiteConfigError, load_site_config
        stamp = _file_stamp(self.path)
        changed = stamp != self.stamp
        if not changed and not hup:
            return
        self.stamp = stamp
        try:
            cfg = load_site_config(self.path)
        except SiteConfigError as exc:
            self.problem = str(exc)
            self._say(f"{exc}: keeping the configuration read before (reads {self.path} again when it "
                      "changes)")
            return
        self.cfg, self.problem = cfg, ""
        self._say(f"re-read {self.path}{'' if changed else ' (SIGHUP)'}: "
                  + ("watching" if cfg.watch.enabled else "[watch] enabled = false: not watching (the loop goes "
                     "on, and reads the file again when it changes)"))

    @staticmethod
    def _say(text: str) -> None:
        print(f"perf-calibrate: watch: {text}", file=sys.stderr, flush=True)


def _file_stamp(path: str) -> "tuple[int, int, int, int] | None":
    """What tells a changed file: device, inode (a file replaced by rename), size, mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class _WakeUp(Exception):
    """Raised out of a ``--every`` loop's sleep by SIGTERM."""


class _WatchLoop:
    """Signals of a ``watch --every`` loop: SIGHUP re-reads perfcast.toml at the next pass; SIGTERM
    ends the loop after the pass under way (at once while it sleeps), so a pass is never cut short
    between a limit it changed and the record of it.  Only in the main thread (tests call main())."""

    def __init__(self) -> None:
        self.hup = self.term = self.sleeping = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "_WatchLoop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {signal.SIGHUP: signal.signal(signal.SIGHUP, self._on_hup),
                              signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_term)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_hup(self, signum: int, frame: object) -> None:
        self.hup = True

    def _on_term(self, signum: int, frame: object) -> None:
        self.term = True
        if self.sleeping:
            raise _WakeUp()

    def take_hup(self) -> bool:
        hup, self.hup = self.hup, False
        return hup

    nap = staticmethod(time.sleep)

    def sleep(self, seconds: float) -> bool:
        """Sleep between passes; True when the loop is to end (SIGTERM)."""
        try:
            try:
                self.sleeping = True
                if not self.term:
                    self.nap(seconds)
            finally:
                self.sleeping = False
        except _WakeUp:
            pass
        return self.term


COMMANDS = {"run": cmd_run, "host": cmd_host, "fabric": cmd_fabric, "plan": cmd_plan, "fit": cmd_fit, "import": cmd_import,
            "install": cmd_install, "schedule": cmd_schedule, "status": cmd_status,
            "rollback": cmd_rollback, "validate": cmd_validate, "harvest": cmd_harvest,
            "report": cmd_report, "watch": cmd_watch}


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``scancel``, a Slurm time limit, systemd), raised like Ctrl-C's
    KeyboardInterrupt so that the same clean-up runs: workers stopped, queues closed, what was
    measured kept."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` for the body.  Without this Python dies at once: no
    ``finally`` runs, the workers are left to themselves and the resource tracker reports the
    queues' semaphores as leaked.  (Waits inside C++ put the default back for their duration:
    ``calibrate.env.signals_default``.)"""
    if threading.current_thread() is not threading.main_thread():   # (tests calling main())
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except PerfcastError as exc:
        print(f"perf-calibrate: {exc}", file=sys.stderr)
        if wants_json(sys.argv[1:] if argv is None else argv):
            print(json.dumps(error_document(exc, 2), indent=2))
        return 2
    if args.cmd not in ("run", "host", "fabric"):
        # xgboost and lightgbm each load an OpenMP runtime; spinning idle threads of one starve
        # the other on a loaded node (a small LightGBM fit goes from 0.03 s to 30 s).  Passive
        # waiting avoids that; it must be set before either library loads.  Not for `run`:
        # measurements keep the OpenMP behaviour that training runs with.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        # `run` only: its spawned workers and queues are what SIGTERM's instant death left behind.
        with _sigterm_as_interrupt() if args.cmd == "run" else contextlib.nullcontext():
            return COMMANDS[args.cmd](args)
    except (PerfcastError, RecordStoreError) as exc:
        print(f"perf-calibrate: {exc}", file=sys.stderr)
        return _json_error(args, exc)
    except Terminated:
        # Only `run` resumes: its store keeps every sample written (another command just stopped).
        resumes = "; a run resumes where it stopped" if args.cmd == "run" else ""
        print(f"perf-calibrate: terminated (SIGTERM{resumes})", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        resumes = " (a run resumes where it stopped)" if args.cmd == "run" else ""
        print(f"perf-calibrate: interrupted{resumes}", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"perf-calibrate: {exc.filename or ''}: {exc.strerror or exc}".replace(": : ", ": "),
              file=sys.stderr)
        return _json_error(args, exc)


def _json_error(args: argparse.Namespace, exc: BaseException) -> int:
    """Exit code 2; a command run with ``--json`` also prints the error as its JSON object."""
    if getattr(args, "json", False):
        print(json.dumps(error_document(exc, 2), indent=2))
    return 2


if __name__ == "__main__":
    sys.exit(main())
