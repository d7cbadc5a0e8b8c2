"""sbatch wall time on the dev cluster: perfcast's job_submit.lua vs a trivial one.

    python benchmarks/bench_sbatch.py [--n 200] [--base .dev-cluster]
    python benchmarks/bench_sbatch.py --distinct               # every submission a new job shape
    python benchmarks/bench_sbatch.py --distinct --concurrent 50 --n 10 --block 5   # 50 sbatch at once
    python benchmarks/bench_sbatch.py --distinct --concurrent 50 --by-process       # where the CPU went

Brings the dev cluster up (packaging/dev-cluster/up.sh; idempotent; stopped again afterwards if
it was not running before), then times ``--n`` held
submissions of a Megatron batch script per variant, alternating blocks of 20 so that drift (page
cache, slurmctld's job table growing) hits both alike.  It measures the deployment of
packaging/INSTALL.md §4-5 -- job_submit.lua on the controller and cli_filter.lua in sbatch warming
perf-predictd up (sbatch runs with the dev cluster's etc-warm/slurm.conf) -- against the same
cluster with both plugins trivial:

  perfcast: the checkout's cli_filter.lua (prewarm) and job_submit.lua -> perf-predictd
            (without --distinct: a prediction cache hit after the first)
  trivial:  a cli_filter.lua and a job_submit.lua that return slurm.SUCCESS

``--no-prewarm``: job_submit.lua alone, no cli_filter.lua in either variant (etc/slurm.conf), as
at sites where sbatch cannot reach the controller's daemon (login nodes of their own).

Switching is a symlink swap beside slurm.conf (slurmctld reloads the script when its mtime is
newer than its last load; sbatch loads cli_filter.lua afresh each time); each switch is checked in
the logs: the trivial block must not reach the daemon.  The perfcast links are restored at the
end.  Prints median/p90 per variant, how many perfcast requests found their prediction ready or
joined it in flight (and how long perf-predictd took on the joined ones: slurmctld waits on each,
one job at a time), perf-predictd's CPU time per perfcast submission (its own process; its workers
and record writer: from the kernel's scheduler statistics, so other load on the machine does not
inflate it), the spread of the ratio block by block (each perfcast block against the trivial block
beside it: what the machine's drift does to one block), and the ratio of medians (target <= 1.5;
with --concurrent, <= 2).  Jobs are cancelled afterwards.  With ``PERFCAST_DEV_TIMING=true``
(given to the dev cluster when it is brought up, here or by hand) it also prints how long
slurmctld spent in job_submit.lua per perfcast submission and how much of it was waiting for the
daemon's answer: slurmctld runs the plugin one job at a time, so in a burst that time adds up
across the queue of submissions.

``--distinct``: each submission is a job of its own shape (``--num-layers`` counts up), so every
perfcast submission is a new prediction (no cache hit, no memoised shape).  ``--concurrent N``:
each timed submission is N sbatch processes started at once; every one is timed.

It also prints the sbatch processes' own CPU per submission in each variant (the kernel's
accounting of this script's finished children: cli_filter.lua's warm-up runs inside them), and
with ``--by-process`` each variant's CPU per submission by process name, perf-predictd split into
its main process, workers and record writer ("other exited": processes gone by the block's end
that were not sbatch).  Both are CPU, not time: on a loaded machine the same work costs more CPU.

``--split``: a third variant in the same alternation, "warm-up only": the checkout's
cli_filter.lua warming perf-predictd up, with the trivial job_submit.lua.  Its time over trivial
is what the warm-ups' work costs sbatch (their CPU beside it); perfcast's time over it is
slurmctld waiting for the daemon's answer.  The last line still compares perfcast with trivial.
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRIVIAL = """function slurm_job_submit(job_desc, part_list, submit_uid) return slurm.SUCCESS end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid) return slurm.SUCCESS end
return slurm.SUCCESS
"""
TRIVIAL_CLI = """function slurm_cli_setup_defaults(options, early_pass) return slurm.SUCCESS end
function slurm_cli_pre_submit(options, offset) return slurm.SUCCESS end
function slurm_cli_post_submit(offset, jobid, stepid) return slurm.SUCCESS end
"""


@dataclass
class Served:
    """perf-predictd's log, counted so far: job_submit.lua's requests and how each was answered."""
    n: int = 0
    cached: int = 0
    joined_ms: list = field(default_factory=list)   # the daemon's time on each joined one
    offset: int = 0                                  # bytes of the log already counted

    def read(self, log: Path) -> None:
        """Count the whole lines written since the last call (one still being written: next
        time), so the log is read once however often it is polled."""
        try:
            with open(log, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:      # nothing logged yet
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].decode("utf-8", "replace").splitlines():
            if "event=request " in line:
                self.n += 1
                self.cached += " cached=1" in line
                if " joined=1" in line:
                    ms = line.split(" ms=", 1)[1].split(" ", 1)[0] if " ms=" in line else ""
                    self.joined_ms.append(float(ms) if ms.replace(".", "", 1).isdigit() else 0.0)


def thread_cpu_ns(pid: str, tid: str) -> int | None:
    """CPU time so far of one thread (ns, the kernel's scheduler statistics); None once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="submissions per variant")
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--base", default=os.environ.get("PERFCAST_DEV_BASE", str(REPO / ".dev-cluster")))
    ap.add_argument("--iters", default="2000", help="train iters in the benchmark script")
    ap.add_argument("--distinct", action="store_true", help="every submission a new job shape")
    ap.add_argument("--concurrent", type=int, default=1, metavar="N",
                    help="N submissions at once, each timed")
    ap.add_argument("--no-prewarm", action="store_true",
                    help="no cli_filter.lua warm-up: job_submit.lua alone")
    ap.add_argument("--by-process", action="store_true",
                    help="also print each variant's CPU per submission by process name")
    ap.add_argument("--split", action="store_true",
                    help="also time a warm-up-only variant (cli_filter.lua's warm-up, trivial job_submit.lua)")
    args = ap.parse_args()
    if args.split and args.no_prewarm:
        ap.error("--split times the warm-up on its own: it needs the warm-up (drop --no-prewarm)")

    env = {**os.environ, "PERFCAST_DEV_BASE": args.base}
    pid_file = Path(args.base) / "run" / "slurmctld.pid"
    was_up = pid_file.exists() and Path(f"/proc/{pid_file.read_text().strip()}").exists()
    up = subprocess.run([str(REPO / "packaging/dev-cluster/up.sh")], env=env, capture_output=True,
                        text=True)
    if up.returncode != 0:
        sys.exit(f"up.sh failed:\n{up.stderr}")
    base = Path(args.base)
    # etc-warm: CliFilterPlugins=lua as well
    env["SLURM_CONF"] = str(base / ("etc" if args.no_prewarm else "etc-warm") / "slurm.conf")
    link = base / "etc" / "job_submit.lua"
    real = REPO / "slurm_plugin" / "lua" / "job_submit.lua"
    trivial = base / "etc" / "job_submit_trivial.lua"
    trivial.write_text(TRIVIAL)
    cli_link = base / "etc-warm" / "cli_filter.lua"
    cli_real = REPO / "slurm_plugin" / "lua" / "cli_filter.lua"
    cli_trivial = base / "etc-warm" / "cli_filter_trivial.lua"
    cli_trivial.write_text(TRIVIAL_CLI)
    if not cli_link.parent.joinpath("slurm.conf").exists():
        sys.exit(f"{cli_link.parent}/slurm.conf missing: packaging/dev-cluster/up.sh makes it")
    text = (REPO / "tests/slurm/scripts/megatron_gpt.sh").read_text().replace("@ITERS@", args.iters)
    shapes = itertools.count()
    run_tag = f"{os.getpid()}-{time.time_ns()}"
    vocab = 50257 + 256 * random.randrange(1, 4096)
    lock = threading.Lock()

    def script_file() -> Path:
        """The batch script to submit: the same one, or (--distinct) one of a new shape."""
        if not args.distinct:
            path = base / "jobs" / "bench_megatron.sh"
            if not path.exists():
                path.write_text(text)
                path.chmod(0o644)
            return path
        with lock:
            k = next(shapes)
        # (layers, hidden) never seen in this run; layers divisible by the script's pipeline size
        # (2), hidden by its 16 heads; all of the size the script trains (about 1.3B parameters).
        layers, hidden = 8 + 2 * (k % 24), 2048 + 64 * (k // 24)
        path = base / "jobs" / f"bench_megatron_{k}.sh"
        # The run's own vocabulary size (a step of 256 moves the padded vocabulary too) and tag:
        # a shape or a script the daemon met in an earlier run is not new.
        path.write_text(text.replace("--num-layers 24", f"--num-layers {layers}")
                        .replace("--hidden-size 2048", f"--hidden-size {hidden}")
                        .replace("--vocab-size 50257", f"--vocab-size {vocab}")
                        .replace("set -euo pipefail", f"# bench run {run_tag}\nset -euo pipefail"))
        path.chmod(0o644)
        return path

    def point(at: Path, target: Path) -> None:
        tmp = at.with_suffix(".tmp")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target)
        os.replace(tmp, at)

    def use(target: Path, warm: bool) -> None:
        # slurmctld reloads job_submit.lua when the file's mtime is *newer than its last load*
        # (1 s resolution): let a second pass, then give the target the current time.
        time.sleep(1.05)
        os.utime(target)
        point(link, target)
        point(cli_link, cli_real if warm else cli_trivial)   # (unused with --no-prewarm)

    ids: list[str] = []
    daemon_log = base / "log" / "predictd.log"

    log = Served()

    def served(expect: int) -> None:
        """Bring ``log`` up to date with the requests from job_submit.lua so far: how many, how
        many found their outcome ready (cached) and how many joined it in flight (the warm-up
        still computing)."""
        # perf-predictd logs a request after answering it: sbatch may return before the line is
        # written, and on a loaded machine well after.  Every perfcast submission logs one line,
        # so wait (untimed, at most 5 s) until the ``expect`` lines so far have landed.
        until = time.monotonic() + 5.0
        log.read(daemon_log)
        while log.n < expect and time.monotonic() < until:
            time.sleep(0.02)
            log.read(daemon_log)

    def daemon_cpu_ns() -> tuple[int, int]:
        """CPU time so far of perf-predictd's own process and of its children (workers, record
        writer), all threads, from the kernel's scheduler statistics (ns): where the plugin's
        cost lands, whatever the machine's other load does to wall times."""
        def run_ns(pid: str) -> int:
            # (a thread or a worker that went meanwhile counts nothing)
            return sum(thread_cpu_ns(pid, tid) or 0 for tid in os.listdir(f"/proc/{pid}/task"))
        try:
            pid = (base / "run" / "predictd.pid").read_text().strip()
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            return run_ns(pid), sum(run_ns(k) for k in kids if Path(f"/proc/{k}").exists())
        except OSError:
            return 0, 0

    ctld_log = base / "log" / "slurmctld.log"
    lua_ms: list[dict[str, float]] = []   # job_submit.lua's phases per perfcast submission

    def ctld_log_size() -> int:
        try:
            return ctld_log.stat().st_size
        except OSError:
            return 0

    def lua_timings(start: int) -> list[dict[str, float]]:
        """job_submit.lua's own timing lines written since ``start`` (PERFCAST_DEV_TIMING=true):
        how long slurmctld held its job_submit lock per submission, and where it went."""
        out = []
        try:
            with open(ctld_log, "rb") as fh:
                fh.seek(start)
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return out
        for line in text.splitlines():
            if "perfcast: timing_ms " in line:
                pairs = line.split("timing_ms ", 1)[1].split()
                out.append({k: float(v) for k, v in (p.split("=", 1) for p in pairs if "=" in p)})
        return out

    def machine_cpu_ns() -> int:
        """CPU time so far of the whole machine (every process: sbatch, munged, slurmctld, the
        daemon, this script), from /proc/stat: what a submission costs all told."""
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
        return (user + nice + system + irq + softirq) * 10**9 // os.sysconf("SC_CLK_TCK")

    def tasks_cpu_ns() -> dict[tuple[str, str], tuple[str, int]]:
        """Every living thread's CPU so far (ns, the kernel's scheduler statistics), keyed by
        (pid, tid), with its process's name: where a block's CPU went (--by-process)."""
        out = {}
        try:
            daemon_pid = (base / "run" / "predictd.pid").read_text().strip()
        except OSError:
            daemon_pid = ""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                tids = os.listdir(f"/proc/{pid}/task")
                if comm.startswith("python"):     # perf-predictd's processes by their role
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"writer_main" in cmd:
                        comm = "perf-predictd writer"
                    elif b"slurm_plugin.daemon" in cmd:
                        comm = "perf-predictd" if pid == daemon_pid else "perf-predictd workers"
            except OSError:
                continue
            for tid in tids:
                ns = thread_cpu_ns(pid, tid)
                if ns is not None:
                    out[(pid, tid)] = (comm, ns)
        return out

    def by_process(before: dict, after: dict) -> dict[str, int]:
        """CPU (ns) spent between two snapshots per process name, by the threads alive at the
        second (a thread that started meanwhile counts from zero)."""
        spent: dict[str, int] = {}
        for key, (comm, ns) in after.items():
            was = before.get(key)
            used = ns - (was[1] if was is not None else 0)   # (a kworker's name changes)
            spent[comm] = spent.get(comm, 0) + max(0, used)
        return spent

    def children_cpu_ns() -> int:
        """CPU so far of this script's finished children: in a block, the sbatch commands alone
        (cli_filter.lua runs inside them)."""
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return int((ru.ru_utime + ru.ru_stime) * 1e9)

    def submit_one(script: Path, out: list) -> None:
        t0 = time.perf_counter()
        p = subprocess.run(["sbatch", "--parsable", "--hold", str(script)], env=env,
                           capture_output=True, text=True, cwd=str(base / "jobs"))
        out.append((time.perf_counter() - t0, p))

    def submit() -> list[tuple[float, str]]:
        """One submission, or --concurrent of them at once: (seconds, sbatch's stderr) each."""
        scripts = [script_file() for _ in range(args.concurrent)]
        out: list = []
        threads = [threading.Thread(target=submit_one, args=(sc, out)) for sc in scripts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for _, p in out:
            if p.returncode != 0:
                sys.exit(f"sbatch failed: {p.stderr}")
            ids.append(p.stdout.strip())
        return [(dt, p.stderr) for dt, p in out]

    # (name, job_submit.lua, cli_filter.lua's warm-up)
    variants = [("perfcast", real, True), ("trivial", trivial, False)]
    if args.split:
        variants.append(("warm-only", trivial, True))
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    cpu_ns = [0, 0]     # perf-predictd's CPU during the timed perfcast blocks: daemon, children
    machine_ns = dict.fromkeys(times, 0)    # the whole machine's CPU in each variant's blocks
    process_ns: dict[str, dict[str, int]] = {name: {} for name in times}   # --by-process
    sbatch_ns = dict.fromkeys(times, 0)     # the sbatch processes' own CPU in each variant's blocks
    cached = 0
    joined_ms: list[float] = []
    block_medians: dict[str, list[float]] = {name: [] for name in times}
    sample = {}
    # Requests perf-predictd has logged: those of earlier runs, then one per perfcast submission.
    served(0)
    expect = log.n
    try:
        for name, target, warm in variants:   # warm each
            use(target, warm)
            for _ in range(3):
                sample[name] = submit()[0][1]
                expect += args.concurrent if name == "perfcast" else 0
        done = 0
        while done < args.n:
            k = min(args.block, args.n - done)
            for name, target, warm in variants:
                use(target, warm)
                submit()   # the first call after a switch reloads the script: not timed
                expect += args.concurrent if name == "perfcast" else 0
                served(expect)
                before_n, before_cached, before_joined = log.n, log.cached, len(log.joined_ms)
                cpu_before = daemon_cpu_ns()
                log_before = ctld_log_size()
                tasks_before = tasks_cpu_ns() if args.by_process else {}
                sbatch_before = children_cpu_ns()
                machine_before = machine_cpu_ns()
                block: list[float] = []
                for _ in range(k):
                    block.extend(dt for dt, _ in submit())
                machine_ns[name] += machine_cpu_ns() - machine_before
                sbatch_ns[name] += children_cpu_ns() - sbatch_before
                if args.by_process:
                    for comm, ns in by_process(tasks_before, tasks_cpu_ns()).items():
                        process_ns[name][comm] = process_ns[name].get(comm, 0) + ns
                cpu_after = daemon_cpu_ns()
                times[name].extend(block)
                block_medians[name].append(statistics.median(block))
                want = k * args.concurrent if name == "perfcast" else 0
                expect += want
                served(expect)
                if name == "perfcast":
                    lua_ms.extend(lua_timings(log_before))
                    cpu_ns[0] += cpu_after[0] - cpu_before[0]
                    cpu_ns[1] += cpu_after[1] - cpu_before[1]
                    cached += log.cached - before_cached
                    joined_ms.extend(log.joined_ms[before_joined:])
                reached = log.n - before_n
                if reached != want:
                    sys.exit(f"{name} block: {reached} of its {k * args.concurrent} submissions "
                             f"reached the daemon (expected {want}); the job_submit.lua switch did not take")
            done += k
    finally:
        use(real, True)
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
    n_perfcast = len(times["perfcast"])
    print(f"perfcast requests answered from a ready or in-flight prediction: "
          f"{cached + len(joined_ms)} of {n_perfcast} (ready {cached}, joined in flight {len(joined_ms)})")
    if joined_ms:
        print(f"  the joined ones (slurmctld waits on each, one job at a time): perf-predictd's time "
              f"on them median {statistics.median(joined_ms):.2f} ms, mean {statistics.fmean(joined_ms):.2f} ms, "
              f"max {max(joined_ms):.2f} ms")
    # Each block against the trivial block beside it: how far the machine's drift moves the ratio.
    pairs = sorted(p / t for p, t in zip(block_medians["perfcast"], block_medians["trivial"]))
    print(f"ratio of block medians, block by block ({len(pairs)} pairs): min {pairs[0]:.2f}, "
          f"median {statistics.median(pairs):.2f}, max {pairs[-1]:.2f}")
    n = max(1, n_perfcast)
    print(f"perf-predictd CPU per perfcast submission: daemon {cpu_ns[0] / n / 1e6:.2f} ms, "
          f"its workers and record writer {cpu_ns[1] / n / 1e6:.2f} ms")
    if lua_ms:
        total = [t.get("total", 0.0) for t in lua_ms]
        answer = [t.get("answer", 0.0) for t in lua_ms]
        print(f"job_submit.lua per perfcast submission (slurmctld runs it one job at a time): "
              f"median {statistics.median(total):.2f} ms, mean {statistics.fmean(total):.2f} ms, "
              f"of which waiting for the answer: median {statistics.median(answer):.2f} ms, "
              f"mean {statistics.fmean(answer):.2f} ms")
    else:
        print("job_submit.lua's own timing: not logged (bring the dev cluster up with "
              "PERFCAST_DEV_TIMING=true to see it)")
    print("the machine's CPU per submission (every process, its other load included): "
          + ", ".join(f"{name} {machine_ns[name] / max(1, len(times[name])) / 1e6:.2f} ms"
                      for name in times))
    print("the sbatch processes' own CPU per submission (cli_filter.lua runs in them): "
          + ", ".join(f"{name} {sbatch_ns[name] / max(1, len(times[name])) / 1e6:.2f} ms"
                      for name in times))
    if args.by_process:
        # What the living processes and the sbatch commands do not account for ran in other
        # processes that exited within the block (or is the two clocks' disagreement).
        print("CPU per submission by process (ms; 'other exited': processes other than sbatch "
              "gone by the block's end):")
        for name in times:
            per = max(1, len(times[name])) * 1e6
            spent = dict(process_ns[name])
            spent["sbatch"] = sbatch_ns[name]
            spent["other exited"] = max(0, machine_ns[name] - sum(spent.values()))
            top = sorted(spent.items(), key=lambda kv: -kv[1])[:8]
            print(f"  {name:9s} " + ", ".join(f"{comm} {ns / per:.2f}" for comm, ns in top))
    print(f"({'new job shapes' if args.distinct else 'one job shape'}, {args.concurrent} at once, "
          f"{'no warm-up' if args.no_prewarm else 'cli_filter.lua warm-up'})")
    print(f"target: median ratio <= {1.5 if args.concurrent == 1 else 2}")
    # The last line as issue 33 names it (scripts read the ratio from it).
    print(f"median ratio perfcast/trivial = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
