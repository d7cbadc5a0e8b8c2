"""Small stand-ins for the predictor and the launch parser, so the daemon's own logic is tested
without bundles: a script says what it "is" in ``# FAKE key=value`` lines.

    # FAKE iters=1000 iter_s=2.5        -> a job of 1000 iterations at 2.5 s each (+60 s overhead)
    # FAKE config=/path/to/file.yml      -> read through read_file (the user's rights), like a
                                            NeoX config; a read failure makes it unpredictable
    # FAKE sleep=0.5                     -> parsing takes that long (deadline tests)
    # FAKE pidfile=/tmp/x                -> the worker writes its pid there before anything else
    # FAKE quote=1                       -> with config=: the error quotes the file's first line
                                            (as a real parser quotes a value it cannot use)
    # FAKE bad=1                         -> the predictor rejects the job (PerfcastError)

parse_script runs in the daemon's worker processes: what it was called with is appended to the
file ``SEEN_PATH`` (JSON lines; the conftest sets it) and read back with :func:`seen`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

from predictor import PerfcastError


@dataclass(frozen=True)
class FakePlatform:
    name: str
    gpus_per_node: int = 4
    bundle_id: str = "fakebundle01"
    gpu_memory_gib: float = 80.0


@dataclass(frozen=True)
class FakeJob:
    iters: int
    iter_s: float
    bad: bool = False

    def to_dict(self) -> dict:
        return {"fake": {"iters": self.iters, "iter_s": self.iter_s}}


@dataclass
class FakeRequest:
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    ntasks: Optional[int] = None
    ntasks_per_node: Optional[int] = None
    partition: Optional[str] = None
    time_limit_minutes: Optional[int] = None
    array: Optional[str] = None
    job_name: Optional[str] = None
    cpus_per_task: Optional[int] = None


SEEN_PATH: Optional[str] = None   # where parse_script records its calls (worker processes)


def seen() -> list[dict[str, Any]]:
    """What parse_script was called with, oldest first (``request`` is a dict of FakeRequest)."""
    if not SEEN_PATH or not os.path.exists(SEEN_PATH):
        return []
    with open(SEEN_PATH) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_platform(name: str) -> FakePlatform:
    if name.startswith("broken"):
        raise PerfcastError(f"no platform {name!r}")
    return FakePlatform(name=name, gpus_per_node=8 if "h100" in name else 4)


def parse_script(path, text=None, *, request=None, read_file=None, env=None,
                 default_gpus_per_node=None, work_dir=None, deadline_s=None):
    kv = dict(re.findall(r"^# FAKE .*?(\w+)=(\S+)", text or "", re.M))
    for m in re.finditer(r"^# FAKE (.*)$", text or "", re.M):
        kv.update(dict(re.findall(r"(\w+)=(\S+)", m.group(1))))
    if "pidfile" in kv:
        with open(kv["pidfile"], "w") as fh:
            fh.write(f"{os.getpid()}\n")
    if SEEN_PATH and path != "warmup.sh":     # the daemon's own warm-up is not a request
        entry = {"path": path, "env": env, "work_dir": work_dir, "deadline_s": deadline_s,
                 "default_gpus_per_node": default_gpus_per_node, "pid": os.getpid(),
                 "request": dataclasses.asdict(request) if dataclasses.is_dataclass(request)
                 else request}
        with open(SEEN_PATH, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
    if "sleep" in kv:
        time.sleep(float(kv["sleep"]))
    if "config" in kv:
        try:
            content = read_file(kv["config"])
        except OSError as exc:
            return SimpleNamespace(job=None, warnings=[],
                                   error=f"cannot predict: cannot read {kv['config']}: {exc.strerror}")
        if "quote" in kv:
            first = content.decode("utf-8", "replace").splitlines()[0][:40]
            return SimpleNamespace(job=None, warnings=[f"num_layers = {first!r} is not an integer"],
                                   error=f"cannot predict: --num-layers: {first!r} is not an "
                                         f"integer (from {kv['config']}: {first})")
    if "iters" not in kv:
        return SimpleNamespace(job=None, warnings=[], error="cannot predict: no training launch found")
    return SimpleNamespace(job=FakeJob(int(kv["iters"]), float(kv.get("iter_s", 1.0)),
                                       bad="bad" in kv), warnings=[], error=None)


def predict(job: FakeJob, platform: FakePlatform):
    if job.bad:
        raise PerfcastError("layout.tp: 3 does not divide heads 64")
    return SimpleNamespace(iteration_seconds=job.iter_s, iterations=job.iters,
                           total_seconds=job.iters * job.iter_s + 60.0,
                           interval_seconds=(job.iter_s * 0.9, job.iter_s * 1.1),
                           platform=platform.name, bundle=platform.bundle_id, warnings=[])


BACKENDS = {"load_platform": load_platform, "predict": predict, "parse_script": parse_script,
            "slurm_request": FakeRequest, "errors": (PerfcastError,)}


def main() -> int:
    """``python -m tests.daemon.fakes --config X``: perf-predictd with these fakes (manual tests)."""
    import asyncio
    import sys
    from slurm_plugin import daemon
    from slurm_plugin.siteconfig import load_site_config
    args = sys.argv[1:]
    opt = lambda name: args[args.index(name) + 1] if name in args else None  # noqa: E731
    cfg = load_site_config(opt("--config"))
    daemon.setup_logging("info", opt("--log-file"))
    engine = daemon.Engine(cfg, BACKENDS).load()
    server = daemon.PredictServer(engine, config_file=cfg.path,
                                  engine_factory=lambda c: daemon.Engine(c, BACKENDS).load())
    asyncio.run(daemon.serve(server, opt("--pid-file")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# A batch script the fake predictor reads (# FAKE iters= iter_s=), and the request job_submit.lua
# would send for it: what most daemon tests submit.
JOB = "#!/bin/bash\n#SBATCH -N 2\n# FAKE iters=1000 iter_s=2.4\nsrun python train.py\n"


def req(**kw: Any) -> dict:
    base = {"script": JOB, "submit_uid": os.geteuid(), "submit_gid": os.getegid(),
            "partition": "gpu", "work_dir": "/tmp"}
    base.update(kw)
    return base


def until(fn: Any, within: float = 30.0, what: str = "condition") -> Any:
    """``fn()`` once it is true (polled), or a failed assertion after ``within`` seconds."""
    end = time.monotonic() + within
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)
