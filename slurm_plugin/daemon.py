"""perf-predictd: the prediction daemon next to slurmctld.

job_submit.lua runs inside slurmctld while it holds its locks, so the Lua side only forwards the
job here over a Unix socket and applies the answer.  This daemon keeps the platforms loaded (one
load, predictions in-process), parses the batch script, predicts, applies the partition's policy
and answers within a deadline shorter than the Lua timeout.

Protocol (one request and one answer per connection):

- request: one JSON object on one line (``\\n``-terminated, or ended by EOF), at most
  ``max_request_bytes``.  Keys (all optional but ``script`` and ``submit_uid``)::

      script, work_dir, submit_uid, submit_gid, partition, min_nodes, max_nodes, num_tasks,
      ntasks_per_node, cpus_per_task, tres_per_node, tres_per_job, tres_per_task, time_limit,
      max_time, argv (list), name, array, env (object; cli_filter only), format ("lines"|"json"),
      partitions ({name: {"max_time": minutes, "default": bool}}, from job_submit.lua's part_list)

  Numbers may be Slurm's NO_VAL markers; the daemon treats those as "not given".  ``partition``
  may list several ("a,b"): the first one perfcast manages is used; none = the default partition.
- answer, ``format = "lines"`` (what job_submit.lua asks for, so Lua parses no JSON): ``key=value``
  lines, values never contain a newline::

      status=ok|skip|error|refused
      time_limit=30            (only when the limit must be set; minutes)
      admin_comment=perfcast:v1 iter_s=... iters=... total_min=... platform=... bundle=...
      message=perfcast: ...    (one line for the user; absent = say nothing)
      reason=short-code

  ``format = "json"`` (the default; tests and tools): the same keys plus ``prediction`` and
  ``warnings``, as one JSON object.

Security: on the controller socket only root, the SlurmUser and the daemon's own uid are served
(SO_PEERCRED).  On the optional user socket (for cli_filter.lua on login nodes) anybody is served,
but as themselves: the kernel-reported uid/gid replace whatever the request claims.  Files named by
a script are read by a child that has dropped to the submitting user's uid, gid and groups, with a
size and time bound; answers carry only numbers and messages computed here, never file contents.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import errno
import json
import logging
import os
import pwd
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from . import policy as policy_mod
from .policy import PredictionFacts
from .siteconfig import SiteConfig, SiteConfigError, config_path, load_site_config

log = logging.getLogger("perfcast.daemon")

# Slurm's "not set" markers.  16-bit ones only apply to 16-bit fields: uid 65534 is `nobody`.
_NO_VALS = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF}
_NO_VALS16 = _NO_VALS | {0xFFFE, 0xFFFF}
_U16_FIELDS = ("ntasks_per_node", "cpus_per_task")
MAX_MESSAGE = 1000           # characters of the user's line; Slurm truncates long log_user text
MAX_RECORD = 500             # characters of the AdminComment record
MAX_FILES_PER_REQUEST = 16   # a script naming more configs than this is not a training launch
HEAD = "/usr/bin/head" if os.path.exists("/usr/bin/head") else "head"


# --------------------------------------------------------------------------------------------
# request and answer

class BadRequest(ValueError):
    """The request itself is malformed (not the job): answered with status=error."""


@dataclass(frozen=True)
class PredictRequest:
    """One job as job_submit.lua (or cli_filter.lua) describes it."""

    script: str
    submit_uid: int
    submit_gid: int
    work_dir: str = "/"
    partition: Optional[str] = None
    min_nodes: Optional[int] = None
    max_nodes: Optional[int] = None
    num_tasks: Optional[int] = None
    ntasks_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    tres_per_node: str = ""
    tres_per_job: str = ""
    tres_per_task: str = ""
    time_limit: Optional[int] = None
    max_time: Optional[int] = None
    argv: tuple[str, ...] = ()
    name: Optional[str] = None
    array: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    format: str = "json"
    partition_max_time: Mapping[str, Optional[int]] = field(default_factory=dict)
    default_partition: Optional[str] = None

    def candidate_partitions(self) -> list[str]:
        """The partitions the job may run in, in the user's order (or the default one)."""
        if self.partition:
            return [p.strip() for p in self.partition.split(",") if p.strip()]
        return [self.default_partition] if self.default_partition else []

    @property
    def gpus_per_node(self) -> Optional[int]:
        """GPUs per node from --gres/--gpus-per-node, else --gpus spread over the nodes."""
        per_node = _gpu_count(self.tres_per_node)
        if per_node:
            return per_node
        total = _gpu_count(self.tres_per_job)
        if total and self.min_nodes:
            return max(1, total // self.min_nodes)
        per_task = _gpu_count(self.tres_per_task)
        if per_task and self.ntasks_per_node:
            return per_task * self.ntasks_per_node
        return None


_GPU_RE = re.compile(r"(?:^|[,;])\s*(?:gres[:/])?gpu(?::[^:,;]+)?:(\d+)\s*(?=$|[,;(])")


def _gpu_count(tres: str) -> Optional[int]:
    """``gres:gpu:4`` / ``gres/gpu:a100:4`` / ``gpu:4`` -> 4; None when absent."""
    if not tres:
        return None
    total = 0
    for m in _GPU_RE.finditer(tres):
        total += int(m.group(1))
    return total or None


def parse_request(raw: bytes, *, max_script: int,
                  peer: Optional[tuple[int, int]] = None) -> PredictRequest:
    """Decode and validate one request; raises :class:`BadRequest` with a short reason.

    ``peer`` (uid, gid) replaces the request's own claim (the user socket: the kernel's word).
    """
    try:
        # Scripts are bytes to Slurm; undecodable bytes must not make a job unpredictable.
        data = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        raise BadRequest("request is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("request is not a JSON object")
    cli = data.get("cli_options")
    if isinstance(cli, dict):
        data = _from_cli_options(data, cli)
    script = data.get("script")
    if not isinstance(script, str):
        raise BadRequest("no script text (sbatch < file, srun and salloc have none)")
    if len(script) > max_script:
        raise BadRequest("script larger than the limit")
    fmt = data.get("format", "json")
    if fmt not in ("json", "lines"):
        raise BadRequest("format must be json or lines")
    uid, gid = peer if peer is not None else (_opt_int(data, "submit_uid"),
                                               _opt_int(data, "submit_gid"))
    if uid is None:
        raise BadRequest("submit_uid missing")
    if gid is None:   # guessing a group could grant the reader rights the user does not have
        raise BadRequest("submit_gid missing")
    work_dir = data.get("work_dir") or "/"
    if not isinstance(work_dir, str) or not work_dir.startswith("/") or "\0" in work_dir:
        raise BadRequest("work_dir must be an absolute path")
    argv = data.get("argv") or []
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise BadRequest("argv must be a list of strings")
    env = data.get("env") or {}
    if not isinstance(env, dict) or len(env) > 4096:
        raise BadRequest("env must be an object")
    env = {str(k): str(v) for k, v in env.items()
           if isinstance(k, str) and isinstance(v, str) and len(k) < 256 and len(v) < 65536}
    time_limit = _opt_int(data, "time_limit")
    if time_limit is None and isinstance(data.get("time_limit_text"), str):
        # cli_filter.lua passes --time as the user typed it ("1:30:00", "2-00:00:00", "90").
        from .slurm_client import SlurmError, parse_slurm_time
        try:
            time_limit = parse_slurm_time(data["time_limit_text"][:64])
        except SlurmError:
            raise BadRequest("time_limit_text is not a Slurm time") from None
    tres_per_node = _opt_str(data, "tres_per_node") or ""
    gpn = _opt_str(data, "gpus_per_node")      # cli_filter: --gpus-per-node as typed ("4", "a100:4")
    if gpn and not tres_per_node:
        tres_per_node = "gpu:" + gpn
    parts = data.get("partitions") or {}
    if not isinstance(parts, dict) or len(parts) > 10000:
        raise BadRequest("partitions must be an object")
    max_times: dict[str, Optional[int]] = {}
    default_part = None
    for name, info in parts.items():
        if not isinstance(info, dict):
            continue
        max_times[str(name)] = _opt_int(info, "max_time")
        if info.get("default") is True:
            default_part = str(name)
    return PredictRequest(
        script=script, submit_uid=uid, submit_gid=gid, work_dir=work_dir,
        partition=_opt_str(data, "partition"),
        min_nodes=_opt_int(data, "min_nodes"), max_nodes=_opt_int(data, "max_nodes"),
        num_tasks=_opt_int(data, "num_tasks"), ntasks_per_node=_opt_int(data, "ntasks_per_node"),
        cpus_per_task=_opt_int(data, "cpus_per_task"),
        tres_per_node=tres_per_node,
        tres_per_job=_opt_str(data, "tres_per_job") or "",
        tres_per_task=_opt_str(data, "tres_per_task") or "",
        time_limit=time_limit, max_time=_opt_int(data, "max_time"),
        argv=tuple(argv[:256]), name=_opt_str(data, "name"), array=_opt_str(data, "array"),
        env=env, format=fmt, partition_max_time=max_times, default_partition=default_part)


# cli_filter.lua sends slurm.json_cli_options(options): sbatch's long option names -> our keys.
_CLI_KEYS = {"partition": "partition", "nodes": "min_nodes", "ntasks": "num_tasks",
             "ntasks-per-node": "ntasks_per_node", "cpus-per-task": "cpus_per_task",
             "gres": "tres_per_node", "gpus-per-node": "gpus_per_node", "gpus": "tres_per_job",
             "job-name": "name", "array": "array", "time": "time_limit_text", "chdir": "work_dir"}


def _from_cli_options(data: Mapping[str, Any], cli: Mapping[str, Any]) -> dict[str, Any]:
    """Fill request keys from cli_filter's option dump; only options really set (not null)."""
    out = dict(data)
    for opt, key in _CLI_KEYS.items():
        value = cli.get(opt)
        # sbatch's chdir (default: the cwd) beats the PWD the Lua side sends as a fallback
        if isinstance(value, str) and value and (key not in data or key == "work_dir"):
            out[key] = value
    tres = out.get("tres_per_job")
    if isinstance(tres, str) and not tres.startswith(("gpu", "gres")):
        out["tres_per_job"] = "gpu:" + tres        # --gpus=8 / --gpus=a100:8
    argv = cli.get("argv")
    if isinstance(argv, list) and "argv" not in data:
        out["argv"] = [a for a in argv if isinstance(a, str)]
    return out


def _opt_int(data: Mapping[str, Any], key: str) -> Optional[int]:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        # cli_filter.lua sends options as typed: "4", "2-4" (min-max nodes), "16".
        m = re.match(r"\s*(\d{1,18})", value)
        if not m:
            raise BadRequest(f"{key} must be an integer")
        value = int(m.group(1))
    if not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer")
    if value < 0 or value in (_NO_VALS16 if key in _U16_FIELDS else _NO_VALS):
        return None
    return value


def _opt_str(data: Mapping[str, Any], key: str) -> Optional[str]:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 4096:
        raise BadRequest(f"{key} must be a short string")
    return value


@dataclass
class Answer:
    status: str                       # ok | skip | error | refused
    reason: str = ""
    message: str = ""
    time_limit: Optional[int] = None
    admin_comment: str = ""
    warnings: list[str] = field(default_factory=list)
    prediction: Optional[dict] = None
    partition: str = ""               # the partition decided for (logged, not sent)

    def encode(self, fmt: str) -> bytes:
        if fmt == "lines":
            out = [f"status={self.status}"]
            if self.time_limit is not None:
                out.append(f"time_limit={int(self.time_limit)}")
            if self.admin_comment:
                out.append(f"admin_comment={_one_line(self.admin_comment, MAX_RECORD)}")
            if self.message:
                out.append(f"message={_one_line(self.message, MAX_MESSAGE)}")
            if self.reason:
                out.append(f"reason={_one_line(self.reason, 100)}")
            return ("\n".join(out) + "\n").encode("utf-8", "replace")
        body = {"status": self.status, "reason": self.reason,
                "message": _one_line(self.message, MAX_MESSAGE), "time_limit": self.time_limit,
                "admin_comment": _one_line(self.admin_comment, MAX_RECORD),
                "warnings": [_one_line(w, MAX_MESSAGE) for w in self.warnings],
                "prediction": self.prediction}
        return (json.dumps(body, default=str) + "\n").encode()


def _one_line(text: str, limit: int) -> str:
    """Printable, newline-free, bounded: what Lua and slurm.log_user can take safely."""
    text = "".join(c if (c.isprintable() or c == " ") else " " for c in str(text))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode_lines(raw: bytes) -> dict[str, str]:
    """Parse a ``lines`` answer (what job_submit.lua does, for tests and tools)."""
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


# --------------------------------------------------------------------------------------------
# reading files as the submitting user

class FileTooLarge(OSError):
    pass


class UserFileReader:
    """``read_file`` for the launch parser: reads with the submitting user's rights, bounded.

    A child process drops to the user's uid, gid and supplementary groups before it opens the
    file (subprocess does setgroups/setregid/setreuid in C between fork and exec, so no Python
    runs in the forked child), so the kernel decides exactly as it would for the user, ACLs and
    root-squashed NFS included.  Paths are made absolute against the job's work_dir and the child
    runs in ``/``: a relative open from a directory root had entered would skip the user's search
    permission on that directory's ancestors.  Nothing read here is ever put in an answer or log.
    """

    def __init__(self, uid: int, gid: int, work_dir: str, *, max_bytes: int, timeout_s: float,
                 deadline: Optional[float] = None):
        self.uid, self.gid, self.work_dir = uid, gid, work_dir
        self.max_bytes, self.timeout_s, self.deadline = max_bytes, timeout_s, deadline
        self.reads = 0

    def _groups(self) -> list[int]:
        try:
            name = pwd.getpwuid(self.uid).pw_name
            return sorted(set(os.getgrouplist(name, self.gid)))
        except (KeyError, OSError):
            return [self.gid]

    def __call__(self, path: str) -> bytes:
        if not isinstance(path, str) or not path or "\0" in path:
            raise FileNotFoundError(errno.ENOENT, "bad path")
        self.reads += 1
        if self.reads > MAX_FILES_PER_REQUEST:
            raise OSError(errno.EMFILE, "too many files named by one script")
        full = path if os.path.isabs(path) else os.path.join(self.work_dir, path)
        timeout = self.timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            raise TimeoutError(errno.ETIMEDOUT, "no time left to read files")
        kwargs: dict[str, Any] = {}
        if os.geteuid() == 0:
            kwargs = {"user": self.uid, "group": self.gid, "extra_groups": self._groups()}
        elif self.uid != os.geteuid():
            # An unprivileged daemon cannot become somebody else; refusing is the only safe answer.
            raise PermissionError(errno.EACCES, "daemon cannot read files as that user")
        try:
            proc = subprocess.run([HEAD, "-c", str(self.max_bytes + 1), "--", full],
                                  capture_output=True, timeout=timeout, cwd="/", close_fds=True,
                                  env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"}, **kwargs)
        except subprocess.TimeoutExpired:
            # A FIFO or a hung NFS mount: give up on the file, not on the daemon.
            raise TimeoutError(errno.ETIMEDOUT, "reading the file took too long") from None
        except OSError as exc:
            raise OSError(exc.errno, "cannot start reader") from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace")
            if "Permission denied" in err:
                raise PermissionError(errno.EACCES, "Permission denied")
            if "No such file" in err or "Not a directory" in err:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory")
            if "Is a directory" in err:
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            raise OSError(errno.EIO, "cannot read file")
        if len(proc.stdout) > self.max_bytes:
            raise FileTooLarge(errno.EFBIG, f"file larger than {self.max_bytes} bytes")
        return proc.stdout


# --------------------------------------------------------------------------------------------
# the engine: platforms, parser, predictor, policy

def _default_backends() -> dict[str, Callable]:
    """The real predictor and launch parser, imported late so ``--help`` stays instant."""
    from predictor import PerfcastError, load_platform, predict
    from . import launch
    return {"load_platform": load_platform, "predict": predict,
            "parse_script": launch.parse_script, "slurm_request": launch.SlurmRequest,
            "errors": (PerfcastError,)}


class CacheMiss(Exception):
    """handle(cached_only=True) would have to parse or predict."""


class Engine:
    """Everything a request needs, immutable after load; a SIGHUP builds a new one and swaps it.

    ``backends`` (for tests): ``load_platform(name)``, ``predict(job, platform)``,
    ``parse_script(path, text, *, request, read_file, env, default_gpus_per_node, work_dir)``,
    ``slurm_request`` (a constructor taking keyword fields) and ``errors`` (a tuple of the
    exception types meaning "bad job", reported to the user as one line).
    """

    def __init__(self, config: SiteConfig, backends: Optional[Mapping[str, Any]] = None):
        self.config = config
        self.backends = dict(backends) if backends is not None else _default_backends()
        self.platforms: dict[str, Any] = {}
        self.platform_errors: dict[str, str] = {}
        self._cache: "collections.OrderedDict[Any, PredictionFacts]" = collections.OrderedDict()
        self._cache_lock = threading.Lock()
        self.loaded_at = time.time()
        # {partition: (MaxTime minutes or None, is default)} from Slurm itself; only filled for
        # the user socket (cli_filter.lua cannot see part_list; job_submit.lua sends it).
        self.slurm_partitions: dict[str, tuple[Optional[int], bool]] = {}
        self._pw: dict[int, tuple[float, Optional[tuple[str, str]]]] = {}

    def load(self, lookup_partitions: bool = True) -> "Engine":
        if lookup_partitions and self.config.daemon.user_socket:
            # In the background: a slow or absent controller must not delay serving.
            threading.Thread(target=self._load_slurm_partitions, daemon=True,
                             name="slurm-partitions").start()
        for name in self.config.platforms():
            t0 = time.monotonic()
            try:
                self.platforms[name] = self.backends["load_platform"](name)
                log_event("platform_loaded", platform=name,
                          bundle=getattr(self.platforms[name], "bundle_id", ""),
                          ms=round((time.monotonic() - t0) * 1e3, 1))
            except Exception as exc:  # a broken bundle must not take the daemon down
                self.platform_errors[name] = _one_line(str(exc) or type(exc).__name__, 300)
                log_event("platform_failed", level=logging.ERROR, platform=name,
                          error=self.platform_errors[name])
        return self

    def _load_slurm_partitions(self) -> None:
        from .slurm_client import SlurmClient, SlurmError
        try:
            parts = SlurmClient(timeout=10).partitions()
        except SlurmError as exc:
            log_event("slurm_partitions_failed", level=logging.WARNING, error=str(exc))
            return
        self.slurm_partitions = {p.name: (p.max_time_minutes, p.is_default) for p in parts}
        log_event("slurm_partitions", count=len(parts))

    # The work of one request, run in a worker thread (never on the event loop).
    def handle(self, req: PredictRequest, deadline: float, cached_only: bool = False) -> Answer:
        """Answer one request.  ``cached_only``: raise :class:`CacheMiss` rather than parse or
        predict (the event loop answers repeats itself, without a trip through the pool)."""
        if time.monotonic() >= deadline:
            # Queued behind slower work and already answered "too slow": do not spend CPU on it.
            return Answer("error", reason="deadline")
        if not req.partition_max_time and self.slurm_partitions:
            req = dataclasses.replace(
                req, partition_max_time={k: v[0] for k, v in self.slurm_partitions.items()},
                default_partition=next((k for k, v in self.slurm_partitions.items() if v[1]), None))
        candidates = req.candidate_partitions()
        name = next((p for p in candidates if p in self.config.partitions),
                    candidates[0] if candidates else None)
        part = self.config.partition(name)
        if part is None:
            return Answer("skip", reason="partition-unmanaged", partition=name or "")
        max_time = req.max_time if req.max_time is not None else req.partition_max_time.get(name or "")
        if part.policy == "off":
            return Answer("skip", reason="policy-off")
        platform = self.platforms.get(part.platform)
        if platform is None:
            # The reason (a bundle error) went to the log at load time; users get the name only.
            return self._skip(part, "platform-unavailable",
                              f"platform {part.platform} is not available")
        settings = self.config.daemon
        reader = UserFileReader(req.submit_uid, req.submit_gid, req.work_dir,
                                max_bytes=settings.max_file_bytes,
                                timeout_s=settings.file_read_timeout_ms / 1000.0, deadline=deadline)
        slurm_req = self._slurm_request(req, part.name or name)
        parsed = self._parse(req, slurm_req, reader, getattr(platform, "gpus_per_node", None),
                             cached_only)
        job = getattr(parsed, "job", None)
        if job is None:
            why = getattr(parsed, "error", None) or "cannot predict: no training job found"
            return self._skip(part, "no-job", why)
        try:
            facts = self._predict(job, part.platform, platform, cached_only)
        except self.backends.get("errors", ()) as exc:
            return self._skip(part, "predict-error", f"cannot predict: {exc}")
        if facts.iterations <= 0:
            # A time limit from start-up alone would kill the job: say why and change nothing.
            return self._skip(part, "no-length", "cannot predict the run time: the script gives no "
                              "train_iters, train_samples or train_tokens that could be read")
        decision = policy_mod.decide(facts, req.time_limit, part, max_time)

        warnings = list(getattr(parsed, "warnings", []) or [])
        return Answer("ok", reason=decision.action, message=decision.message, partition=name or "",
                      time_limit=decision.time_limit_minutes, admin_comment=decision.admin_comment,
                      warnings=decision.warnings + [str(w) for w in warnings],
                      prediction={"iteration_seconds": facts.iteration_seconds,
                                  "iterations": facts.iterations,
                                  "total_seconds": facts.total_seconds,
                                  "interval_seconds": list(facts.interval_seconds),
                                  "platform": facts.platform, "bundle": facts.bundle,
                                  "recommended_minutes": decision.recommended_minutes})

    def _parse(self, req: PredictRequest, slurm_req: Any, reader: "UserFileReader",
               default_gpn: Optional[int], cached_only: bool = False) -> Any:
        """parse_script, remembered when the script read no file.

        Resubmissions and job arrays send the same script again and again; when parsing it read
        nothing (no launch config), the result depends only on what is in the key below, so it
        can be reused.  A parse that read files is never reused: the files may have changed, and
        another user may not be allowed to read them.
        """
        env = self._env(req, cached_only)
        path = req.argv[0] if req.argv else "<batch script>"
        try:
            key = ("parse", path, req.script, _freeze(slurm_req), tuple(sorted(env.items())),
                   req.work_dir, default_gpn)
            hash(key)
        except TypeError:
            key = None
        hit = self._cached(key, cached_only)
        if hit is not None:
            return hit
        parsed = self.backends["parse_script"](path, req.script, request=slurm_req,
                                               read_file=reader, env=env,
                                               default_gpus_per_node=default_gpn,
                                               work_dir=req.work_dir)
        if key is not None and reader.reads == 0:
            self._remember(key, parsed)
        return parsed

    def _remember(self, key: Any, value: Any) -> None:
        if self.config.daemon.cache_size <= 0:
            return
        with self._cache_lock:
            self._cache[key] = value
            while len(self._cache) > self.config.daemon.cache_size:
                self._cache.popitem(last=False)

    def _skip(self, part, reason: str, why: str) -> Answer:
        why = _one_line(why, 400)
        msg = f"perfcast: no time limit suggested ({why}); job submitted unchanged"
        return Answer("skip", reason=reason, message=msg if part.notify_skipped else "",
                      partition=part.name)

    def _slurm_request(self, req: PredictRequest, name: Optional[str]) -> Any:
        ctor = self.backends.get("slurm_request")
        values = {"nodes": req.min_nodes, "gpus_per_node": req.gpus_per_node,
                  "ntasks": req.num_tasks, "ntasks_per_node": req.ntasks_per_node,
                  "partition": name, "time_limit_minutes": req.time_limit,
                  "array": req.array, "job_name": req.name, "cpus_per_task": req.cpus_per_task}
        if ctor is None:
            return values
        if dataclasses.is_dataclass(ctor):
            names = {f.name for f in dataclasses.fields(ctor)}
            values = {k: v for k, v in values.items() if k in names}
        return ctor(**values)

    def _passwd(self, uid: int, cached_only: bool = False) -> Optional[tuple[str, str]]:
        """(name, home) of ``uid``, remembered for 10 minutes: NSS may be LDAP/sssd, which the
        event loop must never wait for (cached_only: a miss goes to the pool)."""
        now = time.monotonic()
        hit = self._pw.get(uid)
        if hit is not None and now - hit[0] < 600:
            return hit[1]
        if cached_only:
            raise CacheMiss()
        try:
            pw = pwd.getpwuid(uid)
            value: Optional[tuple[str, str]] = (pw.pw_name, pw.pw_dir)
        except KeyError:
            value = None
        self._pw[uid] = (now, value)
        return value

    def _env(self, req: PredictRequest, cached_only: bool = False) -> dict[str, str]:
        """What a script's ``$VAR`` may expand to: the user's env (cli_filter) or their passwd."""
        env = dict(req.env)
        pw = self._passwd(req.submit_uid, cached_only)
        if pw is not None:
            env.setdefault("HOME", pw[1])
            env.setdefault("USER", pw[0])
            env.setdefault("LOGNAME", pw[0])
        env.setdefault("SLURM_SUBMIT_DIR", req.work_dir)
        env.setdefault("PWD", req.work_dir)
        if req.name:
            env.setdefault("SLURM_JOB_NAME", req.name)
        if req.partition:
            env.setdefault("SLURM_JOB_PARTITION", req.partition)
        return env

    def _cached(self, key: Any, cached_only: bool) -> Any:
        """The cached answer for ``key`` (refreshed as most recent), else None or CacheMiss."""
        if key is not None:
            with self._cache_lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    return hit
        if cached_only:
            raise CacheMiss()
        return None

    def _predict(self, job: Any, name: str, platform: Any,
                 cached_only: bool = False) -> PredictionFacts:
        try:
            key = (name, hash(job), job)
        except TypeError:
            key = None
        hit = self._cached(key, cached_only)
        if hit is not None:
            return hit
        pred = self.backends["predict"](job, platform)
        facts = facts_from_prediction(pred, name, platform)
        if key is not None:
            self._remember(key, facts)
        return facts


def _freeze(obj: Any) -> Any:
    """A hashable stand-in for a (possibly mutable) dataclass or dict."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj).__name__,) + tuple((f.name, _freeze(getattr(obj, f.name)))
                                             for f in dataclasses.fields(obj))
    if isinstance(obj, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in obj.items()))
    if isinstance(obj, (list, tuple)):
        return tuple(_freeze(v) for v in obj)
    return obj


def release_memory() -> None:
    """Hand the heap freed by platform loading back to the OS.

    Loading bundles decompresses and decodes model files: tens of MB of short-lived objects that
    glibc keeps mapped after they are freed (about 70 MB with two platforms).  The daemon lives
    for months, so trim once after each (re)load.
    """
    import gc
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to do
        pass


def facts_from_prediction(pred: Any, name: str, platform: Any) -> PredictionFacts:
    """Read a predictor.Prediction defensively: platform/bundle may be names or objects."""
    plat = getattr(pred, "platform", None) or name
    plat = getattr(plat, "name", plat)
    bundle = getattr(pred, "bundle", None) or getattr(platform, "bundle_id", "") or "-"
    bundle = getattr(bundle, "bundle_id", None) or getattr(bundle, "id", None) or bundle
    low_high = tuple(getattr(pred, "interval_seconds", (0.0, 0.0)) or (0.0, 0.0))
    return PredictionFacts(iteration_seconds=float(pred.iteration_seconds),
                           iterations=int(pred.iterations), total_seconds=float(pred.total_seconds),
                           platform=str(plat), bundle=str(bundle),
                           interval_seconds=(float(low_high[0]), float(low_high[-1])))


# --------------------------------------------------------------------------------------------
# the server

def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel reports it."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


def trusted_uids(settings) -> set[int]:
    """root, the SlurmUser, and ourselves (a process of our uid could ptrace us anyway)."""
    uids = {0, os.geteuid()}
    try:
        uids.add(pwd.getpwnam(settings.slurm_user).pw_uid)
    except KeyError:
        if settings.slurm_user.isdigit():
            uids.add(int(settings.slurm_user))
        else:
            log_event("slurm_user_unknown", level=logging.WARNING, user=settings.slurm_user)
    return uids


class PredictServer:
    """The asyncio Unix-socket server; ``engine`` is swapped whole on reload."""

    def __init__(self, engine: Engine, *, config_file: Optional[str] = None,
                 engine_factory: Optional[Callable[[SiteConfig], Engine]] = None):
        self.engine = engine
        self.settings = engine.config.daemon
        self.config_file = config_file
        self.engine_factory = engine_factory or (lambda cfg: Engine(cfg).load())
        self.trusted = trusted_uids(self.settings)
        self.pool = ThreadPoolExecutor(max_workers=self.settings.workers,
                                       thread_name_prefix="predict")
        self.servers: list[asyncio.AbstractServer] = []
        self.stats = collections.Counter()
        self._reloading: Optional[asyncio.Task] = None
        self._in_flight = 0

    async def start(self) -> None:
        s = self.settings
        self.servers.append(await self._listen(s.socket, s.socket_mode, user_mode=False))
        if s.user_socket:
            self.servers.append(await self._listen(s.user_socket, s.user_socket_mode, user_mode=True))

    async def _listen(self, path: str, mode: int, user_mode: bool) -> asyncio.AbstractServer:
        _prepare_socket_path(path)
        old = os.umask(0o177)  # no window in which the socket is wider than asked
        try:
            server = await asyncio.start_unix_server(
                lambda r, w: self._serve(r, w, user_mode), path=path,
                limit=64 * 1024, backlog=256)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        if os.geteuid() == 0 and not user_mode:
            try:
                os.chown(path, 0, pwd.getpwnam(self.settings.slurm_user).pw_gid)
            except KeyError:
                pass
        log_event("listening", socket=path, mode=oct(mode), user_mode=user_mode)
        return server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     user_mode: bool) -> None:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        engine = self.engine  # a reload mid-request must not change what this request sees
        settings = engine.config.daemon
        deadline = t0 + settings.deadline_ms / 1000.0
        fmt = "lines"
        fields: dict[str, Any] = {}
        self._in_flight += 1
        try:
            try:
                pid, uid, gid = peer_credentials(writer.get_extra_info("socket"))
            except OSError:
                pid, uid, gid = -1, -1, -1
            fields.update(peer_pid=pid, peer_uid=uid)
            if not user_mode and uid not in self.trusted:
                answer = Answer("refused", reason="peer-not-trusted",
                                message="perfcast: this socket serves only slurmctld")
            else:
                try:
                    raw = await asyncio.wait_for(
                        _read_request(reader, settings.max_request_bytes), deadline - time.monotonic())
                    fmt = _sniff_format(raw)
                    # On the user socket the kernel's word replaces the request's claim.
                    req = parse_request(raw, max_script=settings.max_request_bytes,
                                        peer=(uid, gid) if user_mode else None)
                    fmt = req.format
                    fields.update(uid=req.submit_uid, bytes=len(raw))
                    try:   # repeats (arrays, resubmissions) are answered right here
                        answer = engine.handle(req, deadline, cached_only=True)
                        fields["cached"] = 1
                    except CacheMiss:
                        answer = await asyncio.wait_for(
                            loop.run_in_executor(self.pool, engine.handle, req, deadline),
                            max(0.001, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    answer = Answer("error", reason="deadline",
                                    message=f"perfcast: no prediction (took longer than "
                                            f"{settings.deadline_ms} ms); job submitted unchanged")
                except RequestTooLarge:
                    answer = Answer("error", reason="too-large",
                                    message="perfcast: script too large to predict; job submitted "
                                            "unchanged")
                except BadRequest as exc:
                    answer = Answer("error", reason="bad-request",
                                    message=f"perfcast: no prediction ({exc}); job submitted "
                                            "unchanged")
                except Exception:  # a bug: log it, fail open, never a traceback to the user
                    log.exception("request failed")
                    answer = Answer("error", reason="internal",
                                    message="perfcast: internal error; job submitted unchanged")
            self.stats[answer.status] += 1
            if answer.partition:
                fields["partition"] = answer.partition
            try:
                writer.write(answer.encode(fmt))
                await asyncio.wait_for(writer.drain(), 1.0)
            except (OSError, asyncio.TimeoutError):
                fields["write"] = "failed"   # Lua gave up already; it let the job through
            log_event("request", status=answer.status, reason=answer.reason,
                      time_limit=answer.time_limit if answer.time_limit is not None else "-",
                      ms=round((time.monotonic() - t0) * 1e3, 2),
                      level=logging.WARNING if answer.status in ("refused", "error") else logging.INFO,
                      **fields)
        finally:
            self._in_flight -= 1
            writer.close()

    async def reload(self) -> None:
        """SIGHUP: re-read the config, reload platforms off the loop, swap; keep serving meanwhile."""
        if self._reloading is not None and not self._reloading.done():
            log_event("reload_skipped", reason="already reloading")
            return
        self._reloading = asyncio.current_task()
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        try:
            cfg = await loop.run_in_executor(None, load_site_config, self.config_file)
            new = await loop.run_in_executor(None, self.engine_factory, cfg)
        except SiteConfigError as exc:
            log_event("reload_failed", level=logging.ERROR, error=str(exc))
            return
        except Exception as exc:
            log.exception("reload failed")
            log_event("reload_failed", level=logging.ERROR, error=type(exc).__name__)
            return
        if cfg.daemon.socket != self.settings.socket or cfg.daemon.user_socket != self.settings.user_socket:
            log_event("reload_note", level=logging.WARNING,
                      note="socket paths change only on restart")
        self.trusted = trusted_uids(cfg.daemon)
        self.engine = new
        # Requests in flight keep the old engine alive; trim once they are likely done.
        loop.call_later(settings_deadline(cfg) + 0.5, release_memory)
        log_event("reloaded", platforms=",".join(sorted(new.platforms)) or "-",
                  failed=",".join(sorted(new.platform_errors)) or "-",
                  ms=round((time.monotonic() - t0) * 1e3, 1))

    async def close(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()
        for _ in range(100):   # let answers in flight go out (at most about the deadline)
            if self._in_flight == 0:
                break
            await asyncio.sleep(0.01)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for path in (self.settings.socket, self.settings.user_socket):
            if path:
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)
                except OSError:
                    pass


def settings_deadline(cfg: SiteConfig) -> float:
    return cfg.daemon.deadline_ms / 1000.0


class RequestTooLarge(Exception):
    pass


async def _read_request(reader: asyncio.StreamReader, limit: int) -> bytes:
    """One line (or everything up to EOF), never more than ``limit`` bytes kept in memory."""
    buf = bytearray()
    while True:
        chunk = await reader.read(256 * 1024)
        if not chunk:
            return bytes(buf)
        nl = chunk.find(b"\n")
        if nl >= 0:
            buf += chunk[:nl]
            if len(buf) > limit:
                raise RequestTooLarge()
            return bytes(buf)
        buf += chunk
        if len(buf) > limit:
            raise RequestTooLarge()


_LINES_RE = re.compile(rb'^\s*\{\s*"format"\s*:\s*"lines"')


def _sniff_format(raw: bytes) -> str:
    # job_submit.lua puts "format":"lines" first, so even a request that turns out malformed
    # further on gets an answer Lua can read.
    return "lines" if _LINES_RE.match(raw[:256]) else "json"


def _prepare_socket_path(path: str) -> None:
    """Create the directory; refuse if a live daemon is there; remove a stale socket."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"perf-predictd: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)   # stale: nobody listens
    else:
        raise SystemExit(f"perf-predictd: another daemon is listening on {path}")
    finally:
        probe.close()


# --------------------------------------------------------------------------------------------
# a client (tests, benchmarks, perf-predict --daemon)

def ask_daemon(socket_path: str, request: Mapping[str, Any], timeout: float = 1.0) -> dict[str, Any]:
    """Send one request, return the answer (JSON or lines, decoded to a dict)."""
    payload = json.dumps(request).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        s.sendall(payload)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except ValueError:
        return decode_lines(raw)   # "lines" answers, and refusals sent before the request was read


# --------------------------------------------------------------------------------------------
# logging and main

class _KVFormatter(logging.Formatter):
    """``2024-05-01T12:00:00.123Z level=info event=request status=ok ms=3.2 ...``: grep- and
    journald-friendly, one line per event."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts += f".{int(record.msecs):03d}Z"
        line = f"{ts} level={record.levelname.lower()} {record.getMessage()}"
        if record.exc_info:
            line += " exc=" + _kv(self.formatException(record.exc_info))
        return line


def _kv(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t\\') and text.isprintable():
        return text
    return json.dumps(text)


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    if log.isEnabledFor(level):
        log.log(level, "event=%s %s", event, " ".join(f"{k}={_kv(v)}" for k, v in fields.items()))


def setup_logging(level: str = "info", log_file: Optional[str] = None) -> None:
    handler: logging.Handler = (logging.FileHandler(log_file) if log_file
                                else logging.StreamHandler(sys.stderr))
    handler.setFormatter(_KVFormatter())
    root = logging.getLogger("perfcast")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    root.propagate = False


async def serve(server: PredictServer, pid_file: Optional[str] = None) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    await server.start()
    loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(server.reload()))
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if pid_file:   # written once the socket listens: whoever waits on it can connect
        with open(pid_file + ".tmp", "w") as fh:
            fh.write(f"{os.getpid()}\n")
        os.replace(pid_file + ".tmp", pid_file)
    log_event("ready", pid=os.getpid(), platforms=",".join(sorted(server.engine.platforms)) or "-")
    await stop.wait()
    log_event("stopping", served=sum(server.stats.values()))
    await server.close()
    if pid_file:
        try:
            os.unlink(pid_file)
        except OSError:
            pass


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="perf-predictd",
                                 description="perfcast prediction daemon for job_submit.lua")
    ap.add_argument("--config", help=f"site config (default: $PERFCAST_CONFIG or "
                                     f"/etc/perfcast/perfcast.toml)")
    ap.add_argument("--log-file", help="append log lines here instead of stderr")
    ap.add_argument("--log-level", help="debug | info | warning (default: the config's)")
    ap.add_argument("--pid-file", help="write the pid here once listening")
    ap.add_argument("--check", action="store_true",
                    help="validate the config and load its platforms, then exit (0 = good)")
    args = ap.parse_args(argv)
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
    server = PredictServer(engine, config_file=path)
    try:
        asyncio.run(serve(server, args.pid_file))
    except SystemExit as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
