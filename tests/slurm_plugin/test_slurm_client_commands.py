"""One place runs Slurm's commands (SlurmClient._cmd), and its errors name a command by what it
does: ``scontrol -o show partition`` is "scontrol show partition", not "scontrol -o"."""
from __future__ import annotations

import subprocess

import pytest

from slurm_plugin.slurm_client import SlurmClient, SlurmError, command_name

PARTS = "PartitionName=gpu MaxTime=01:00:00 State=UP\nPartitionName=watch MaxTime=01:00:00 State=UP\n"


def answer(rc: int = 0, out: str = "", err: str = "", calls: "list | None" = None):
    def run(argv, **kw):
        if calls is not None:
            calls.append((argv, kw))
        return subprocess.CompletedProcess(argv, rc, out.encode(), err.encode())
    return run


@pytest.mark.parametrize("argv, name", [
    (["scontrol", "-o", "show", "partition"], "scontrol show partition"),
    (["scontrol", "-o", "show", "job", "7"], "scontrol show job"),
    (["scontrol", "show", "config"], "scontrol show config"),
    (["scontrol", "update", "JobId=7", "TimeLimit=9"], "scontrol update"),
    (["sacctmgr", "-n", "-P", "show", "assoc", "cluster=dev", "format=User"], "sacctmgr show assoc"),
    (["/usr/bin/scontrol", "-o", "show", "reservation"], "/usr/bin/scontrol show reservation"),
    (["squeue", "--start", "-h", "-t", "PD"], "squeue --start"),
    (["sbatch", "--parsable", "job.sh"], "sbatch --parsable"),
    (["scancel", "7"], "scancel 7"),
])
def test_commands_are_named_by_what_they_do(argv, name):
    assert command_name(argv) == name


def test_an_o_command_that_fails_is_named_by_its_subcommand():
    down = answer(1, err="slurm_load_partitions: Unable to contact slurm controller (connect failure)\n")
    client = SlurmClient(runner=down)
    for call, name in ((client.partitions, "scontrol show partition"),
                       (client.partition_names, "scontrol show partition"),
                       (client.running_jobs, "scontrol show job"),
                       (client.reservations, "scontrol show reservation")):
        with pytest.raises(SlurmError) as exc:
            call()
        assert str(exc.value) == f"{name}: slurm_load_partitions: Unable to contact slurm controller (connect failure)"

    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, 2)
    with pytest.raises(SlurmError, match=r"^scontrol show partition: no answer within 2 s$"):
        SlurmClient(runner=slow, timeout=2).partition_names()

    def denied(argv, **kw):
        raise PermissionError(13, "Permission denied")
    with pytest.raises(SlurmError, match=r"^scontrol show partition: Permission denied$"):
        SlurmClient(runner=denied).partition_names()


def test_partition_names_read_scontrol_alone():
    calls: list = []
    assert SlurmClient(runner=answer(out=PARTS, calls=calls)).partition_names() == ["gpu", "watch"]
    (argv, kw), = calls                      # no sinfo: only the names are wanted
    assert argv == ["scontrol", "-o", "show", "partition"]
    assert kw["stdin"] is subprocess.DEVNULL  # never waits on the caller's terminal
    # scontrol may exit 0 without a controller: no partitions is an error, with what it said.
    with pytest.raises(SlurmError, match=r"^scontrol show partition: slurm_load_partitions: Zero Bytes"):
        SlurmClient(runner=answer(err="slurm_load_partitions: Zero Bytes were transmitted\n")).partition_names()
    with pytest.raises(SlurmError, match=r"^scontrol show partition: no partitions$"):
        SlurmClient(runner=answer()).partition_names()


def test_a_command_given_input_gets_it_on_stdin():
    calls: list = []
    SlurmClient(runner=answer(out="7\n", calls=calls)).submit("", text="#!/bin/sh\n")
    (argv, kw), = calls
    assert kw["input"] == b"#!/bin/sh\n" and kw["stdin"] is None
