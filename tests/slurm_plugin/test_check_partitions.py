"""F9: ``perf-predictd --check`` compares the configured partition names with Slurm's.

A name that is a near miss of one of Slurm's partitions is a typo (FAILED, rc 1: the real partition
would be left unmanaged); a name near none may be a partition still to be created (a warning,
rc 0); a Slurm that cannot be asked is one line and no failure.  ``scontrol`` here is a stand-in
on PATH that prints what ``scontrol -o show partition`` prints on the dev cluster."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_plugin.daemon.cli import check_partition_names
from slurm_plugin.siteconfig import (configured_partitions, parse_site_config, slurm_partition_names,
                                     unknown_partitions)
from slurm_plugin.slurm_client import SlurmError

REPO = Path(__file__).resolve().parents[2]
DEV = ["gpu", "short", "h100", "cpu", "watch", "watchshort"]     # packaging/dev-cluster/up.sh

SCONTROL = """#!/bin/sh
case "$FAKE_SCONTROL" in
  down) echo "slurm_load_partitions: Unable to contact slurm controller (connect failure)" >&2; exit 1 ;;
  hang) exec sleep 30 ;;
esac
for p in {names}; do
  echo "PartitionName=$p AllowGroups=ALL AllowAccounts=ALL Default=NO MaxTime=01:00:00 State=UP"
done
"""


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A fake ``scontrol`` first on PATH; ``FAKE_SCONTROL=down|hang`` makes it fail or hang."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "scontrol"
    exe.write_text(SCONTROL.format(names=" ".join(DEV)))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FAKE_SCONTROL", raising=False)
    return bin_dir


def cfg(**tables):
    return parse_site_config(tables)


def test_configured_partitions_are_tables_and_the_watch_list():
    c = cfg(partitions={"gpu": {"platform": "dgx-h100"}},
            watch={"enabled": True, "partitions": ["gpu", "watchshrt"]})
    assert configured_partitions(c) == {"partitions": ("gpu",), "watch.partitions": ("gpu", "watchshrt")}
    assert configured_partitions(cfg(defaults={"platform": "dgx-h100"})) == {}


def test_near_misses_and_unknown_names():
    c = cfg(partitions={"watchshrt": {"platform": "dgx-h100"}, "gpu": {"platform": "dgx-h100"},
                        "gpu2": {"platform": "dgx-h100"}, "future_a100": {"platform": "dgx-h100"}},
            watch={"partitions": ["watch", "watchshrt", "gpu"]})
    got = {(p.where, p.name): p for p in unknown_partitions(c, DEV)}
    assert set(got) == {("partitions.watchshrt", "watchshrt"), ("partitions.gpu2", "gpu2"),
                        ("partitions.future_a100", "future_a100"), ("watch.partitions", "watchshrt")}
    assert got["partitions.watchshrt", "watchshrt"].suggestion == "watchshort"
    assert got["watch.partitions", "watchshrt"].suggestion == "watchshort"
    assert "did you mean 'watchshort'?" in got["watch.partitions", "watchshrt"].message()
    # gpu2 beside [partitions.gpu]: a second partition on purpose, not a typo of gpu
    assert not got["partitions.gpu2", "gpu2"].near_miss
    assert not got["partitions.future_a100", "future_a100"].near_miss


def test_check_fails_only_for_near_misses(capsys):
    c = cfg(partitions={"gpu": {"platform": "dgx-h100"}, "h10": {"platform": "dgx-h100"},
                        "future_a100": {"platform": "dgx-h100"}})
    assert check_partition_names(c, lambda: DEV) == 1
    out = capsys.readouterr().out.splitlines()
    assert "partition h10: FAILED: partitions.h10: Slurm has no partition 'h10' (did you mean 'h100'?)" \
        in "\n".join(out)
    assert any(line.startswith("partition future_a100: warning:") for line in out)
    assert check_partition_names(cfg(partitions={"gpu": {"platform": "dgx-h100"}}), lambda: DEV) == 0
    assert capsys.readouterr().out.startswith("partitions: ok")


def test_check_without_slurm_says_so_once_and_does_not_fail(capsys):
    def down():
        raise SlurmError("scontrol show partition: Unable to contact slurm controller")
    assert check_partition_names(cfg(partitions={"gpuu": {"platform": "dgx-h100"}}), down) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["partitions: not checked against Slurm (scontrol show partition: Unable to "
                   "contact slurm controller)"]


def test_slurm_partition_names_from_scontrol(scontrol, monkeypatch):
    assert slurm_partition_names() == DEV
    monkeypatch.setenv("FAKE_SCONTROL", "down")
    with pytest.raises(SlurmError, match="Unable to contact"):
        slurm_partition_names()
    monkeypatch.setenv("FAKE_SCONTROL", "hang")
    with pytest.raises(SlurmError, match="no answer within 0.5 s"):
        slurm_partition_names(timeout=0.5)
    monkeypatch.setenv("PATH", str(scontrol.parent / "nowhere"))
    with pytest.raises(SlurmError, match="not installed"):
        slurm_partition_names()


def _check(tmp_path, text: str, **env) -> subprocess.CompletedProcess:
    path = tmp_path / "perfcast.toml"
    path.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, "-m", "slurm_plugin.daemon", "--config", str(path), "--check"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, **env})


def test_perf_predictd_check_fails_a_misspelt_watch_partition(scontrol, tmp_path):
    res = _check(tmp_path, """
        [partitions.watch]
        platform = "dgx-h100"
        [watch]
        enabled = true
        partitions = ["watch", "watchshrt"]
        """)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "platform dgx-h100: ok" in res.stdout
    assert ("partition watchshrt: FAILED: watch.partitions: Slurm has no partition 'watchshrt' "
            "(did you mean 'watchshort'?)") in res.stdout


def test_perf_predictd_check_warns_for_a_partition_still_to_come(scontrol, tmp_path):
    text = """
        [partitions.gpu]
        platform = "dgx-h100"
        [partitions.a100_new]
        platform = "dgx-h100"
        """
    res = _check(tmp_path, text)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "partition a100_new: warning: partitions.a100_new: Slurm has no partition" in res.stdout
    down = _check(tmp_path, text, FAKE_SCONTROL="down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "partitions: not checked against Slurm (" in down.stdout
