"""The facts perf-calibrate watch reads from a real Slurm 22.05, as it reads them: a pending job's
reason in the backfill plan (a job waiting for its --begin time does not wait for resources), a
job's StdErr apart from its StdOut, its RunTime without the time it was suspended, and a
maintenance reservation created on its node while it runs (docs/watch.md §1-2)."""
from __future__ import annotations

import subprocess
import time

from calibrate.watch import reservation_cap

SLEEPER = "#!/bin/bash\necho out\necho err >&2\nsleep 600\n"


def _running(cluster, job_id: int, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for j in cluster.client.running_jobs():
            if j.job_id == job_id:
                return j
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not start within {timeout:.0f} s")


def _scontrol(cluster, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=cluster.env(), check=True, capture_output=True, timeout=30)


def test_the_facts_the_watch_reads(cluster):
    wdir = cluster.jobs_dir / "facts"
    wdir.mkdir(exist_ok=True)
    wdir.chmod(0o1777)
    script = wdir / "sleeper.sh"
    script.write_text(SLEEPER)
    ids = []
    resv = f"wfacts{int(time.time()) % 100000}"
    try:
        run = cluster.client.submit(script, ["--partition=cpu", "--time=20", f"--output={wdir}/run-%j.out",
                                             f"--error={wdir}/run-%j.err"], cwd=str(wdir)).job_id
        ids.append(run)
        later = cluster.client.submit(script, ["--partition=cpu", "--time=5", "--begin=now+600"],
                                      cwd=str(wdir)).job_id
        ids.append(later)
        job = _running(cluster, run)
        assert job.std_out == f"{wdir}/run-{run}.out" and job.std_err == f"{wdir}/run-{run}.err"
        # Waiting for its begin time: planned, but not on this job's end.
        end = time.monotonic() + 30
        plans = []
        while time.monotonic() < end and not plans:
            plans = [p for p in cluster.client.planned_starts() if p.job_id == later]
            time.sleep(0.5)
        assert plans and plans[0].reason == "BeginTime" and not plans[0].waits_for_resources, plans
        # Suspended for a few seconds: RunTime leaves that out, as Slurm's limit does.
        _scontrol(cluster, "suspend", str(run))
        time.sleep(6)
        _scontrol(cluster, "resume", str(run))
        job = _running(cluster, run)
        assert job.run_seconds is not None and job.start is not None
        assert time.time() - job.start - job.run_seconds >= 4.0, (job.run_seconds, time.time() - job.start)
        # A maintenance window created on its node while it runs caps an extension at its start.
        _scontrol(cluster, "create", "reservation", f"reservationname={resv}", "starttime=now+13minutes",
                  "duration=30", "nodes=dev001", "users=root", "flags=maint,ignore_jobs")
        (r,) = [r for r in cluster.client.reservations() if r.name == resv]
        assert r.nodes == ("dev001",) and "MAINT" in r.flags and 12 * 60 < r.start - time.time() <= 13 * 60
        assert reservation_cap(job, [r], ("dev001",), time.time()) == (r.start, resv)
    finally:
        subprocess.run(["scontrol", "delete", f"reservation={resv}"], env=cluster.env(), capture_output=True,
                       timeout=30)
        if ids:
            cluster.client.cancel(ids)
