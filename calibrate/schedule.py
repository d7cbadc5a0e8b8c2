"""Scheduling recalibration of a partition: a batch job sized for it, recurring, self-installing.

``perf-calibrate schedule --partition P [--every 30d]`` asks Slurm about P (nodes, GPUs per node,
MaxTime), sizes the calibration job (all GPUs of up to ``--nodes`` nodes, so that intra-node,
inter-node and mixed groups can be measured), estimates its time from the plan's cost, writes the
batch script under ``<root>/P/jobs/`` and submits it with ``sbatch --parsable``.

The script measures into ``<root>/P/staging/current`` (a killed job's successor resumes it),
moves the finished store aside, fits, and calls ``perf-calibrate install`` — which refuses a
worse-validating or incomplete platform, so a failed, killed or bad calibration never replaces the
active one (``set -e`` stops the script at the first failing step; install is the last).

Recurrence: ``--recur begin`` (default) — each job first queues its successor with
``sbatch --begin=now+<every>``, so the chain survives a failed run; ``--recur scrontab`` — a
block in the submitting user's scrontab (cron granularity: daily, weekly or monthly).
"""
from __future__ import annotations

import logging
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from predictor.errors import did_you_mean
from slurm_plugin.policy import slurm_duration

from .env import KNOWN_GPUS, DeviceSpec, gpu_key, published_spec
from .errors import CalibrationError
from .install import check_partition_name, platforms_root
from .plans import Allocation, Cost, _nominal_spec, check_plan, estimate_cost, make_plan, resolve_gpu

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "": 86400}
FIT_MINUTES = 15          # fitting + install after the measurements (regressors on the CPUs)
HOST_FABRIC_MINUTES = 5   # perf-calibrate host and fabric: a few hundred small timed calls each
SAFETY = 1.5              # the estimate is rough; a time-limit kill only costs a resume, but still
MIN_MINUTES = 20
MIN_ADAPTIVE_MINUTES = 5  # a default budget below this much measuring (wall-clock) is not worth a job
MAX_EVERY_S = 366 * 86400  # recalibrating less often than yearly: a typo (99999999w), not a plan


class SlurmLike(Protocol):  # what we need of slurm_plugin.slurm_client.SlurmClient
    def partition(self, name: Optional[str] = None) -> Any: ...
    def submit(self, script: Any, args: Any = (), **kw: Any) -> Any: ...


def parse_every(text: str) -> int:
    """'30d', '12h', '2w', '45m' or a bare number of days → seconds."""
    m = _DURATION.match(text or "")
    if not m:
        raise CalibrationError(f"--every {text!r}: expected a duration like 30d, 12h, 2w")
    seconds_f = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds_f < 3600:
        raise CalibrationError(f"--every {text!r}: recalibrating more than hourly makes no sense")
    if seconds_f > MAX_EVERY_S:
        raise CalibrationError(f"--every {text!r}: at most {MAX_EVERY_S // 86400}d (a yearly recalibration)")
    return int(seconds_f)


@dataclass
class ScheduleRequest:
    partition: str
    every: str | None = None
    recur: str = "begin"                   # begin | scrontab | none
    plan: str = "adaptive"
    budget_gpu_minutes: float = 0.0        # adaptive: 0 = fit the partition's MaxTime
    precisions: tuple[str, ...] = ("fp16",)
    nodes: int = 0                         # 0 = min(partition nodes, 4)
    root: str | None = None
    command: str = ""                      # how compute nodes run perf-calibrate
    account: str = ""
    extra_sbatch: tuple[str, ...] = ()
    tolerance: float = 0.10
    dry_run: bool = False
    gpu: str = ""                          # GPU whose figures size the job ("": the partition's gres type)


@dataclass
class ScheduledJob:
    script_path: Path
    script: str
    nodes: int
    gpus_per_node: int
    time_limit_minutes: int
    cost: Cost
    job_id: int | None = None
    recurrence: str = ""
    notes: list[str] = field(default_factory=list)


# A typed GPU gres: gpu:a100:4 (a node's Gres), gres/gpu:a100=32 (TRES), GRES/gpu:a100=2.0
# (TRESBillingWeights).  An untyped one (gpu:4, gres/gpu=32) names no type.
_GRES_GPU_TYPE = re.compile(r"gpu:([A-Za-z][\w.-]*)[:=]\d")


def _gpu_types(part: Any) -> list[str]:
    """The GPU types a partition's gres names, as spelt there and in order, each once."""
    raw = getattr(part, "raw", {}) or {}
    found: list[str] = []
    for text in (raw.get("Gres", ""), raw.get("TRES", ""), raw.get("TRESBillingWeights", "")):
        for name in _GRES_GPU_TYPE.findall(str(text)):
            if name.lower() not in (f.lower() for f in found):
                found.append(name)
    return found


def _known_names() -> str:
    return ", ".join(sorted(KNOWN_GPUS))


def _requested_gpu(req: ScheduleRequest) -> DeviceSpec | None:
    """``--gpu``'s published figures (None when not given); an unknown name is refused with the
    known ones and a did-you-mean."""
    if not req.gpu:
        return None
    try:
        return resolve_gpu(req.gpu)
    except CalibrationError as exc:
        raise CalibrationError(f"--gpu: {exc}") from None


def sizing_gpu(req: ScheduleRequest, part: Any) -> tuple[DeviceSpec | None, list[str]]:
    """The GPU whose published figures size the job (None: a nominal A100), and notes saying what
    was assumed.  Only the job's time limit and budget depend on it: the job itself measures the
    GPUs it runs on.  A GPU type the partition names must be one perfcast knows (a word of the
    name, any case: ``env.gpu_key``); another is refused rather than sized as something else."""
    types = _gpu_types(part)
    spec = _requested_gpu(req)
    if spec is not None:
        other = [t for t in types if gpu_key(t) != gpu_key(req.gpu)]
        notes = [f"partition {req.partition}'s gres names GPU type {', '.join(other)}; the job is sized for "
                 f"--gpu {req.gpu}"] if other else []
        return spec, notes
    if not types:
        # Slurm often has no type to tell (an untyped gres, gpu:8): not an error, but said.
        return None, [f"partition {req.partition}: its gres names no GPU type (gpu:TYPE:N), so the job is "
                      f"sized for a nominal A100; --gpu NAME sizes it for its GPUs ({_known_names()})"]
    for t in types:
        if gpu_key(t) is None:
            raise CalibrationError(
                f"partition {req.partition}: GPU type {t!r} (its gres) is not a GPU perfcast has published "
                f"figures for{did_you_mean(t.lower(), sorted(KNOWN_GPUS))}; known: {_known_names()}; "
                "size the job with --gpu NAME (the job measures the real GPUs either way)")
    spec = published_spec(types[0])     # not None: gpu_key knows every type, checked above
    keys = sorted({gpu_key(t) or "" for t in types})
    notes = [f"partition {req.partition} has GPU types {', '.join(types)}: the job is sized for {types[0]} "
             "(--gpu NAME for another)"] if len(keys) > 1 else []
    return spec, notes


def _fmt_minutes(minutes: int) -> str:
    return slurm_duration(int(minutes) * 60.0)


def default_command() -> str:
    """The same Python that runs this, so compute nodes use the same installation."""
    return f"{shlex.quote(sys.executable)} -m calibrate.cli"


def render_script(req: ScheduleRequest, alloc: Allocation, time_limit: int, script_path: Path,
                  root: Path, every_s: int | None, budget: float) -> str:
    """The batch script (pure: unit-tested)."""
    p = req.partition
    q = shlex.quote
    cmd = req.command or default_command()
    pdir = root / p
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=perfcast-calibrate-{p}",
        f"#SBATCH --partition={p}",
        f"#SBATCH --nodes={alloc.nodes}",
        f"#SBATCH --ntasks-per-node={alloc.gpus_per_node}",
    ]
    if alloc.gpus_per_node > 0:
        lines.append(f"#SBATCH --gpus-per-node={alloc.gpus_per_node}")
    lines += [
        "#SBATCH --exclusive",
        f"#SBATCH --time={_fmt_minutes(time_limit)}",
        f"#SBATCH --output={pdir}/logs/calibrate-%j.out",
    ]
    if req.account:
        lines.append(f"#SBATCH --account={req.account}")
    lines += [f"#SBATCH {a}" for a in req.extra_sbatch]
    plan_args = f"--plan {q(req.plan)} --precision {q(','.join(req.precisions))}"
    # The host's tiny tensors in the job's 16-bit precision (FP8 calls are timed beside them).
    host_precision = next((p for p in req.precisions if p != "fp8"), "bf16")
    if req.plan == "adaptive":
        plan_args += f" --budget {budget:.0f}"
    lines += [
        "# Written by perf-calibrate schedule; rewritten by the next `schedule` of this partition.",
        "set -euo pipefail",
        f"export PERFCAST_PLATFORMS={q(str(root))}",
        f"STAGING={q(str(pdir / 'staging'))}",
        'mkdir -p "$STAGING"',
    ]
    if every_s and req.recur == "begin":
        lines += [
            "# Queue the next calibration first: the chain survives this run failing or being killed.",
            f"sbatch --parsable --begin=now+{every_s} {q(str(script_path))} "
            '|| echo "perfcast: could not queue the next calibration" >&2',
        ]
    lines += [
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        "# Measure into staging/current: a killed run's successor resumes it where it stopped.",
        "# Operators: one task on one node, spawning a rank per GPU that each measure a share.",
        f'srun --nodes=1 --ntasks=1 --gpus={alloc.gpus_per_node} {cmd} run --device cuda {plan_args} '
        f'--ranks {alloc.gpus_per_node} --out "$STAGING/current" --part operators',
        f'srun {cmd} run --device cuda {plan_args} --out "$STAGING/current" --part collectives',
    ]
    if alloc.nodes >= 2:
        lines += [
            "# Collectives beside each other across the nodes (fit: [fabric]); kept when resumed.",
            f'[ -f "$STAGING/current/fabric.toml" ] || srun {cmd} fabric --device cuda '
            f'--precision {q(host_precision)} --out "$STAGING/current/fabric.toml" '
            '|| echo "perfcast: fabric not measured; the platform gets no [fabric]" >&2',
        ]
    lines += [
        "# Host issue costs (fit carries them into the platform's [host]); kept when resumed.",
        f'[ -f "$STAGING/current/host.toml" ] || srun --nodes=1 --ntasks=1 --gpus=1 {cmd} host --device cuda '
        f'--precision {q(host_precision)} --out "$STAGING/current/host.toml" '
        '|| echo "perfcast: host costs not measured; the platform gets no host term" >&2',
        '# Done measuring: set the store aside so the next run starts fresh.',
        'DONE="$STAGING/job-$SLURM_JOB_ID"',
        'mv "$STAGING/current" "$DONE/samples" 2>/dev/null || { mkdir -p "$DONE"; mv "$STAGING/current" "$DONE/samples"; }',
        f'{cmd} fit "$DONE/samples" --out "$DONE/platform" --name {q(p)}',
        "# install refuses an incomplete or worse-validating platform: the active one then stays.",
        f'{cmd} install "$DONE/platform" --partition {q(p)} --root {q(str(root))} '
        f'--tolerance {req.tolerance}',
        # Keep the last three finished stores (samples are useful for refits), drop older ones.
        'ls -1dt "$STAGING"/job-* 2>/dev/null | tail -n +4 | xargs -r rm -rf',
    ]
    return "\n".join(lines) + "\n"


def cron_line(every_s: int) -> str:
    """A cron schedule close to ``every_s`` (cron cannot say "every 30 days")."""
    days = every_s / 86400
    if days < 1:
        hours = max(1, round(every_s / 3600))
        return f"0 */{hours} * * *"
    if days < 7:
        return f"0 3 */{max(1, round(days))} * *"
    if days < 28:
        return "0 3 * * 0"
    return "0 3 1 * *"


def install_scrontab(partition: str, script_path: Path, every_s: int, header: str,
                     run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """Replace this partition's block in the user's scrontab (other entries are kept)."""
    begin, end = f"# BEGIN perfcast-calibrate {partition}", f"# END perfcast-calibrate {partition}"
    cur = run(["scrontab", "-l"], capture_output=True, text=True)
    existing = cur.stdout if cur.returncode == 0 else ""
    kept, skipping = [], False
    for line in existing.splitlines():
        if line.strip() == begin:
            skipping = True
            continue
        if line.strip() == end:
            skipping = False
            continue
        if not skipping:
            kept.append(line)
    block = [begin, header, f"{cron_line(every_s)} {shlex.quote(str(script_path))}", end]
    text = "\n".join(kept + block) + "\n"
    with tempfile.NamedTemporaryFile("w", suffix=".scrontab", delete=False) as fh:
        fh.write(text)
        tmp = fh.name
    try:
        res = run(["scrontab", tmp], capture_output=True, text=True)
    finally:
        os.unlink(tmp)
    if res.returncode != 0:
        raise CalibrationError(f"scrontab refused the entry: {(res.stderr or res.stdout).strip()[:200]}")
    return block[2]


def schedule(req: ScheduleRequest, client: SlurmLike | None = None,
             run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> ScheduledJob:
    """Size, write and (unless dry_run) submit the calibration job of a partition."""
    check_partition_name(req.partition)
    if req.recur not in ("begin", "scrontab", "none"):
        raise CalibrationError("--recur must be begin, scrontab or none")
    every_s = parse_every(req.every) if req.every else None
    if req.nodes < 0:
        raise CalibrationError(f"--nodes must be 1 or more (0: up to 4 of the partition's), got {req.nodes}")
    if req.budget_gpu_minutes and req.plan != "adaptive":
        raise CalibrationError(f"--budget is for the adaptive plan only: plan {req.plan} measures "
                               "a fixed set of points")
    _requested_gpu(req)      # a misspelt --gpu is refused before Slurm is asked
    try:                     # and so is a misspelt --plan, or a plan file that does not load
        check_plan(req.plan, device="cuda", precisions=req.precisions)
    except CalibrationError as exc:
        raise CalibrationError(f"--plan: {exc}") from None
    if client is None:
        from slurm_plugin.slurm_client import SlurmClient
        client = SlurmClient()
    try:
        part = client.partition(req.partition)
    except Exception as exc:  # SlurmError, or any failure of the CLI underneath
        raise CalibrationError(f"partition {req.partition}: {exc}") from None
    gpn = int(getattr(part, "gpus_per_node", 0) or 0)
    if gpn < 1:
        # The job is a GPU job (--device cuda, --gpus-per-node, sized from GPU figures); a CPU
        # partition is calibrated by hand on one of its nodes.
        p = shlex.quote(req.partition)
        raise CalibrationError(
            f"partition {req.partition}: no GPUs per node known to Slurm (gres gpu): schedule writes GPU "
            f"calibration jobs only; calibrate a CPU partition on one of its nodes by hand: perf-calibrate run "
            f"--device cpu --plan smoke --out SAMPLES, then perf-calibrate fit SAMPLES --out PLATFORM --name {p} "
            f"and perf-calibrate install PLATFORM --partition {p}")
    total = int(getattr(part, "nodes", 0) or 0) or 1
    max_nodes = getattr(part, "max_nodes", None) or total
    nodes = min(req.nodes or min(total, 4), total, max_nodes)
    alloc = Allocation(nodes, gpn)
    spec_d, gpu_notes = sizing_gpu(req, part)
    spec = spec_d.to_gpu_spec() if spec_d else _nominal_spec("cuda")
    max_time = getattr(part, "max_time_minutes", None)
    notes: list[str] = []
    budget = req.budget_gpu_minutes
    sized = req.plan == "adaptive" and budget <= 0
    if sized:
        # Fill the partition's time limit (or 4 h): the budget is what the job may spend on
        # measuring, with its margin, once host/fabric, fit and install have their minutes.
        limit_min = max_time or 240
        room = limit_min - FIT_MINUTES - HOST_FABRIC_MINUTES
        if room / SAFETY < MIN_ADAPTIVE_MINUTES:
            need = math.ceil(FIT_MINUTES + HOST_FABRIC_MINUTES + MIN_ADAPTIVE_MINUTES * SAFETY)
            raise CalibrationError(
                f"partition {req.partition}: MaxTime {_fmt_minutes(limit_min)} is too short for a calibration job: "
                f"fit and install ({FIT_MINUTES} min), host and fabric ({HOST_FABRIC_MINUTES} min) and at least "
                f"{MIN_ADAPTIVE_MINUTES} min of measuring (×{SAFETY} margin) need {_fmt_minutes(need)}")
        # Whole GPU-minutes (the script passes --budget as one), rounded down to stay inside.
        budget = float(math.floor(room / SAFETY * alloc.ranks))
    memory = spec_d.memory_gib if spec_d else 80.0
    plan = make_plan(req.plan, device="cuda", precisions=req.precisions, allocation=alloc,
                     memory_gib=memory, budget_gpu_minutes=budget, spec=spec)
    cost = estimate_cost(plan, spec, "cuda")
    # (less a hair: the sized budget's wall-clock × SAFETY is the room exactly, up to rounding)
    limit = int(math.ceil(cost.wall_minutes * SAFETY + HOST_FABRIC_MINUTES + FIT_MINUTES - 1e-6))
    limit = max(limit, MIN_MINUTES)
    if sized and max_time is not None and limit > max_time:
        raise CalibrationError(
            f"partition {req.partition}: estimated {_fmt_minutes(limit)} exceeds MaxTime {_fmt_minutes(max_time)} "
            f"even with the budget sized to it: the collectives alone take {cost.collective_seconds / 60:.0f} min "
            f"on {nodes} node(s); use fewer --nodes or a partition with a longer MaxTime")
    if max_time is not None and limit > max_time:
        notes.append(f"estimated {_fmt_minutes(limit)} exceeds MaxTime {_fmt_minutes(max_time)}: the job may be killed "
                     "and resumed by the next one (use --plan adaptive with a --budget to bound it)")
        limit = max_time
    if every_s is not None and req.recur != "none" and every_s < limit * 60:
        # The begin chain queues the next job as this one starts: it would resume the same
        # staging store while this one still measures into it.
        raise CalibrationError(f"--every {req.every}: shorter than the job's own time limit {_fmt_minutes(limit)}; "
                               "the next calibration would start while this one still runs")
    # After the time limit's notes: what the sizing assumed about the GPU.
    notes += gpu_notes
    root = platforms_root(req.root)
    jobs = root / req.partition / "jobs"
    script_path = jobs / "calibrate.sbatch"
    script = render_script(req, alloc, limit, script_path, root, every_s, budget)
    if req.dry_run:
        return ScheduledJob(script_path, script, nodes, gpn, limit, cost, None, "dry run", notes)
    try:
        jobs.mkdir(parents=True, exist_ok=True)
        (root / req.partition / "logs").mkdir(parents=True, exist_ok=True)
        tmp = script_path.with_name(f".{script_path.name}.tmp{os.getpid()}")
        tmp.write_text(script, encoding="utf-8")
        os.chmod(tmp, 0o755)
        os.replace(tmp, script_path)
    except OSError as exc:
        raise CalibrationError(f"cannot write {script_path}: {exc.strerror or exc}") from None
    recurrence = "once"
    if every_s and req.recur == "scrontab":
        header = (f"#SCRON --partition={req.partition} --nodes={nodes} --ntasks-per-node={gpn} "
                  f"--gpus-per-node={gpn} --exclusive --time={_fmt_minutes(limit)} "
                  f"--job-name=perfcast-calibrate-{req.partition}")
        line = install_scrontab(req.partition, script_path, every_s, header, run)
        recurrence = f"scrontab: {line.split(' /')[0]}"
        return ScheduledJob(script_path, script, nodes, gpn, limit, cost, None, recurrence, notes)
    try:
        res = client.submit(script_path)
    except Exception as exc:  # SlurmError from sbatch
        raise CalibrationError(f"sbatch refused the calibration job: {exc}") from None
    if every_s and req.recur == "begin":
        recurrence = f"every {every_s // 86400} d {every_s % 86400 // 3600} h (sbatch --begin chain)"
    return ScheduledJob(script_path, script, nodes, gpn, limit, cost, int(res.job_id), recurrence, notes)
