"""perf-predictd: the prediction daemon next to slurmctld.

job_submit.lua runs inside slurmctld while it holds its locks, so the Lua side only forwards the
job here over a Unix socket and applies the answer.  This daemon keeps the platforms loaded,
parses the batch script and predicts in worker processes, applies the partition's policy and
answers within a deadline shorter than the Lua timeout -- or says at once that it cannot.

The package, by concern:

- :mod:`.protocol`  the request and answer formats (and a small client, :func:`ask_daemon`)
- :mod:`.server`    the sockets, peer credentials, deadlines, reload (SIGHUP) and stop (SIGTERM)
- :mod:`.pool`      worker processes with hard deadlines, and load shedding
- :mod:`.engine`    routing, parse + predict (in a worker), the policy, the outcome cache
- :mod:`.reader`    reading files named by a script as the submitting user, bounded
- :mod:`.logs`      ``key=value`` log lines
- :mod:`.cli`       ``perf-predictd`` itself

Security: on the controller socket only root, the SlurmUser and the daemon's own uid are served
(SO_PEERCRED).  On the optional user socket (for cli_filter.lua on login nodes) anybody is served,
but as themselves.  Files named by a script are read by a child that has dropped to the
submitting user's uid, gid and groups, with a size and time bound; answers and log lines carry
only numbers and messages computed here, never file contents.
"""
from __future__ import annotations

import importlib
from typing import Any

# Names resolve on first use (PEP 562), not at import: the record writer, a process of its own
# started with the daemon, imports .recorder alone, and importing the whole package (asyncio,
# the engine, the predictor) cost it ~0.26 s of CPU at every start.
_WHERE = {
    "main": "cli",
    "Engine": "engine", "Outcome": "engine", "Route": "engine", "facts_from_prediction": "engine",
    "release_memory": "engine", "worker_count": "engine",
    "log_event": "logs", "setup_logging": "logs",
    "PoolBusy": "pool", "WorkerDied": "pool", "WorkerOverrun": "pool", "WorkerPool": "pool",
    "Answer": "protocol", "BadRequest": "protocol", "PredictRequest": "protocol", "RequestTooLarge": "protocol",
    "ask_daemon": "protocol", "decode_lines": "protocol", "parse_request": "protocol",
    "MAX_FILES_PER_REQUEST": "reader", "FileTooLarge": "reader", "UserFileReader": "reader",
    "PredictServer": "server", "peer_credentials": "server", "serve": "server", "trusted_uids": "server",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
