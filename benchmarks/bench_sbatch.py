"""sbatch wall time on the dev cluster: perfcast's job_submit.lua vs a trivial one.

    python benchmarks/bench_sbatch.py [--n 200] [--base .dev-cluster]

Brings the dev cluster up (packaging/dev-cluster/up.sh; idempotent; stopped again afterwards if
it was not running before), then times ``--n`` held
submissions of a Megatron batch script per variant, alternating blocks of 20 so that drift (page
cache, slurmctld's job table growing) hits both alike:

  perfcast: the checkout's job_submit.lua -> perf-predictd (a prediction cache hit after the first)
  trivial:  a job_submit.lua that returns slurm.SUCCESS

Switching is a symlink swap beside slurm.conf (slurmctld reloads the script when its mtime is
newer than its last load); each switch is checked in the logs: the trivial block must not reach
the daemon.  The perfcast link is restored at the end.  Prints median/p90 per variant and the ratio
of medians (target <= 1.5).  Jobs are cancelled afterwards.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRIVIAL = """function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end
return slurm.SUCCESS
"""


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="submissions per variant")
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--base", default=os.environ.get("PERFCAST_DEV_BASE", str(REPO / ".dev-cluster")))
    ap.add_argument("--iters", default="2000", help="train iters in the benchmark script")
    args = ap.parse_args()

    env = {**os.environ, "PERFCAST_DEV_BASE": args.base}
    pid_file = Path(args.base) / "run" / "slurmctld.pid"
    was_up = pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip()}").exists()
    up = subprocess.run([str(REPO / "packaging/dev-cluster/up.sh")], env=env, capture_output=True,
                        text=True)
    if up.returncode != 0:
        sys.exit(f"up.sh failed:\n{up.stderr}")
    conf = dict(kv.split("=", 1) for kv in up.stdout.split()[1:])["SLURM_CONF"]   # "export A=.. B=.."
    env["SLURM_CONF"] = conf
    base = Path(args.base)
    link = base / "etc" / "job_submit.lua"
    real = REPO / "slurm_plugin" / "lua" / "job_submit.lua"
    trivial = base / "etc" / "job_submit_trivial.lua"
    trivial.write_text(TRIVIAL)
    script = base / "jobs" / "bench_megatron.sh"
    script.write_text((REPO / "tests/slurm/scripts/megatron_gpt.sh").read_text()
                      .replace("@ITERS@", args.iters))
    script.chmod(0o644)

    def use(target: Path) -> None:
        # slurmctld reloads job_submit.lua when the file's mtime is *newer than its last load*
        # (1 s resolution): let a second pass, then give the target the current time.
        time.sleep(1.05)
        os.utime(target)
        tmp = link.with_suffix(".tmp")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target)
        os.replace(tmp, link)

    ids: list[str] = []
    daemon_log = base / "log" / "predictd.log"

    def served() -> int:
        with open(daemon_log, errors="replace") as fh:
            return sum(1 for line in fh if "event=request " in line)

    def submit() -> tuple[float, str]:
        t0 = time.perf_counter()
        p = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], env=env,
                           capture_output=True, text=True, cwd=str(base / "jobs"))
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"sbatch failed: {p.stderr}")
        ids.append(p.stdout.strip())
        return dt, p.stderr

    times = {"perfcast": [], "trivial": []}
    sample = {}
    try:
        for name, target in (("perfcast", real), ("trivial", trivial)):   # warm both
            use(target)
            for _ in range(3):
                _, sample[name] = submit()
        done = 0
        while done < args.n:
            k = min(args.block, args.n - done)
            for name, target in (("perfcast", real), ("trivial", trivial)):
                use(target)
                submit()   # the first call after a switch reloads the script: not timed
                before = served()
                for _ in range(k):
                    times[name].append(submit()[0])
                reached = served() - before
                if (name == "trivial") != (reached == 0):
                    sys.exit(f"{name} block: {reached} of {k} submissions reached the daemon; "
                             "the job_submit.lua switch did not take")
            done += k
    finally:
        use(real)
        for i in range(0, len(ids), 200):
            subprocess.run(["scancel", *ids[i:i + 200]], env=env)
        if not was_up:   # leave the machine as we found it
            subprocess.run([str(REPO / "packaging/dev-cluster/down.sh")], env=env,
                           capture_output=True)

    print(f"perfcast message: {sample['perfcast'].strip()!r}")
    for name, ts in times.items():
        ms = [t * 1e3 for t in ts]
        print(f"{name:9s} n={len(ms)}  median={statistics.median(ms):6.2f} ms  "
              f"p90={pct(ms, 90):6.2f} ms  p99={pct(ms, 99):6.2f} ms  mean={statistics.fmean(ms):6.2f} ms")
    ratio = statistics.median(times["perfcast"]) / statistics.median(times["trivial"])
    print(f"median ratio perfcast/trivial = {ratio:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
