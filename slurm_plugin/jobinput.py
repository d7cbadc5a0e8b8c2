"""What the user CLIs share: reading JOB (a TOML job file or a batch script) and choosing a platform."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from predictor import TrainingJob
from predictor.errors import UsageError

__all__ = ["JobInput", "UsageError", "load_job_input", "load_job_and_platform", "named_platform"]


@dataclass
class JobInput:
    job: TrainingJob
    parsed: Optional[Any] = None      # slurm_plugin.launch.ParsedScript for batch scripts


def is_job_file(path: str) -> bool:
    return path.endswith(".toml")


def load_job_input(path: str, default_gpus_per_node: Optional[int] = None) -> JobInput:
    """A TrainingJob from a TOML job file or a batch script (parsed, never executed)."""
    if is_job_file(path):
        return JobInput(TrainingJob.from_toml(path))
    import os

    from slurm_plugin.launch import parse_script
    # sbatch exports the submitting environment by default, so the script sees the user's variables.
    parsed = parse_script(path, default_gpus_per_node=default_gpus_per_node, env=dict(os.environ))
    if parsed.job is None:
        why = parsed.error or "cannot predict: no training job found in the script"
        raise UsageError(why if path in why else f"{path}: {why}")
    return JobInput(parsed.job, parsed)


def named_platform(platform: Optional[str], partition: Optional[str], config: Optional[str]) -> Optional[str]:
    """The platform --platform names, or the site config's for --partition; None if neither is given."""
    if platform:
        return platform
    if not partition:
        return None
    from slurm_plugin.siteconfig import SiteConfigError, load_site_config
    try:
        site = load_site_config(config)
    except SiteConfigError as exc:
        raise UsageError(f"--partition {partition} needs the site config: {exc}") from None
    pol = site.partitions.get(partition)
    if pol is None:
        known = ", ".join(sorted(site.partitions)) or "none"
        raise UsageError(f"partition {partition!r} is not in {site.path} "
                         f"(partitions there: {known}); use --platform")
    return pol.platform


def load_job_and_platform(path: str, platform: Optional[str], partition: Optional[str],
                          config: Optional[str]) -> tuple[JobInput, Any]:
    """JOB and its platform: the one named on the command line, else the job's [cluster] platform.

    The platform is loaded first when named, because a batch script needs its GPUs per node to be
    read; a job file may name its own platform inside.
    """
    from predictor import load_platform
    name = named_platform(platform, partition, config)
    plat = load_platform(name) if name else None
    inp = load_job_input(path, int(plat.gpus_per_node) if plat is not None else None)
    if plat is None:
        if not inp.job.cluster.platform:
            raise UsageError("no platform: give --platform NAME or --partition NAME "
                             "(or set [cluster] platform in the job); see perf-predict --list-platforms")
        plat = load_platform(inp.job.cluster.platform)
    return inp, plat
