"""The socket server: peers, deadlines, the worker pool, reload and stop.

Security: on the controller socket only root, the SlurmUser and the daemon's own uid are served
(SO_PEERCRED).  On the optional user socket (for cli_filter.lua on login nodes) anybody is served,
but as themselves: the kernel-reported uid/gid replace whatever the request claims.

Every request is answered by its deadline (``deadline_ms`` after it was accepted): from the
outcome cache, by a worker, or -- when the workers cannot make it -- at once with ``skip`` and
one line saying why.  A worker still busy at the deadline is killed (see :mod:`.pool`).
"""
from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import pwd
import signal
import socket
import stat
import struct
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Optional, Union

from ..records import PredictionRecord, new_record_id, record_key
from ..siteconfig import (DaemonSettings, SiteConfig, SiteConfigError, load_site_config,
                          slurm_partition_names, slurm_user_problem, unknown_partitions)
from .engine import Engine, Outcome, Route, release_memory, worker_count
from .logs import exception_summary, log_event, log_fds
from .pool import PoolBusy, WorkerDied, WorkerOverrun, WorkerPool
from .recorder import STOP_GRACE_S as RECORDS_GRACE_S
from .recorder import Recorder
from .protocol import (Answer, BadRequest, PredictRequest, RequestBuffer, RequestTooLarge,
                       parse_request, request_limit, sniff_format)

BACKSTOP_S = 0.05      # the pool answers by the deadline itself; this only guards against bugs
MIN_JOIN_LEFT_S = 0.01  # a failed warm-up leaves this much of the deadline: compute afresh
WARM_KEEP_S = 60.0     # a warm-up that read files serves job_submit's request this long, once
STOP_GRACE_S = 0.3     # SIGTERM: answers in flight may take this long to go out, then workers die
WRITE_GRACE_S = 1.0    # an answer the client does not take (a full socket buffer) is dropped then
# A user-socket request that comes while Slurm's partitions are still being looked up (the
# daemon's first moments: scontrol waits for a slurmctld that is starting too) waits for the
# lookup this long rather than being answered "partition not managed"; bounded, so that a hung
# controller holds none of them longer.  Not counted in the request's deadline_ms.
PARTITIONS_WAIT_S = 2.0
ACCEPT_BATCH = 64      # connections accepted per wake-up, so that other events are served too
ACCEPT_RETRY_S = 1.0   # out of file descriptors: stop accepting this long (as asyncio does)
# One read from a client: a request is a few KiB (the script and the job's options), read into
# a buffer kept for every connection (the loop runs one callback at a time) rather than a fresh
# 256 KiB object per read (see READ_CHUNK in .pool).
READ_BYTES = 64 * 1024

# What a reload (SIGHUP) does with each [daemon] setting.  Applied: the new value is in use once
# the reload has swapped (sockets' modes and group set again, the record store switched, the log
# level set unless --log-level was given; the rest is read from the new engine or its workers).
# At restart only: the sockets the daemon listens on; a reload that changes one logs
# ``restart_needed`` (the setting, the running value, the new one) and keeps the running one.
RELOAD_APPLIES = ("socket_mode", "user_socket_mode", "slurm_user", "deadline_ms", "max_request_bytes",
                  "max_file_bytes", "file_read_timeout_ms", "workers", "max_queue", "cache_size",
                  "log_level", "records")
RESTART_ONLY = ("socket", "user_socket")
# What every refused reload (``reload_failed``) keeps, as its line says.
RELOAD_KEPT = "the running config and platforms"

log = logging.getLogger("perfcast.daemon")


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel reports it."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return _UCRED.unpack(raw)


_UCRED = struct.Struct("3i")     # struct ucred: pid, uid, gid


def trusted_uids(settings: Any) -> set[int]:
    """root, the SlurmUser, and ourselves (a process of our uid could ptrace us anyway)."""
    uids = {0, os.geteuid()}
    try:
        uids.add(pwd.getpwnam(settings.slurm_user).pw_uid)
    except KeyError:
        if settings.slurm_user.isdigit():
            uids.add(int(settings.slurm_user))
        else:
            # ERROR: slurmctld connects as the SlurmUser, so on a controller every job would go
            # through unchanged (``perf-predictd --check`` fails on it)
            log_event("slurm_user_unknown", level=logging.ERROR, error=slurm_user_problem(settings),
                      note="only root and the daemon's own uid are served on the socket")
    return uids


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in a daemon thread: unlike the default executor, a stop does not wait for it
    (a reload loading platforms must not delay SIGTERM)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()

    def settle(value: Any, exc: Optional[BaseException]) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)

    def run() -> None:
        try:
            value, exc = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            value, exc = None, e
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:   # the loop is gone: the daemon stopped meanwhile
            pass

    threading.Thread(target=run, daemon=True, name="perfcast-reload").start()
    return await fut


@dataclass(eq=False)
class _Computation:
    """A prediction in a worker: the pool's job (promoted when a request starts waiting for it)
    and its outcome, decoded once for every request that joins it."""

    job: "asyncio.Future[bytes]"
    outcome: "asyncio.Future[Outcome]"


class PredictServer:
    """The asyncio Unix-socket server; ``engine`` is swapped whole on reload.

    ``freeze_gc`` (the real daemon): move everything loaded so far out of the garbage
    collector's sight before forking workers, so that collections in a worker do not touch (and
    so copy) the pages it shares with the daemon.  ``log_level_fixed``: ``--log-level`` was given,
    so a reload leaves the level alone.  ``partition_names``: how to ask Slurm for its partitions'
    names when the engine has not (default: the engine's ``slurm_partitions`` backend, else
    ``scontrol``), to warn about configured partitions Slurm does not have.
    """

    def __init__(self, engine: Engine, *, config_file: Optional[str] = None,
                 engine_factory: Optional[Callable[[SiteConfig], Engine]] = None,
                 freeze_gc: bool = False, records_log_fd: Optional[int] = None,
                 log_level_fixed: bool = False,
                 partition_names: Optional[Callable[[], list[str]]] = None):
        self.engine = engine
        self.log_level_fixed = log_level_fixed
        self.partition_names = partition_names
        self.records_log_fd = records_log_fd     # the record writer's log (default: the daemon's)
        self.settings = engine.config.daemon
        self.config_file = config_file
        self.engine_factory = engine_factory or (lambda cfg: Engine(cfg).load())
        self.trusted = trusted_uids(self.settings)
        self.freeze_gc = freeze_gc
        self.pool = WorkerPool(engine.run_work, worker_count(self.settings),
                               max_queue=self.settings.max_queue, warmup=engine.warm_up)
        self.servers: list[_Listener] = []
        self.stats: collections.Counter[str] = collections.Counter()
        self._reloading: Optional[asyncio.Task] = None
        self._in_flight = 0
        self._tasks: set[asyncio.Future] = set()     # answers being computed
        self.records: Optional[Recorder] = None
        # Record writers of stores a reload switched away from, draining before they exit.
        self._retired: list[tuple[Recorder, Any]] = []
        self._retired_stats: collections.Counter[str] = collections.Counter()
        self._ticker: Optional[asyncio.TimerHandle] = None
        self.read_chunk = memoryview(bytearray(READ_BYTES))   # every connection's reads

    async def start(self) -> None:
        if self.freeze_gc:
            gc.collect()
            gc.freeze()
        self.pool.start()
        await self.pool.wait_ready(5.0)   # answer the first burst with warm workers
        if self.settings.records:
            # Records go to a spool file and a writer process of its own: nothing the store's file
            # or SQLite does can stop this process answering (see .recorder).
            self.records = self._recorder(self.settings.records)
            self.records.start()
            self._tick()
        s = self.settings
        self.servers.append(await self._listen(s.socket, s.socket_mode, user_mode=False))
        if s.user_socket:
            self.servers.append(await self._listen(s.user_socket, s.user_socket_mode, user_mode=True))
        self._check_partitions(self.engine)

    def _recorder(self, path: str) -> Recorder:
        fds = sorted(log_fds() - {0, 1})
        fd = self.records_log_fd if self.records_log_fd is not None else (fds[0] if fds else None)
        return Recorder(path, log_fd=fd)

    def _tick(self) -> None:
        self._ticker = None
        if self.pool.closing:
            return
        if self.records is not None:
            self.records.tick()
        self._reap_retired()
        if self.records is not None or self._retired:
            self._ticker = asyncio.get_running_loop().call_later(0.5, self._tick)

    def _reap_retired(self) -> None:
        """Forget the writers of retired stores that have drained and exited."""
        for rec, writer in list(self._retired):
            if writer is not None and writer.poll() is None:
                continue
            self._retired.remove((rec, writer))
            rec.spool.refresh()
            if rec.spool.pending_bytes:     # the store refused them: they wait in its spool
                log_event("records_pending", level=logging.WARNING, spool=rec.spool.dir,
                          kib=rec.spool.pending_bytes >> 10,
                          note="stored when perf-predictd next keeps its records there")

    # ---- Slurm's partitions against the config's ------------------------------------------------
    def _check_partitions(self, engine: Engine) -> None:
        """Once Slurm's partitions are known (the engine's lookup, else one of our own, off the
        loop): a WARNING for each partition the config names that Slurm does not have."""
        if not engine.config.partitions and not engine.config.watch.partitions:
            return
        loop = asyncio.get_running_loop()

        def known() -> None:        # (the engine's lookup thread)
            try:
                loop.call_soon_threadsafe(self._partitions_known, engine)
            except RuntimeError:    # the loop is gone: the daemon stopped meanwhile
                pass
        if not engine.when_partitions_known(known):
            self._partitions_known(engine)

    def _partitions_known(self, engine: Engine) -> None:
        if engine is not self.engine or self.pool.closing:
            return                  # replaced meanwhile: the new engine's check says it
        if engine.slurm_partitions:
            self._warn_partitions(engine, list(engine.slurm_partitions))
            return
        # The engine did not ask Slurm (no user socket) or could not: ask it here.
        task = asyncio.ensure_future(self._look_up_partitions(engine))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _look_up_partitions(self, engine: Engine) -> None:
        lookup = self.partition_names
        if lookup is None:
            backend = engine.backends.get("slurm_partitions")
            lookup = ((lambda: [p.name for p in backend()]) if backend is not None
                      else slurm_partition_names)
        try:
            names = await in_thread(lookup)
        except Exception as exc:  # noqa: BLE001 - SlurmError, or a lookup's bug: names unchecked
            log_event("partitions_unchecked", error=str(exc) or type(exc).__name__,
                      note="partition names not compared with Slurm's")
            return
        if engine is self.engine and not self.pool.closing:
            self._warn_partitions(engine, names)

    @staticmethod
    def _warn_partitions(engine: Engine, names: list[str]) -> None:
        for p in unknown_partitions(engine.config, names):
            log_event("partition_unknown", level=logging.WARNING, partition=p.name, where=p.where,
                      did_you_mean=p.suggestion or "-", error=p.message())

    async def _listen(self, path: str, mode: int, user_mode: bool) -> "_Listener":
        prepare_socket_path(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # no window in which the socket is wider than asked
        try:
            sock.bind(path)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        sock.listen(1024)
        sock.setblocking(False)
        os.chmod(path, mode)
        if os.geteuid() == 0 and not user_mode:
            try:
                os.chown(path, 0, pwd.getpwnam(self.settings.slurm_user).pw_gid)
            except KeyError:
                pass
        listener = _Listener(self, sock, user_mode)
        log_event("listening", socket=path, mode=oct(mode), user_mode=user_mode,
                  workers=self.pool.size)
        return listener

    def _answer(self, engine: Engine, req: PredictRequest, deadline: float,
                fields: dict[str, Any]) -> "Union[Answer, Awaitable[Answer]]":
        """The answer, right here when no worker is needed (a cached or warmed-up outcome, a
        warm-up handed over, nothing to do); else what to await for it."""
        routed = engine.route(req)
        if isinstance(routed, Answer):
            return _warm() if req.warm else routed
        key = engine.cache_key(routed)
        if log.isEnabledFor(logging.DEBUG):
            fields["key"] = key[:12]
        # repeats (arrays, resubmissions) and warmed-up submissions are answered right here
        out: Optional[Outcome] = engine.outcomes.get(key)
        if out is None and not req.warm:
            out = engine.take_warmed(key)
        if out is not None:
            fields["cached"] = 1
            return _warm() if req.warm else self._finish(engine, routed, out, req)
        if req.warm:
            # cli_filter.lua's warm-up: job_submit.lua's request for this submission, a moment
            # later, finds the outcome kept or joins the computation in flight.
            if key not in engine.pending and not engine.is_warmed(key):
                try:
                    self._start(engine, routed, key, deadline, warm=True)
                except PoolBusy as exc:
                    fields["shed"] = str(exc)
            return _warm()
        return self._computed(engine, routed, key, deadline, fields, req)

    async def _answer_later(self, engine: Engine, req: PredictRequest, deadline_ms: int,
                            fields: dict[str, Any]) -> Answer:
        """:meth:`_answer` once Slurm's partitions are known (a user-socket request in the
        daemon's first moments); the deadline runs from then."""
        loop = asyncio.get_running_loop()
        known: asyncio.Future = loop.create_future()

        def settle() -> None:
            if not known.done():
                known.set_result(None)
        if engine.when_partitions_known(lambda: loop.call_soon_threadsafe(settle)):
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(known, PARTITIONS_WAIT_S)
            except asyncio.TimeoutError:
                fields["partitions"] = "unknown"
            fields["partitions_ms"] = _ms_since(t0)
        answer = self._answer(engine, req, time.monotonic() + deadline_ms / 1000.0, fields)
        return answer if isinstance(answer, Answer) else await answer

    def _computed(self, engine: Engine, routed: Route, key: str, deadline: float,
                  fields: dict[str, Any], req: PredictRequest) -> "asyncio.Future[Answer]":
        """The answer once the outcome is in: joining a computation already in flight (a warm-up)
        if there is one, else computed by a worker ahead of any warm-up still queued.

        Callbacks on the outcome's future rather than a task awaiting it: no task, no wait_for
        and no shield per request, so an answer goes out one loop pass after its outcome."""
        loop = asyncio.get_running_loop()
        answer: "asyncio.Future[Answer]" = loop.create_future()
        t_pool = time.monotonic()

        def give(out: Optional[Outcome], exc: Optional[BaseException]) -> None:
            if answer.done():
                return
            if exc is not None:
                a = _failed(engine, routed, exc, fields)
            else:
                assert out is not None
                if log.isEnabledFor(logging.DEBUG):
                    fields["worker_ms"] = out.compute_ms
                    fields["pool_ms"] = round((time.monotonic() - t_pool) * 1e3, 3)
                try:
                    a = self._finish(engine, routed, out, req)
                except Exception:  # a bug: log it, fail open
                    log.exception("request failed")
                    a = _internal()
            answer.set_result(a)

        def compute() -> None:
            try:
                comp = self._start(engine, routed, key, deadline, warm=False)
            except PoolBusy as exc:      # refused at once
                give(None, exc)
                return
            _settle(comp.outcome, deadline, give)

        def joined(out: Optional[Outcome], exc: Optional[BaseException]) -> None:
            if exc is not None:
                if isinstance(exc, (PoolBusy, WorkerOverrun, WorkerDied)) \
                        and deadline - time.monotonic() > MIN_JOIN_LEFT_S:
                    compute()   # the warm-up failed (its own deadline, a crash): as if it never ran
                    return
                give(None, exc)
                return
            engine.take_warmed(key)      # kept for this request only
            assert out is not None
            if not out.timely and deadline - time.monotonic() > MIN_JOIN_LEFT_S:
                compute()                # cut short by the warm-up's clock, not by ours
                return
            give(out, None)

        comp: Optional[_Computation] = engine.pending.get(key)
        if comp is not None:
            fields["joined"] = 1
            self.pool.promote(comp.job)    # a warm-up still queued: slurmctld waits for it now
            _settle(comp.outcome, deadline, joined)
        else:
            compute()
        return answer

    def _start(self, engine: Engine, routed: Route, key: str, deadline: float,
               warm: bool) -> "_Computation":
        """Hand the work to the pool (raises PoolBusy); its outcome is kept when it comes."""
        job = self.pool.submit(engine.work(routed, deadline), deadline, urgent=not warm)
        comp = _Computation(job, job.get_loop().create_future())
        engine.pending[key] = comp

        def settled(f: "asyncio.Future[bytes]") -> None:
            if engine.pending.get(key) is comp:
                del engine.pending[key]
            if f.cancelled():
                comp.outcome.cancel()
                return
            exc = f.exception()
            if exc is not None:
                comp.outcome.set_exception(exc)
                comp.outcome.exception()   # seen here: a warm-up nobody joined fails quietly
                return
            out = Outcome.from_json(f.result())
            if out.cacheable:
                engine.outcomes.put(key, out)
            elif warm and out.timely:
                # Read files: kept only for the one request it was computed ahead of.
                engine.warmed.put(key, (time.monotonic() + WARM_KEEP_S, out))
            comp.outcome.set_result(out)
        job.add_done_callback(settled)
        return comp

    def _finish(self, engine: Engine, routed: Route, out: Outcome, req: PredictRequest) -> Answer:
        """The policy's answer; a prediction is also recorded (off the loop, by the writer's
        thread) under an id that goes into the job's AdminComment, for perf-calibrate harvest."""
        answer = engine.finish(routed, out)
        if self.records is None or answer.status != "ok" or out.facts is None or out.job is None:
            return answer
        rid = new_record_id()
        facts, pred = out.facts, answer.prediction or {}
        kept = self.records.record(PredictionRecord(
            record_id=rid, created=time.time(), partition=routed.name or "", platform=facts.platform,
            bundle=facts.bundle, job=out.job, iteration_seconds=facts.iteration_seconds,
            iterations=facts.iterations, total_seconds=facts.total_seconds,
            interval_seconds=tuple(facts.interval_seconds), time_limit_minutes=answer.time_limit,
            time_min_minutes=answer.time_min, recommended_minutes=pred.get("recommended_minutes"),
            action=answer.reason, policy=routed.part.policy, std_out=req.std_out, std_err=req.std_err,
            work_dir=req.work_dir, job_name=req.name or "", uid=req.submit_uid, gid=req.submit_gid),
            out.job_text)
        if kept:     # an id only for a record that is kept: a harvest must find what it names
            answer.admin_comment = f"{answer.admin_comment} {record_key(rid)}"
        return answer

    async def reload(self) -> None:
        """SIGHUP: re-read the config, reload platforms off the loop, swap; keep serving meanwhile.

        Refused as a whole -- ``reload_failed`` at ERROR with the reason, the running config,
        engine and workers kept -- when the new config does not parse (as ``--check`` says, rc 2)
        or names a platform that does not load (unknown, or failing verification: ``--check``'s
        rc 1).  A platform that did not load in the running config either is no reason to refuse
        (the reload loses nothing there): it stays unavailable, and ``reloaded`` is then a
        WARNING naming it.  [daemon] settings: :data:`RELOAD_APPLIES` are applied,
        :data:`RESTART_ONLY` logged (``restart_needed``) and kept until the restart.
        """
        if self._reloading is not None and not self._reloading.done():
            log_event("reload_skipped", reason="already reloading")
            return
        self._reloading = asyncio.current_task()
        t0 = time.monotonic()
        running = self.settings
        recorder: Optional[Recorder] = None
        try:
            read = await in_thread(load_site_config, self.config_file)
            # The settings that change only at a restart stay as they run: the new engine is
            # built with them (its lookup of Slurm's partitions follows the user socket that is
            # there), and the next reload compares against them again.
            cfg = replace(read, daemon=replace(read.daemon, **{
                k: getattr(running, k) for k in RESTART_ONLY}))
            new = await in_thread(self.engine_factory, cfg)
            broken = {name: err for name, err in sorted(new.platform_errors.items())
                      if name not in self.engine.platform_errors}
            if broken:
                del new
                self._trim()
                log_event("reload_failed", level=logging.ERROR,
                          error="; ".join(f"platform {n} does not load: {e}" for n, e in broken.items()),
                          kept=RELOAD_KEPT)
                return
            await in_thread(new.warm_up)
            if cfg.daemon.records and cfg.daemon.records != running.records:
                recorder = self._recorder(cfg.daemon.records)
                await in_thread(recorder.start)     # its spool made and writer started off the loop
        except SiteConfigError as exc:
            log_event("reload_failed", level=logging.ERROR, error=str(exc), kept=RELOAD_KEPT)
            return
        except Exception as exc:     # (a bug: where, never what -- the message may quote the file)
            log_event("reload_failed", level=logging.ERROR, error=exception_summary(exc), kept=RELOAD_KEPT)
            return
        if self.pool.closing:
            if recorder is not None:
                Recorder.finish(recorder.close_nowait(), recorder.spool)
            return
        self._apply_settings(running, read.daemon, recorder)
        self.settings = cfg.daemon
        self.trusted = trusted_uids(cfg.daemon)
        self.engine = new
        # Requests in flight keep the old engine alive until their deadline; then hand its memory
        # back (before that, the new workers are forked with the old engine's pages still there:
        # harmless, they are shared).
        asyncio.get_running_loop().call_later(cfg.daemon.deadline_ms / 1000.0 + 0.5, self._trim)
        # New workers are forked from the new engine; old ones finish what they hold.
        self.pool.swap(new.run_work, worker_count(cfg.daemon), warmup=new.warm_up)
        self.pool.max_queue = max(1, cfg.daemon.max_queue)
        log_event("reloaded", level=logging.WARNING if new.platform_errors else logging.INFO,
                  platforms=",".join(sorted(new.platforms)) or "-",
                  failed=",".join(sorted(new.platform_errors)) or "-",
                  workers=self.pool.size, ms=round((time.monotonic() - t0) * 1e3, 1))
        self._check_partitions(new)

    def _apply_settings(self, old: DaemonSettings, new: DaemonSettings,
                        recorder: Optional[Recorder]) -> None:
        """The [daemon] settings a reload changes that need more than the new engine: the
        sockets' modes and group, the log level, the record store (``recorder``: the new store's,
        started).  One line per changed setting; WARNING for those kept until a restart."""
        for key in RESTART_ONLY:
            if getattr(new, key) != getattr(old, key):
                log_event("restart_needed", level=logging.WARNING, setting=f"daemon.{key}",
                          old=getattr(old, key) or "-", new=getattr(new, key) or "-",
                          note="takes effect at restart; the running value is kept until then")
        for key in RELOAD_APPLIES:
            before, after = getattr(old, key), getattr(new, key)
            if before == after:
                continue
            shown = {"old": oct(before), "new": oct(after)} if key.endswith("_mode") else \
                {"old": before or "-", "new": after or "-"}
            if key == "log_level" and self.log_level_fixed:
                log_event("setting_not_applied", level=logging.WARNING, setting="daemon.log_level",
                          **shown, note="--log-level on the command line wins")
                continue
            problem = self._apply_setting(key, old, new, recorder)
            if problem:
                log_event("setting_not_applied", level=logging.WARNING, setting=f"daemon.{key}",
                          **shown, error=problem)
            else:
                log_event("setting_applied", setting=f"daemon.{key}", **shown)

    def _apply_setting(self, key: str, old: DaemonSettings, new: DaemonSettings,
                       recorder: Optional[Recorder]) -> str:
        """Apply one changed setting; "" or why it could not be."""
        try:
            if key == "socket_mode":
                os.chmod(old.socket, new.socket_mode)
            elif key == "user_socket_mode" and old.user_socket:
                os.chmod(old.user_socket, new.user_socket_mode)
            elif key == "slurm_user" and os.geteuid() == 0:
                # (trusted uids are recomputed by the reload; the socket's group follows here)
                os.chown(old.socket, 0, pwd.getpwnam(new.slurm_user).pw_gid)
            elif key == "log_level":
                level = getattr(logging, new.log_level.upper(), None)
                if not isinstance(level, int):
                    return f"unknown level {new.log_level!r}"
                for name in ("perfcast", "slurm_plugin", "predictor"):
                    logging.getLogger(name).setLevel(level)
            elif key == "records":
                self._switch_records(recorder)
        except KeyError:
            return f"no user {new.slurm_user!r}"
        except OSError as exc:
            return exc.strerror or str(exc)
        return ""

    def _switch_records(self, recorder: Optional[Recorder]) -> None:
        """Keep records in ``recorder``'s store from now on (None: keep none).  The old store's
        writer is told to store everything spooled so far and exit (it is not waited for here)."""
        old, self.records = self.records, recorder
        if old is not None:
            writer = old.close_nowait()
            for k, v in old.stats().items():
                self._retired_stats[k] += v
            self._retired.append((old, writer))
        if self._ticker is None and (self.records is not None or self._retired):
            self._tick()

    def _trim(self) -> None:
        if self.freeze_gc:
            gc.unfreeze()       # the old engine's objects must become collectable again
        release_memory()
        if self.freeze_gc:
            gc.freeze()

    async def close(self) -> None:
        """Stop listening, let answers in flight go out (briefly), kill every worker."""
        for server in self.servers:
            server.close()
        end = time.monotonic() + STOP_GRACE_S
        while self._in_flight and time.monotonic() < end:
            await asyncio.sleep(0.01)
        await self.pool.close()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        writers = list(self._retired)
        self._retired = []
        if self.records is not None:
            writers.append((self.records, self.records.close_nowait()))
        if writers:
            end = time.monotonic() + RECORDS_GRACE_S
            while (any(w is not None and w.poll() is None for _, w in writers)
                   and time.monotonic() < end):
                await asyncio.sleep(0.01)
            for rec, writer in writers:
                Recorder.finish(writer, rec.spool)
        for path in (self.settings.socket, self.settings.user_socket):
            if path:
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)
                except OSError:
                    pass

    def summary(self) -> dict[str, Any]:
        records = collections.Counter(self._retired_stats)
        if self.records is not None:
            records.update(self.records.stats())
        return {"served": sum(self.stats.values()), **dict(sorted(self.pool.stats.items())),
                **dict(records)}


class _Listener:
    """A listening socket: each connection is read and answered on the event loop's thread."""

    def __init__(self, server: PredictServer, sock: socket.socket, user_mode: bool):
        self.server, self.sock, self.user_mode = server, sock, user_mode
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(sock.fileno(), self._accept)
        self.closed = False

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:   # EMFILE and the like: pause rather than spin
                log_event("accept_failed", level=logging.ERROR, error=exc.strerror or str(exc))
                self.loop.remove_reader(self.sock.fileno())
                self.loop.call_later(ACCEPT_RETRY_S, self._resume)
                return
            conn.setblocking(False)
            _Connection(self.server, conn, self.user_mode, self.loop).start()

    def _resume(self) -> None:
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


class _Connection:
    """One connection: one request read (bounded, by its deadline), answered, closed.

    Plain non-blocking socket calls on the loop's thread rather than a transport, a stream reader
    and a task per connection: job_submit.lua has usually sent its request by the time it is
    accepted, so an answer that needs no worker (a cache hit, a warm-up handed over, a refusal)
    is read, decided and written in the one callback -- most of the daemon's own time per request.
    """

    def __init__(self, server: PredictServer, sock: socket.socket, user_mode: bool,
                 loop: asyncio.AbstractEventLoop):
        self.server, self.sock, self.user_mode, self.loop = server, sock, user_mode, loop
        self.engine = server.engine   # a reload mid-request must not change what this one sees
        self.fields: dict[str, Any] = {}
        self.fmt = "lines"
        self.event = "request"
        self.buffer: Optional[RequestBuffer] = None     # while the request is being read
        self.reading = False                            # a reader is registered for the socket
        self.timer: Optional[asyncio.TimerHandle] = None
        self.answered = False
        self.t0 = time.monotonic()
        self.peer = (-1, -1, -1)

    def start(self) -> None:
        self.server._in_flight += 1
        settings = self.engine.config.daemon
        try:
            self.peer = peer_credentials(self.sock)
        except OSError:
            pass
        pid, uid, _ = self.peer
        self.fields.update(peer_pid=pid, peer_uid=uid)
        if not self.user_mode and uid not in self.server.trusted:
            self._reply(Answer("refused", reason="peer-not-trusted",
                               message="perfcast: this socket serves only slurmctld"))
            return
        self.buffer = RequestBuffer(request_limit(settings.max_request_bytes))
        self.timer = self.loop.call_at(self.t0 + settings.deadline_ms / 1000.0, self._too_late)
        self._read()

    def _read(self) -> None:
        chunk = self.server.read_chunk
        while self.buffer is not None:
            try:
                got = self.sock.recv_into(chunk)
            except (BlockingIOError, InterruptedError):
                if not self.reading:
                    self.loop.add_reader(self.sock.fileno(), self._read)
                    self.reading = True
                return
            except OSError:
                got = 0                # reset by the client: whatever came is all there is
            if not got:                # EOF: a request need not end with a newline
                self._received(self.buffer.end())
                return
            try:
                raw = self.buffer.feed(bytes(chunk[:got]))
            except RequestTooLarge:
                self.buffer = None
                self._reply(_too_large())
                return
            if raw is not None:
                self._received(raw)

    def _stop_reading(self) -> None:
        self.buffer = None
        if self.reading:
            self.loop.remove_reader(self.sock.fileno())
            self.reading = False

    def _too_late(self) -> None:
        self.timer = None
        if self.buffer is not None:
            self._stop_reading()
            self._reply(_too_slow(self.engine.config.daemon.deadline_ms))

    def _received(self, raw: bytes) -> None:
        self._stop_reading()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        engine, fields = self.engine, self.fields
        settings = engine.config.daemon
        timing = log.isEnabledFor(logging.DEBUG)   # where the time went, per phase (debug only)
        if timing:
            fields["read_ms"] = _ms_since(self.t0)
        self.fmt = sniff_format(raw)
        pid, uid, gid = self.peer
        try:
            # On the user socket the kernel's word replaces the request's claim.
            req = parse_request(raw, max_script=settings.max_request_bytes,
                                peer=(uid, gid) if self.user_mode else None,
                                peer_cwd=_cwd(pid) if self.user_mode else None)
            self.fmt = req.format
            fields.update(uid=req.submit_uid, bytes=len(raw))
            self.event = "warm" if req.warm else "request"
            del raw
            if timing:
                fields["parsed_ms"] = _ms_since(self.t0)
            # (a warm-up does not wait: one that starts late helps nobody)
            if (self.user_mode and not req.warm and not req.partition_max_time
                    and not engine.partitions_looked_up()):
                answer = self.server._answer_later(engine, req, settings.deadline_ms, fields)
            else:
                answer = self.server._answer(engine, req, self.t0 + settings.deadline_ms / 1000.0,
                                             fields)
        except RequestTooLarge as exc:
            answer = _too_large()
            self.fmt = exc.args[0] if exc.args else self.fmt
        except BadRequest as exc:
            answer = Answer("error", reason="bad-request",
                            message=f"perfcast: no prediction ({exc}); job submitted unchanged")
        except Exception:  # a bug: log it, fail open, never a traceback to the user
            log.exception("request failed")
            answer = _internal()
        if isinstance(answer, Answer):
            self._reply(answer)
        elif isinstance(answer, asyncio.Future):
            answer.add_done_callback(self._reply_done)
        else:
            task = asyncio.ensure_future(self._reply_later(answer))
            self.server._tasks.add(task)       # (the loop itself keeps only a weak reference)
            task.add_done_callback(self.server._tasks.discard)

    def _reply_done(self, pending: "asyncio.Future[Answer]") -> None:
        try:
            answer = pending.result()
        except BaseException:  # a bug: log it, fail open, never a traceback to the user
            log.exception("request failed")
            answer = _internal()
        self._reply(answer)

    async def _reply_later(self, pending: Awaitable[Answer]) -> None:
        try:
            answer = await pending
        except Exception:  # a bug: log it, fail open, never a traceback to the user
            log.exception("request failed")
            answer = _internal()
        self._reply(answer)

    def _reply(self, answer: Answer) -> None:
        """Send the answer, close, log: once per connection."""
        if self.answered:
            return
        self.answered = True
        self._stop_reading()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        fields = self.fields
        if "parsed_ms" in fields:
            fields["answered_ms"] = _ms_since(self.t0)
        self.server.stats[answer.status] += 1
        if answer.partition:
            fields["partition"] = answer.partition
        data = answer.encode(self.fmt)
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:                 # the client went: Lua gave up already, the job went on
            sent = -1
            fields["write"] = "failed"
        if 0 <= sent < len(data):       # a client that does not take its answer: briefly
            self._send_rest(memoryview(data)[sent:], time.monotonic() + WRITE_GRACE_S)
        else:
            self.sock.close()
        self.server._in_flight -= 1
        log_event(self.event, status=answer.status, reason=answer.reason,
                  time_limit=answer.time_limit if answer.time_limit is not None else "-",
                  ms=round((time.monotonic() - self.t0) * 1e3, 2),
                  level=logging.WARNING if answer.status in ("refused", "error") else logging.INFO,
                  **fields)

    def _send_rest(self, rest: memoryview, until: float) -> None:
        fd = self.sock.fileno()

        def more() -> None:
            nonlocal rest
            try:
                rest = rest[self.sock.send(rest):]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                rest = rest[:0]
            if not rest or time.monotonic() >= until:
                done()

        def done() -> None:
            self.loop.remove_writer(fd)
            timer.cancel()
            self.sock.close()
        self.loop.add_writer(fd, more)
        timer = self.loop.call_at(until, done)


def _settle(fut: "asyncio.Future[Outcome]", deadline: float,
            then: Callable[[Optional[Outcome], Optional[BaseException]], None]) -> None:
    """Call ``then(outcome, None)`` or ``then(None, exception)`` once: when ``fut`` is done, or
    (a TimeoutError) at the deadline plus :data:`BACKSTOP_S` should the pool not have answered."""
    loop = fut.get_loop()
    timer: Optional[asyncio.TimerHandle] = None

    def done(f: "asyncio.Future[Outcome]") -> None:
        if timer is not None:
            timer.cancel()
        if f.cancelled():
            then(None, asyncio.CancelledError())
        elif f.exception() is not None:
            then(None, f.exception())
        else:
            then(f.result(), None)

    def late() -> None:
        if fut.remove_done_callback(done):
            then(None, TimeoutError())

    fut.add_done_callback(done)
    if not fut.done():
        timer = loop.call_later(max(0.001, deadline - time.monotonic()) + BACKSTOP_S, late)


def _failed(engine: Engine, routed: Route, exc: BaseException, fields: dict[str, Any]) -> Answer:
    """The answer when no outcome came: busy, too slow, a worker lost, or a bug."""
    if isinstance(exc, PoolBusy):       # refused at once, or waited in the queue until too late
        fields["shed"] = str(exc)
        return engine.skip(routed.part, "busy", "the prediction service is busy")
    if isinstance(exc, (WorkerOverrun, TimeoutError)):
        fields["worker"] = "killed"
        return _too_slow(engine.config.daemon.deadline_ms, engine, routed)
    if isinstance(exc, WorkerDied):
        fields["worker"] = "died"
        return engine.skip(routed.part, "internal", "internal error")
    log.error("request failed", exc_info=exc)   # a bug: logged, failing open
    return _internal()


def _too_large() -> Answer:
    return Answer("error", reason="too-large",
                  message="perfcast: script too large to predict; job submitted unchanged")


def _internal() -> Answer:
    return Answer("error", reason="internal", message="perfcast: internal error; job submitted unchanged")


def _warm() -> Answer:
    return Answer("ok", reason="warm")   # cli_filter.lua does not wait for it


def _cwd(pid: int) -> Optional[str]:
    """The working directory of process ``pid`` as sbatch's getcwd() gives it to Slurm (symlinks
    resolved); from the kernel's record, so a hung file system cannot block the loop here."""
    if pid <= 0:
        return None
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _ms_since(t0: float) -> float:
    return round((time.monotonic() - t0) * 1e3, 3)


def _too_slow(deadline_ms: int, engine: Optional[Engine] = None,
              routed: Optional[Route] = None) -> Answer:
    why = f"no prediction within {deadline_ms} ms"
    if engine is not None and routed is not None:
        return engine.skip(routed.part, "deadline", why)
    return Answer("skip", reason="deadline",
                  message=f"perfcast: no time limit suggested ({why}); job submitted unchanged")


def prepare_socket_path(path: str) -> None:
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


async def serve(server: PredictServer, pid_file: Optional[str] = None) -> None:
    """Run until SIGTERM/SIGINT; SIGHUP reloads.  The pid file appears once the socket listens."""
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
    # (a platform that does not load at start fails open: its partitions' jobs go on unchanged)
    log_event("ready", level=logging.WARNING if server.engine.platform_errors else logging.INFO,
              pid=os.getpid(), workers=",".join(map(str, server.pool.pids())),
              platforms=",".join(sorted(server.engine.platforms)) or "-",
              failed=",".join(sorted(server.engine.platform_errors)) or "-")
    try:
        await stop.wait()
        t0 = time.monotonic()
        await server.close()
        log_event("stopped", ms=round((time.monotonic() - t0) * 1e3, 1), **server.summary())
    finally:
        if pid_file:
            try:
                os.unlink(pid_file)
            except OSError:
                pass
