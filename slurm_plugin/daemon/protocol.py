"""The wire protocol of perf-predictd: one request and one answer per connection.

- request: one JSON object on one line (``\\n``-terminated, or ended by EOF), at most
  ``max_request_bytes``.  Keys (all optional but ``script``, ``submit_uid`` and ``submit_gid``)::

      script, work_dir, submit_uid, submit_gid, partition, min_nodes, max_nodes, num_tasks,
      ntasks_per_node, cpus_per_task, tres_per_node, tres_per_job, tres_per_task, time_limit,
      max_time, argv (list), name, array, std_out (--output as given), std_err (--error as given),
      env (object; cli_filter only), format ("lines"|"json"),
      partitions ({name: {"max_time": minutes, "default": bool, "qos": name}}, from
      job_submit.lua's part_list; "qos": the partition's own QOS, absent or null when none),
      time_min (the user's --time-min, minutes; NO_VAL or absent = not given),
      qos, account (--qos, --account; absent = not given), default_qos, default_account
      (slurmctld's defaults for the job's user, job_desc.default_qos / default_account: sent only
      without --qos / --account), for the QOS and association MaxWall (slurm_plugin.qos_limits),
      warm (true: cli_filter.lua's warm-up; the outcome is computed and kept for job_submit.lua's
      request of the same submission, the answer is ``status=ok reason=warm`` only)

  Numbers may be Slurm's NO_VAL markers; the daemon treats those as "not given".  ``partition``
  may list several ("a,b"): the first one perfcast manages is used; none = the default partition.
- answer, ``format = "lines"`` (what job_submit.lua asks for, so Lua parses no JSON): ``key=value``
  lines, values never contain a newline::

      status=ok|skip|error|refused
      time_limit=30            (only when the limit must be set; minutes)
      time_min=20              (only when --time-min must be set too; minutes, ≤ time_limit)
      admin_comment=perfcast:v1 iter_s=... iters=... total_min=... platform=... bundle=...
      message=perfcast: ...    (one line for the user; absent = say nothing)
      reason=short-code        (skip: busy, deadline, no-job, ...; error: bad-request, ...)

  ``format = "json"`` (the default; tests and tools): the same keys plus ``prediction`` and
  ``warnings``, as one JSON object.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

# Slurm's "not set" markers.  16-bit ones only apply to 16-bit fields: uid 65534 is `nobody`.
_NO_VALS = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF}
_NO_VALS16 = _NO_VALS | {0xFFFE, 0xFFFF}
_U16_FIELDS = ("ntasks_per_node", "cpus_per_task")
MAX_MESSAGE = 1000           # characters of the user's line; Slurm truncates long log_user text
MAX_RECORD = 500             # characters of the AdminComment record


class BadRequest(ValueError):
    """The request itself is malformed (not the job): answered with status=error."""


class RequestTooLarge(Exception):
    """The script is over ``max_request_bytes``, or the request over :func:`request_limit`."""


_SURROGATE = re.compile("[\ud800-\udfff]")
# Room for the request's other fields (env, argv, partitions) around the script.
REQUEST_OVERHEAD_BYTES = 1 << 20


def request_limit(max_script_bytes: int) -> int:
    """The most bytes a request may take on the wire for a script of ``max_script_bytes``.

    job_submit.lua escapes control characters as ``\\u00XX`` (6 bytes for 1) and ``"``, ``\\``,
    newlines and tabs as two: a script Slurm accepted must not be refused for its escaping, so the
    wire allows the worst case and the script itself is measured after decoding.
    """
    return 6 * max_script_bytes + REQUEST_OVERHEAD_BYTES


@dataclass(frozen=True)
class PredictRequest:
    """One job as job_submit.lua (or cli_filter.lua) describes it."""

    script: str
    submit_uid: int
    submit_gid: int
    work_dir: str = "/"
    partition: Optional[str] = None
    min_nodes: Optional[int] = None
    max_nodes: Optional[int] = None
    num_tasks: Optional[int] = None
    ntasks_per_node: Optional[int] = None
    cpus_per_task: Optional[int] = None
    tres_per_node: str = ""
    tres_per_job: str = ""
    tres_per_task: str = ""
    time_limit: Optional[int] = None
    max_time: Optional[int] = None
    argv: tuple[str, ...] = ()
    name: Optional[str] = None
    array: Optional[str] = None
    std_out: str = ""                 # --output as submitted ("" = Slurm's default), for the record
    std_err: str = ""                 # --error as submitted ("" = with stdout), for the record
    env: Mapping[str, str] = field(default_factory=dict)
    format: str = "json"
    partition_max_time: Mapping[str, Optional[int]] = field(default_factory=dict)
    default_partition: Optional[str] = None
    warm: bool = False                # cli_filter.lua's warm-up: compute and keep, answer nothing
    # What decides the job's QOS and association MaxWall (policy inputs only, not the outcome's).
    qos: Optional[str] = None
    account: Optional[str] = None
    default_qos: Optional[str] = None
    default_account: Optional[str] = None
    partition_qos: Mapping[str, str] = field(default_factory=dict)
    # The user's own --time-min (minutes; None: not given): a limit filled below it is one Slurm
    # refuses ("Invalid time-min specification"), so the policy fills at least this much.
    time_min: Optional[int] = None

    def candidate_partitions(self) -> list[str]:
        """The partitions the job may run in, in the user's order (or the default one)."""
        if self.partition:
            return [p.strip() for p in self.partition.split(",") if p.strip()]
        return [self.default_partition] if self.default_partition else []

    @property
    def gpus_per_node(self) -> Optional[int]:
        """GPUs per node from --gres/--gpus-per-node, else --gpus spread over the nodes."""
        per_node = _gpu_count(self.tres_per_node)
        if per_node:
            return per_node
        total = _gpu_count(self.tres_per_job)
        if total and self.min_nodes:
            return max(1, total // self.min_nodes)
        per_task = _gpu_count(self.tres_per_task)
        if per_task and self.ntasks_per_node:
            return per_task * self.ntasks_per_node
        return None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (what the daemon hands a worker process; never pickled)."""
        out = {name: getattr(self, name) for name in _REQUEST_FIELDS}
        out["argv"] = list(self.argv)
        out["env"] = dict(self.env)
        out["partition_max_time"] = dict(self.partition_max_time)
        out["partition_qos"] = dict(self.partition_qos)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PredictRequest":
        """The inverse of :meth:`to_dict` (input from our own parent process, already validated)."""
        values = {k: v for k, v in data.items() if k in _REQUEST_FIELD_SET}
        values["argv"] = tuple(values.get("argv") or ())
        return _request(values) if cls is PredictRequest else cls(**values)


# Read once: dataclasses.fields() walks the class on every call (a request crosses twice).
_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(PredictRequest))
_REQUEST_FIELD_SET = frozenset(_REQUEST_FIELDS)


def _request(values: dict[str, Any]) -> PredictRequest:
    """``PredictRequest(**values)``: when ``values`` name every field, as its __init__ would build
    it (it only stores them) without a frozen dataclass's object.__setattr__ per field."""
    if values.keys() != _REQUEST_FIELD_SET:
        return PredictRequest(**values)
    req = object.__new__(PredictRequest)
    req.__dict__.update(values)
    return req


_GPU_RE = re.compile(r"(?:^|[,;])\s*(?:gres[:/])?gpu(?::[^:,;]+)?:(\d+)\s*(?=$|[,;(])")


def _gpu_count(tres: str) -> Optional[int]:
    """``gres:gpu:4`` / ``gres/gpu:a100:4`` / ``gpu:4`` -> 4; None when absent."""
    if not tres:
        return None
    total = 0
    for m in _GPU_RE.finditer(tres):
        total += int(m.group(1))
    return total or None


def _opt_minutes(data: Mapping[str, Any], key: str) -> Optional[int]:
    """Minutes under ``key``, else Slurm's time text under ``key_text`` (cli_filter.lua's)."""
    minutes = _opt_int(data, key)
    text = data.get(f"{key}_text")
    if minutes is None and isinstance(text, str):
        from ..slurm_client import SlurmError, parse_slurm_time
        try:
            return parse_slurm_time(text[:64])
        except SlurmError:
            raise BadRequest(f"{key}_text is not a Slurm time") from None
    return minutes


def parse_request(raw: bytes, *, max_script: int, peer: Optional[tuple[int, int]] = None,
                  peer_cwd: Optional[str] = None) -> PredictRequest:
    """Decode and validate one request; raises :class:`BadRequest` with a short reason.

    ``peer`` (uid, gid) replaces the request's own claim (the user socket: the kernel's word);
    ``peer_cwd`` (the peer process's working directory) is the work_dir when the request names none.
    """
    try:
        # Scripts are bytes to Slurm; undecodable bytes must not make a job unpredictable.
        data = json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        raise BadRequest("request is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("request is not a JSON object")
    cli = data.get("cli_options")
    if isinstance(cli, dict):
        data = _from_cli_options(data, cli)
    script = data.get("script")
    if not isinstance(script, str):
        raise BadRequest("no script text (sbatch < file, srun and salloc have none)")
    fmt = data.get("format", "json")
    if len(script) > max_script // 4 and len(script.encode("utf-8", "surrogatepass")) > max_script:
        # the script's own bytes, as Slurm counts them; answered in the format asked for
        raise RequestTooLarge(fmt if fmt in ("json", "lines") else "json")
    if not script.isascii() and _SURROGATE.search(script):
        # A lone surrogate (a JSON escape of no character) is no text a file could hold: the
        # parser and its YAML/TOML readers get U+FFFD, as for any undecodable byte.
        script = _SURROGATE.sub("\ufffd", script)
    if fmt not in ("json", "lines"):
        raise BadRequest("format must be json or lines")
    uid, gid = peer if peer is not None else (_opt_int(data, "submit_uid"),
                                               _opt_int(data, "submit_gid"))
    if uid is None:
        raise BadRequest("submit_uid missing")
    if gid is None:   # guessing a group could grant the reader rights the user does not have
        raise BadRequest("submit_gid missing")
    work_dir = data.get("work_dir") or peer_cwd or "/"
    if not isinstance(work_dir, str) or not work_dir.startswith("/") or "\0" in work_dir:
        raise BadRequest("work_dir must be an absolute path")
    argv = data.get("argv") or []
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise BadRequest("argv must be a list of strings")
    env = data.get("env") or {}
    if not isinstance(env, dict) or len(env) > 4096:
        raise BadRequest("env must be an object")
    env = {str(k): str(v) for k, v in env.items()
           if isinstance(k, str) and isinstance(v, str) and len(k) < 256 and len(v) < 65536}
    # cli_filter.lua passes --time / --time-min as the user typed them ("1:30:00", "2-00:00:00", "90").
    time_limit = _opt_minutes(data, "time_limit")
    time_min = _opt_minutes(data, "time_min")
    tres_per_node = _opt_str(data, "tres_per_node") or ""
    gpn = _opt_str(data, "gpus_per_node")      # cli_filter: --gpus-per-node as typed ("4", "a100:4")
    if gpn and not tres_per_node:
        tres_per_node = "gpu:" + gpn
    parts = data.get("partitions") or {}
    if not isinstance(parts, dict) or len(parts) > 10000:
        raise BadRequest("partitions must be an object")
    max_times: dict[str, Optional[int]] = {}
    part_qos: dict[str, str] = {}
    default_part = None
    for name, info in parts.items():
        if not isinstance(info, dict):
            continue
        max_times[str(name)] = _opt_int(info, "max_time")
        if info.get("default") is True:
            default_part = str(name)
        pq = info.get("qos")
        if isinstance(pq, str) and pq and len(pq) < 256:
            part_qos[str(name)] = pq
    # (every field, in the dataclass's order)
    return _request(dict(
        script=script, submit_uid=uid, submit_gid=gid, work_dir=work_dir,
        partition=_opt_str(data, "partition"),
        min_nodes=_opt_int(data, "min_nodes"), max_nodes=_opt_int(data, "max_nodes"),
        num_tasks=_opt_int(data, "num_tasks"), ntasks_per_node=_opt_int(data, "ntasks_per_node"),
        cpus_per_task=_opt_int(data, "cpus_per_task"),
        tres_per_node=tres_per_node,
        tres_per_job=_opt_str(data, "tres_per_job") or "",
        tres_per_task=_opt_str(data, "tres_per_task") or "",
        time_limit=time_limit, max_time=_opt_int(data, "max_time"),
        argv=tuple(argv[:256]), name=_opt_str(data, "name"), array=_opt_str(data, "array"),
        std_out=(_opt_str(data, "std_out") or "")[:4096], std_err=(_opt_str(data, "std_err") or "")[:4096],
        env=env, format=fmt,
        partition_max_time=max_times, default_partition=default_part,
        warm=data.get("warm") is True,
        qos=_opt_name(data, "qos"), account=_opt_name(data, "account"),
        default_qos=_opt_name(data, "default_qos"), default_account=_opt_name(data, "default_account"),
        partition_qos=part_qos, time_min=time_min))


# cli_filter.lua sends slurm.json_cli_options(options): sbatch's long option names -> our keys.
_CLI_KEYS = {"partition": "partition", "nodes": "min_nodes", "ntasks": "num_tasks",
             "ntasks-per-node": "ntasks_per_node", "cpus-per-task": "cpus_per_task",
             "gres": "tres_per_node", "gpus-per-node": "gpus_per_node", "gpus": "tres_per_job",
             "job-name": "name", "array": "array", "time": "time_limit_text", "chdir": "work_dir",
             "qos": "qos", "account": "account", "time-min": "time_min_text"}


def _from_cli_options(data: Mapping[str, Any], cli: Mapping[str, Any]) -> dict[str, Any]:
    """Fill request keys from cli_filter's option dump; only options really set (not null)."""
    out = dict(data)
    for opt, key in _CLI_KEYS.items():
        value = cli.get(opt)
        # sbatch's chdir (default: the cwd) beats the PWD the Lua side sends as a fallback
        if isinstance(value, str) and value and (key not in data or key == "work_dir"):
            out[key] = value
    tres = out.get("tres_per_job")
    if isinstance(tres, str) and not tres.startswith(("gpu", "gres")):
        out["tres_per_job"] = "gpu:" + tres        # --gpus=8 / --gpus=a100:8
    nodes = cli.get("nodes")
    if isinstance(nodes, str) and "max_nodes" not in data:
        # "2" (2 at most) or "2-4" (4), as sbatch hands job_submit.lua its max_nodes, so that the
        # warm-up and that request meet under one key; "2-" and suffixed counts stay unknown
        m = re.fullmatch(r"\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?", nodes)
        if m and int(m.group(2) or m.group(1)) > 0:
            out["max_nodes"] = int(m.group(2) or m.group(1))
    argv = cli.get("argv")
    if isinstance(argv, list) and "argv" not in data:
        out["argv"] = [a for a in argv if isinstance(a, str)]
    if data.get("warm") is True:
        # As sbatch does before job_submit.lua sees the job: --ntasks-per-node on a fixed node
        # count sets the task count (the warm-up must describe the job job_submit.lua gets).
        nodes, per_node = cli.get("nodes"), cli.get("ntasks-per-node")
        if (cli.get("ntasks") is None and isinstance(nodes, str) and nodes.isdigit()
                and isinstance(per_node, str) and per_node.isdigit()):
            out["num_tasks"] = int(nodes) * int(per_node)
    return out


def _opt_int(data: Mapping[str, Any], key: str) -> Optional[int]:
    value = data.get(key)
    if type(value) is int:   # what job_submit.lua sends: no more to check than the markers
        return None if value < 0 or value in (_NO_VALS16 if key in _U16_FIELDS else _NO_VALS) else value
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str):
        # cli_filter.lua sends options as typed: "4", "2-4" (min-max nodes), "16".
        m = re.match(r"\s*(\d{1,18})", value)
        if not m:
            raise BadRequest(f"{key} must be an integer")
        value = int(m.group(1))
    if not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer")
    if value < 0 or value in (_NO_VALS16 if key in _U16_FIELDS else _NO_VALS):
        return None
    return value


def _opt_name(data: Mapping[str, Any], key: str) -> Optional[str]:
    """A QOS, account or the like: a short string, or None (a malformed one is not given: these
    only ever lower the limit perfcast fills, so they never make a request fail)."""
    value = data.get(key)
    if not isinstance(value, str) or not value or len(value) > 255:
        return None
    return value.strip() or None


def _opt_str(data: Mapping[str, Any], key: str) -> Optional[str]:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > 4096:
        raise BadRequest(f"{key} must be a short string")
    return value


@dataclass
class Answer:
    status: str                       # ok | skip | error | refused
    reason: str = ""
    message: str = ""
    time_limit: Optional[int] = None
    time_min: Optional[int] = None    # --time-min for backfill (only with time_limit)
    admin_comment: str = ""
    warnings: list[str] = field(default_factory=list)
    prediction: Optional[dict] = None
    partition: str = ""               # the partition decided for (logged, not sent)

    def encode(self, fmt: str) -> bytes:
        if fmt == "lines":
            out = [f"status={self.status}"]
            if self.time_limit is not None:
                out.append(f"time_limit={int(self.time_limit)}")
                if self.time_min is not None:
                    out.append(f"time_min={int(self.time_min)}")
            if self.admin_comment:
                out.append(f"admin_comment={one_line(self.admin_comment, MAX_RECORD)}")
            if self.message:
                out.append(f"message={one_line(self.message, MAX_MESSAGE)}")
            if self.reason:
                out.append(f"reason={one_line(self.reason, 100)}")
            return ("\n".join(out) + "\n").encode("utf-8", "replace")
        body = {"status": self.status, "reason": self.reason,
                "message": one_line(self.message, MAX_MESSAGE), "time_limit": self.time_limit,
                "time_min": self.time_min if self.time_limit is not None else None,
                "admin_comment": one_line(self.admin_comment, MAX_RECORD),
                "warnings": [one_line(w, MAX_MESSAGE) for w in self.warnings],
                "prediction": self.prediction}
        return (_ANSWER_JSON.encode(body) + "\n").encode()


# json.dumps(body, default=str), without building an encoder per answer
_ANSWER_JSON = json.JSONEncoder(default=str)


def one_line(text: str, limit: int) -> str:
    """Printable, newline-free, bounded: what Lua and slurm.log_user can take safely."""
    text = str(text)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if not text.isprintable():   # rare: only then look at every character
        text = "".join(c if c.isprintable() else " " for c in text)
    return text


def decode_lines(raw: bytes) -> dict[str, str]:
    """Parse a ``lines`` answer (what job_submit.lua does, for tests and tools)."""
    out: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


class RequestBuffer:
    """One request as its bytes arrive: a line (or everything up to EOF), never more than
    ``limit`` bytes kept in memory.  Fed by the server's connection as data comes in."""

    def __init__(self, limit: int):
        self.limit = limit
        self._buf = bytearray()

    def feed(self, data: bytes) -> Optional[bytes]:
        """The whole request once its newline arrived, else None; raises :class:`RequestTooLarge`."""
        nl = data.find(b"\n")
        self._buf += data if nl < 0 else data[:nl]
        if len(self._buf) > self.limit:
            self._buf = bytearray()
            raise RequestTooLarge()
        return bytes(self._buf) if nl >= 0 else None

    def end(self) -> bytes:
        """What arrived before EOF (a request need not end with a newline)."""
        return bytes(self._buf)


_LINES_RE = re.compile(rb'^\s*\{\s*"format"\s*:\s*"lines"')


def sniff_format(raw: bytes) -> str:
    # job_submit.lua puts "format":"lines" first, so even a request that turns out malformed
    # further on gets an answer Lua can read.
    return "lines" if _LINES_RE.match(raw[:256]) else "json"


def ask_daemon(socket_path: str, request: Mapping[str, Any], timeout: float = 1.0) -> dict[str, Any]:
    """Send one request, return the answer (JSON or lines, decoded to a dict).  A client for
    tests, benchmarks and tools."""
    payload = json.dumps(request).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        s.sendall(payload)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except ValueError:
        return decode_lines(raw)   # "lines" answers, and refusals sent before the request was read


async def ask_daemon_async(socket_path: str, payload: bytes, timeout: float = 10.0) -> dict[str, Any]:
    """:func:`ask_daemon` for asyncio clients (benchmarks that send bursts), with the request
    already encoded.  A connection that fails or times out answers
    ``{"status": "client-error", "reason": <the exception's name>}`` instead of raising."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket_path), timeout)
        writer.write(payload)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
        writer.close()
    except (OSError, asyncio.TimeoutError) as exc:
        return {"status": "client-error", "reason": type(exc).__name__}
    try:
        return json.loads(raw)
    except ValueError:
        return decode_lines(raw)
