"""Steady-state iteration times from a training job's own output.

The formats read (one example line each; the numbers are what is taken):

- **Megatron-LM / Megatron-DeepSpeed** (``training_log``; the time averages the ``log_interval``
  iterations since the previous line)::

    [2024-05-01 12:00:00] iteration      200/    5000 | consumed samples: 102400 | elapsed time per iteration (ms): 1234.5 | learning rate: 3.0E-04 |

- **GPT-NeoX** (its own ``training_log``: the same interval average, after ``samples/sec``)::

     samples/sec: 51.234 | iteration      200/    5000 | elapsed time per iteration (ms): 1249.1 | learning rate: 1.6E-04 |

- **NeMo** (``train_step_timing`` as PyTorch Lightning's progress bar prints it, NeMo 1.x, or as
  NeMo 2.x's progress printer does)::

    Epoch 0: : 12%|#2 | 120/1000 [02:03<15:02, v_num=0, reduced_train_loss=5.430, global_step=119.0, train_step_timing in s=1.020]
    Training epoch 0, iteration 45/99 | lr: 6.9e-06 | global_step: 45 | reduced_train_loss: 11.96 | train_step_timing in s: 6.08

- **DeepSpeed pipeline engine** (``train_batch``, every ``steps_per_print`` steps: the mean since
  the previous line)::

    steps: 200 loss: 2.3456 iter time (s): 1.234 samples/sec: 51.860

- **DeepSpeed timers** (``wall_clock_breakdown``; ``SynchronizedWallClockTimer.log``).  A
  ``train_batch`` timer is a whole step; otherwise the step is forward + backward + optimizer step
  of the global (not ``*_microstep``) timers -- the sum DeepSpeed's own autotuner takes::

    [INFO] [logging.py:96:log_dist] [Rank 0] time (ms) | fwd: 412.34 | bwd: 801.20 | bwd_inner: 790.11 | bwd_allreduce: 10.50 | step: 30.12
    [Rank 0] time (ms) | forward: 411.0 | backward: 800.9 | backward_inner: 789.0 | backward_allreduce: 11.2 | step: 29.7

  These exclude data loading and anything between steps, so they are used only when a log has
  none of the formats above.

Steady state: samples are split into segments where the iteration number goes backwards or jumps
(a job that restarted from a checkpoint into the same file); in each segment the first sample (its window
holds the segment's first iteration: CUDA context, NCCL communicators, allocator growth, kernel
autotuning) and every sample within the first :data:`WARMUP_ITERATIONS` iterations are dropped.
The answer is the median of the rest, which also ignores the odd interval stretched by an
evaluation or a checkpoint save.

A job whose speed changes (a second phase with longer sequences, a slower node, a filling file
system) is not described by its whole-run median alone: :meth:`IterationTimes.recent` is the
median of the last :func:`recent_window` steady samples (5 to 50: a tenth of them), which follows
such a change once more than half the window has seen it, and still ignores a lone slow interval.

Hostile or garbled text never raises: every line is bounded, every number checked (finite, in a
physical range, not a truncated digit run), and anything else skipped.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

# The repository's own training-step measurements drop 2 warm-up steps
# (benchmarks/bench_train_family.py --warmup 2, what produced benchmarks/data/h100-lent).
WARMUP_ITERATIONS = 2
# Longest line a reader looks at.  The longest real line above is a DeepSpeed timer line with every
# timer (~1 KiB); NeMo 2's line is ~400 characters.  16x headroom; longer lines are not these.
MAX_LINE = 16 * 1024
# A jump of the iteration number by more than this many logging intervals is another run writing
# into the same file (a job resumed from a later checkpoint): its first samples are warm-up again.
_GAP_WIDTHS = 4
# The recent window (IterationTimes.recent): a tenth of the steady samples, at least 5 (a median
# that one evaluation or checkpoint interval cannot move) and at most 50 (a long run's window still
# follows a change within 26 samples).
RECENT_MIN_SAMPLES = 5
RECENT_MAX_SAMPLES = 50
# Physical range of one iteration: no step is shorter than a kernel launch (~10 us,
# launch_seconds of the dgx-h100 platform's [host] table), and a runs file accepts < 1e7 s
# (predictor.validation).
MIN_ITERATION_SECONDS = 1e-5
MAX_ITERATION_SECONDS = 1e7

# A decimal number of bounded length, not followed by more digits (a truncated digit run is refused
# rather than read as a smaller number).
_NUM = r"([-+]?(?:\d{1,15}(?:\.\d{0,15})?|\.\d{1,15})(?:[eE][-+]?\d{1,3})?)(?![\d.])"
_MEGATRON = re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM)
_ITERATION = re.compile(r"\biteration\s+(\d{1,12})\s*/\s*(\d{1,12})")
_NEMO = re.compile(r"train_step_timing in s\s*[=:]\s*" + _NUM)
_NEMO_STEP = re.compile(r"\bglobal_step\s*[=:]\s*(\d{1,12})(?:\.0+)?(?![\d.])")
_PIPE = re.compile(r"\biter time \(s\):\s*" + _NUM)
_PIPE_STEP = re.compile(r"\bsteps?:\s*(\d{1,12})\b")
_TIMERS = re.compile(r"\btime \(ms\)((?:\s*\|\s*[A-Za-z_][\w\- ]{0,63}:\s*[-+0-9.eE]{1,40})+)")
_TIMER_PAIR = re.compile(r"\|\s*([A-Za-z_][\w\- ]{0,63}):\s*" + _NUM)
# DeepSpeed's global timer names, new (fwd/bwd) and old (forward/backward); the optimizer step is
# 'step' in DeepSpeed's engine, 'optimizer' in Megatron-style timers (GPT-NeoX).  One name per
# phase, the first present, so that a sub-timer (ZeRO's optimizer_step inside 'step') is never
# added to its parent.
_PHASES = (("fwd", "forward"), ("bwd", "backward"), ("step", "optimizer", "optimizer_step"))


@dataclass(frozen=True)
class Sample:
    seconds: float                   # per iteration
    iteration: Optional[int] = None  # the iteration number the line reports, when it has one
    planned: Optional[int] = None    # the run's planned iterations (``iteration 200/5000``), if said


@dataclass(frozen=True)
class IterationTimes:
    """What a log says about its iterations: the format, every sample, and the steady-state median."""

    format: str                      # megatron | gpt-neox | nemo | deepspeed-pipe | deepspeed-timers
    samples: tuple[Sample, ...]
    steady: tuple[float, ...]
    note: str = ""
    steady_samples: tuple[Sample, ...] = ()    # the samples behind ``steady`` (with their iterations)

    @property
    def median_seconds(self) -> Optional[float]:
        return statistics.median(self.steady) if self.steady else None

    @property
    def last_iteration(self) -> Optional[int]:
        """The iteration number of the last numbered sample (where the job was when it logged)."""
        return next((s.iteration for s in reversed(self.samples) if s.iteration is not None), None)

    @property
    def planned_iterations(self) -> Optional[int]:
        """The planned total the last line that says one gives (Megatron, GPT-NeoX, NeMo 2)."""
        return next((s.planned for s in reversed(self.samples) if s.planned is not None), None)

    def recent(self) -> Optional["RecentRate"]:
        """The median of the last :func:`recent_window` steady samples and the iterations they span
        (None when the window's samples are not all numbered); None without steady samples."""
        if not self.steady:
            return None
        window = list(self.steady_samples[-recent_window(len(self.steady_samples)):]) \
            if self.steady_samples else []
        seconds = [s.seconds for s in window] if window else \
            list(self.steady[-recent_window(len(self.steady)):])
        span: Optional[int] = None
        its = [s.iteration for s in window]
        if window and all(i is not None for i in its):
            gaps = [b - a for a, b in zip(its, its[1:]) if b > a]
            width = min(gaps) if gaps else 1
            span = max(its) - min(its) + width
        return RecentRate(statistics.median(seconds), len(seconds), span)

    @property
    def iterations_spanned(self) -> Optional[int]:
        """Iterations between the first and the last numbered sample (a lower bound of those run)."""
        its = [s.iteration for s in self.samples if s.iteration is not None]
        if len(its) < 2:
            return None
        return max(its) - min(its)


@dataclass(frozen=True)
class RecentRate:
    """The median time per iteration of a log's last steady samples (see :meth:`IterationTimes.recent`)."""

    seconds: float
    samples: int
    iterations_spanned: Optional[int] = None   # the iterations those samples cover (None: unknown)


def recent_window(n: int) -> int:
    """How many of ``n`` steady samples the recent median takes: a tenth, 5 to 50 (all when fewer)."""
    return min(n, max(RECENT_MIN_SAMPLES, min(RECENT_MAX_SAMPLES, n // 10)))


def _number(text: str, scale: float = 1.0) -> Optional[float]:
    """A checked number of seconds (``scale`` converts from the log's unit), or None."""
    try:
        v = float(text) * scale
    except (ValueError, OverflowError):
        return None
    if not math.isfinite(v) or not MIN_ITERATION_SECONDS <= v <= MAX_ITERATION_SECONDS:
        return None
    return v


def _megatron(line: str) -> Optional[tuple[str, Sample]]:
    m = _MEGATRON.search(line)
    if not m:
        return None
    v = _number(m.group(1), 1e-3)
    if v is None:
        return None
    it = _ITERATION.search(line)
    fmt = "gpt-neox" if "samples/sec:" in line[:m.start()] else "megatron"
    return fmt, Sample(v, int(it.group(1)) if it else None, int(it.group(2)) if it else None)


def _nemo(line: str) -> Optional[tuple[str, Sample]]:
    m = _NEMO.search(line)
    if not m:
        return None
    v = _number(m.group(1))
    if v is None:
        return None
    # NeMo 2's line says the iteration; Lightning's bar says global_step (0-based, the step done).
    it = _ITERATION.search(line)
    if it:
        return "nemo", Sample(v, int(it.group(1)), int(it.group(2)))
    step = _NEMO_STEP.search(line)
    return "nemo", Sample(v, int(step.group(1)) if step else None)


def _pipe(line: str) -> Optional[tuple[str, Sample]]:
    m = _PIPE.search(line)
    if not m:
        return None
    v = _number(m.group(1))
    if v is None:
        return None
    it = _PIPE_STEP.search(line[:m.start()])
    return "deepspeed-pipe", Sample(v, int(it.group(1)) if it else None)


def _timers(line: str) -> Optional[tuple[str, Sample]]:
    m = _TIMERS.search(line)
    if not m:
        return None
    values: dict[str, float] = {}
    for name, num in _TIMER_PAIR.findall(m.group(1)):
        name = name.strip()
        try:
            v = float(num)
        except (ValueError, OverflowError):
            return None
        if not math.isfinite(v) or v < 0:
            return None
        values.setdefault(name, v)
    if "train_batch" in values:
        v = _number(str(values["train_batch"]), 1e-3)
        return ("deepspeed-timers", Sample(v)) if v is not None else None
    total = 0.0
    for names in _PHASES:
        hit = next((values[n] for n in names if n in values), None)
        if hit is None:
            return None         # a micro-step line, or another timer group: not a whole step
        total += hit
    v = _number(repr(total), 1e-3)
    return ("deepspeed-timers", Sample(v)) if v is not None else None


# In order of preference: a framework's own per-iteration figure first, timer sums last.
_READERS: tuple[tuple[str, Callable[[str], Optional[tuple[str, Sample]]]], ...] = (
    ("megatron", _megatron), ("nemo", _nemo), ("deepspeed-pipe", _pipe), ("deepspeed-timers", _timers))
_NEEDLES = {"megatron": "elapsed time per iteration", "nemo": "train_step_timing",
            "deepspeed-pipe": "iter time (s)", "deepspeed-timers": "time (ms)"}


def _lines(text: str) -> list[str]:
    # Progress bars rewrite their line with \r; every rewrite is a line of its own here.
    return [l for l in re.split(r"[\r\n]", text) if l and len(l) <= MAX_LINE]


def read_samples(text: str) -> dict[str, list[Sample]]:
    """Every sample of every format found, per format (in log order)."""
    found: dict[str, list[Sample]] = {}
    present = [(name, fn) for name, fn in _READERS if _NEEDLES[name] in text]
    if not present:
        return found
    for line in _lines(text):
        for name, fn in present:
            if _NEEDLES[name] not in line:
                continue
            try:
                hit = fn(line)
            except (ValueError, OverflowError, IndexError):   # defensive: a reader never raises out
                hit = None
            if hit is not None:
                fmt, sample = hit
                found.setdefault(fmt, []).append(sample)
                break
    return found


def steady_state(samples: Sequence[Sample], warmup_iterations: int = WARMUP_ITERATIONS) -> list[float]:
    """The samples after warm-up (see the module docstring), in order."""
    return [s.seconds for s in steady_samples(samples, warmup_iterations)]


def steady_samples(samples: Sequence[Sample], warmup_iterations: int = WARMUP_ITERATIONS) -> list[Sample]:
    """:func:`steady_state`'s samples themselves (with their iteration numbers)."""
    out: list[Sample] = []
    segment: list[Sample] = []

    def close(seg: list[Sample]) -> None:
        if not seg:
            return
        numbered = [s.iteration for s in seg if s.iteration is not None]
        if len(numbered) == len(seg) and len(seg) >= 2:
            # The segment started one logging interval before its first sample.
            width = max(1, seg[1].iteration - seg[0].iteration)
            base = seg[0].iteration - width
            keep = [s for s in seg[1:] if s.iteration - base > warmup_iterations]
        else:
            keep = list(seg[max(1, warmup_iterations):])
        out.extend(keep)

    last: Optional[int] = None
    width: Optional[int] = None
    for s in samples:
        if s.iteration is not None and last is not None and (
                s.iteration < last or (width is not None and s.iteration - last > _GAP_WIDTHS * width)):
            close(segment)
            segment, width = [], None
        if s.iteration is not None and last is not None and s.iteration == last and segment:
            # The same iteration printed again (another rank, a progress-bar refresh): keep the latest.
            segment[-1] = s
            continue
        if s.iteration is not None and last is not None and segment and segment[-1].iteration is not None:
            width = width or s.iteration - segment[-1].iteration
        segment.append(s)
        if s.iteration is not None:
            last = s.iteration
    close(segment)
    return out


def iteration_times(data: Union[bytes, str]) -> Optional[IterationTimes]:
    """The best-preferred format found in ``data`` with its steady-state samples; None if no format."""
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else str(data)
    found = read_samples(text)
    if not found:
        return None
    order = ("megatron", "gpt-neox", "nemo", "deepspeed-pipe", "deepspeed-timers")
    best: Optional[IterationTimes] = None
    for fmt in order:
        samples = found.get(fmt)
        if not samples:
            continue
        kept = steady_samples(samples)
        steady = [s.seconds for s in kept]
        res = IterationTimes(fmt, tuple(samples), tuple(steady),
                             "" if steady else f"{len(samples)} {fmt} samples, none after warm-up", tuple(kept))
        if steady:
            return res
        best = best or res
    return best


def best_log(timings: Sequence[Optional[IterationTimes]]) -> Optional[int]:
    """Which of several files of one job (its StdOut, its StdErr) says the most about its
    iterations: the index of the one with steady samples and an iteration number, else steady
    samples, then the furthest iteration, then the most samples (the first on a tie); None when
    none has a line of any format."""
    best: Optional[int] = None
    best_key: Optional[tuple] = None
    for i, t in enumerate(timings):
        if t is None:
            continue
        key = (t.median_seconds is not None and t.last_iteration is not None, t.median_seconds is not None,
               t.last_iteration if t.last_iteration is not None else -1, len(t.steady), len(t.samples))
        if best_key is None or key > best_key:
            best, best_key = i, key
    return best


__all__ = ["IterationTimes", "RecentRate", "Sample", "WARMUP_ITERATIONS", "best_log", "iteration_times",
           "read_samples", "recent_window", "steady_samples", "steady_state"]
