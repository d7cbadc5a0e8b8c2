"""perf-predictd's log lines: the direct write to the daemon's own log file gives exactly the line
the logging path (KVFormatter) gives, and steps aside for any other handler set-up."""
from __future__ import annotations

import logging
import re

import pytest

from slurm_plugin.daemon import logs

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


@pytest.fixture
def own_log(tmp_path):
    """setup_logging to a file, undone afterwards (it rewires process-wide loggers)."""
    names = ("perfcast", "slurm_plugin", "predictor")
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level,
                 logging.getLogger(n).propagate) for n in names}
    path = tmp_path / "predictd.log"
    logs.setup_logging("info", str(path))
    try:
        yield path
    finally:
        for n, (handlers, level, propagate) in saved.items():
            lg = logging.getLogger(n)
            for h in lg.handlers:
                if h not in handlers:
                    h.close()
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


def _via_logging(event: str, level: int, body: str) -> str:
    rec = logs.log.makeRecord(logs.log.name, level, "", 0, "event=%s %s", (event, body), None)
    return logs.KVFormatter().format(rec)


def test_direct_lines_are_the_formatter_lines(own_log):
    assert logs._own_handler(logging.INFO) is not None
    logs.log_event("request", status="ok", ms=0.31, why='a "quoted" word', partition="gpu")
    logs.log_event("hidden", level=logging.DEBUG, x=1)          # below the level: no line
    logs.log_event("worker_died", level=logging.ERROR, pid=42)
    lines = own_log.read_text().splitlines()
    assert len(lines) == 2
    want = [_via_logging("request", logging.INFO, 'status=ok ms=0.31 why="a \\"quoted\\" word" partition=gpu'),
            _via_logging("worker_died", logging.ERROR, "pid=42")]
    for got, expected in zip(lines, want):
        assert re.fullmatch(STAMP + r" .*", got), got
        assert got.split(" ", 1)[1] == expected.split(" ", 1)[1]


def test_a_filter_on_the_handler_is_respected(own_log):
    handler = logging.getLogger("perfcast").handlers[0]
    handler.addFilter(lambda record: "secret" not in record.getMessage())
    assert logs._own_handler(logging.INFO) is None        # the logging path decides, filters and all
    logs.log_event("shown", a=1)
    logs.log_event("dropped", a="secret")
    lines = own_log.read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["event=shown a=1"]


def test_without_the_daemons_set_up_lines_go_through_logging(caplog):
    caplog.set_level(logging.INFO, logger="perfcast")
    if logs._own_handler(logging.INFO) is not None:
        pytest.skip("another test left the daemon's log set up")
    logs.log_event("request", status="ok")
    assert any(r.getMessage() == "event=request status=ok" for r in caplog.records)
