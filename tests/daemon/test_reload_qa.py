"""QA (admin), findings 2 and 6: a reload (SIGHUP) that is refused says so, and what it kept.

6. Every ``reload_failed`` line carries ``kept=`` (the running config and platforms): an unknown key,
   invalid TOML, the config file removed, and a bug (its type and code location only), as the
   misspelt platform's line always did.
2. A ``log_level`` that is no level refuses the reload as a whole (it used to log
   ``setting_not_applied``, run on at the old level, and, once fixed, ``setting_applied old=debgu``
   for a level that never applied).
"""
from __future__ import annotations

import logging
import os

import pytest

from .fakes import req
from .test_reload_config import edit, events

KEPT = 'kept="the running config and platforms"'


def _refused(running, caplog) -> str:
    engine = running.server.engine
    running.call(running.server.reload)
    (line,) = events(caplog, "reload_failed")
    assert line.levelno == logging.ERROR
    assert not events(caplog, "reloaded") and running.server.engine is engine
    assert running.ask(req())["time_limit"] == 55          # still served, on the running config
    return line.getMessage()


@pytest.mark.parametrize("old, new, error", [
    ("workers = 2", "workers = 2\nsokcet = \"/x\"", "daemon.sokcet: unknown key (did you mean 'socket'?)"),
    ("[defaults]", "[defaults", "not valid TOML"),
    ("margin = 0.5", 'margin = 0.5\n[harvst]\nsince = "7d"', "unknown section [harvst]"),
])
def test_a_broken_config_refuses_the_reload_and_says_what_it_kept(running, caplog, old, new, error):
    edit(running, "margin = 0.15", "margin = 0.5")       # would change the answers, were it applied
    edit(running, old, new)
    said = _refused(running, caplog)
    assert error in said and said.endswith(KEPT)


def test_a_removed_config_refuses_the_reload_and_says_what_it_kept(running, caplog):
    os.unlink(running.config_file)
    said = _refused(running, caplog)
    assert f"{running.config_file}: no such file" in said and said.endswith(KEPT)


def test_a_bug_in_a_reload_is_its_type_and_place_and_what_it_kept(running, caplog):
    def broken(cfg):
        raise RuntimeError("a line of someone's file")
    running.server.engine_factory = broken
    said = _refused(running, caplog)
    assert 'error="RuntimeError at ' in said and "someone" not in said and said.endswith(KEPT)


def test_a_log_level_typo_refuses_the_reload_as_a_whole(running, caplog):
    levels = {n: logging.getLogger(n).level for n in ("perfcast", "slurm_plugin", "predictor")}
    edit(running, "workers = 2", 'workers = 2\nlog_level = "debgu"')
    edit(running, "margin = 0.15", "margin = 0.5")
    said = _refused(running, caplog)
    assert "daemon.log_level: 'debgu' is not one of debug, info, warning, error (did you mean 'debug'?)" in said
    assert said.endswith(KEPT)
    assert not events(caplog, "setting_not_applied") and not events(caplog, "setting_applied")
    assert {n: logging.getLogger(n).level for n in levels} == levels
    # fixed: applied, and no "setting_applied old=debgu" for a level that never ran
    edit(running, 'log_level = "debgu"', 'log_level = "info"')
    caplog.clear()
    running.call(running.server.reload)
    assert events(caplog, "reloaded") and not events(caplog, "setting_applied")
    assert running.ask(req())["time_limit"] == 70
