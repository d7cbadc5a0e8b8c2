"""What the user CLIs share: reading JOB (a TOML job file or a batch script) and choosing a platform."""
from __future__ import annotations

import sys
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


# The top-level tables of a perfcast job file (predictor.job): a TOML file with TorchTitan's tables
# and none of these is a TorchTitan config, not a job file.
_JOB_TABLES = frozenset({"model", "layout", "run", "cluster"})
_CONFIG_SUFFIXES = (".yml", ".yaml", ".json")
_SNIFF_BYTES = 1 << 20          # a larger file is not a config or job file anyone meant to give here


def _sniff_text(path: str) -> Optional[str]:
    """The file's text when it is a small regular UTF-8 file (never blocking on a FIFO), else None:
    whoever reads it next says what is wrong with it."""
    from slurm_plugin.launch.files import default_read_file
    try:
        data = default_read_file(path)
    except (OSError, ValueError):
        return None
    if len(data) > _SNIFF_BYTES or b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _toml_tables(text: str) -> Optional[dict]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.9/3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return None
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def _is_torchtitan(tables: dict) -> bool:
    from slurm_plugin.launch.torchtitan import JOB_CONFIG_KEYS
    return bool((set(tables) & set(JOB_CONFIG_KEYS)) - _JOB_TABLES) and not (set(tables) & (_JOB_TABLES - {"model"}))


def _config_framework(path: str, text: str) -> Optional[str]:
    """Which framework's config a YAML / JSON file is, from its top-level keys (None: not known)."""
    from slurm_plugin.launch.configs import load_config
    from slurm_plugin.launch.limits import CannotPredict
    from slurm_plugin.launch.llmfoundry_keys import TRAIN_CONFIG_KEYS
    from slurm_plugin.launch.neox_keys import DEEPSPEED_KEYS, NEOX_KEYS
    try:
        data = load_config(text, path, None, "json" if path.lower().endswith(".json") else "yaml").data
    except CannotPredict:
        return None
    if not isinstance(data, dict):
        return None
    keys = {str(k).replace("-", "_") for k in data}
    if isinstance(data.get("trainer"), dict) and isinstance(data.get("model"), dict):
        return "NeMo"
    if isinstance(data.get("model"), dict) and keys & (TRAIN_CONFIG_KEYS - {"model", "optimizer", "scheduler"}):
        return "llm-foundry"
    if keys & (NEOX_KEYS - DEEPSPEED_KEYS):
        return "GPT-NeoX"
    if keys & DEEPSPEED_KEYS:
        return "DeepSpeed"
    return None


def _not_a_job(path: str, what: str, it: str = "it") -> UsageError:
    return UsageError(f"{path} {what}: give the batch script that launches {it} (perfcast reads the configs it "
                      f"names), or a perfcast job file (docs/job-file.md)")


def is_job_file(path: str) -> bool:
    """Whether JOB is a perfcast job file (else a batch script). A framework's config given in their
    place (a GPT-NeoX / llm-foundry / NeMo YAML, a DeepSpeed JSON, a TorchTitan TOML) is refused
    with what to give instead. A job file under another name (``jobfile``, ``job.TOML``: TOML with
    a [model] table) is read as the job file it is."""
    low = path.lower()
    if low.endswith(_CONFIG_SUFFIXES):
        text = _sniff_text(path)
        if text is None or text.startswith("#!"):
            return False            # unreadable (the script reader says why), or a script after all
        fw = _config_framework(path, text)
        if fw:
            raise _not_a_job(path, f"looks like {'an' if fw == 'llm-foundry' else 'a'} {fw} config")
        kind = "JSON" if low.endswith(".json") else "YAML"
        raise _not_a_job(path, f"is a {kind} file, not a batch script or a perfcast job file", "the training")
    text = _sniff_text(path)
    tables = _toml_tables(text) if text is not None else None
    if tables is not None and _is_torchtitan(tables):
        raise _not_a_job(path, "looks like a TorchTitan config")
    if low.endswith(".toml"):
        return True
    return tables is not None and isinstance(tables.get("model"), dict)


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
