"""What the user CLIs share: reading JOB (a TOML job file or a batch script) and choosing a platform."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from predictor import TrainingJob
from predictor.errors import UsageError

__all__ = ["JobInput", "UsageError", "load_job_input", "load_job_and_platform", "named_platform",
           "script_partition"]


@dataclass
class JobInput:
    job: TrainingJob
    parsed: Optional[Any] = None      # slurm_plugin.launch.ParsedScript for batch scripts
    platform_from: Optional[str] = None   # how the platform was chosen, when a partition chose it


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


def script_partition(path: str, env: Optional[dict] = None) -> Optional[tuple[str, str]]:
    """(partition, where it is asked for) of a batch script, as sbatch takes it: ``$SBATCH_PARTITION``
    wins over the script's ``#SBATCH --partition`` / ``-p``; of a list (``a,b``) the first. None when
    neither names one (sbatch then uses the cluster's default partition, which only Slurm knows)."""
    import os

    from slurm_plugin.launch.files import decode_text
    from slurm_plugin.launch.limits import CannotPredict
    from slurm_plugin.launch.sbatch import read_directives
    env = os.environ if env is None else env
    if env.get("SBATCH_PARTITION"):
        value, where = env["SBATCH_PARTITION"], "$SBATCH_PARTITION"
    else:
        try:
            with open(path, "rb") as fh:
                text = decode_text(fh.read(4 << 20), path)
            d = read_directives(text, path)
        except (OSError, ValueError, CannotPredict):
            return None                      # the parse that follows says what is wrong with it
        value, where = d.request.partition, d.provenance.get("request.partition", path)
    first = (value or "").split(",")[0].strip()
    return (first, where) if first else None


def named_platform(platform: Optional[str], partition: Optional[str], config: Optional[str],
                   asked_where: str = "--partition") -> Optional[str]:
    """The platform --platform names, or the site config's for the partition; None if neither is given."""
    if platform is not None and not platform.strip():
        raise UsageError("--platform: empty name; see perf-predict --list-platforms")
    if partition is not None and not partition.strip():
        raise UsageError("--partition: empty name")
    if platform:
        return platform
    if not partition:
        return None
    from slurm_plugin.siteconfig import SiteConfigError, config_path, load_site_config
    try:
        site = load_site_config(config)
    except SiteConfigError as exc:
        raise UsageError(f"partition {partition} ({asked_where}) needs the site config to name its platform: "
                         f"{exc}; give --platform NAME or --config FILE") from None
    pol = site.partition(partition)
    if pol is None or not pol.platform:
        known = ", ".join(sorted(site.partitions)) or "none"
        raise UsageError(f"partition {partition!r} ({asked_where}) is not in {site.path or config_path(config)} "
                         f"(partitions there: {known}); use --platform")
    return pol.platform


def load_job_and_platform(path: str, platform: Optional[str], partition: Optional[str],
                          config: Optional[str]) -> tuple[JobInput, Any]:
    """JOB and its platform: the one named on the command line (``--platform``, or ``--partition``
    through the site config), else, for a batch script, the partition it asks sbatch for through
    the site config (as job_submit.lua does), else the job's [cluster] platform.

    The platform is loaded first when named, because a batch script needs its GPUs per node to be
    read; a job file may name its own platform inside. ``JobInput.platform_from`` says which
    partition chose it and where that was written.
    """
    from predictor import load_platform
    from slurm_plugin.siteconfig import config_path
    asked_where = "--partition"
    if not platform and not partition and not is_job_file(path):
        found = script_partition(path)
        if found is not None:
            partition, asked_where = found
    name = named_platform(platform, partition, config, asked_where)
    plat = load_platform(name) if name else None
    inp = load_job_input(path, int(plat.gpus_per_node) if plat is not None else None)
    if plat is None:
        if not inp.job.cluster.platform:
            raise UsageError("no platform: give --platform NAME or --partition NAME "
                             "(or #SBATCH --partition in the script, or set [cluster] platform in the job); "
                             "see perf-predict --list-platforms")
        plat = load_platform(inp.job.cluster.platform)
    elif not platform:
        inp.platform_from = (f"platform {name} for partition {partition} ({asked_where}), "
                             f"from {config_path(config)}")
    own = inp.job.cluster.platform if inp.job is not None else ""
    if own and name and own not in (name, str(getattr(plat, "name", ""))):
        # The job's own [cluster] platform loses to the command line; a misspelt one would
        # otherwise pass unseen.
        chosen = inp.platform_from or f"platform {name} (--platform)"
        inp.platform_from = f"{chosen}; the job's [cluster] platform {own!r} is not used"
    return inp, plat
