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

from .cli import main
from .engine import Engine, Outcome, Route, facts_from_prediction, release_memory, worker_count
from .logs import log_event, setup_logging
from .pool import PoolBusy, WorkerDied, WorkerOverrun, WorkerPool
from .protocol import (Answer, BadRequest, PredictRequest, RequestTooLarge, ask_daemon,
                       decode_lines, parse_request)
from .reader import MAX_FILES_PER_REQUEST, FileTooLarge, UserFileReader
from .server import PredictServer, peer_credentials, serve, trusted_uids

__all__ = ["Answer", "BadRequest", "Engine", "FileTooLarge", "MAX_FILES_PER_REQUEST", "Outcome",
           "PoolBusy", "PredictRequest", "PredictServer", "RequestTooLarge", "Route",
           "UserFileReader", "WorkerDied", "WorkerOverrun", "WorkerPool", "ask_daemon",
           "decode_lines", "facts_from_prediction", "log_event", "main", "parse_request",
           "peer_credentials", "release_memory", "serve", "setup_logging", "trusted_uids",
           "worker_count"]
