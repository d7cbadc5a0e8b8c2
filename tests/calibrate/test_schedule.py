from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

import pytest

from calibrate.errors import CalibrationError
from calibrate.schedule import ScheduleRequest, cron_line, install_scrontab, parse_every, schedule


@dataclass
class FakePartition:
    name: str = "gpu"
    nodes: int = 8
    gpus_per_node: int = 4
    max_time_minutes: int | None = 240
    max_nodes: int | None = None
    raw: dict = field(default_factory=lambda: {"TRES": "cpu=512,gres/gpu=32"})


class FakeSlurm:
    def __init__(self, part=None):
        self.part = part or FakePartition()
        self.submitted = []

    def partition(self, name=None):
        if name != self.part.name:
            raise RuntimeError(f"no partition {name!r}")
        return self.part

    def submit(self, script, args=(), **kw):
        self.submitted.append(script)

        @dataclass
        class R:
            job_id: int = 4242
        return R()


def test_parse_every():
    assert parse_every("30d") == 30 * 86400
    assert parse_every("2w") == 14 * 86400
    assert parse_every("12h") == 12 * 3600
    assert parse_every("7") == 7 * 86400
    for bad in ("soon", "10s", ""):
        with pytest.raises(CalibrationError):
            parse_every(bad)


def test_schedule_sizes_writes_and_submits(tmp_path):
    slurm = FakeSlurm()
    job = schedule(ScheduleRequest(partition="gpu", every="30d", root=str(tmp_path),
                                   command="perf-calibrate"), client=slurm)
    assert job.job_id == 4242 and slurm.submitted == [job.script_path]
    assert job.nodes == 4 and job.gpus_per_node == 4
    assert 20 <= job.time_limit_minutes <= 240
    text = job.script_path.read_text()
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --gpus-per-node=4" in text
    assert "#SBATCH --nodes=4" in text and "--ntasks-per-node=4" in text
    assert f"--begin=now+{30 * 86400}" in text
    assert "perf-calibrate run --device cuda --plan adaptive" in text
    # install is last and nothing after it can replace the active platform
    assert text.index(" fit ") < text.index(" install ")
    assert "set -euo pipefail" in text
    assert job.cost.gpu_minutes > 0
    # The host costs are measured into the store (once: a resumed run keeps them) before the fit,
    # which carries them into the platform's [host].
    host_line = next(line for line in text.splitlines() if " host --device cuda" in line)
    assert host_line.startswith('[ -f "$STAGING/current/host.toml" ] || srun --nodes=1 --ntasks=1 --gpus=1 ')
    assert "--precision fp16" in host_line and '--out "$STAGING/current/host.toml"' in host_line
    assert text.index(host_line) < text.index(" fit ")
    # Across the job's nodes, the collectives beside each other too ([fabric]); neither
    # measurement failing stops the calibration (set -e): the platform is fitted without it.
    fabric_line = next(line for line in text.splitlines() if " fabric --device cuda" in line)
    assert fabric_line.startswith('[ -f "$STAGING/current/fabric.toml" ] || srun perf-calibrate fabric ')
    assert text.index(fabric_line) < text.index(" fit ")
    assert all(line.rstrip().endswith(">&2") and " || echo " in line for line in (host_line, fabric_line))
    assert subprocess.run(["bash", "-n", str(job.script_path)]).returncode == 0


def test_one_node_schedules_no_fabric_measurement(tmp_path):
    job = schedule(ScheduleRequest(partition="gpu", every="30d", root=str(tmp_path), command="perf-calibrate"),
                   client=FakeSlurm(FakePartition(nodes=1)))
    assert job.nodes == 1
    text = job.script_path.read_text()
    assert " fabric " not in text and " host --device cuda" in text


def test_schedule_measures_host_costs_in_a_16_bit_precision(tmp_path):
    job = schedule(ScheduleRequest(partition="gpu", every="30d", root=str(tmp_path), command="perf-calibrate",
                                   precisions=("fp8", "bf16")), client=FakeSlurm())
    assert "host --device cuda --precision bf16" in job.script_path.read_text()


def test_time_limit_capped_at_maxtime(tmp_path):
    slurm = FakeSlurm(FakePartition(max_time_minutes=30))
    job = schedule(ScheduleRequest(partition="gpu", plan="paper", root=str(tmp_path), dry_run=True),
                   client=slurm)
    assert job.time_limit_minutes == 30 and job.notes and slurm.submitted == []
    assert "exceeds MaxTime 00:30:00" in job.notes[0]       # Slurm's spelling of a duration


def test_schedule_refuses_unknown_or_gpuless_partition(tmp_path):
    with pytest.raises(CalibrationError, match="no partition"):
        schedule(ScheduleRequest(partition="nope", root=str(tmp_path)), client=FakeSlurm())
    with pytest.raises(CalibrationError, match="no GPUs"):
        schedule(ScheduleRequest(partition="gpu", root=str(tmp_path)),
                 client=FakeSlurm(FakePartition(gpus_per_node=0)))


def test_scrontab_block_replaced_other_entries_kept(tmp_path):
    calls = []
    state = {"tab": "0 0 * * * /home/me/backup.sh\n# BEGIN perfcast-calibrate gpu\nold\n# END perfcast-calibrate gpu\n"}

    def run(argv, **kw):
        calls.append(argv)
        if argv[:2] == ["scrontab", "-l"]:
            return subprocess.CompletedProcess(argv, 0, state["tab"], "")
        state["tab"] = open(argv[1]).read()
        return subprocess.CompletedProcess(argv, 0, "", "")
    line = install_scrontab("gpu", tmp_path / "s.sbatch", 30 * 86400, "#SCRON --partition=gpu", run)
    assert line.startswith("0 3 1 * * ")
    assert "/home/me/backup.sh" in state["tab"] and "old" not in state["tab"]
    assert state["tab"].count("# BEGIN perfcast-calibrate gpu") == 1
    assert cron_line(86400) == "0 3 */1 * *" and cron_line(7 * 86400) == "0 3 * * 0"
