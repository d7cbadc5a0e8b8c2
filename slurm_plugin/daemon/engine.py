"""The engine: platforms, parser, predictor and policy for one site config.

A request goes through three steps, split so that only the expensive, hostile-input one runs in a
killable worker process:

1. :meth:`Engine.route` (daemon process, microseconds): which partition, which policy, which
   platform; unmanaged partitions and ``policy = "off"`` are answered here.
2. :meth:`Engine.compute` (worker process): parse the script (reading files as the user), predict.
   The result is an :class:`Outcome`: a few numbers, or why there are none; plain data that
   crosses the process boundary as JSON.
3. :meth:`Engine.finish` (daemon process): apply the partition's policy to the outcome.

Outcomes of scripts that read no file are remembered (bounded LRU, keyed by a digest, so the
cache holds no script text): resubmissions and job arrays are answered without a worker.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import pwd
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from .. import policy as policy_mod
from ..policy import PredictionFacts, WallCap
from ..qos_limits import WallLimitsSource, shared_source
from ..siteconfig import PartitionPolicy, SiteConfig
from .logs import log_event
from .protocol import Answer, PredictRequest, one_line
from .recorder import job_line_text
from .reader import UserFileReader

PARSE_BUDGET_S = 0.06        # at most this much parsing per script (+ the last loop), then a clean skip
PREDICT_RESERVE_S = 0.02     # of the request's deadline, kept for predicting after the parse
WORKER_CACHE = 256           # predictions remembered per worker (same job shape, other script)
PASSWD_CACHE = 4096          # uids remembered (per process)
# At the daemon's first start, how long load() waits (after loading the platforms) for the first
# lookup of the QOS and association limits, so that the first jobs are capped by them too.
LIMITS_WAIT_S = 3.0
# A small training job run once per platform before serving (in the daemon, then in each new
# worker): the first parse and prediction in a process pay for lazy imports and, in a forked
# worker, for copy-on-write page faults -- better then than on a user's job.
WARMUP_SCRIPT = """#!/bin/bash
#SBATCH --nodes=1 --gpus-per-node=4
srun python pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 \\
  --seq-length 512 --max-position-embeddings 512 --micro-batch-size 1 --global-batch-size 8 \\
  --train-iters 10
"""


def _default_backends() -> dict[str, Any]:
    """The real predictor and launch parser, imported late so ``--help`` stays instant."""
    from predictor import PerfcastError, Predictor, load_platform
    from predictor.platform import forget_loaded
    from .. import launch
    # One Predictor per loaded platform, for this Engine's life: a shape costed once (the warm-up,
    # an earlier job) is not costed again.  Each holds its platform, so an id is never reused.
    predictors: dict[int, Any] = {}

    def predict(job: Any, platform: Any) -> Any:
        p = predictors.get(id(platform))
        if p is None:
            p = predictors[id(platform)] = Predictor(platform)
        return p.predict(job)
    return {"load_platform": load_platform, "forget_loaded": forget_loaded, "predict": predict,
            "parse_script": launch.parse_script, "slurm_request": launch.SlurmRequest,
            "errors": (PerfcastError,), "wall_limits": shared_source(log_event)}


@dataclass(frozen=True)
class Route:
    """Where a request goes: decided in the daemon process before any work is done."""

    req: PredictRequest
    part: PartitionPolicy
    name: str                          # the partition chosen ("" = the default one, unnamed)
    max_time: Optional[int]
    wall: Optional[WallCap] = None     # the job's QOS or association MaxWall (None: none applies)

    @property
    def platform(self) -> str:
        return self.part.platform


_FACT_FIELDS = tuple(f.name for f in dataclasses.fields(PredictionFacts))
# json.dumps(inputs, sort_keys=True, default=str) of the cache key, without an encoder per request
_KEY_JSON = json.JSONEncoder(sort_keys=True, default=str)


def _json_text(raw: "bytes | str") -> str:
    """Our own JSON frames as text: json.loads on bytes first guesses their encoding (always UTF-8)."""
    return raw.decode("utf-8", "surrogatepass") if type(raw) is bytes else raw


@dataclass
class Outcome:
    """What a worker found: the prediction's numbers, or a skip with its one-line reason."""

    facts: Optional[PredictionFacts] = None
    warnings: list[str] = field(default_factory=list)
    skip_reason: str = ""
    skip_why: str = ""
    cacheable: bool = False           # read no file and finished within its budget
    timely: bool = True               # finished within its budget (a warm-up's outcome is kept)
    job: Optional[dict] = None        # the resolved job (TrainingJob.to_dict()), for the record
    compute_ms: float = 0.0           # the worker's own time on it (logged at debug level)
    # ``job`` as the record spool writes it (recorder.job_line_text), from the worker's frame: the
    # daemon splices it into the record's line rather than encoding the job a second time.
    job_text: str = field(default="", repr=False, compare=False)

    def to_json(self) -> bytes:
        # Field by field: the facts are scalars and one tuple, which JSON writes as asdict's copy.
        facts = self.facts
        job_text = job_line_text(self.job) if self.job is not None else ""
        body = {"facts": {k: getattr(facts, k) for k in _FACT_FIELDS} if facts else None,
                "warnings": self.warnings, "skip_reason": self.skip_reason,
                "skip_why": self.skip_why, "cacheable": self.cacheable, "timely": self.timely,
                "job": None if job_text else self.job,
                "compute_ms": self.compute_ms}
        if not job_text:
            return json.dumps(body).encode()
        # The job on a line of its own (JSON text holds no raw newline), in the spool's spelling.
        return (json.dumps(body) + "\n" + job_text).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "Outcome":
        head, _, job_text = _json_text(raw).partition("\n")
        d = json.loads(head)
        if job_text:
            d["job"] = json.loads(job_text)
            if not isinstance(d["job"], dict):
                job_text = ""
        facts = None
        if d.get("facts"):
            f = dict(d["facts"])
            f["interval_seconds"] = tuple(f.get("interval_seconds") or (0.0, 0.0))
            facts = PredictionFacts(**f)
        return cls(facts=facts, warnings=[str(w) for w in d.get("warnings") or []],
                   skip_reason=str(d.get("skip_reason") or ""), skip_why=str(d.get("skip_why") or ""),
                   cacheable=bool(d.get("cacheable")), timely=bool(d.get("timely", True)),
                   job=d["job"] if isinstance(d.get("job"), dict) else None,
                   compute_ms=float(d.get("compute_ms") or 0.0), job_text=job_text)


class LRU:
    """A small bounded mapping, most recent last (thread-safe: the reload thread reads too)."""

    def __init__(self, size: int):
        self.size = size
        self._d: "collections.OrderedDict[Any, Any]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
            return hit

    def put(self, key: Any, value: Any) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.size:
                self._d.popitem(last=False)

    def pop(self, key: Any) -> Any:
        with self._lock:
            return self._d.pop(key, None)

    def __len__(self) -> int:
        return len(self._d)


class Engine:
    """Everything a request needs, immutable after load; a SIGHUP builds a new one and swaps it.

    ``backends`` (for tests): ``load_platform(name)``, ``predict(job, platform)``,
    ``parse_script(path, text, *, request, read_file, env, default_gpus_per_node, work_dir,
    deadline_s)``, ``slurm_request`` (a constructor taking keyword fields), ``errors`` (a tuple
    of the exception types meaning "bad job", reported to the user as one line) and, optionally,
    ``slurm_partitions()`` (Slurm's partitions for the user socket; default: ``scontrol``),
    ``forget_loaded()`` (drop the loader's cache before this Engine loads its platforms) and
    ``wall_limits`` (the QOS and association MaxWall: a :class:`~slurm_plugin.qos_limits.
    WallLimitsSource`, or a function returning :class:`~slurm_plugin.qos_limits.WallLimits`;
    default: the daemon's one source, from ``scontrol`` and ``sacctmgr``; absent from the
    backends a test passes: no such limits).
    """

    def __init__(self, config: SiteConfig, backends: Optional[Mapping[str, Any]] = None):
        self.config = config
        self.backends = dict(backends) if backends is not None else _default_backends()
        self.platforms: dict[str, Any] = {}
        self.platform_errors: dict[str, str] = {}
        self.outcomes = LRU(config.daemon.cache_size)          # daemon process: digest -> Outcome
        # cli_filter.lua's warm-ups that read files: digest -> (expiry, Outcome), used once
        self.warmed = LRU(config.daemon.cache_size)
        # digest -> the worker's future, while computed (daemon process; bounded by the pool's
        # queue): a request joins it.  Per engine, so none joins work of a replaced platform.
        self.pending: dict[str, Any] = {}
        self._predictions = LRU(min(WORKER_CACHE, config.daemon.cache_size))  # worker: job -> facts
        self._pw = LRU(PASSWD_CACHE)
        self._request_fields: dict[Any, set[str]] = {}     # slurm_request's field names, read once
        self.loaded_at = time.time()
        # {partition: (MaxTime minutes or None, is default)} from Slurm itself; only filled for
        # the user socket (cli_filter.lua cannot see part_list; job_submit.lua sends it).
        self.slurm_partitions: dict[str, tuple[Optional[int], bool]] = {}
        self._slurm_max_times: dict[str, Optional[int]] = {}
        self._slurm_default: Optional[str] = None
        self._slurm_part_qos: dict[str, str] = {}       # the partitions' own QOS (user socket)
        src = self.backends.get("wall_limits")
        if src is not None and not isinstance(src, WallLimitsSource):
            src = WallLimitsSource(src, log=log_event)
        self.wall_limits: Optional[WallLimitsSource] = src
        # Set once the lookup has ended (found or failed); callbacks wait for it (the server's).
        self._partitions_known = threading.Event()
        self._partitions_lock = threading.Lock()
        self._on_partitions_known: list[Callable[[], None]] = []

    def load(self, lookup_partitions: bool = True) -> "Engine":
        # The QOS and association MaxWall: looked up again at every (re)load, in the background
        # (a reload keeps serving the limits known so far); not for --check.
        limits_pending = None
        if lookup_partitions and self.wall_limits is not None:
            limits_pending = self.wall_limits.refresh()
        if lookup_partitions and self.config.daemon.user_socket:
            # In the background: a slow or absent controller must not delay serving.
            threading.Thread(target=self._load_slurm_partitions, daemon=True,
                             name="slurm-partitions").start()
        else:
            self._partitions_known.set()
        # Each Engine (start, every SIGHUP) reads and verifies its platforms' files afresh: a
        # bundle corrupted on disk since the last load must fail now, not at the next restart.
        # Its platforms still share a bundle among themselves (dgx-a100 and perlmutter-a100).
        forget = self.backends.get("forget_loaded")
        if forget is not None:
            forget()
        for name in self.config.platforms():
            t0 = time.monotonic()
            try:
                self.platforms[name] = self.backends["load_platform"](name)
                log_event("platform_loaded", platform=name,
                          bundle=getattr(self.platforms[name], "bundle_id", ""),
                          ms=round((time.monotonic() - t0) * 1e3, 1))
            except Exception as exc:  # a broken bundle must not take the daemon down
                self.platform_errors[name] = one_line(str(exc) or type(exc).__name__, 300)
                log_event("platform_failed", level=logging.ERROR, platform=name,
                          error=self.platform_errors[name])
        if limits_pending is not None and self.wall_limits is not None and self.wall_limits.limits is None:
            limits_pending.wait(LIMITS_WAIT_S)      # the first start: usually done by now
        return self

    def _load_slurm_partitions(self) -> None:
        from ..slurm_client import SlurmClient, SlurmError
        lookup = self.backends.get("slurm_partitions") or SlurmClient(timeout=10).partitions
        try:
            parts = lookup()
        except SlurmError as exc:
            log_event("slurm_partitions_failed", level=logging.WARNING, error=str(exc))
        else:
            found = {p.name: (p.max_time_minutes, p.is_default) for p in parts}
            self._slurm_part_qos = {p.name: q for p in parts
                                    if (q := str((getattr(p, "raw", None) or {}).get("QoS", "")).strip())
                                    and q not in ("N/A", "(null)")}
            self._slurm_max_times = {k: v[0] for k, v in found.items()}
            self._slurm_default = next((k for k, v in found.items() if v[1]), None)
            self.slurm_partitions = found
            log_event("slurm_partitions", count=len(parts))
        finally:
            with self._partitions_lock:
                self._partitions_known.set()
                waiting, self._on_partitions_known = self._on_partitions_known, []
            for callback in waiting:
                callback()

    def partitions_looked_up(self) -> bool:
        """Whether the lookup of Slurm's partitions has ended (found or failed), or never runs."""
        return self._partitions_known.is_set()

    def when_partitions_known(self, callback: Callable[[], None]) -> bool:
        """Have ``callback`` called (from the lookup's thread) once Slurm's partitions are looked
        up; False, and nothing registered, when they are already (or never will be)."""
        with self._partitions_lock:
            if self._partitions_known.is_set():
                return False
            self._on_partitions_known.append(callback)
            return True

    def warm_up(self) -> None:
        """Predict :data:`WARMUP_SCRIPT` once per platform (results are not kept)."""
        for name in sorted(self.platforms):
            req = PredictRequest(script=WARMUP_SCRIPT, submit_uid=os.geteuid(),
                                 submit_gid=os.getegid(), argv=("warmup.sh",))
            try:
                self.compute(req, "", name, time.monotonic() + 5.0)
            except Exception:  # noqa: BLE001 - an optimisation only
                pass
        _own_words()     # the redaction's word list (~36 ms), built before the first error needs it

    # ---- step 1 (daemon process) ---------------------------------------------------------------
    def route(self, req: PredictRequest) -> "Route | Answer":
        """The partition and policy of a request, or the answer when there is nothing to do."""
        if not req.partition_max_time and self.slurm_partitions:
            req = dataclasses.replace(req, partition_max_time=self._slurm_max_times,
                                      default_partition=self._slurm_default)
        candidates = req.candidate_partitions()
        name = next((p for p in candidates if p in self.config.partitions),
                    candidates[0] if candidates else None)
        part = self.config.partition(name)
        if part is None:
            return Answer("skip", reason="partition-unmanaged", partition=name or "")
        max_time = req.max_time if req.max_time is not None else req.partition_max_time.get(name or "")
        if part.policy == "off":
            return Answer("skip", reason="policy-off", partition=name or "")
        if part.platform not in self.platforms:
            # The reason (a bundle error) went to the log at load time; users get the name only.
            return self.skip(part, "platform-unavailable",
                             f"platform {part.platform} is not available")
        if req.warm:
            # A warm-up is answered "warm" whatever the limits: only job_submit.lua's request needs them.
            return Route(req=req, part=part, name=name or "", max_time=max_time)
        wall, lifted = self.accounting_limits(req, name or "")
        if lifted:
            max_time = None        # its QOS lets it run past the partition's MaxTime
        return Route(req=req, part=part, name=name or "", max_time=max_time, wall=wall)

    def accounting_limits(self, req: PredictRequest, partition: str) -> tuple[Optional[WallCap], bool]:
        """What Slurm's accounting holds the job to (:mod:`slurm_plugin.qos_limits`): the QOS or
        association MaxWall that applies (None when none does, none is known yet, or the lookup
        fails: fail open), and whether the job's QOS has flag PartitionTimeLimit, so that the
        partition's MaxTime does not cap its limit (False when not known: the cap stays)."""
        src = self.wall_limits
        limits = src.current() if src is not None else None
        if limits is None or not limits.enforced:
            return None, False
        part_qos = req.partition_qos.get(partition) if req.partition_qos else self._slurm_part_qos.get(partition)
        job = dict(user=lambda: self._user_name(req.submit_uid), account=req.account, qos=req.qos,
                   partition=partition, default_account=req.default_account, default_qos=req.default_qos)
        wall, lifted = None, False
        try:
            wall = limits.cap(partition_qos=part_qos, **job)
            lifted = limits.lifts_max_time(**job)
        except Exception as exc:  # noqa: BLE001 - an extra: never fail a job for it
            log_event("slurm_limits_error", level=logging.ERROR, error=type(exc).__name__)
        return wall, lifted

    def _user_name(self, uid: int) -> Optional[str]:
        pw = self._passwd(uid)
        return pw[0] if pw is not None else None

    def cache_key(self, route: Route) -> str:
        """A digest of everything :meth:`compute` reads (the cache keeps no script text).

        Exactly the outcome's inputs -- the script, whose rights files are read with (uid, gid),
        where from, the environment and the Slurm request the parser sees, the partition and
        platform -- so that job_submit.lua's request and cli_filter.lua's warm-up of the same
        submission meet under one key, and requests of two users never do.  The policy's inputs
        (the user's --time, MaxTime) are not in it: :meth:`finish` runs on every request.
        """
        req = route.req
        h = hashlib.sha256(req.script.encode("utf-8", "surrogatepass"))
        inputs = [route.name, route.platform, req.submit_uid, req.submit_gid, req.work_dir,
                  list(req.argv), dict(req.env), req.name, req.partition,
                  self._slurm_request_values(req, route.name)]
        h.update(_KEY_JSON.encode(inputs).encode())
        return h.hexdigest()

    def is_warmed(self, key: str) -> bool:
        hit = self.warmed.get(key)
        return hit is not None and hit[0] >= time.monotonic()

    def take_warmed(self, key: str) -> Optional[Outcome]:
        """The outcome a warm-up computed for ``key`` (files read: once, and only while fresh)."""
        hit = self.warmed.pop(key)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def work(self, route: Route, deadline: float) -> bytes:
        """What a worker needs for :meth:`compute`, as JSON (never pickled): a line of JSON, then
        the script's own text (not escaped into the JSON and scanned back)."""
        req = route.req.to_dict()
        script = req.pop("script")
        head = json.dumps({"req": req, "partition": route.name, "platform": route.platform,
                           "deadline": deadline})
        return (head + "\n").encode() + script.encode("utf-8", "surrogatepass")

    # ---- step 2 (worker process) ---------------------------------------------------------------
    def run_work(self, payload: bytes) -> bytes:
        """A worker's entry point: :meth:`work`'s frame in, JSON out (:class:`Outcome`)."""
        t0 = time.monotonic()
        try:
            head, _, script = payload.partition(b"\n")
            msg = json.loads(head.decode("utf-8", "surrogatepass"))
            req = PredictRequest.from_dict({"script": script.decode("utf-8", "surrogatepass"),
                                            **msg["req"]})
            out = self.compute(req, str(msg["partition"]), str(msg["platform"]),
                               float(msg["deadline"]))
        except Exception as exc:  # a bug: logged (where, not what); the job goes on unchanged
            log_event("worker_error", level=logging.ERROR, error=type(exc).__name__)
            logging.getLogger("perfcast.daemon").debug("worker error", exc_info=True)
            out = Outcome(skip_reason="internal", skip_why="internal error")
        out.compute_ms = round((time.monotonic() - t0) * 1e3, 3)
        return out.to_json()

    def compute(self, req: PredictRequest, partition: str, platform_name: str,
                deadline: float) -> Outcome:
        """Parse and predict; never raises for a bad script, only returns why."""
        platform = self.platforms.get(platform_name)
        if platform is None:
            return Outcome(skip_reason="platform-unavailable",
                           skip_why=f"platform {platform_name} is not available")
        settings = self.config.daemon
        reader = UserFileReader(req.submit_uid, req.submit_gid, req.work_dir,
                                max_bytes=settings.max_file_bytes,
                                timeout_s=settings.file_read_timeout_ms / 1000.0,
                                deadline=deadline - PREDICT_RESERVE_S)
        slurm_req = self._slurm_request(req, partition)
        env = self._env(req)
        path = req.argv[0] if req.argv else "<batch script>"
        budget = max(0.001, min(PARSE_BUDGET_S, deadline - PREDICT_RESERVE_S - time.monotonic()))
        parse_end = time.monotonic() + budget
        parsed = self.backends["parse_script"](
            path, req.script, request=slurm_req, read_file=reader, env=env,
            default_gpus_per_node=getattr(platform, "gpus_per_node", None),
            work_dir=req.work_dir, deadline_s=budget)
        # A parse cut short by the clock may succeed next time (a busy machine): not remembered.
        timely = time.monotonic() < parse_end
        cacheable = reader.reads == 0 and timely
        warnings = [str(w) for w in (getattr(parsed, "warnings", None) or [])]
        job = getattr(parsed, "job", None)
        if job is None:
            why = getattr(parsed, "error", None) or "cannot predict: no training job found"
            out = Outcome(skip_reason="no-job", skip_why=str(why), warnings=warnings,
                          cacheable=cacheable)
        else:
            try:
                facts = self._predict(job, platform_name, platform)
            except self.backends.get("errors", ()) as exc:
                out = Outcome(skip_reason="predict-error", skip_why=f"cannot predict: {exc}",
                              warnings=warnings, cacheable=cacheable)
            else:
                if facts.iterations <= 0:
                    # A time limit from start-up alone would kill the job: say why, change nothing.
                    out = Outcome(skip_reason="no-length", cacheable=cacheable, warnings=warnings,
                                  skip_why="cannot predict the run time: the script gives no "
                                  "train_iters, train_samples or train_tokens that could be read")
                else:
                    out = Outcome(facts=facts, warnings=warnings, cacheable=cacheable,
                                  job=job.to_dict() if hasattr(job, "to_dict") else None)
        out.timely = timely
        if reader.contents:
            redact_outcome(out, reader.contents, req.script)
        return out

    def _predict(self, job: Any, name: str, platform: Any) -> PredictionFacts:
        try:
            key: Any = (name, hash(job), job)
        except TypeError:
            key = None
        if key is not None:
            hit = self._predictions.get(key)
            if hit is not None:
                return hit
        pred = self.backends["predict"](job, platform)
        facts = facts_from_prediction(pred, name, platform)
        if key is not None:
            self._predictions.put(key, facts)
        return facts

    @staticmethod
    def _slurm_request_values(req: PredictRequest, name: Optional[str]) -> dict[str, Any]:
        # (max_nodes 0: no maximum, as unknown)
        return {"nodes": req.min_nodes, "max_nodes": req.max_nodes or None, "gpus_per_node": req.gpus_per_node,
                "ntasks": req.num_tasks, "ntasks_per_node": req.ntasks_per_node,
                "partition": name or None, "time_limit_minutes": req.time_limit,
                "array": req.array, "job_name": req.name, "cpus_per_task": req.cpus_per_task}

    def _slurm_request(self, req: PredictRequest, name: Optional[str]) -> Any:
        ctor = self.backends.get("slurm_request")
        values = self._slurm_request_values(req, name)
        if ctor is None:
            return values
        if dataclasses.is_dataclass(ctor):
            names = self._request_fields.get(ctor)
            if names is None:
                names = self._request_fields[ctor] = {f.name for f in dataclasses.fields(ctor)}
            values = {k: v for k, v in values.items() if k in names}
        return ctor(**values)

    def _passwd(self, uid: int) -> Optional[tuple[str, str]]:
        """(name, home) of ``uid``, remembered for 10 minutes (NSS may be LDAP/sssd: slow)."""
        now = time.monotonic()
        hit = self._pw.get(uid)
        if hit is not None and now - hit[0] < 600:
            return hit[1]
        try:
            pw = pwd.getpwuid(uid)
            value: Optional[tuple[str, str]] = (pw.pw_name, pw.pw_dir)
        except KeyError:
            value = None
        self._pw.put(uid, (now, value))
        return value

    def _env(self, req: PredictRequest) -> dict[str, str]:
        """What a script's ``$VAR`` may expand to: the user's env (cli_filter) or their passwd."""
        env = dict(req.env)
        pw = self._passwd(req.submit_uid)
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

    # ---- step 3 (daemon process) ---------------------------------------------------------------
    def finish(self, route: Route, out: Outcome) -> Answer:
        part = route.part
        if out.facts is None:
            return self.skip(part, out.skip_reason or "no-job", out.skip_why or "cannot predict")
        facts = out.facts
        decision = policy_mod.decide(facts, route.req.time_limit, part, route.max_time, route.wall,
                                     user_time_min=route.req.time_min)
        return Answer("ok", reason=decision.action, message=decision.message, partition=route.name,
                      time_limit=decision.time_limit_minutes, time_min=decision.time_min_minutes,
                      admin_comment=decision.admin_comment,
                      warnings=decision.warnings + list(out.warnings),
                      prediction={"iteration_seconds": facts.iteration_seconds,
                                  "iterations": facts.iterations,
                                  "total_seconds": facts.total_seconds,
                                  "interval_seconds": list(facts.interval_seconds),
                                  "platform": facts.platform, "bundle": facts.bundle,
                                  "recommended_minutes": decision.recommended_minutes})

    def skip(self, part: PartitionPolicy, reason: str, why: str) -> Answer:
        why = one_line(why, 400)
        msg = f"perfcast: no time limit suggested ({why}); job submitted unchanged"
        return Answer("skip", reason=reason, message=msg if part.notify_skipped else "",
                      partition=part.name)

    def handle(self, req: PredictRequest, deadline: float) -> Answer:
        """All three steps in this process (tools and tests; the daemon uses worker processes)."""
        routed = self.route(req)
        if isinstance(routed, Answer):
            return routed
        return self.finish(routed, self.compute(routed.req, routed.name, routed.platform, deadline))


# --------------------------------------------------------------------------------------------
# keeping file contents out of answers

# Words of the parser's and predictor's own messages, and launch-config key names: never secret,
# so never redacted even when a config file happens to contain them too. Besides this short list,
# every word of the source of the modules that write the messages counts (_own_words).
_MESSAGE_WORDS = frozenset("""
    cannot predict read config file not integer number the and for with from unknown using default
    valid JSON YAML larger than KiB MiB nested levels deep deeply mapping keys ignored duplicate
    would stop value values modelled global attention type types list count mixes everywhere
    activation gelu same shapes differs says precision arguments DeepSpeed Megatron NeoX object
    path launch command commands predicting first maximum node nodes job has but task tasks each
    GPU GPUs srun torchrun deepspeed python model shape layers hidden heads divide does
    train_iters train_samples train_tokens num_layers hidden_size num_attention_heads seq_length
    max_position_embeddings micro_batch_size global_batch_size train_micro_batch_size_per_gpu
    gradient_accumulation_steps zero_optimization stage fp16 bf16 fp32 enabled pipe_parallel_size
    model_parallel_size tensor_model_parallel_size pipeline_model_parallel_size vocab_size
    padded_vocab_size is are an of in to at or no on as by be was this that there which
    Permission denied such directory too long took evaluate script launch-config
    """.split())
_TOKEN_RE = re.compile(r"""'([^'\n]{1,200})'|"([^"\n]{1,200})"|([^\s'"`(),;:=\[\]{}<>]{3,})""")
_NUMBER_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?[A-Za-z%]{0,3}")
_SUGGESTION_RE = re.compile(r"did you mean '?([^'?]{1,160}?)'?\?")
_TRAILING = ".,?!…"
_SOURCE_WORD_RE = re.compile(r"""[^\s'"`(),;:=\[\]{}<>\\]{3,}""")
REDACTED = "<file content>"
# The packages whose source is perfcast's own wording (the parser, the predictor, the daemon's own
# answers and the policy's).
_OWN_PACKAGES = ("slurm_plugin.launch", "predictor", "slurm_plugin.daemon", "slurm_plugin")


def _own_words() -> frozenset:
    """Every word of the source of the message-writing modules, and every key and flag
    name the readers know: text that is perfcast's own (public source), never a file's secret.
    Computed once per process (some 50 ms), from the installed source."""
    global _OWN_WORDS
    if _OWN_WORDS is None:
        import importlib
        import pathlib
        words: set = set(_MESSAGE_WORDS)
        for name in _OWN_PACKAGES:
            try:
                root = pathlib.Path(importlib.import_module(name).__file__).parent
            except (ImportError, TypeError):
                continue
            for path in sorted(root.glob("*.py")):
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                # every word of the source: its messages' wording and names (public text)
                words.update(w.strip(_TRAILING) for w in _SOURCE_WORD_RE.findall(text))
        try:
            from slurm_plugin.launch import megatron_flags, neox_keys, nemo, torchtitan
            words.update(megatron_flags.KNOWN, neox_keys.NEOX_KEYS, neox_keys.ZERO_KEYS, nemo.READ_KEYS)
            words.update(k for keys in torchtitan.JOB_CONFIG_KEYS.values() for k in keys)
        except ImportError:
            pass
        _OWN_WORDS = frozenset(w for w in words if w)
    return _OWN_WORDS


_OWN_WORDS: Optional[frozenset] = None


def _near(piece: str, suggestions: list) -> bool:
    """A name the user misspelt: the message suggests a known name it is one typo away from."""
    import difflib
    return any(difflib.SequenceMatcher(None, piece.lstrip("-+~"), s.lstrip("-+~")).ratio() >= 0.8
               for s in suggestions)


def redact(text: str, contents: list[str], script: str) -> str:
    """``text`` with every piece that comes from a file read for this request (and not from the
    script itself) replaced by ``<file content>``.

    Kept: numbers (answers are numbers and messages; a model shape read from a config is what the
    message is about), perfcast's own words (:func:`_own_words`), and the name of a key the message
    calls a misspelling of the name it suggests ("'x' is not a … key; did you mean 'y'?"): the user
    wrote that key, and it is one typo from a public name, so it tells nothing of the file.
    """
    own = _own_words()
    suggestions = [m.group(1).split()[-1] for m in _SUGGESTION_RE.finditer(text) if m.group(1).split()]

    def secret(piece: str) -> bool:
        piece = piece.strip()
        bare = piece.strip(_TRAILING)
        if len(piece) < 3 or piece in own or bare in own or _NUMBER_RE.fullmatch(piece):
            return False
        if piece in script or not any(piece in c for c in contents):
            return False
        return not (suggestions and _near(bare, suggestions))

    def sub(m: "re.Match[str]") -> str:
        quoted = m.group(1) if m.group(1) is not None else m.group(2)
        if quoted is not None:
            q = "'" if m.group(1) is not None else '"'
            if secret(quoted) or any(secret(t.group(0)) for t in _TOKEN_RE.finditer(quoted)):
                return q + REDACTED + q
            return m.group(0)
        return REDACTED if secret(m.group(3)) else m.group(0)

    return _TOKEN_RE.sub(sub, text)


def redact_outcome(out: Outcome, contents: list[bytes], script: str) -> None:
    texts = [c.decode("utf-8", "replace") for c in contents]
    out.skip_why = redact(out.skip_why, texts, script)
    out.warnings = [redact(w, texts, script) for w in out.warnings]


# --------------------------------------------------------------------------------------------

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
    # The prediction's own start-up, so that the policy counts it once beside the site's allowance.
    details = getattr(pred, "details", None)
    total = getattr(details, "total", None)
    kind = getattr(details, "kind", None) or {}
    return PredictionFacts(iteration_seconds=float(pred.iteration_seconds),
                           iterations=int(pred.iterations), total_seconds=float(pred.total_seconds),
                           platform=str(plat), bundle=str(bundle),
                           interval_seconds=(float(low_high[0]), float(low_high[-1])),
                           startup_seconds=float(getattr(total, "startup_seconds", 0.0) or 0.0),
                           factors=str(kind.get("factors", "")), kind=str(kind.get("key", "")),
                           kind_runs=int(kind.get("runs", 0) or 0))


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_count(settings: Any) -> int:
    """``workers`` from the config; 0 = one per usable core (at most 16)."""
    return settings.workers if settings.workers > 0 else min(16, usable_cores())
