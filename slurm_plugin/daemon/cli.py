"""``perf-predictd``: the command line.

``--check`` applies the rule a reload (SIGHUP) applies: a config that does not parse fails (rc 2),
and so does a ``slurm_user`` this host does not know (a start or reload logs that at ERROR,
``slurm_user_unknown``); a config whose platforms do not all load fails (rc 1), and the running
daemon refuses such a reload and keeps its config.  At start there is no config to keep: the daemon
starts anyway, logs ``platform_failed`` for each platform that does not load (and lists them in
``ready ... failed=``), and the partitions on it fail open (jobs go through unchanged, their users
told the platform is not available).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Callable, Optional

from ..siteconfig import (LOG_LEVELS, DaemonSettings, SiteConfig, SiteConfigError, config_path,
                          configured_partitions, load_site_config, slurm_partition_names, slurm_user_problem,
                          unknown_partitions)
from ..slurm_client import SlurmError
from .engine import Engine, release_memory
from .logs import log_event, setup_logging
from .pool import SESSION_NICE, raise_session_priority
from .server import PredictServer, serve


def _one_thread_per_worker() -> None:
    # Each worker process predicts one job at a time: numerical libraries must not start a
    # thread per core in every worker (set before numpy is imported by the predictor).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def check_partition_names(cfg: SiteConfig, lookup: Callable[[], list[str]] = slurm_partition_names) -> int:
    """``--check``'s partition lines: the configured partition names against Slurm's; the number
    of near misses of a Slurm partition (typos: they fail the check).

    A name near no Slurm partition is a warning only (a partition still to be created is
    legitimate: its jobs are left alone until it exists), and a Slurm that cannot be asked (no
    controller, no answer within :data:`SLURM_LOOKUP_S`) is one line, not a failure."""
    if not configured_partitions(cfg):
        return 0
    try:
        known = lookup()
    except SlurmError as exc:
        print(f"partitions: not checked against Slurm ({exc})")
        return 0
    problems = unknown_partitions(cfg, known)
    for p in problems:
        print(f"partition {p.name}: {'FAILED' if p.near_miss else 'warning'}: {p.message()}")
    if not problems:
        print(f"partitions: ok (every name is one of Slurm's {len(set(known))} partitions)")
    return sum(p.near_miss for p in problems)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="perf-predictd",
                                 description="perfcast prediction daemon for job_submit.lua")
    ap.add_argument("--config", help="site config (default: $PERFCAST_CONFIG or "
                                     "/etc/perfcast/perfcast.toml)")
    ap.add_argument("--log-file", help="append log lines here instead of stderr")
    ap.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                    help="debug | info | warning | error (default: the config's)")
    ap.add_argument("--pid-file", help="write the pid here once listening")
    ap.add_argument("--check", action="store_true",
                    help="validate the config, load its platforms and compare its partition names "
                         "with Slurm's, then exit (0 = good; 1 = a platform that does not load or "
                         "a partition name that is a near miss of one of Slurm's; 2 = a config "
                         "error, an unknown slurm_user included)")
    args = ap.parse_args(argv)
    _one_thread_per_worker()
    path = config_path(args.config)
    try:
        cfg = load_site_config(path)
    except SiteConfigError as exc:
        print(f"perf-predictd: {exc}", file=sys.stderr)
        return 2
    unknown_user = slurm_user_problem(cfg.daemon) if args.check else ""
    if unknown_user and cfg.daemon.slurm_user == DaemonSettings.slurm_user:
        # The default, on a host without a "slurm" user: a SlurmUser of root needs none (root is
        # always trusted), so it is said, not failed.
        print(f"perf-predictd: warning: {path}: {unknown_user} (the default); if slurm.conf's SlurmUser "
              "is not root, set [daemon] slurm_user to it", file=sys.stderr)
    elif unknown_user:
        # (a start only logs it, slurm_user_unknown: the daemon still serves root and the user
        # socket; but on a controller it would refuse every request of slurmctld's)
        print(f"perf-predictd: {path}: {unknown_user}; slurmctld connects as slurm.conf's SlurmUser, "
              "which the daemon would not serve", file=sys.stderr)
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
        typos = check_partition_names(cfg)
        return 0 if not engine.platform_errors and not typos else 1
    engine.warm_up()       # lazy imports and first-use costs paid once, shared by the workers
    log_event("session_priority", nice=SESSION_NICE, result=raise_session_priority())
    server = PredictServer(engine, config_file=path, freeze_gc=True,
                           log_level_fixed=bool(args.log_level))
    try:
        asyncio.run(serve(server, args.pid_file))
    except SystemExit as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
