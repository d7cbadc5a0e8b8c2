"""CPU of one perf-calibrate watch pass reading ``scontrol -o show job``, by how many jobs
slurmctld knows.

    python benchmarks/bench_watch_parse.py [--jobs 1000 10000 50000] [--running 20] [--rounds 3]

Each pass of the watch asks slurmctld for every job it knows (``scontrol -o show job``: pending,
running, and finished ones for MinJobAge) and keeps the RUNNING ones.  A controller knows many
more pending and finished jobs than running ones: the dev cluster holds ~10,000 after one
``bench_sbatch.py --concurrent 50`` run, a busy site tens of thousands.  This times the parse of
such a dump (lines as Slurm 22.05 prints them, ``--running`` of them RUNNING), CPU per pass:

  all lines   every line parsed (parse_oneliner), then the RUNNING ones kept -- as before
  running     slurm_plugin.slurm_client.parse_running_jobs: lines that cannot be RUNNING
              skipped before they are parsed

and checks that both find the same jobs.  The scontrol call itself (slurmctld's work and the
output's transfer) is not timed: the same in both.
"""
from __future__ import annotations

import argparse
import statistics
import time

from slurm_plugin.slurm_client import job_is_running, parse_running_jobs, scontrol_job_lines

# One job as `scontrol -o show job` prints it (Slurm 22.05, the dev cluster; paths made generic).
LINE = (
    "JobId={jid} JobName=gpt-1.3b UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=0 "
    "Nice=0 Account=proj QOS=normal JobState={state} Reason={reason} Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime={run} TimeLimit=02:05:00 "
    "TimeMin=01:30:00 SubmitTime=2026-11-27T00:25:06 EligibleTime=Unknown AccrueTime=Unknown "
    "StartTime={start} EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-11-27T00:25:06 Scheduler=Main Partition=gpu AllocNode:Sid=login1:1234 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList={nodes} NumNodes=4-4 NumCPUs=16 NumTasks=16 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=16,mem=2000G,node=4,billing=16 Socks/Node=* "
    "NtasksPerN:B:S:C=4:0:*:* CoreSpec=* MinCPUsNode=4 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=/home/alice/jobs/pretrain_{jid}.sh WorkDir=/home/alice "
    "AdminComment=perfcast:v1 iter_s=4.91078 iters=1000 total_min=83.8 platform=perlmutter-a100 "
    "bundle=a100-sxm4-80gb@27ab504fcc2b policy=fill action=set rec_min=125 min_min=90 "
    "rec=e3ea60253aa5  StdErr=/home/alice/slurm-{jid}.out StdIn=/dev/null "
    "StdOut=/home/alice/slurm-{jid}.out Power= TresPerNode=gres:gpu:4 ")


def dump(jobs: int, running: int) -> str:
    """``jobs`` lines: every (jobs // running)-th RUNNING, the others pending or cancelled."""
    step = max(1, jobs // max(1, running))
    out = []
    for i in range(jobs):
        if running and i % step == 0 and i // step < running:
            fields = dict(state="RUNNING", reason="None", run="00:10:00",
                          start="2026-11-27T00:30:00", nodes="gpu[001-004]")
        else:
            fields = dict(state="PENDING" if i % 3 else "CANCELLED",
                          reason="JobHeldUser" if i % 3 else "None", run="00:00:00",
                          start="Unknown", nodes="")
        out.append(LINE.format(jid=1000 + i, **fields))
    return "\n".join(out) + "\n"


def all_lines(text: str) -> list[int]:
    """The RUNNING jobs' ids with every line parsed first (the watch before the pre-filter)."""
    return [jid for jid, kv in scontrol_job_lines(text) if job_is_running(kv)]


def cpu_ms(fn, text: str, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        fn(text)
        times.append((time.process_time() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000, 50000])
    ap.add_argument("--running", type=int, default=20, help="RUNNING jobs among them")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"CPU per pass (median of {args.rounds}), {args.running} RUNNING jobs among:")
    for n in args.jobs:
        text = dump(n, args.running)
        found = [j.job_id for j in parse_running_jobs(text)]
        if found != all_lines(text):
            raise SystemExit(f"{n} jobs: the pre-filter changed which jobs are RUNNING")
        before, after = cpu_ms(all_lines, text, args.rounds), cpu_ms(parse_running_jobs, text, args.rounds)
        print(f"  {n:6d} jobs ({len(text) / 2**20:5.1f} MiB): all lines {before:8.1f} ms, "
              f"running {after:7.1f} ms  ({len(found)} found)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
