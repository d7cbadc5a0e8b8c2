"""The lent GPU's stack measurements (``benchmarks/bench_gpu_stacks.py``'s rows) as runs.

Each row's ``job`` is the calibration loop's job; a stack's run is predicted as the job its launch
would reveal (:data:`STACK_JOB`):

* ``pytorch``: the calibration's own loop (ZeRO-1 by hand): no framework named;
* ``sdpa_efficient``: the same loop with SDPA pinned to its memory-efficient kernel:
  ``model.attention_impl = "sdpa_efficient"``;
* ``fsdp``: FSDP2 per layer, fp32 parameters, bf16 compute: what TorchTitan runs:
  ``run.framework = "torchtitan"``, ``layout.zero_stage = 3`` (``reshard_after_forward`` and the
  gradient reduction precision at TorchTitan's defaults, as the stack ran them);
* ``fsdp1``: FSDP1 per layer (Composer's ``FullyShardedDataParallel``, ``FULL_SHARD``, PURE mixed
  precision: bf16 compute and reduction over fp32 parameters): what llm-foundry runs:
  ``run.framework = "llm-foundry"``, ``layout.zero_stage = 3``, ``run.grad_reduce_precision = "bf16"``;
* ``ddp``: a one-rank DDP module with fused AdamW: a plain PyTorch launch names no framework and
  replicates the optimizer state, so ``layout.zero_stage = 0``.  Its kind (predictor/kinds.py:
  framework, attention, precision, recompute) is the same as ``pytorch``'s: nothing a launch shows
  tells a DDP script from a hand-written loop.

A flash-attention job runs whichever kernel SDPA picked: the row's ``sdpa_backend`` where the call
pinned one (``bench_gpu_stacks.py --sdpa-backend``), else the file's ``provenance.sdpa_default``
(torch's own choice), else :data:`KNOWN_SDPA_DEFAULT` for files that predate that key.  The run
names that kernel (``model.attention_impl``) where the stack's launch would not: where it differs
from the framework's default kernel, and, for the stacks that name no framework, where the call
pinned it (unpinned, they ran SDPA's choice, which is what a bundle's ``flash_atten`` samples time).
A pinned run's name ends with its kernel (``... flash sdpa_flash``).

A row whose job sets ``layout.recompute`` (``bench_gpu_stacks.py --stacks fsdp+selective``) keeps
it, and its run is named ``"<stack>+<recompute> <job name>"``; other runs ``"<stack> <job name>"``.
A job measured more than once keeps its fastest step time (a later call ran after larger jobs had
left memory behind, which only adds time); the source line gives every measurement.  Rows
with an ``error`` (out of memory) are left out.  No torch.
"""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from predictor.attention import SAME_KERNEL, default_impl, is_hopper_or_newer

from .env import published_spec
from .errors import CalibrationError

# What the launch of each stack reveals, as (section, key) -> value over the row's job.
STACK_JOB: dict[str, dict[tuple[str, str], Any]] = {
    "pytorch": {},
    "sdpa_efficient": {("model", "attention_impl"): "sdpa_efficient"},
    "fsdp": {("run", "framework"): "torchtitan", ("layout", "zero_stage"): 3},
    "fsdp1": {("run", "framework"): "llm-foundry", ("layout", "zero_stage"): 3,
              ("run", "grad_reduce_precision"): "bf16"},
    "ddp": {("layout", "zero_stage"): 0},
    # The CPU family's third stack (calibrate/cpu_family.py): DeepSpeed's engine at ZeRO-1, and
    # at ZeRO-2 (its gradients reduced after every micro-batch: recipe.reduces_every_micro_batch).
    "deepspeed": {("run", "framework"): "deepspeed", ("layout", "zero_stage"): 1},
    "deepspeed_zero2": {("run", "framework"): "deepspeed", ("layout", "zero_stage"): 2},
}
STACKS = tuple(STACK_JOB)

#: SDPA's own choice of kernel for the files whose provenance predates ``sdpa_default``, by (GPU,
#: torch): the lent H100's attention survey recorded it (stacks/attention.json, 2026-11-26 01:37)
#: and the later files of the same software confirm it (their ``provenance.sdpa_default``).
KNOWN_SDPA_DEFAULT = {("NVIDIA H100 80GB HBM3", "2.11.0+cu130"): "cudnn"}
# The stacks that name no framework: their unpinned flash jobs run what a bundle's samples time.
_NO_FRAMEWORK = ("pytorch", "ddp")


class StackRowError(CalibrationError):
    """A row of a stacks file that cannot become a run (names the file and row)."""


def stack_job(job: dict, stack: str) -> dict:
    """``job`` (the calibration loop's job dict) as the launch of ``stack`` would reveal it."""
    if stack not in STACK_JOB:
        raise StackRowError(f"stack {stack!r}: not one of {', '.join(STACKS)}")
    out = copy.deepcopy(job)
    for (section, key), value in STACK_JOB[stack].items():
        out.setdefault(section, {})[key] = value
    return out


def row_label(row: dict) -> str:
    """A row's stack as runs name it: ``"fsdp"``, or ``"fsdp+selective"`` where its job sets
    ``layout.recompute``, and ``"fsdp+full:norng"`` where its checkpoint kept no RNG state
    (TorchTitan's).  Raises :class:`StackRowError` for a job or layout that is not a table."""
    job = row.get("job", {})
    layout = job.get("layout", {}) if isinstance(job, dict) else None
    if not isinstance(layout, dict):
        raise StackRowError(f"row {row.get('name', '?')!r}: job and job.layout must be tables")
    recompute = layout.get("recompute", "none")
    if recompute == "none":
        return row["stack"]
    return f"{row['stack']}+{recompute}" + (":norng" if row.get("preserve_rng_state") is False else "")


def split_label(label: str) -> tuple[str, str, bool]:
    """:func:`row_label`'s inverse: ``"fsdp+full:norng"`` -> ``("fsdp", "full", False)`` (stack,
    recompute or "", whether the checkpoint keeps the RNG state).  Raises :class:`StackRowError`
    for a suffix other than ``:norng`` after ``+full``."""
    stack, _, recompute = label.partition("+")
    recompute, _, rng = recompute.partition(":")
    if ":" in stack or (rng and (rng != "norng" or recompute != "full")):
        raise StackRowError(f"{label!r}: the only suffix is :norng, after +full")
    return stack, recompute, not rng


def attention_ran(row: dict, provenance: dict) -> tuple[str, bool]:
    """The kernel a row's flash-attention job ran and whether the call pinned it ("" where the row
    is not a flash-attention job on a GPU).  Raises :class:`StackRowError` where nobody recorded it."""
    model = row["job"].get("model", {}) if isinstance(row["job"], dict) else {}
    if not isinstance(model, dict) or model.get("attention") != "flash" or "attention_impl" in model:
        return "", False
    pinned = row.get("sdpa_backend")
    if isinstance(pinned, str) and pinned:
        return pinned, True
    if provenance.get("device") != "cuda":
        return "", False
    chosen = provenance.get("sdpa_default") or KNOWN_SDPA_DEFAULT.get(
        (provenance.get("gpu"), provenance.get("torch")))
    if not chosen:
        raise StackRowError(f"row {row.get('name', '?')!r}: a GPU file without provenance.sdpa_default "
                            f"({provenance.get('gpu')!r}, torch {provenance.get('torch')!r}): which "
                            "attention kernel SDPA ran is not recorded")
    return chosen, False


def _named_kernel(stack: str, job: dict, kernel: str, pinned: bool, provenance: dict) -> str:
    """The ``model.attention_impl`` the run states ("" = the launch's default is what ran)."""
    if not kernel:
        return ""
    if stack in _NO_FRAMEWORK:
        return kernel if pinned else ""
    framework = stack_job(job, stack).get("run", {}).get("framework", "")
    spec = published_spec(str(provenance.get("gpu", "")))
    default = default_impl(framework, hopper=spec is not None and is_hopper_or_newer(spec.tflops))
    return "" if SAME_KERNEL.get(kernel, kernel) == SAME_KERNEL.get(default, default) else kernel


def _provenance_note(raw: dict, file: str) -> str:
    prov = raw.get("provenance") or {}
    return (f"robust step time of {raw.get('steps', '?')} steps after {raw.get('warmup', '?')} warm-ups, "
            f"{prov.get('gpu', '?')}, torch {prov.get('torch', '?')}, CUDA {prov.get('cuda', '?')}, "
            f"NCCL {prov.get('nccl', '?')}, {prov.get('date', '?')} ({file})")


def runs_from_files(files: Iterable[Path], stacks: Sequence[str] = STACKS) -> list[dict]:
    """One ``[[run]]`` dict per (stack, job) that ran without error, in first-seen order."""
    for s in stacks:
        if s not in STACK_JOB:
            raise StackRowError(f"stack {s!r}: not one of {', '.join(STACKS)}")
    seen: dict[tuple[str, str], list[tuple[float, str, dict]]] = {}
    for path in files:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StackRowError(f"{path}: cannot read: {exc}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("rows"), list):
            raise StackRowError(f"{path}: no \"rows\" list")
        note = _provenance_note(raw, path.name)
        provenance = raw.get("provenance") if isinstance(raw.get("provenance"), dict) else {}
        for i, row in enumerate(raw["rows"]):
            where = f"{path}: rows[{i}]"
            if not isinstance(row, dict) or not {"stack", "name", "job"} <= set(row):
                raise StackRowError(f"{where}: needs stack, name and job")
            if row["stack"] not in stacks or row.get("error"):
                continue
            secs = row.get("measured_iteration_seconds")
            if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not secs > 0:
                raise StackRowError(f"{where}: measured_iteration_seconds must be > 0, got {secs!r}")
            try:
                label = row_label(row)
                kernel, pinned = attention_ran(row, provenance)
            except StackRowError as exc:
                raise StackRowError(f"{where}: {exc}") from None
            job = row["job"]
            impl = _named_kernel(row["stack"], job, kernel, pinned, provenance)
            if impl:
                job = {**job, "model": {**job["model"], "attention_impl": impl}}
            name = f"{row['name']} {kernel}" if pinned else row["name"]
            seen.setdefault((label, name), []).append((float(secs), note, job))
    runs = []
    for (label, name), meas in seen.items():
        stack = label.split("+", 1)[0]
        best = min(meas, key=lambda m: m[0])
        calls = " / ".join(f"{1e3 * s:.1f} ms" for s, _, _ in meas)
        source = (f"benchmarks/bench_gpu_stacks.py, stack {label}, "
                  + (f"fastest of {len(meas)} measurements ({calls}; a later one ran after larger "
                     "jobs, which only adds time), " if len(meas) > 1 else "")
                  + best[1])
        runs.append({"name": f"{label} {name}", "source": source, "measured_iteration_seconds": best[0],
                     "job": stack_job(best[2], stack)})
    return runs


#: Which jobs a runs file holds, for its header (the family's, unless a caller says otherwise).
FAMILY_RUNS = "of the 33-job family"


def to_toml(runs: list[dict], what: str = FAMILY_RUNS) -> str:
    """``runs`` as a runs file; ``what``: which jobs, for its header."""
    from predictor.samples import dump_toml

    return (f"# Real training steps on one lent H100 {what} under several software stacks\n"
            "# (benchmarks/data/h100-lent/stacks/README.md), converted by benchmarks/gpu_stacks_runs.py;\n"
            "# each job is what the stack's launch reveals (perf-calibrate validate --runs reads this)\n"
            + dump_toml({"run": runs}))


@dataclasses.dataclass(frozen=True)
class StepCheck:
    """One run's measured step beside its prediction (no site fit)."""
    name: str
    predicted_seconds: float
    measured_seconds: float
    parameters: int
    #: the measured step lies inside the prediction's interval
    covered: bool

    @property
    def error(self) -> float:
        return self.predicted_seconds / self.measured_seconds - 1


def predicted_against_measured(platform: str, files: Iterable[Path]) -> dict[str, list[StepCheck]]:
    """Each stack's runs of ``files`` predicted on the shipped ``platform`` with its fit dropped,
    grouped by stack label; "fsdp >= 0.75B" (FSDP2's device-bound steps) and "all" are added."""
    from predictor import Predictor, TrainingJob, load_platform
    from predictor.recipe import total_parameters

    predictor = Predictor(dataclasses.replace(load_platform(platform), fitted=None))
    groups: dict[str, list[StepCheck]] = {}
    for run in runs_from_files(files):
        job = TrainingJob.from_dict(run["job"])
        result = predictor.predict(job)
        measured = run["measured_iteration_seconds"]
        low, high = result.interval_seconds
        groups.setdefault(run["name"].split(" ", 1)[0], []).append(StepCheck(
            run["name"], result.iteration_seconds, measured, total_parameters(job.model), low <= measured <= high))
    groups["fsdp >= 0.75B"] = [c for c in groups.get("fsdp", []) if c.parameters >= 7.5e8]
    groups["all"] = [c for stack, checks in groups.items() if stack != "fsdp >= 0.75B" for c in checks]
    return {stack: checks for stack, checks in groups.items() if checks}
