"""``perf-predictd``: the command line."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Optional

from ..siteconfig import SiteConfigError, config_path, load_site_config
from .engine import Engine, release_memory
from .logs import setup_logging
from .server import PredictServer, serve


def _one_thread_per_worker() -> None:
    # Each worker process predicts one job at a time: numerical libraries must not start a
    # thread per core in every worker (set before numpy is imported by the predictor).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="perf-predictd",
                                 description="perfcast prediction daemon for job_submit.lua")
    ap.add_argument("--config", help="site config (default: $PERFCAST_CONFIG or "
                                     "/etc/perfcast/perfcast.toml)")
    ap.add_argument("--log-file", help="append log lines here instead of stderr")
    ap.add_argument("--log-level", help="debug | info | warning (default: the config's)")
    ap.add_argument("--pid-file", help="write the pid here once listening")
    ap.add_argument("--check", action="store_true",
                    help="validate the config and load its platforms, then exit (0 = good)")
    args = ap.parse_args(argv)
    _one_thread_per_worker()
    path = config_path(args.config)
    try:
        cfg = load_site_config(path)
    except SiteConfigError as exc:
        print(f"perf-predictd: {exc}", file=sys.stderr)
        return 2
    setup_logging(args.log_level or cfg.daemon.log_level, args.log_file)
    try:
        engine = Engine(cfg).load(lookup_partitions=not args.check)
    except ImportError as exc:
        print(f"perf-predictd: cannot import the predictor: {exc}", file=sys.stderr)
        return 2
    release_memory()
    if args.check:
        for name in cfg.platforms():
            state = "ok" if name in engine.platforms else f"FAILED: {engine.platform_errors[name]}"
            print(f"platform {name}: {state}")
        return 0 if not engine.platform_errors else 1
    engine.warm_up()       # lazy imports and first-use costs paid once, shared by the workers
    server = PredictServer(engine, config_file=path, freeze_gc=True)
    try:
        asyncio.run(serve(server, args.pid_file))
    except SystemExit as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
