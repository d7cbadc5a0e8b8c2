"""perf-predictd caps the limit it fills by the job's QOS / association MaxWall (fake lookups)."""
from __future__ import annotations

import json
import os
import pwd
import threading
import time

import pytest

from slurm_plugin import daemon
from slurm_plugin.daemon import parse_request
from slurm_plugin.qos_limits import Assoc, Qos, WallLimits, WallLimitsSource
from slurm_plugin.siteconfig import load_site_config
from slurm_plugin.slurm_client import SlurmError

from .fakes import JOB
from . import fakes
from .conftest import RunningDaemon, write_config

# 1000 x 2.4 s + 60 s = 41 min: filled 55 min (15 % margin, 5 min start-up); --time-min 50.
ME = pwd.getpwuid(os.geteuid()).pw_name
PARTS = {"gpu": {"max_time": 2880, "default": True}, "h100": {"max_time": 2880},
         "cpu": {"max_time": 4294967295}}


def limits(enforced: bool = True) -> WallLimits:
    return WallLimits(
        enforced=enforced,
        qos={"normal": Qos(None), "qa10": Qos(12), "half": Qos(30), "big": Qos(600),
             "long": Qos(None, part_time_limit=True), "longcap": Qos(50, part_time_limit=True)},
        users={(ME, "proj", ""): Assoc(40, default_qos="half", qos=("normal", "half")),
               (ME, "plain", ""): Assoc(20, qos=("normal", "qa10")),
               (ME, "plain", "h100"): Assoc(None, qos=("normal", "qa10"))},
        accounts={"root": Assoc(None), "proj": Assoc(40, parent="root"), "plain": Assoc(None, parent="root")},
        default_accounts={ME: "plain"})


def req(**kw):
    base = {"format": "lines", "script": JOB, "submit_uid": os.geteuid(), "submit_gid": os.getegid(),
            "work_dir": "/tmp", "time_limit": 4294967294, "partitions": PARTS}
    base.update(kw)
    return base


@pytest.fixture
def with_limits(monkeypatch):
    """The daemon's engines (the first and every reload's) get a fake lookup."""
    state = {"answer": limits(), "calls": 0}

    def lookup():
        state["calls"] += 1
        answer = state["answer"]
        if isinstance(answer, Exception):
            raise answer
        return answer
    src = WallLimitsSource(lookup, log=daemon.log_event)
    monkeypatch.setitem(fakes.BACKENDS, "wall_limits", src)
    d = RunningDaemon()
    d.limits, d.state = src, state
    yield d
    d.stop()


def test_filled_limit_capped_by_the_qos_the_job_names(with_limits):
    a = with_limits.ask(req(qos="qa10"))
    assert a["status"] == "ok" and a["time_limit"] == "12" and "time_min" not in a
    assert "time limit set to 00:12:00 (QOS qa10's MaxWall)" in a["message"]
    assert "needs about 00:55:00 but QOS qa10 allows 00:12:00" in a["message"]
    assert "warn=capped cap=qos" in a["admin_comment"]


def test_a_partition_time_limit_qos_lifts_the_partitions_maxtime(with_limits):
    """Partition h100 allows 30 min here (and the user's association on it no MaxWall); the job
    needs 55.  Its QOS with flag PartitionTimeLimit lets Slurm run it past MaxTime: filled as it
    needs (up to that QOS's MaxWall), no MaxTime warning."""
    parts = dict(PARTS, h100={"max_time": 30})

    def ask(**kw):
        return with_limits.ask(req(partition="h100", partitions=parts, **kw))
    a = ask(qos="long")
    assert a["time_limit"] == "55" and "MaxTime" not in a["message"] and "warn=" not in a["admin_comment"], a
    a = ask(qos="longcap")
    assert a["time_limit"] == "50" and "(QOS longcap's MaxWall)" in a["message"], a["message"]
    # A --time past MaxTime is no reason to warn under it; under QOS normal it is.
    assert "MaxTime" not in ask(qos="long", time_limit=50)["message"]
    assert "exceeds h100's MaxTime 00:30:00" in ask(qos="normal", time_limit=50)["message"]
    a = ask(qos="normal")
    assert a["time_limit"] == "30" and "(the partition's MaxTime)" in a["message"], a["message"]


def test_the_default_qos_when_no_qos_is_given(with_limits):
    # slurmctld's own default (job_desc.default_qos, from job_submit.lua) ...
    assert with_limits.ask(req(default_qos="qa10"))["time_limit"] == "12"
    # ... else the association's (account proj: default QOS half, 30 min) ...
    a = with_limits.ask(req(account="proj"))
    assert a["time_limit"] == "30" and "(QOS half's MaxWall)" in a["message"]
    # ... and an account from slurmctld's default (job_desc.default_account) counts the same.
    assert with_limits.ask(req(default_account="proj"))["time_limit"] == "30"


def test_the_associations_maxwall_when_no_qos_has_one(with_limits):
    # Default account plain: QOS normal (no MaxWall), the association's 20 minutes.
    a = with_limits.ask(req())
    assert a["time_limit"] == "20"
    assert f"(the MaxWall of user {ME}'s association in account plain)" in a["message"]
    assert "cap=assoc" in a["admin_comment"]
    # Its partition h100 association has none (and h100's policy is enforce): uncapped.
    assert with_limits.ask(req(partition="h100"))["time_limit"] == "55"


def test_the_partitions_qos_from_job_submit_luas_partition_list(with_limits):
    parts = dict(PARTS, gpu={"max_time": 2880, "default": True, "qos": "qa10"})
    a = with_limits.ask(req(partitions=parts, qos="big"))
    assert a["time_limit"] == "12" and "QOS qa10's MaxWall" in a["message"]


def test_no_change_without_a_binding_limit(with_limits, running):
    """Same answers as a daemon that knows no limits: a QOS above the fill, limits not enforced."""
    for extra in ({"qos": "big"}, {"qos": "big", "time_limit": 30}, {"qos": "nosuchqos", "account": "nosuch"}):
        a, b = with_limits.ask(req(**extra)), running.ask(req(**extra))
        a.pop("admin_comment"), b.pop("admin_comment")    # (each has its own record id)
        assert a == b, extra
    with_limits.state["answer"] = limits(enforced=False)
    assert with_limits.limits.refresh().wait(5)
    a, b = with_limits.ask(req(qos="qa10")), running.ask(req(qos="qa10"))
    assert a["time_limit"] == b["time_limit"] == "55" and a["message"] == b["message"]


def test_a_failing_lookup_fails_open(monkeypatch, caplog):
    def lookup():
        raise SlurmError("sacctmgr: not installed")
    monkeypatch.setitem(fakes.BACKENDS, "wall_limits", lookup)
    d = RunningDaemon()
    try:
        a = d.ask(req(qos="qa10"))
        assert a["status"] == "ok" and a["time_limit"] == "55"
        assert "event=slurm_limits_failed" in caplog.text and "sacctmgr: not installed" in caplog.text
    finally:
        d.stop()


def test_a_reload_looks_the_limits_up_again_and_keeps_them_meanwhile(with_limits):
    assert with_limits.ask(req(qos="qa10"))["time_limit"] == "12"
    calls = with_limits.state["calls"]
    with_limits.state["answer"] = SlurmError("sacctmgr: Connection refused")
    with_limits.call(with_limits.server.reload)
    end = time.monotonic() + 10
    while with_limits.state["calls"] == calls and time.monotonic() < end:
        time.sleep(0.02)
    assert with_limits.state["calls"] > calls
    assert with_limits.limits.wait(5)
    assert with_limits.ask(req(qos="qa10"))["time_limit"] == "12"     # the last good answer


def test_engine_load_waits_for_the_first_lookup():
    gate = threading.Event()

    def lookup():
        gate.wait(0.2)
        return limits()
    cfg = load_site_config(write_config(_tmpdir()))
    engine = daemon.Engine(cfg, dict(fakes.BACKENDS, wall_limits=lookup)).load()
    assert engine.wall_limits.limits == limits()
    routed = engine.route(parse_request(json.dumps(req(qos="qa10")).encode(), max_script=65536))
    assert routed.wall is not None and routed.wall.minutes == 12
    # cli_filter.lua's warm-up of the same job is answered "warm" only: no cap looked up for it
    warm = engine.route(parse_request(json.dumps(dict(req(qos="qa10"), warm=True)).encode(), max_script=65536))
    assert warm.req.warm and warm.wall is None
    # --check (no lookups): none made, nothing capped
    engine = daemon.Engine(cfg, dict(fakes.BACKENDS, wall_limits=lookup)).load(lookup_partitions=False)
    assert engine.wall_limits.limits is None and engine.wall_limits.lookups == 0


def _tmpdir() -> str:
    import tempfile
    return tempfile.mkdtemp(prefix="pcw", dir="/tmp")


def test_request_fields():
    r = parse_request(json.dumps(req(qos="qa10", account="proj", default_qos="d", default_account="da",
                                     partitions={"gpu": {"max_time": 60, "qos": "pq"},
                                                 "cpu": {"max_time": 60, "qos": None}})).encode(),
                      max_script=65536)
    assert (r.qos, r.account, r.default_qos, r.default_account) == ("qa10", "proj", "d", "da")
    assert r.partition_qos == {"gpu": "pq"}
    assert _round_trips(r)
    # Malformed values are "not given" (they could only lower a limit): never a bad request.
    r = parse_request(json.dumps(req(qos=5, account="x" * 300)).encode(), max_script=65536)
    assert r.qos is None and r.account is None
    # cli_filter.lua's options
    r = parse_request(json.dumps({"script": JOB, "submit_uid": 0, "submit_gid": 0,
                                  "cli_options": {"qos": "qa10", "account": "proj"}}).encode(), max_script=65536)
    assert (r.qos, r.account) == ("qa10", "proj")


def _round_trips(r) -> bool:
    from slurm_plugin.daemon import PredictRequest
    return PredictRequest.from_dict(r.to_dict()) == r
