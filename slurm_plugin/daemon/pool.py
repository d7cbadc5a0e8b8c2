"""Worker processes with hard deadlines, and load shedding in front of them.

Parsing a hostile script or predicting an odd job must never hold the daemon: each piece of work
runs in a worker process forked from the daemon (so the loaded platforms are shared
copy-on-write and nothing is pickled: work and results are JSON frames over a socketpair).

- Every job carries the request's deadline.  A worker still busy at that moment is SIGKILLed and a
  fresh one forked in its place; the request is answered "too slow" right then.  No script holds
  a CPU or a worker past its deadline.
- A job that cannot start and finish before its deadline, judged from the queue ahead of it and
  the rate at which the queue was measured to drain (seconds between results while jobs waited),
  is refused at once (:class:`PoolBusy`) instead of waiting to time out: the job goes on unchanged
  with one line saying so.  Without a fresh measurement (a first burst) it queues, and is refused
  only once its own measured wait leaves no time to run it.  So is one beyond ``max_queue``.
- :meth:`WorkerPool.swap` (SIGHUP) forks workers from the new engine; old workers finish the job
  they hold, then go.  :meth:`WorkerPool.close` (SIGTERM) kills every worker whatever it does.

Workers are forked from the event-loop thread only (the daemon's other threads, a reload or the
partition lookup, never fork), and die with the daemon (PR_SET_PDEATHSIG) should it be killed.
Each worker leads a session (so a process group) of its own, which the file readers it starts stay
in: whenever a worker goes (its deadline, a crash, a retirement, the daemon stopping) the whole
group is SIGKILLed before the worker is reaped, so no reader blocked on a FIFO outlives it.  (A daemon
killed with SIGKILL leaves such readers to systemd, which kills the unit's cgroup.)
"""
from __future__ import annotations

import asyncio
import collections
import ctypes
import errno
import logging
import os
import signal
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .logs import log_event, log_fds

Target = Callable[[bytes], bytes]
Warmup = Callable[[], None]

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20           # a request is at most max_request_bytes plus a little JSON
MIN_SLOT_S = 0.002             # a job with less time than this left is not started
SERVICE_INIT_S = 0.008         # service-time estimate before any job finished
SERVICE_CAP_S = 0.25           # one hostile script must not make the estimate shed everything
EWMA = 0.2
DRAIN_FRESH_S = 2.0            # a drain rate measured longer ago than this is not used to shed
RESPAWN_BACKOFF_S = 0.5        # a worker that dies within this of starting: wait before the next
RESPAWN_BACKOFF_MAX_S = 30.0   # ... doubling while they keep dying so, up to this: no crash loop
# Workers yield the CPU to the daemon's own loop (accepting, answering, handing out work) and to
# slurmctld: a starved loop leaves workers idle and answers late.  Not while slurmctld waits for
# the job (holding its locks): then a worker that yields only makes it wait longer, so a daemon
# that may lower a nice value again (root with CAP_SYS_NICE: not every container's root) runs
# urgent jobs at nice 0 and warm-ups at WORKER_NICE; any other runs every job at WORKER_NICE.
# The daemon sets a worker's nice value, before it sends a job and when it promotes one: from one
# thread, so a promotion cannot be undone by the worker reading its job's frame afterwards.
WORKER_NICE = 5
# Under the kernel's autogroup scheduling (kernel.sched_autogroup_enabled, the default of many
# distributions, for processes in the root cpu cgroup) CPU is shared between *sessions* first and
# by nice value only within one: a worker in the daemon's session would take its turns from the
# daemon's loop, and its nice value would make it yield to nobody else.  So each worker leads a
# session of its own, and the daemon, when it leads one (as a service or under setsid; not when
# run from a shell), gives its own this nice value: its loop answers slurmctld, which waits holding
# its locks, for about a millisecond of CPU per submission (measured: packaging/INSTALL.md §3).
# In a cpu cgroup of its own (systemd with the cpu controller on) sessions play no part, and
# nice values order the daemon's processes among themselves as above.
SESSION_NICE = -10


class PoolBusy(Exception):
    """The job was not taken: no worker could answer it before its deadline."""


class WorkerOverrun(Exception):
    """The worker was still busy at the deadline: it has been killed (and replaced)."""


class WorkerDied(Exception):
    """The worker exited while holding the job (a crash: logged, and replaced)."""


@dataclass
class _Job:
    payload: bytes
    deadline: float                 # time.monotonic() (the event loop's clock too)
    future: asyncio.Future
    urgent: bool = True             # slurmctld waits for it (not a warm-up): ahead of the others


@dataclass(eq=False)   # identity: workers live in sets
class _Worker:
    pid: int
    sock: socket.socket
    generation: int
    started: float
    transport: Optional[asyncio.Transport] = None
    job: Optional[_Job] = None
    dispatched: float = 0.0
    timer: Optional[asyncio.TimerHandle] = None
    retire: bool = False            # go once the current job is done (reload)
    killed: bool = False
    ready: bool = False             # warmed up and waiting for work
    nice: Optional[int] = None      # as last set by the daemon (None: as the worker started)
    buf: bytearray = field(default_factory=bytearray)


# What one read from a worker's socket may bring.  A worker's answer is a few KiB: a buffer of
# this size, filled in place (recv_into), costs no allocation per read, where asyncio's default
# recv(256 KiB) allocates and shrinks a 256 KiB object each time: 11-12 against 1.4-1.6 us per
# message on the development VM (benchmarks/bench_daemon_reads.py).
READ_CHUNK = 64 * 1024


class _WorkerProtocol(asyncio.BufferedProtocol):
    def __init__(self, pool: "WorkerPool", worker: _Worker):
        self.pool, self.worker = pool, worker
        self.chunk = memoryview(bytearray(READ_CHUNK))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.worker.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.chunk

    def buffer_updated(self, nbytes: int) -> None:
        buf = self.worker.buf
        buf += self.chunk[:nbytes]
        while len(buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(buf)
            if n > MAX_FRAME:
                self.pool._kill(self.worker, "bad-frame")
                return
            if len(buf) < _HEADER.size + n:
                return
            frame = bytes(buf[_HEADER.size:_HEADER.size + n])
            del buf[:_HEADER.size + n]
            if n == 0:
                self.pool._on_ready(self.worker)
            else:
                self.pool._on_result(self.worker, frame)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.pool._on_exit(self.worker)


class WorkerPool:
    """``size`` worker processes running ``target(payload) -> result`` (bytes in, bytes out).

    ``warmup()`` runs in each new worker before it takes work (first use of a forked process
    is slow: copy-on-write faults, caches): a replacement is never slow on a user's job.
    """

    def __init__(self, target: Target, size: int, *, max_queue: int = 256,
                 warmup: Optional[Warmup] = None):
        self.target = target
        self.warmup = warmup
        self.size = max(1, size)
        self.max_queue = max(1, max_queue)
        self.generation = 0
        self.workers: set[_Worker] = set()
        self.idle: collections.deque[_Worker] = collections.deque()
        self.queue: collections.deque[_Job] = collections.deque()
        self.service_s = SERVICE_INIT_S
        self.drain_s: Optional[float] = None   # measured seconds between results while jobs queued
        self._last_done = 0.0
        self._last_done_queued = False
        self.stats: collections.Counter[str] = collections.Counter()
        self.early_deaths = 0      # workers in a row that died before they were ready
        self.closing = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._zombies: set[int] = set()
        self._reaper: Optional[asyncio.TimerHandle] = None
        self._respawn: Optional[asyncio.TimerHandle] = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._fill()

    async def wait_ready(self, timeout: float) -> bool:
        """Until every worker has warmed up (or ``timeout``); True if they all have."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.workers and all(w.ready for w in self.workers):
                return True
            await asyncio.sleep(0.005)
        return False

    def swap(self, target: Target, size: Optional[int] = None,
             warmup: Optional[Warmup] = None) -> None:
        """Serve from ``target`` from now on: idle workers are replaced at once, busy ones after
        the job they hold (no request is dropped)."""
        self.target = target
        self.warmup = warmup
        if size is not None:
            self.size = max(1, size)
        self.generation += 1
        for w in list(self.workers):
            w.retire = True
        while self.idle:
            self._retire(self.idle.popleft())
        self._fill()

    async def close(self, reap_s: float = 0.3) -> None:
        """Kill every worker (SIGKILL: whatever it is doing) and fail what is queued."""
        self.closing = True
        for h in (self._reaper, self._respawn):
            if h is not None:
                h.cancel()
        while self.queue:
            job = self.queue.popleft()
            if not job.future.done():
                job.future.set_exception(PoolBusy("stopping"))
        for w in list(self.workers):
            self._kill(w, "stopping")
        end = time.monotonic() + reap_s
        while self._zombies and time.monotonic() < end:
            self._reap_now()
            if self._zombies:
                await asyncio.sleep(0.01)
        if self._zombies:   # stuck in the kernel: init reaps them once we are gone
            log_event("workers_unreaped", level=logging.WARNING,
                      pids=",".join(map(str, sorted(self._zombies))))

    # ---- submitting --------------------------------------------------------------------------
    def submit(self, payload: bytes, deadline: float, urgent: bool = True) -> "asyncio.Future[bytes]":
        """Queue a job; raises :class:`PoolBusy` at once when it cannot be answered in time.

        The future gets the worker's result, or :class:`WorkerOverrun` / :class:`WorkerDied`.
        ``urgent`` jobs (somebody waits) queue ahead of the others (warm-ups).
        """
        loop = self._loop or asyncio.get_running_loop()
        now = time.monotonic()
        if self.closing:
            raise PoolBusy("stopping")
        if not self.workers:
            raise PoolBusy("no-workers")
        if now + MIN_SLOT_S >= deadline:
            raise PoolBusy("deadline")
        if not self.idle or self.queue:
            if len(self.queue) >= self.max_queue:
                self.stats["shed_queue"] += 1
                raise PoolBusy("queue-full")
            # Starts once the jobs ahead of it are done, at the rate the queue was last measured
            # to drain; then runs.  Unmeasured (a first burst) or stale: it queues, and waits only
            # as long as its deadline allows (_pump) -- never refused on a guess.
            ahead = self._urgent_queued() if urgent else len(self.queue)
            if self.drain_s is not None and now - self._last_done < DRAIN_FRESH_S:
                wait = (ahead + 1) * self.drain_s
                if now + wait + self.service_s > deadline:
                    self.stats["shed_deadline"] += 1
                    raise PoolBusy("deadline")
        job = _Job(payload, deadline, loop.create_future(), urgent)
        if urgent:
            self.queue.insert(self._urgent_queued(), job)
        else:
            self.queue.append(job)
        self._pump()
        return job.future

    def _urgent_queued(self) -> int:
        n = 0
        for job in self.queue:     # urgent ones are at the front
            if not job.urgent:
                break
            n += 1
        return n

    def promote(self, future: "asyncio.Future[bytes]") -> None:
        """Somebody now waits for the job of ``future``: queued, it goes ahead of the others;
        running, its worker stops yielding the CPU."""
        for i, job in enumerate(self.queue):
            if job.future is future:
                if not job.urgent:
                    del self.queue[i]
                    job.urgent = True
                    self.queue.insert(self._urgent_queued(), job)
                    # Warm-ups left a worker free for jobs like it: start it there now, not when
                    # the next job comes or a warm-up ends (at a burst's end, a whole prediction).
                    self._pump()
                return
        for w in self.workers:
            if w.job is not None and w.job.future is future and not w.job.urgent:
                w.job.urgent = True
                _renice(w, 0)
                return

    def _pump(self) -> None:
        while self.idle and self.queue:
            if not self.queue[0].urgent and len(self.idle) == 1 and self.size > 1:
                # Warm-ups leave one worker free: a request slurmctld waits on (its locks held)
                # starts at once instead of behind warm-ups nobody waits for yet.
                return
            job = self.queue.popleft()
            if job.future.done():          # the request gave up already
                continue
            # Started this late it would most likely be killed at its deadline: answering "busy"
            # now is kinder to the user and spares a worker (and a fork).
            if time.monotonic() + max(MIN_SLOT_S, self.service_s) >= job.deadline:
                self.stats["shed_late"] += 1
                job.future.set_exception(PoolBusy("deadline"))
                continue
            # The worker idle the shortest time: its CPU caches are still warm, so the job costs
            # less CPU than on one that sat idle longer (round-robin).
            self._dispatch(self.idle.pop(), job)

    def _dispatch(self, w: _Worker, job: _Job) -> None:
        assert self._loop is not None and w.transport is not None
        w.job = job
        w.dispatched = time.monotonic()
        _renice(w, 0 if job.urgent else WORKER_NICE)
        w.transport.write(_HEADER.pack(len(job.payload)) + job.payload)
        w.timer = self._loop.call_at(job.deadline, self._overrun, w)

    # ---- worker events -----------------------------------------------------------------------
    def _on_result(self, w: _Worker, frame: bytes) -> None:
        job, w.job = w.job, None
        if w.timer is not None:
            w.timer.cancel()
            w.timer = None
        if job is None:       # nothing asked: a confused worker is not trusted further
            self._kill(w, "unexpected-frame")
            return
        took = time.monotonic() - w.dispatched
        self.service_s += EWMA * (min(took, SERVICE_CAP_S) - self.service_s)
        self._drained()
        self.stats["done"] += 1
        if not job.future.done():
            job.future.set_result(frame)
        if w.retire or w.generation != self.generation:
            self._retire(w)
            self._fill()
        else:
            self.idle.append(w)
        self._pump()

    def _drained(self) -> None:
        """A job left a worker: while jobs were queued since the last one, the time between the two
        is how fast the queue drains (all workers, the loop's own overhead included)."""
        now = time.monotonic()
        if self._last_done_queued:
            interval = min(now - self._last_done, SERVICE_CAP_S)
            self.drain_s = interval if self.drain_s is None else \
                self.drain_s + EWMA * (interval - self.drain_s)
        self._last_done = now
        self._last_done_queued = bool(self.queue)

    def _overrun(self, w: _Worker) -> None:
        w.timer = None
        job, w.job = w.job, None
        if job is None:
            return
        self.stats["killed"] += 1
        took = time.monotonic() - w.dispatched      # what it held the worker for, at least
        self.service_s += EWMA * (min(took, SERVICE_CAP_S) - self.service_s)
        self._drained()
        if not job.future.done():
            job.future.set_exception(WorkerOverrun())
        self._kill(w, "deadline")
        self._fill()

    def _on_exit(self, w: _Worker) -> None:
        """The worker's socket closed: it exited (or we killed or retired it)."""
        if w not in self.workers:
            return
        self._forget(w)
        job, w.job = w.job, None
        if w.timer is not None:
            w.timer.cancel()
        if job is not None and not job.future.done():
            job.future.set_exception(WorkerDied())
        # Readers it left behind (blocked on a FIFO, a hung mount) go with it; before the reap,
        # while its zombie keeps the pid (and so the group id) from being reused.
        _kill_group(w.pid, group_only=True)
        self._reap(w.pid)
        if self.closing or w.killed or w.retire:
            return
        self.stats["died"] += 1
        log_event("worker_died", level=logging.ERROR, pid=w.pid,
                  after_s=round(time.monotonic() - w.started, 3))
        if not w.ready or time.monotonic() - w.started < RESPAWN_BACKOFF_S:
            self.early_deaths += 1
            self._schedule_fill(self.respawn_delay())   # crashing at start: do not spin
        else:
            self._fill()

    def _forget(self, w: _Worker) -> None:
        self.workers.discard(w)
        try:
            self.idle.remove(w)
        except ValueError:
            pass

    def _kill(self, w: _Worker, why: str) -> None:
        if w.killed:
            return
        w.killed = True
        self._forget(w)
        if w.timer is not None:
            w.timer.cancel()
            w.timer = None
        job, w.job = w.job, None
        if job is not None and not job.future.done():
            job.future.set_exception(WorkerDied())
        _kill_group(w.pid)
        if why not in ("stopping",):
            log_event("worker_killed", level=logging.WARNING, pid=w.pid, why=why)
        if w.transport is not None:
            w.transport.abort()
        else:
            w.sock.close()
        self._reap(w.pid)

    def _retire(self, w: _Worker) -> None:
        """Let a worker go (no job held): closing its socket makes it exit."""
        w.retire = True
        self._forget(w)
        if w.transport is not None:
            w.transport.close()
        else:
            w.sock.close()
        self._reap(w.pid)

    # ---- processes ---------------------------------------------------------------------------
    def _fill(self) -> None:
        while not self.closing and len(self.workers) < self.size:
            try:
                self._spawn()
            except OSError as exc:
                log_event("worker_spawn_failed", level=logging.ERROR, error=exc.strerror or str(exc))
                self._schedule_fill(RESPAWN_BACKOFF_S)
                return

    def _schedule_fill(self, delay: float) -> None:
        if self._respawn is None and self._loop is not None and not self.closing:
            def again() -> None:
                self._respawn = None
                self._fill()
            self._respawn = self._loop.call_later(delay, again)

    def _spawn(self) -> None:
        assert self._loop is not None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        target, warmup, me = self.target, self.warmup, os.getpid()
        keep = {0, 1, 2, child.fileno()} | log_fds()
        pid = os.fork()
        if pid == 0:   # the worker: never returns into the daemon's code
            code = 1
            try:
                code = _worker_main(child, target, warmup, keep, me)
            finally:
                os._exit(code)
        child.close()
        # (no setpgid here, which would make the worker's setsid fail: until the worker has made
        # its session, _kill_group kills it by its pid, and it starts no reader before its ready
        # frame, hence none outside its group)
        parent.setblocking(False)
        w = _Worker(pid=pid, sock=parent, generation=self.generation, started=time.monotonic())
        self.workers.add(w)
        self.stats["spawned"] += 1
        self._loop.create_task(self._attach(w))

    async def _attach(self, w: _Worker) -> None:
        assert self._loop is not None
        try:
            await self._loop.create_unix_connection(lambda: _WorkerProtocol(self, w), sock=w.sock)
        except OSError:
            self._kill(w, "attach-failed")
            self._schedule_fill(RESPAWN_BACKOFF_S)
            return

    def respawn_delay(self) -> float:
        """The wait before replacing workers that die at start: doubling with each in a row, so
        that a worker that can never start (a broken install, a library that crashes in fork())
        costs a log line every half-minute, not a fork loop."""
        streak = max(1, self.early_deaths)
        return min(RESPAWN_BACKOFF_MAX_S, RESPAWN_BACKOFF_S * 2.0 ** min(streak - 1, 16))

    def _on_ready(self, w: _Worker) -> None:
        """The worker has warmed up: it takes work from now on."""
        if w.ready or w.killed or w not in self.workers:
            return
        w.ready = True
        self.early_deaths = 0
        if w.retire or w.generation != self.generation:
            self._retire(w)
            self._fill()
            return
        self.idle.append(w)
        self._pump()

    def _reap(self, pid: int) -> None:
        self._zombies.add(pid)
        self._reap_now()
        if self._zombies and self._reaper is None and self._loop is not None and not self.closing:
            self._reaper = self._loop.call_later(0.05, self._reap_later)

    def _reap_later(self) -> None:
        self._reaper = None
        self._reap_now()
        if self._zombies and self._loop is not None and not self.closing:
            self._reaper = self._loop.call_later(1.0, self._reap_later)

    def _reap_now(self) -> None:
        for pid in list(self._zombies):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._zombies.discard(pid)

    def pids(self) -> list[int]:
        return sorted(w.pid for w in self.workers)


def _kill_group(pid: int, group_only: bool = False) -> None:
    """SIGKILL a worker and every process in its group (its file readers)."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return
    except OSError:
        pass
    if not group_only:      # not (yet) a group leader: it was forked a moment ago
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# --------------------------------------------------------------------------------------------
# the worker process

def _worker_main(sock: socket.socket, target: Target, warmup: Optional[Warmup], keep: set[int],
                 parent: int) -> int:
    """Serve jobs from the daemon until it closes the socket (or dies)."""
    # Signals are the daemon's business: a reload or ^C must not kill a job half-way;
    # SIGTERM (systemd stopping the whole unit) and SIGKILL end us.
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    try:   # die with the daemon, even if it is SIGKILLed
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        return 0
    try:   # a session and group of its own: the readers it starts stay in the group and are
        os.setsid()   # killed with it, and it shares no CPU turns with the daemon (SESSION_NICE)
    except OSError:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
    # The daemon's listening sockets, client connections, event loop and other workers' pipes
    # are not ours: a copy held open here would keep a client waiting for EOF.  Each is replaced
    # by /dev/null rather than closed, because the Python objects that own those numbers still
    # exist here and may close them when collected: that must not hit a file we opened since.
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep and fd != null:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    sock.setblocking(True)
    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass
    if warmup is not None:
        try:
            warmup()
        except Exception:  # noqa: BLE001 - a warm-up is an optimisation, never a reason to die
            pass
    sock.sendall(_HEADER.pack(0))          # ready
    while True:
        header = _recv_exact(sock, _HEADER.size)
        if header is None:
            return 0
        (n,) = _HEADER.unpack(header)
        if n > MAX_FRAME:
            return 1
        payload = _recv_exact(sock, n)
        if payload is None:
            return 0
        result = target(payload)
        sock.sendall(_HEADER.pack(len(result)) + result)


def raise_session_priority(nice: int = SESSION_NICE) -> str:
    """Give this process's session ``nice`` under autogroup scheduling (see SESSION_NICE), if it
    leads the session: a daemon run from a shell must not change the whole terminal session's
    priority.  Returns what happened, for the log: "set", "not-session-leader", or why not."""
    if os.getsid(0) != os.getpid():
        return "not-session-leader"
    try:
        with open("/proc/self/autogroup", "w") as fh:   # (no such file: no autogroup scheduling)
            fh.write(str(nice))
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "set"


def _renice(w: _Worker, nice: int) -> None:
    if w.nice == nice:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, w.pid, nice)
        w.nice = nice
    except OSError:
        pass    # lowering it needs CAP_SYS_NICE (root's, as a rule): then it stays niced


def _recv_exact(sock: socket.socket, n: int) -> Optional[bytes]:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return None
        got += k
    return bytes(buf)
