"""The site configuration of perf-predictd: ``/etc/perfcast/perfcast.toml``.

One file, owned by the admin, says which partitions perfcast manages, on which platform each runs,
with which time-limit policy, and where the daemon listens.  Example (all keys optional except a
partition's ``platform``)::

    [daemon]
    socket = "/run/perfcast/predictd.sock"   # job_submit.lua connects here
    socket_mode = "0660"                     # SO_PEERCRED is the real gate; the mode is defence in depth
    slurm_user = "slurm"                     # trusted besides root (SlurmUser of slurm.conf)
    deadline_ms = 250                        # answer before job_submit.lua gives up (300 ms)
    max_request_bytes = 4194304              # Slurm's own default script limit
    max_file_bytes = 1048576                 # a launch config bigger than this is not read
    file_read_timeout_ms = 150
    workers = 0                              # worker processes; 0 = one per usable core (<= 16)
    max_queue = 256                          # requests waiting for a worker; more answer "busy"
    user_socket = ""                         # for cli_filter.lua on login nodes; "" = off
    records = "/var/lib/perfcast/records.sqlite"  # every prediction, for perf-calibrate harvest

    [defaults]                               # every partition inherits these
    policy = "fill"                          # off | advise | fill | enforce
    margin = 0.15                            # limit = predicted total x (1 + margin) + startup
    cover_interval = true                    # ... and at least the prediction's upper bound
    fill_level = 0.98                        # ... at this level (about 1 - this of jobs outrun it)
    time_min = true                          # fill/enforce also set --time-min to the point prediction
    startup_minutes = 5
    round_minutes = 5
    over_ask_factor = 3.0                    # warn when --time asks for more than this x prediction
    notify_skipped = true                    # tell users when their job could not be predicted

    [partitions.gpu]
    platform = "perlmutter-a100"             # a shipped platform name or a path to one
    margin = 0.2
    max_time_minutes = 2880                  # optional; otherwise Slurm's MaxTime as sent by Lua

    [watch]                                  # perf-calibrate watch (docs/watch.md); off unless enabled
    enabled = true
    partitions = ["gpu"]                     # [] = every partition perfcast manages
    extend_user_limits = false               # also extend limits users set (--time)
    max_growth = 1.0                         # a limit grows to at most (1 + this) x its start value
    user_extra_hours = 0                     # extension hours one user may get per 24 h; 0 = no cap
    shrink = true                            # lower limits perfcast set when a job runs fast
    backfill_allowance_minutes = 0           # how far an extension may delay a planned pending job

    [partitions.gpu.watch]                   # partition gpu's watch policy: [watch] with these replaced
    max_growth = 0.5
    extend_user_limits = true

Path: ``--config`` wins, then ``$PERFCAST_CONFIG``, then ``/etc/perfcast/perfcast.toml``.
Every error names the key at fault, so an admin can fix the file from the log line alone.
"""
from __future__ import annotations

import difflib
import os
import pwd
import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from .slurm_client import SlurmClient

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - older Pythons only
    import tomli as tomllib

DEFAULT_PATH = "/etc/perfcast/perfcast.toml"
ENV_VAR = "PERFCAST_CONFIG"
POLICIES = ("off", "advise", "fill", "enforce")
LOG_LEVELS = ("debug", "info", "warning", "error")
SECTIONS = ("daemon", "defaults", "partitions", "watch")
# Sections an admin may look for that perfcast.toml does not have, and where their settings are.
_ELSEWHERE = {"harvest": "the harvest reads its store from [daemon] records and takes the rest on its "
                         "command line (perf-calibrate harvest --help)",
              "records": "the record store is [daemon] records"}
# Slurm's default max_script_size; a request bigger than this is refused (the job goes on unchanged).
SLURM_SCRIPT_LIMIT = 4 * 1024 * 1024


class SiteConfigError(ValueError):
    """The site configuration cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class DaemonSettings:
    socket: str = "/run/perfcast/predictd.sock"
    socket_mode: int = 0o660
    slurm_user: str = "slurm"
    deadline_ms: int = 250
    max_request_bytes: int = SLURM_SCRIPT_LIMIT
    max_file_bytes: int = 1024 * 1024
    file_read_timeout_ms: int = 150
    workers: int = 0             # 0: one worker process per usable core (at most 16)
    max_queue: int = 256
    user_socket: str = ""
    user_socket_mode: int = 0o666
    cache_size: int = 1024
    log_level: str = "info"
    records: str = ""            # SQLite file of every prediction answered ("" = none kept)


#: The share of a partition's jobs the filled limit is meant to let finish by default (issue 28: "the
#: default fill kills <= 2 %"); the prediction's 90 % interval ends at its 95 % one-sided level.
FILL_LEVEL = 0.98


@dataclass(frozen=True)
class PartitionPolicy:
    """How perfcast treats jobs of one partition (the defaults when ``name`` is empty)."""

    name: str = ""
    platform: str = ""
    policy: str = "fill"
    margin: float = 0.15
    cover_interval: bool = True              # the limit also covers the prediction's upper bound
    fill_level: float = FILL_LEVEL           # ... at this one-sided level (slurm_plugin.policy)
    time_min: bool = True                    # also set --time-min (point prediction + startup)
    startup_minutes: float = 5.0
    round_minutes: int = 5
    over_ask_factor: float = 3.0
    max_time_minutes: Optional[int] = None   # None: use Slurm's MaxTime (sent by job_submit.lua)
    notify_skipped: bool = True


@dataclass(frozen=True)
class WatchPolicy:
    """``[watch]``: how ``perf-calibrate watch`` may correct running jobs' time limits."""

    enabled: bool = False                    # off unless the admin turns it on
    partitions: tuple[str, ...] = ()         # () = every partition perfcast manages
    extend: bool = True
    extend_user_limits: bool = False         # also limits users set (not only perfcast's)
    shrink: bool = True                      # lower limits perfcast set when a job runs fast
    shrink_user_limits: bool = False
    max_growth: float = 1.0                  # a limit grows to at most (1 + this) x its first value
    user_extra_hours: float = 0.0            # extension hours per user per 24 h (0 = no cap)
    margin: float = 0.10                     # on the remaining run time
    margin_minutes: float = 10.0             # a checkpoint save, a last evaluation, the tear-down
    shrink_min_minutes: float = 30.0         # a shrink must return at least this much to backfill
    backfill_allowance_minutes: float = 0.0  # how far an extension may delay a planned pending job
    min_samples: int = 3                     # steady-state log samples before acting
    stall_minutes: float = 30.0              # no new iteration in this much run time: not progressing
    max_parallel_reads: int = 8
    read_timeout_seconds: float = 10.0
    pass_budget_seconds: float = 120.0       # one pass reads no longer than this in all
    # [partitions.<name>.watch]: that partition's policy, [watch] with the table's keys replaced
    overrides: Mapping[str, "WatchPolicy"] = field(default_factory=dict)
    table: str = "watch"                     # the table this policy was read from (for messages)

    def watches(self, partition: str) -> bool:
        return self.enabled and (not self.partitions or partition in self.partitions)

    def for_partition(self, partition: str) -> "WatchPolicy":
        """The policy for jobs of ``partition``: its ``[partitions.<name>.watch]`` overrides, else ``[watch]``."""
        return self.overrides.get(partition, self)


@dataclass(frozen=True)
class SiteConfig:
    path: str
    daemon: DaemonSettings
    defaults: PartitionPolicy
    partitions: Mapping[str, PartitionPolicy] = field(default_factory=dict)
    watch: WatchPolicy = field(default_factory=WatchPolicy)

    def partition(self, name: Optional[str]) -> Optional[PartitionPolicy]:
        """The policy of partition ``name``; the ``[defaults]`` one if it names a platform; else None.

        None means perfcast does not manage that partition: the job is left alone, silently.
        """
        if name and name in self.partitions:
            return self.partitions[name]
        if self.defaults.platform:
            return replace(self.defaults, name=name or "")
        return None

    def platforms(self) -> list[str]:
        """Every platform the daemon must keep loaded, in a stable order."""
        names = [p.platform for p in self.partitions.values()]
        if self.defaults.platform:
            names.append(self.defaults.platform)
        return sorted(set(n for n in names if n))


def config_path(cli_value: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> str:
    """``--config`` wins, then ``$PERFCAST_CONFIG``, then the system default."""
    env = os.environ if env is None else env
    return cli_value or env.get(ENV_VAR) or DEFAULT_PATH


def load_site_config(path: Optional[str] = None) -> SiteConfig:
    """Read and validate the site config; raises :class:`SiteConfigError` with a one-line reason."""
    path = config_path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        if raw.startswith(b"\xef\xbb\xbf"):
            raise SiteConfigError(f"{path}: starts with a byte-order mark, which TOML does not allow: "
                                  "save the file as UTF-8 without BOM")
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise SiteConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise SiteConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise SiteConfigError(f"{path}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise SiteConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_site_config(data, path)
    except SiteConfigError as exc:
        raise SiteConfigError(_with_line(str(exc), path, raw.decode("utf-8"))) from None


_KEY_PATH = re.compile(r"[A-Za-z0-9_.\-]+")
_HEADER = re.compile(r"\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_ASSIGN = re.compile(r"\s*([A-Za-z0-9_\-\.\"' ]+?)\s*=")


def _with_line(message: str, path: str, text: str) -> str:
    """``PATH: KEY: why`` -> ``PATH:LINE: KEY: why`` where the key (or, for a table, its header)
    is written in the file: tomllib gives no positions, and an admin editing a long perfcast.toml
    should not have to search for it.  Left as it is when the message names no key path."""
    head = f"{path}: "
    if not message.startswith(head):
        return message
    rest = message[len(head):]
    dotted = rest.split(":", 1)[0]
    if dotted.startswith("unknown section ["):
        dotted = dotted[len("unknown section ["):].split("]", 1)[0]
    if not _KEY_PATH.fullmatch(dotted):
        return message
    line = _line_of(text, dotted)
    return f"{path}:{line}: {rest}" if line else message


def _line_of(text: str, dotted: str) -> int:
    """The 1-based line that defines ``dotted`` (``partitions.gpu.margin``): a ``key =`` under its
    table's header, a dotted key, an inline table holding it, or the first header of that table or
    of one inside it; for a key the file lacks (a required one), the header of the table that
    should hold it; 0 if none."""
    def norm(key: str) -> str:
        return ".".join(part.strip().strip("\"'") for part in key.split("."))
    table, parent, parent_depth = "", 0, 0
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            table = norm(header.group(1))
            if table == dotted or table.startswith(dotted + "."):
                return number
            depth = table.count(".") + 1
            if dotted.startswith(table + ".") and depth > parent_depth:
                parent, parent_depth = number, depth
            continue
        assign = _ASSIGN.match(line)
        if assign:
            key = norm(assign.group(1))
            full = f"{table}.{key}" if table else key
            if full == dotted or dotted.startswith(full + "."):   # (the latter: an inline table)
                return number
    return parent


def parse_site_config(data: Mapping[str, Any], path: str = "<config>") -> SiteConfig:
    """Validate an already-decoded config mapping (tests build these directly)."""
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise SiteConfigError(f"{path}: {_unknown_section(unknown[0])}")
    daemon = _build(DaemonSettings, _table(data, "daemon", path), "daemon", path)
    level = daemon.log_level.lower()
    if level not in LOG_LEVELS:
        raise SiteConfigError(f"{path}: daemon.log_level: {daemon.log_level!r} is not one of "
                              f"{', '.join(LOG_LEVELS)}{_near(level, LOG_LEVELS)}")
    daemon = replace(daemon, log_level=level)
    if not daemon.socket or not os.path.isabs(daemon.socket):
        raise SiteConfigError(f"{path}: daemon.socket: must be an absolute path")
    if daemon.user_socket and not os.path.isabs(daemon.user_socket):
        raise SiteConfigError(f"{path}: daemon.user_socket: must be an absolute path")
    if daemon.records and not os.path.isabs(daemon.records):
        raise SiteConfigError(f"{path}: daemon.records: must be an absolute path")
    for key in ("deadline_ms", "max_request_bytes", "max_file_bytes", "file_read_timeout_ms",
                "max_queue"):
        if getattr(daemon, key) <= 0:
            raise SiteConfigError(f"{path}: daemon.{key}: must be > 0")
    if not 0 <= daemon.workers <= 1024:
        raise SiteConfigError(f"{path}: daemon.workers: must be between 0 (one per core) and 1024")
    defaults = _build(PartitionPolicy, _table(data, "defaults", path), "defaults", path,
                      forbid=("name",))
    _check_policy(defaults, "defaults", path)
    parts: dict[str, PartitionPolicy] = {}
    watch_tables: dict[str, Mapping[str, Any]] = {}
    for name, table in _table(data, "partitions", path).items():
        if not isinstance(table, Mapping):
            raise SiteConfigError(f"{path}: partitions.{name}: must be a table")
        if "watch" in table:
            watch_tables[name] = _table(table, "watch", path, f"partitions.{name}.watch")
            table = {k: v for k, v in table.items() if k != "watch"}
        merged = {f.name: getattr(defaults, f.name) for f in fields(PartitionPolicy)}
        pol = _build(PartitionPolicy, table, f"partitions.{name}", path, forbid=("name",),
                     base=merged)
        pol = replace(pol, name=name)
        if not pol.platform:
            raise SiteConfigError(f"{path}: partitions.{name}.platform: required")
        _check_policy(pol, f"partitions.{name}", path)
        parts[name] = pol
    watch = parse_watch_policy(_table(data, "watch", path), path)
    overrides = {}
    for name, table in watch_tables.items():
        where = f"partitions.{name}.watch"
        if watch.partitions and name not in watch.partitions:
            raise SiteConfigError(f"{path}: {where}: partition {name} is not in watch.partitions "
                                  f"({', '.join(watch.partitions)}), so the watch never reads this table")
        overrides[name] = parse_watch_policy(table, path, base=watch, where=where)
    if overrides:
        watch = replace(watch, overrides=overrides)
    return SiteConfig(path=path, daemon=daemon, defaults=defaults, partitions=parts, watch=watch)


# [watch] keys a partition's table cannot change: the pass's own switch, list and read bounds, and
# the extension allowance, which is one per user across partitions.
WATCH_PASS_KEYS = ("enabled", "partitions", "user_extra_hours", "max_parallel_reads", "read_timeout_seconds",
                   "pass_budget_seconds")


def parse_watch_policy(table: Mapping[str, Any], path: str = "<config>", *, base: Optional[WatchPolicy] = None,
                       where: str = "watch") -> WatchPolicy:
    """The ``[watch]`` table, or (with ``base``, the ``[watch]`` policy) a partition's
    ``[partitions.<name>.watch]`` table over it; every error names ``<where>.<key>``."""
    values: dict[str, Any] = {}
    known = {f.name: f for f in fields(WatchPolicy) if f.name not in ("overrides", "table")}
    for key, value in table.items():
        if key not in known:
            raise SiteConfigError(f"{path}: {where}.{key}: unknown key{_near(key, known)}")
        if base is not None and key in WATCH_PASS_KEYS:
            raise SiteConfigError(f"{path}: {where}.{key}: set in [watch] only (it applies to the whole pass "
                                  "or, for user_extra_hours, to each user across partitions)")
        if key == "partitions":
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise SiteConfigError(f"{path}: {where}.partitions: must be a list of partition names")
            values[key] = tuple(value)
        else:
            values[key] = _coerce(known[key], value, f"{where}.{key}", path)
    w = replace(base, overrides={}, table=where, **values) if base is not None else WatchPolicy(**values)
    bounds = {"max_growth": (0, 100), "user_extra_hours": (0, 1e6), "margin": (0, 10),
              "margin_minutes": (0, 1440), "shrink_min_minutes": (0, 1e6),
              "backfill_allowance_minutes": (0, 1e6), "min_samples": (1, 10000),
              "stall_minutes": (0.1, 1e6), "max_parallel_reads": (1, 256),
              "read_timeout_seconds": (0.1, 3600), "pass_budget_seconds": (1, 86400)}
    for key, (lo, hi) in bounds.items():
        if not lo <= getattr(w, key) <= hi:
            raise SiteConfigError(f"{path}: {where}.{key}: must be between {lo:g} and {hi:g}")
    return w


def _table(data: Mapping[str, Any], key: str, path: str, name: str = "") -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise SiteConfigError(f"{path}: [{name or key}] must be a table")
    return value


def _build(cls, table: Mapping[str, Any], where: str, path: str, forbid: tuple = (),
           base: Optional[dict] = None):
    known = {f.name: f for f in fields(cls)}
    values = dict(base or {})
    for key, value in table.items():
        if key not in known or key in forbid:
            raise SiteConfigError(f"{path}: {where}.{key}: unknown key"
                                  f"{_near(key, (k for k in known if k not in forbid))}")
        values[key] = _coerce(known[key], value, f"{where}.{key}", path)
    return cls(**values)


def _near(name: str, known: Any) -> str:
    """" (did you mean 'x'?)" for the known name nearest ``name``, "" when none is near (the rule of
    :func:`predictor.errors.did_you_mean`, without importing the predictor)."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown_section(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), SECTIONS + tuple(_ELSEWHERE), n=1)
    if close and close[0] in _ELSEWHERE:
        return f"unknown section [{name}]: perfcast.toml has no [{close[0]}]; {_ELSEWHERE[close[0]]}"
    if close:
        return f"unknown section [{name}] (did you mean [{close[0]}]?)"
    return (f"unknown section [{name}] (perfcast.toml has [daemon], [defaults], [partitions.NAME] "
            "and [watch])")


def slurm_user_problem(settings: DaemonSettings) -> str:
    """Why ``[daemon] slurm_user`` names nobody this host knows ("" when it names a user, or is a
    numeric uid): slurmctld connects as the SlurmUser, and the daemon trusts only root, that
    user and itself, so with a name it cannot resolve every job would go through unchanged."""
    name = settings.slurm_user
    if name.isdigit():
        return ""
    try:
        pwd.getpwnam(name)
        return ""
    except KeyError:
        pass
    try:
        users = [u.pw_name for u in pwd.getpwall()]
    except OSError:     # (a name service that cannot list its users)
        users = []
    return f"daemon.slurm_user: no such user {name!r}{_near(name, users)}"


def _coerce(f, value: Any, where: str, path: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if f.name.endswith("_mode"):
        # Modes read best in octal; TOML has 0o660 but admins write "0660".
        try:
            return int(value, 8) if isinstance(value, str) else int(value)
        except ValueError:
            raise SiteConfigError(f"{path}: {where}: not an octal mode: {value!r}") from None
    if kind == "bool":
        if not isinstance(value, bool):
            raise SiteConfigError(f"{path}: {where}: must be true or false")
        return value
    if kind == "int" or kind == "Optional[int]":
        if isinstance(value, bool) or not isinstance(value, int):
            raise SiteConfigError(f"{path}: {where}: must be an integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SiteConfigError(f"{path}: {where}: must be a number")
        return float(value)
    if not isinstance(value, str):
        raise SiteConfigError(f"{path}: {where}: must be a string")
    return value


def _check_policy(p: PartitionPolicy, where: str, path: str) -> None:
    if p.policy not in POLICIES:
        raise SiteConfigError(f"{path}: {where}.policy: {p.policy!r} is not one of "
                              f"{', '.join(POLICIES)}")
    if not 0 <= p.margin <= 10:
        raise SiteConfigError(f"{path}: {where}.margin: must be between 0 and 10")
    if not 0.95 <= p.fill_level <= 0.999:
        # Below 0.95 the limit would cover less than the 90 % interval's own upper end.
        raise SiteConfigError(f"{path}: {where}.fill_level: must be between 0.95 and 0.999")
    if not 0 <= p.startup_minutes <= 24 * 60:
        raise SiteConfigError(f"{path}: {where}.startup_minutes: must be between 0 and 1440")
    if not 1 <= p.round_minutes <= 24 * 60:
        raise SiteConfigError(f"{path}: {where}.round_minutes: must be between 1 and 1440")
    if p.over_ask_factor <= 1:
        raise SiteConfigError(f"{path}: {where}.over_ask_factor: must be > 1")
    if p.max_time_minutes is not None and p.max_time_minutes <= 0:
        raise SiteConfigError(f"{path}: {where}.max_time_minutes: must be > 0")


# ---- configured partition names against Slurm's (perf-predictd --check, the daemon's start and reload)

#: How long ``scontrol show partition`` may take before the names are reported as not checked.
SLURM_LOOKUP_S = 10.0


@dataclass(frozen=True)
class PartitionNameProblem:
    """A partition named in the config that Slurm does not have.

    ``suggestion``: the Slurm partition the name is a near miss of (``difflib``'s rule, as
    :func:`predictor.errors.did_you_mean`), "" when none is near.  A near miss is taken for a
    typo (``--check`` fails); a name near nothing may be a partition still to be created (a
    warning: its jobs are left alone until it exists).
    """

    name: str
    where: str                 # "partitions.NAME" or "watch.partitions"
    suggestion: str = ""

    @property
    def near_miss(self) -> bool:
        return bool(self.suggestion)

    def message(self) -> str:
        if self.suggestion:
            return (f"{self.where}: Slurm has no partition {self.name!r} (did you mean "
                    f"{self.suggestion!r}?); this entry matches no job")
        return (f"{self.where}: Slurm has no partition {self.name!r} (not created yet?); this "
                "entry matches no job until it exists")


def configured_partitions(cfg: SiteConfig) -> dict[str, tuple[str, ...]]:
    """The partition names the config spells out, by where: ``partitions.<name>`` tables (and so
    their ``.watch`` tables) and the ``[watch] partitions`` list.  ``[defaults] platform`` names
    none (it manages whatever partition a job asks for)."""
    out: dict[str, tuple[str, ...]] = {}
    if cfg.partitions:
        out["partitions"] = tuple(cfg.partitions)
    if cfg.watch.partitions:
        out["watch.partitions"] = tuple(cfg.watch.partitions)
    return out


def unknown_partitions(cfg: SiteConfig, slurm_names: Any) -> list[PartitionNameProblem]:
    """Every configured partition name Slurm does not have, with its near miss among Slurm's
    partitions.  A near miss is looked for among the Slurm partitions not already named in the
    same place: ``[partitions.gpu]`` and ``[partitions.gpu2]`` are two partitions on purpose, so
    ``gpu2`` (still to be created) is no typo of ``gpu``."""
    known = set(slurm_names)
    problems = []
    for where, names in configured_partitions(cfg).items():
        candidates = sorted(known - set(names))
        for name in names:
            if name in known:
                continue
            close = difflib.get_close_matches(name, candidates, n=1)
            label = f"partitions.{name}" if where == "partitions" else where
            problems.append(PartitionNameProblem(name, label, close[0] if close else ""))
    return problems


def slurm_partition_names(timeout: float = SLURM_LOOKUP_S) -> list[str]:
    """Slurm's partition names (``scontrol -o show partition``, through
    :meth:`slurm_plugin.slurm_client.SlurmClient.partition_names`, the one place that runs Slurm's
    commands); raises :class:`slurm_plugin.slurm_client.SlurmError` when Slurm cannot be asked (not
    installed, no controller, no answer within ``timeout``)."""
    return SlurmClient(timeout=timeout).partition_names()


def example_path() -> Path:
    """Where the example config ships in a source checkout (for docs and the dev cluster)."""
    return Path(__file__).resolve().parent.parent / "packaging" / "perfcast.toml.example"
