"""A stand-in for Megatron's pretrain_gpt.py for the watch's tests: prints Megatron's log line every
STANDIN_LOG_INTERVAL iterations, claiming STANDIN_ITER_S seconds per iteration and really taking
that long (it sleeps), until --train-iters.  With STANDIN_GATE_AFTER=n it pauses after n lines
until slurmctld shows a time limit other than the one it started with (at most STANDIN_GATE_MAX
seconds): the job waits for the watch instead of racing it, so the outcome does not depend on how
fast this machine runs the watch's pass.  With STANDIN_START_FILE it prints nothing until that
file exists (at most STANDIN_GATE_MAX seconds)."""
import os
import subprocess
import sys
import time

iters = int(sys.argv[sys.argv.index("--train-iters") + 1])
iter_s = float(os.environ["STANDIN_ITER_S"])
every = int(os.environ.get("STANDIN_LOG_INTERVAL", "10"))
gate_after = int(os.environ.get("STANDIN_GATE_AFTER", "0"))
gate_max = float(os.environ.get("STANDIN_GATE_MAX", "120"))


def limit() -> str:
    out = subprocess.run(["scontrol", "-o", "show", "job", os.environ["SLURM_JOB_ID"]],
                         capture_output=True, text=True).stdout
    return next((t.split("=", 1)[1] for t in out.split() if t.startswith("TimeLimit=")), "")


start_file = os.environ.get("STANDIN_START_FILE", "")
if start_file:                      # the test says when to start (a backfill plan is in place)
    end = time.monotonic() + gate_max
    while not os.path.exists(start_file) and time.monotonic() < end:
        time.sleep(0.5)
start_limit = limit()
lines = 0
for i in range(every, iters + 1, every):
    time.sleep(every * iter_s)
    print(f" iteration {i:8d}/{iters:8d} | consumed samples: {8 * i:10d} | elapsed time per iteration "
          f"(ms): {1000 * iter_s:.1f} | learning rate: 1.000E-04 |", flush=True)
    lines += 1
    if gate_after and lines == gate_after:
        end = time.monotonic() + gate_max
        while limit() == start_limit and time.monotonic() < end:
            time.sleep(1)
        print(f"stand-in: time limit {start_limit} -> {limit()}", flush=True)
print("stand-in: done", flush=True)
