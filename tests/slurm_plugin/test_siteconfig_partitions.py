"""siteconfig.slurm_partition_names asks Slurm through SlurmClient (the one place that runs Slurm's
commands), keeping what perf-predictd --check relies on (test_check_partitions.py)."""
from __future__ import annotations

import subprocess

import pytest

from slurm_plugin import siteconfig
from slurm_plugin.slurm_client import SlurmClient, SlurmError


def test_partition_names_go_through_the_slurm_client(monkeypatch):
    seen = []

    def cmd(self, args, **kw):
        seen.append((list(args), self.timeout))
        return subprocess.CompletedProcess(args, 0, b"PartitionName=gpu State=UP\nPartitionName=cpu State=UP\n", b"")
    monkeypatch.setattr(SlurmClient, "_cmd", cmd)
    assert siteconfig.slurm_partition_names(timeout=3.0) == ["gpu", "cpu"]
    assert seen == [(["scontrol", "-o", "show", "partition"], 3.0)]


def test_its_errors_are_the_clients(monkeypatch):
    def cmd(self, args, **kw):
        raise SlurmError("scontrol show partition: Unable to contact slurm controller (connect failure)")
    monkeypatch.setattr(SlurmClient, "_cmd", cmd)
    with pytest.raises(SlurmError, match="^scontrol show partition: Unable to contact"):
        siteconfig.slurm_partition_names()
