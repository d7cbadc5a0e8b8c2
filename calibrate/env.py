"""The measuring environment: what device, which software, where, and its roofline figures.

Everything here ends up in ``samples.toml`` so that a sample store says where it came from, and so
that a store from another GPU type or software stack can be refused on resume.  torch is imported
inside the functions: this module is also read by torch-free commands (``status``).
"""
from __future__ import annotations

import contextlib
import logging
import os
import platform as _platform
import re
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Mapping

log = logging.getLogger(__name__)

# Version of the *measurement method* (kernels, timing statistic, shape derivation).  A store
# written by another method version is refused on resume: mixing the two would bias the regressors.
METHOD_VERSION = 1

# Published dense peaks of common training GPUs (TFLOP/s per precision, HBM GB/s): the roofline
# normaliser only, so the exact figure matters little; unknown GPUs are probed instead.
KNOWN_GPUS: dict[str, tuple[float, dict[str, float], float]] = {
    # fp32 = the TF32 tensor-core peak where the GPU has one (what torch's fp32 GEMMs may use),
    # as in the shipped platforms (scripts/build_platforms.py).  fp8: the dense FP8 tensor-core
    # peak where the GPU has FP8 tensor cores (a job's run.fp8 needs it; predictor.fp8).
    "a100": (80.0, {"fp16": 312.0, "bf16": 312.0, "fp32": 156.0}, 2039.0),
    "h100": (80.0, {"fp16": 989.0, "bf16": 989.0, "fp32": 494.0, "fp8": 1979.0}, 3350.0),
    "h200": (141.0, {"fp16": 989.0, "bf16": 989.0, "fp32": 494.0, "fp8": 1979.0}, 4800.0),
    "gh200": (96.0, {"fp16": 989.0, "bf16": 989.0, "fp32": 494.0, "fp8": 1979.0}, 4000.0),
    "v100": (32.0, {"fp16": 125.0, "bf16": 125.0, "fp32": 15.7}, 900.0),
    "a40": (48.0, {"fp16": 150.0, "bf16": 150.0, "fp32": 74.8}, 696.0),
    "l40s": (48.0, {"fp16": 362.0, "bf16": 362.0, "fp32": 183.0, "fp8": 733.0}, 864.0),
    "mi250x": (128.0, {"fp16": 383.0, "bf16": 383.0, "fp32": 47.9}, 3277.0),
}


@dataclass
class DeviceSpec:
    """Name and roofline figures of the measuring device (becomes the predictor's GpuSpec)."""

    name: str
    device: str                         # "cuda" | "cpu"
    memory_gib: float
    tflops: dict[str, float]
    memory_gbps: float
    source: str = "probe"               # "published" | "probe"

    def to_gpu_spec(self):  # -> predictor.operators.GpuSpec
        from predictor.operators import GpuSpec
        return GpuSpec(self.name, self.memory_gib, dict(self.tflops), self.memory_gbps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DeviceSpec":
        return cls(name=str(d["name"]), device=str(d["device"]), memory_gib=float(d["memory_gib"]),
                   tflops={k: float(v) for k, v in dict(d["tflops"]).items()},
                   memory_gbps=float(d["memory_gbps"]), source=str(d.get("source", "probe")))


@dataclass
class Environment:
    """Where and with what the samples were measured (the [environment] table of samples.toml)."""

    device: str
    gpu_name: str
    driver: str = ""
    torch: str = ""
    cuda: str = ""
    nccl: str = ""
    host: str = ""
    slurm_job_id: str = ""
    cpu_threads: int = 0
    python: str = ""
    started: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d.update(self.extra)
        return d


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (_platform.processor() or _platform.machine() or "unknown")


def collect_environment(device: str, cpu_threads: int = 0) -> Environment:
    """Record GPU name, driver, torch / CUDA / NCCL versions, host and Slurm job of this process."""
    import torch

    env = Environment(device=device, gpu_name="", torch=torch.__version__,
                      host=socket.gethostname(),
                      slurm_job_id=os.environ.get("SLURM_JOB_ID", ""),
                      cpu_threads=cpu_threads or torch.get_num_threads(),
                      python=_platform.python_version(),
                      started=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if device == "cuda":
        env.gpu_name = torch.cuda.get_device_name(0)
        env.cuda = torch.version.cuda or ""
        try:
            env.nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - NCCL absent from some builds; not fatal for recording
            env.nccl = ""
        env.driver = _nvidia_driver()
    else:
        env.gpu_name = cpu_name()
    return env


def _nvidia_driver() -> str:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            first = fh.readline()
        for tok in first.split():
            if tok[:1].isdigit() and "." in tok:
                return tok
    except OSError:
        pass
    return ""


def gpu_key(gpu_name: str) -> str | None:
    """The ``KNOWN_GPUS`` key a GPU name spells, else None (case does not matter).

    A word of the name (split at spaces, hyphens, underscores …) must be the key, or the key
    followed by letters only (a variant: V100S, H100NVL); or the whole name without separators
    must be it ("H 100").  So "NVIDIA H100 80GB HBM3", "a100-sxm4-80gb" and "GH200" are known,
    while a substring is not enough: "NVIDIA RTX A1000" is no A100 and "h1000" no H100 (their
    figures would be an A100's or H100's, several times too high).  ``plan --gpu`` and
    ``schedule`` resolve names by it too (``calibrate.plans.known_gpu``).
    """
    low = gpu_name.strip().lower()
    words = [w for w in re.split(r"[^a-z0-9]+", low) if w] + [re.sub(r"[^a-z0-9]+", "", low)]
    # Longest keys first: "gh200" must win over "h200".
    for key in sorted(KNOWN_GPUS, key=len, reverse=True):
        if any(w == key or (w.startswith(key) and w[len(key):].isalpha()) for w in words):
            return key
    return None


def published_spec(gpu_name: str) -> DeviceSpec | None:
    """The published figures of a known GPU (``gpu_key``: a word of its name), else None."""
    key = gpu_key(gpu_name)
    if key is None:
        return None
    mem, tf, bw = KNOWN_GPUS[key]
    return DeviceSpec(gpu_name, "cuda", mem, dict(tf), bw, source="published")


def probe_spec(device: str, precisions: tuple[str, ...]) -> DeviceSpec:
    """Measure a device's GEMM peak per precision and its copy bandwidth (a few seconds).

    On CPU this is the only source of roofline figures; on an unknown GPU it stands in for the
    data sheet.  The figures only normalise the regressors' target, so a rough probe is enough.
    """
    import torch

    from .timing import measure

    dev = torch.device(device)
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        mem = torch.cuda.get_device_properties(0).total_memory / 2**30
        n, elems = 8192, 1 << 28
    else:
        name = cpu_name()
        mem = _host_memory_gib()
        n, elems = 768, 1 << 24
    tflops: dict[str, float] = {}
    one = torch.ones((), device=dev)
    for p in precisions:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
                 "fp8": torch.float8_e4m3fn}[p]
        a = torch.randn(n, n, device=dev).to(dtype)
        b = torch.randn(n, n, device=dev).to(dtype)
        if p == "fp8":     # per-tensor scaled, second operand column-major (calibrate.kernels)
            t = measure(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                        device, warmup=1, repeats=3)
        else:
            t = measure(lambda: torch.mm(a, b), device, warmup=1, repeats=3)
        tflops[p] = max(2.0 * n**3 / t.seconds / 1e12, 1e-6)
    src = torch.empty(elems, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device, warmup=1, repeats=5)
    gbps = 2.0 * elems * 4 / t.seconds / 1e9
    # Four significant figures, not decimals: a slow CPU's emulated FP8 GEMM (~1e-4 TFLOP/s, less
    # under load) would otherwise round to a peak of 0, and every roofline would divide by it.
    return DeviceSpec(name, device, round(mem, 2), {k: float(f"{v:.4g}") for k, v in tflops.items()},
                      float(f"{gbps:.4g}"), source="probe")


def device_spec(device: str, precisions: tuple[str, ...]) -> DeviceSpec:
    """Published figures for a known GPU, a probe otherwise (always a probe on CPU)."""
    if device == "cuda":
        import torch
        spec = published_spec(torch.cuda.get_device_name(0))
        if spec is not None and all(p in spec.tflops for p in precisions):
            return spec
    return probe_spec(device, precisions)


# ------------------------------------------------------------------ worker processes and signals
# Ctrl-C reaches every process of the terminal's foreground group, and Slurm signals every process
# of a job step: the spawned workers get the signal their parent gets.  Handling it is the
# parent's business (it stops the workers and keeps what was measured); a worker that raised
# KeyboardInterrupt would only print its traceback, often from inside torch's import.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held(signals: tuple[int, ...] = _STOP_SIGNALS) -> Iterator[None]:
    """Hold ``signals`` for the body: one that arrives is delivered (its handler run, its
    exception raised) once the body is done, unless the body ends in an exception (the process
    is stopping anyway).  Handlers, not the signal mask: Python runs them in the main thread
    whichever thread the kernel picks, and torch's threads do not block anything.  Only the main
    thread sets handlers: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, lambda signum, frame: held.append(signum))
    stopping = False
    try:
        yield
    except BaseException:
        stopping = True
        raise
    finally:
        for sig, handler in previous.items():
            # None: a handler not set from Python, which Python cannot put back; the default.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if held and not stopping:
            signal.raise_signal(held[0])     # its own handler now: KeyboardInterrupt, or the default


@contextlib.contextmanager
def signals_default(signals: tuple[int, ...] = (signal.SIGTERM,)) -> Iterator[None]:
    """The default action (the process ends) for ``signals`` during the body: for waits inside
    C++ (a process group's rendezvous, a collective, a barrier), where a Python handler runs only
    once the wait is over (hours for a rank waiting for rank 0's operators), so that SIGTERM
    would wait for Slurm's SIGKILL.  Only the main thread sets handlers: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = [(sig, signal.signal(sig, signal.SIG_DFL)) for sig in signals]
    try:
        yield
    finally:
        for sig, handler in previous:
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def spawning_workers() -> Iterator[None]:
    """Around starting spawned workers: they start with SIGINT and SIGTERM blocked, so that
    nothing interrupts them before ``quiet_worker_signals`` (a signal mask survives fork and
    exec; handlers do not).  A signal for this process meanwhile is held (``signals_held``): the
    start is never cut short with workers running that the caller does not know of."""
    from multiprocessing import resource_tracker
    # Started inside the body, the resource tracker would unblock both signals again (the
    # standard library blocks them around its own launch and unblocks them after).
    resource_tracker.ensure_running()
    with signals_held():
        blocking = hasattr(signal, "pthread_sigmask")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if blocking else None
        try:
            yield
        finally:
            if blocking:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)


def quiet_worker_signals(parent_pid: int | None = None,
                         signals: tuple[int, ...] = (signal.SIGINT,)) -> None:
    """In a spawned worker: leave ``signals`` to the parent, which stops its workers itself.

    While the parent lives, the signal is ignored.  Once it is gone (torch's workers get SIGINT
    when their parent dies, PR_SET_PDEATHSIG), the worker exits at once, quietly: nobody reads
    what it would measure.  ``parent_pid``: the parent's pid as the parent saw it (a parent that
    died before this call leaves the worker with another one); default the current parent.
    """
    parent = os.getppid() if parent_pid is None else parent_pid

    def on_signal(signum: int, frame: object) -> None:
        if os.getppid() != parent:
            os._exit(128 + signum)

    for sig in signals:
        signal.signal(sig, on_signal)
    if os.getppid() != parent:
        os._exit(128 + signals[0])
    if hasattr(signal, "pthread_sigmask"):
        # Blocked by spawning_workers(); a signal that arrived during start-up meets the handler.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 8.0
