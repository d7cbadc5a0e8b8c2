"""slurm_plugin.daemon's package namespace: its names resolve when used, so a process that needs
one module (the record writer) does not import the daemon's server, engine and predictor."""
from __future__ import annotations

import subprocess
import sys

import pytest

import slurm_plugin.daemon as daemon


def test_the_record_writer_imports_neither_the_server_nor_the_predictor():
    code = ("import sys; import slurm_plugin.daemon.recorder; "
            "print(sorted(m for m in ('asyncio', 'predictor', 'slurm_plugin.daemon.engine', "
            "'slurm_plugin.daemon.server', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_exported_name_resolves_and_an_unknown_one_is_refused():
    for name in daemon.__all__:
        assert getattr(daemon, name) is not None, name
    assert daemon.main.__module__ == "slurm_plugin.daemon.cli"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        daemon.nope  # noqa: B018
