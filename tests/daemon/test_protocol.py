"""perf-predictd's protocol, security and robustness, against fake backends."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from slurm_plugin import daemon
from slurm_plugin.daemon import Answer, PredictRequest, decode_lines, parse_request
from slurm_plugin.daemon import server as server_mod
from slurm_plugin.slurm_client import PartitionInfo

from .fakes import JOB, req
from . import fakes
from .conftest import RunningDaemon

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def test_prediction_json(running):
    a = running.ask(req())
    assert a["status"] == "ok" and a["time_limit"] == 55
    assert a["admin_comment"].startswith("perfcast:v1 iter_s=2.4 iters=1000 total_min=41.0 "
                                         "platform=perlmutter-a100 bundle=fakebundle01")
    assert a["prediction"]["recommended_minutes"] == 55


def test_prediction_lines_for_lua(running):
    a = running.ask(req(format="lines"))
    assert a["status"] == "ok" and a["time_limit"] == "55"
    assert set(a) <= {"status", "time_limit", "time_min", "admin_comment", "message", "reason"}
    assert int(a["time_min"]) < int(a["time_limit"])     # --time-min, for backfill


def test_max_time_from_lua_partition_list_caps(running):
    parts = {"gpu": {"max_time": 30, "default": True}, "cpu": {"max_time": 4294967295}}
    a = running.ask(req(partition=None, partitions=parts))
    assert a["time_limit"] == 30 and "iterations fit" in a["message"]


def test_first_managed_of_several_partitions(running):
    a = running.ask(req(partition="cpu,h100"))
    assert a["prediction"]["platform"] == "dgx-h100"


def test_unmanaged_partition_is_silent(running):
    a = running.ask(req(partition="cpu"))
    assert a["status"] == "skip" and not a["message"] and a["time_limit"] is None


def test_user_time_kept_and_enforce(running):
    assert running.ask(req(time_limit=20))["time_limit"] is None
    a = running.ask(req(time_limit=20, partition="h100"))
    assert a["time_limit"] == 55 and "replaced" in a["message"]


def test_no_val_markers_are_not_values(running):
    a = running.ask(req(time_limit=4294967294, min_nodes=4294967294, cpus_per_task=65534,
                        ntasks_per_node=65534))
    assert a["time_limit"] == 55
    seen = fakes.seen()[-1]["request"]
    assert seen["nodes"] is None and seen["cpus_per_task"] is None and seen["ntasks_per_node"] is None


def test_nobody_uid_is_not_a_no_val_marker():
    r = parse_request(json.dumps(req(submit_uid=65534, submit_gid=65534)).encode(), max_script=1 << 20)
    assert r.submit_uid == 65534


@pytest.mark.parametrize("field", ["std_out", "std_err"])
def test_output_paths_are_bounded_strings_named_when_bad(field):
    from slurm_plugin.daemon.protocol import BadRequest

    def parse(**kw):
        return parse_request(json.dumps(req(**kw)).encode(), max_script=1 << 20)

    assert getattr(parse(), field) == "" and getattr(parse(**{field: None}), field) == ""
    path = "/scratch/" + "d" * (4096 - len("/scratch/"))
    r = parse(**{field: path})
    assert getattr(r, field) == path and PredictRequest.from_dict(r.to_dict()) == r
    for bad in (path + "x", 42, ["e.err"]):
        with pytest.raises(BadRequest, match=f"^{field} must be a short string$"):
            parse(**{field: bad})


def test_request_fields_reach_the_parser(running):
    running.ask(req(min_nodes=4, tres_per_node="gres:gpu:4", num_tasks=16, name="gpt",
                    argv=["/home/u/job.sh", "x"]))
    seen = fakes.seen()[-1]
    assert seen["path"] == "/home/u/job.sh"
    assert seen["request"]["nodes"] == 4 and seen["request"]["gpus_per_node"] == 4
    assert seen["request"]["job_name"] == "gpt" and seen["work_dir"] == "/tmp"
    assert seen["env"]["SLURM_SUBMIT_DIR"] == "/tmp"


@pytest.mark.parametrize("tres, nodes, expect", [
    ("gres:gpu:4", None, 4), ("gres/gpu:a100:8", None, 8), ("gpu:2,gres:nic:1", None, 2),
    ("", None, None), ("gres:nic:1", None, None)])
def test_gpus_per_node_from_tres(tres, nodes, expect):
    assert PredictRequest(script="", submit_uid=0, submit_gid=0, tres_per_node=tres,
                          min_nodes=nodes).gpus_per_node == expect


def test_gpus_total_spread_over_nodes():
    r = PredictRequest(script="", submit_uid=0, submit_gid=0, tres_per_job="gres:gpu:16", min_nodes=4)
    assert r.gpus_per_node == 4


def test_unpredictable_script_says_why_in_one_line(running):
    a = running.ask(req(script="#!/bin/bash\nhostname\n", format="lines"))
    assert a["status"] == "skip" and a["reason"] == "no-job"
    assert "no training launch found" in a["message"] and "unchanged" in a["message"]


def test_job_without_a_length_gets_no_time_limit(running):
    # A prediction of start-up alone would set a limit that kills the job.
    a = running.ask(req(script="#!/bin/bash\n# FAKE iters=0 iter_s=2.0\nsrun python train.py\n"))
    assert a["status"] == "skip" and a["reason"] == "no-length"
    assert a["time_limit"] is None and "train_iters" in a["message"]


def test_predictor_error_is_one_line(running):
    a = running.ask(req(script=JOB + "# FAKE bad=1\n"))
    assert a["status"] == "skip" and "does not divide" in a["message"]


def test_broken_platform_fails_open(running):
    a = running.ask(req(partition="broken"))
    assert a["status"] == "skip" and a["reason"] == "platform-unavailable"


@pytest.mark.parametrize("raw, reason", [
    (b"this is not json\n", "bad-request"),
    (b"[1, 2]\n", "bad-request"),
    (b'{"submit_uid": 0}\n', "bad-request"),
    (b'{"script": "x", "submit_uid": "root"}\n', "bad-request"),
    (b'{"script": "x", "submit_uid": 0, "submit_gid": 0, "work_dir": "relative"}\n', "bad-request"),
    (b'{"script": "x", "submit_uid": 0}\n', "bad-request"),
    (b'{"format":"lines","script": 5}\n', "bad-request"),
    (b"\xff\xfe\x00garbage\n", "bad-request"),
])
def test_bad_requests_answer_errors_not_tracebacks(running, raw, reason):
    answer = _raw_exchange(running.socket, raw)
    parsed = json.loads(answer) if answer.startswith(b"{") else decode_lines(answer)
    assert parsed["status"] == "error" and parsed["reason"] == reason
    assert b"Traceback" not in answer


def test_garbage_script_text_is_fine(running):
    script = "#!/bin/bash\n" + "".join(chr(c) for c in range(1, 32)) + "\udcff\u2603 $((( '\"\n"
    a = running.ask(req(script=script, format="lines"))
    assert a["status"] == "skip"


def test_oversized_request_is_refused_without_reading_it_all(running):
    from slurm_plugin.daemon.protocol import RequestBuffer, RequestTooLarge, request_limit
    big = json.dumps(req(script="#" * 200_000, format="lines")).encode() + b"\n"
    answer = _raw_exchange(running.socket, big, ignore_send_errors=True)
    assert decode_lines(answer)["reason"] == "too-large"

    # past the wire limit, reading stops: nothing is kept
    buf = RequestBuffer(request_limit(65536))
    chunk = b"#" * (256 * 1024)
    with pytest.raises(RequestTooLarge):
        for _ in range(request_limit(65536) // len(chunk) + 1):
            assert buf.feed(chunk) is None
    assert buf.end() == b""


def test_request_size_is_the_scripts_bytes_not_its_json_escaping(running):
    # 60 KiB of script (the limit is 64 KiB) that JSON-escapes to ~140 KiB on the wire (issue 32:
    # a 3.5 MiB heredoc became 4.1 MiB of JSON and was refused although Slurm had accepted it).
    body = 'cat > c.json <<EOF\n' + '{"a": "\\t"}\n' * 4000 + "EOF\n"
    script = JOB + body[: 60_000 - len(JOB) - 4] + "\nEOF\n"
    wire = json.dumps(req(script=script)).encode()
    assert len(script.encode()) <= 65536 < len(wire)
    assert running.ask(req(script=script))["status"] == "ok"
    # Counted in bytes, not characters: 30,000 snowmen are 90,000 bytes.
    assert running.ask(req(script=JOB + "#" + "\u2603" * 30_000))["reason"] == "too-large"


def test_slow_client_is_cut_off_at_the_deadline():
    d = RunningDaemon(deadline_ms=200)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(d.socket)
            s.sendall(b'{"format":"lines","script":"')   # ...and never finishes
            s.settimeout(30)
            answer = s.recv(4096)
        assert b"status=skip" in answer and b"reason=deadline" in answer
    finally:
        d.stop()


def test_fifty_concurrent_clients(running):
    results = []

    def one():
        results.append(running.ask(req(), timeout=5))

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 50 and all(r["status"] == "ok" for r in results)


def test_reload_swaps_config_and_keeps_serving(running):
    with open(running.config_file) as fh:
        text = fh.read()
    with open(running.config_file, "w") as fh:
        fh.write(text.replace("margin = 0.15", "margin = 0.5"))
    answers = []
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            answers.append(running.ask(req())["status"])

    t = threading.Thread(target=hammer)
    t.start()
    running.call(running.server.reload)
    stop.set()
    t.join()
    assert answers and set(answers) == {"ok"}
    # 41 min x 1.5 + 5 = 66.5 -> 70
    assert running.ask(req())["time_limit"] == 70


def test_reload_with_broken_config_keeps_old(running):
    with open(running.config_file, "w") as fh:
        fh.write("[daemon\n")
    running.call(running.server.reload)
    assert running.ask(req())["time_limit"] == 55


def test_messages_are_single_lines():
    a = Answer("ok", message="a\nb\rc", admin_comment="x\ny", time_limit=5)
    lines = a.encode("lines").decode().splitlines()
    assert lines == ["status=ok", "time_limit=5", "admin_comment=x y", "message=a b c"]


# --- security -------------------------------------------------------------------------------

def _as_user(fn, uid: int = 65534) -> bytes:
    """Run ``fn() -> bytes`` in a forked child that has become ``uid`` (the interpreter in
    /root is not reachable for nobody, so no new python is started)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # child: only syscalls and socket work, then _exit
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(w, fn())
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            os.write(w, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        c = os.read(r, 65536)
        if not c:
            break
        chunks.append(c)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks)


@ROOT_ONLY
def test_untrusted_peer_is_refused(running):
    def client() -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(running.socket)
            try:   # the daemon may answer and close before reading anything
                s.sendall(json.dumps({"script": JOB, "submit_uid": 0}).encode() + b"\n")
            except BrokenPipeError:
                pass
            return s.recv(65536)
    out = _as_user(client).decode()
    assert "status=refused" in out, out
    assert "time_limit" not in out


@ROOT_ONLY
def test_user_socket_serves_users_as_themselves(running, tmp_path):
    secret = "/tmp/pcd-secret-%d.yml" % os.getpid()
    with open(secret, "w") as fh:
        fh.write("SECRET-MARKER-1234\n")
    os.chmod(secret, 0o600)
    try:
        script = JOB + "# FAKE config=%s\n" % secret
        # The request claims uid 0; the kernel says nobody: the file must not be read.
        out = _as_user(lambda: json.dumps(daemon.ask_daemon(
            running.user_socket, {"script": script, "submit_uid": 0, "partition": "gpu"})).encode())
        a = json.loads(out)
        assert a["status"] == "skip" and "Permission denied" in a["message"]
        assert b"SECRET-MARKER" not in out
        # root on the controller socket may read it (and the answer still has no content)
        b = running.ask(req(script=script))
        assert b["status"] == "ok" and "SECRET-MARKER" not in json.dumps(b)
    finally:
        os.unlink(secret)


def _daemon_looking_up_partitions(monkeypatch, release=None):
    """A daemon whose lookup of Slurm's partitions (the user socket's MaxTimes and default)
    ends only once ``release(server)`` says so; gpu is the default, with a MaxTime of 30 min."""
    holder: dict = {}

    def lookup():
        end = time.monotonic() + 30
        while time.monotonic() < end and not ("server" in holder and release(holder["server"])):
            time.sleep(0.005)
        return [PartitionInfo("gpu", max_time_minutes=30, default_time_minutes=None, nodes=1,
                              node_list="dev001", gpus_per_node=4, is_default=True)]
    monkeypatch.setitem(fakes.BACKENDS, "slurm_partitions", lookup)
    running = RunningDaemon()
    holder["server"] = running.server
    return running


def _seen_a_request(server) -> bool:
    return server._in_flight > 0 or sum(server.stats.values()) > 0


def test_a_user_socket_request_waits_for_slurms_partitions(monkeypatch):
    # The lookup ends only once the request is in the daemon: answered before it ends, the
    # request would find no partition ("partition-unmanaged") and sbatch would go on unfilled.
    running = _daemon_looking_up_partitions(monkeypatch, _seen_a_request)
    try:
        a = daemon.ask_daemon(running.user_socket, {"script": JOB, "submit_uid": 0}, 30)
        assert a["status"] == "ok", a
        assert a["time_limit"] == 30            # the default partition's MaxTime, from Slurm
    finally:
        running.stop()


def test_the_wait_for_slurms_partitions_is_bounded(monkeypatch):
    monkeypatch.setattr(server_mod, "PARTITIONS_WAIT_S", 0.05)
    gone = threading.Event()
    running = _daemon_looking_up_partitions(monkeypatch, lambda server: gone.is_set())
    try:
        a = daemon.ask_daemon(running.user_socket, {"script": JOB, "submit_uid": 0}, 30)
        assert (a["status"], a["reason"]) == ("skip", "partition-unmanaged")
        # ... and the controller socket (partitions from job_submit.lua) never waits for it
        assert running.ask(req())["status"] == "ok"
    finally:
        gone.set()
        running.stop()


@ROOT_ONLY
def test_reader_uses_the_users_rights(tmp_path):
    private = tmp_path / "private.yml"
    private.write_text("SECRET\n")
    private.chmod(0o600)
    reader = daemon.UserFileReader(65534, 65534, "/", max_bytes=100, timeout_s=2)
    with pytest.raises(PermissionError):
        reader(str(private))
    assert daemon.UserFileReader(0, 0, "/", max_bytes=100, timeout_s=2)(str(private)) == b"SECRET\n"


@ROOT_ONLY
def test_reader_relative_paths_resolve_against_work_dir_as_the_user(tmp_path):
    # work_dir is the user's --chdir: root must not enter a directory the user cannot search.
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "open.yml").write_text("x: 1\n")
    (locked / "open.yml").chmod(0o644)
    locked.chmod(0o700)
    tmp_path.chmod(0o755)
    reader = daemon.UserFileReader(65534, 65534, str(locked), max_bytes=100, timeout_s=2)
    with pytest.raises(PermissionError):
        reader("open.yml")


def test_reader_bounds_size_count_and_time(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * 5000)
    uid = os.geteuid()
    reader = daemon.UserFileReader(uid, os.getegid(), "/", max_bytes=4096, timeout_s=2)
    with pytest.raises(daemon.FileTooLarge):
        reader(str(big))
    with pytest.raises(daemon.FileTooLarge):   # endless devices are cut off too
        reader("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        daemon.UserFileReader(uid, os.getegid(), "/", max_bytes=10, timeout_s=0.2)(str(fifo))
    assert time.monotonic() - t0 < 2
    with pytest.raises(FileNotFoundError):
        reader(str(tmp_path / "missing"))
    many = daemon.UserFileReader(uid, os.getegid(), "/", max_bytes=10, timeout_s=1)
    with pytest.raises(OSError):
        for _ in range(daemon.MAX_FILES_PER_REQUEST + 1):
            try:
                many(str(tmp_path / "missing"))
            except FileNotFoundError:
                pass


# --- the real process -------------------------------------------------------------------------

def test_main_check_reports_bad_config(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[partitions.gpu]\n")
    assert daemon.main(["--config", str(bad), "--check"]) == 2
    assert "partitions.gpu.platform" in capsys.readouterr().err


def test_daemon_process_sighup_and_sigterm(tmp_path):
    """The fake-backed daemon as a process: answers, reloads on SIGHUP, exits on SIGTERM."""
    from .conftest import write_config
    d = tempfile_dir()
    cfg = write_config(d)
    pid_file = os.path.join(d, "pid")
    proc = subprocess.Popen([sys.executable, "-m", "tests.daemon.fakes", "--config", cfg,
                             "--pid-file", pid_file, "--log-file", os.path.join(d, "log")])
    try:
        for _ in range(100):
            if os.path.exists(pid_file):
                break
            time.sleep(0.05)
        sock = os.path.join(d, "d.sock")
        assert daemon.ask_daemon(sock, req())["status"] == "ok"
        proc.send_signal(signal.SIGHUP)
        for _ in range(20):
            assert daemon.ask_daemon(sock, req())["status"] == "ok"
        # The reload runs beside the answers; how long it takes depends on the machine's load.
        log_path = os.path.join(d, "log")
        for _ in range(600):
            if "event=reloaded" in open(log_path).read():
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
        assert not os.path.exists(sock) and not os.path.exists(pid_file)
        log = open(os.path.join(d, "log")).read()
        assert "event=reloaded" in log and "event=request status=ok" in log
        assert "SECRET" not in log
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile
    d = tempfile.mkdtemp(prefix="pcp", dir="/tmp")
    os.chmod(d, 0o755)
    return d


def _raw_exchange(path: str, payload: bytes, ignore_send_errors: bool = False) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(3)
        s.connect(path)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            if not ignore_send_errors:
                raise
        chunks = []
        while True:
            try:
                c = s.recv(65536)
            except ConnectionResetError:
                break
            if not c:
                break
            chunks.append(c)
        return b"".join(chunks)


def test_cli_filter_options_fill_the_request():
    cli = {"nodes": "4", "ntasks": None, "gres": "gres:gpu:4", "time": "1:30:00",
           "chdir": "/home/u/run", "gpus": "a100:16", "job-name": "gpt", "argv": ["/home/u/job.sh"],
           "partition": None, "hold": "set"}
    raw = json.dumps({"format": "lines", "script": JOB, "cli_options": cli, "work_dir": "/",
                      "submit_uid": -1}).encode()
    r = parse_request(raw, max_script=1 << 20, peer=(1000, 1000))
    assert (r.submit_uid, r.min_nodes, r.num_tasks, r.time_limit, r.work_dir, r.name) == \
        (1000, 4, None, 90, "/home/u/run", "gpt")
    assert r.gpus_per_node == 4 and r.tres_per_job == "gpu:a100:16" and r.argv == ("/home/u/job.sh",)
    assert r.partition is None


def test_parse_is_reused_only_when_no_file_was_read(running):
    n = len(fakes.seen())
    first = running.ask(req(script=JOB + "# FAKE tag=reuse\n"))
    again = running.ask(req(script=JOB + "# FAKE tag=reuse\n"))
    assert len(fakes.seen()) == n + 1          # second one came from the cache
    # The same answer, but each submission is a job of its own with its own record id.
    recless = [dict(a, admin_comment=re.sub(r" rec=\w+", "", a["admin_comment"])) for a in (first, again)]
    assert recless[0] == recless[1] and first["admin_comment"] != again["admin_comment"]
    script = JOB + "# FAKE config=/etc/hostname\n"
    running.ask(req(script=script))
    running.ask(req(script=script))
    assert len(fakes.seen()) == n + 3          # read a file: parsed every time


def test_every_prediction_is_recorded_under_the_id_in_its_admin_comment(running):
    from slurm_plugin.records import RecordStore, parse_admin_comment
    a = running.ask(req(std_out="/tmp/logs/train-%j.out", std_err="/tmp/logs/train-%j.err", name="train"))
    assert a["status"] == "ok"
    rid = parse_admin_comment(a["admin_comment"])["rec"]
    again = running.ask(req())                      # the same script again: a new job, a new record
    assert parse_admin_comment(again["admin_comment"])["rec"] != rid
    store_path = os.path.join(running.dir, "records.sqlite")
    running.wait_stored()                           # the spool, moved by the writer process
    rec = RecordStore(store_path).get(rid)
    assert rec is not None
    assert rec.partition == "gpu" and rec.platform == "perlmutter-a100"
    assert rec.time_limit_minutes == a["time_limit"] and rec.time_min_minutes == a["time_min"]
    assert rec.std_out == "/tmp/logs/train-%j.out" and rec.job_name == "train"
    assert rec.std_err == "/tmp/logs/train-%j.err"
    assert rec.uid == os.geteuid() and rec.job == {"fake": {"iters": 1000, "iter_s": 2.4}}


def test_skips_are_not_recorded(running):
    a = running.ask(req(script="#!/bin/bash\necho hello\n"))
    assert a["status"] == "skip" and "rec=" not in (a.get("admin_comment") or "")


def test_the_asyncio_client_gets_what_the_plain_one_gets_and_never_raises(running, tmp_path):
    import asyncio
    from slurm_plugin.daemon.protocol import ask_daemon_async
    body = req(script=JOB + "# FAKE tag=async\n")
    payload = json.dumps(body).encode() + b"\n"
    got = asyncio.run(ask_daemon_async(running.socket, payload))
    plain = daemon.ask_daemon(running.socket, body)

    def recless(a: dict) -> dict:
        return dict(a, admin_comment=re.sub(r" rec=\w+", "", a["admin_comment"]))
    assert got["status"] == "ok" and recless(got) == recless(plain)
    nobody = asyncio.run(ask_daemon_async(str(tmp_path / "none.sock"), payload, timeout=1.0))
    assert nobody == {"status": "client-error", "reason": "FileNotFoundError"}
