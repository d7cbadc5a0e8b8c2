#!/usr/bin/env bash
# Stop what packaging/dev-cluster/up.sh started (by the pids in its pid files, after checking
# /proc/PID/comm), jobs first so that slurmstepd exits cleanly, slurmdbd after slurmctld (which
# hands it its last job records) and MariaDB last.  Idempotent.
# PERFCAST_DEV_PURGE=1 also removes the base directory (state, logs, keys).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BASE="${PERFCAST_DEV_BASE:-$REPO/.dev-cluster}"
say() { echo "dev-cluster: $*" >&2; }

[ -d "$BASE" ] || { say "nothing to stop ($BASE does not exist)"; exit 0; }

pid_of() {  # pid_of PIDFILE COMM...  -> pid if that process still runs under one of those names
  local pid comm
  [ -s "$1" ] || return 1
  pid="$(cat "$1" 2>/dev/null)"; [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
  comm="$(cat "/proc/$pid/comm")"; shift
  for name in "$@"; do [ "$comm" = "$name" ] && { echo "$pid"; return 0; }; done
  return 1
}

stop() {  # [STOP_WAIT=tenths] stop LABEL PIDFILE COMM...
  local label="$1" file="$2" pid; shift 2
  pid="$(pid_of "$file" "$@")" || { rm -f "$file"; return 0; }
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 "${STOP_WAIT:-50}"); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  if [ -d "/proc/$pid" ]; then kill -KILL "$pid" 2>/dev/null; say "$label killed"; else say "$label stopped"; fi
  rm -f "$file"
}

py="$(basename "$(readlink -f "$(command -v "${PERFCAST_PYTHON:-python3}")")" 2>/dev/null || echo python3)"
# The watch first: it must not act on jobs that are being cancelled.
stop "perf-calibrate watch" "$BASE/run/watch.pid" python3 python3.11 python3.12 python "$py"
if pid_of "$BASE/run/slurmctld.pid" slurmctld >/dev/null; then
  SLURM_CONF="$BASE/etc/slurm.conf" scancel --quiet --full --state=RUNNING,PENDING,SUSPENDED \
    --partition=gpu,short,h100,cpu,watch,watchshort 2>/dev/null || true
  SLURM_CONF="$BASE/etc/slurm.conf" timeout 5 bash -c \
    'while [ -n "$(squeue -h -t R,CG 2>/dev/null)" ]; do sleep 0.2; done' || true
fi
stop slurmd "$BASE/run/slurmd-dev001.pid" slurmd
# A job's own processes (slurmstepd, its batch script, srun, the training stand-in) can outlive a cancel that
# slurmd no longer sees through: those still running with this cluster's SLURM_CONF and a job id
# in their environment go too (never anything of another cluster's, or outside a job).
job_pids() {
  local d env
  for d in /proc/[0-9]*; do
    # slurmstepd (its environment is overwritten by its title) runs in slurmd's log directory
    if [ "$(cat "$d/comm" 2>/dev/null)" = slurmstepd ]; then
      [ "$(readlink "$d/cwd" 2>/dev/null)" = "$BASE/log" ] && echo "${d#/proc/}"
      continue
    fi
    env="$( { tr '\0' '\n' < "$d/environ"; } 2>/dev/null)" || continue
    case "$env" in *"SLURM_CONF=$BASE/etc"*) ;; *) continue ;; esac
    case "$env" in *SLURM_JOB_ID=*) echo "${d#/proc/}" ;; esac
  done
}
left="$(job_pids)"
if [ -n "$left" ]; then
  kill -TERM $left 2>/dev/null; sleep 0.5
  left="$(job_pids)"; [ -n "$left" ] && kill -KILL $left 2>/dev/null
  say "job processes left by slurmd stopped"
fi
# slurmctld saves its state and hands slurmdbd its pending records (~6 s with the dead nodes).
STOP_WAIT=150 stop slurmctld "$BASE/run/slurmctld.pid" slurmctld
stop slurmdbd "$BASE/run/slurmdbd.pid" slurmdbd
# MariaDB flushes InnoDB on SIGTERM (about a second); killing it would cost a recovery next start.
STOP_WAIT=300 stop mariadb "$BASE/mysql/run/mariadbd.pid" mariadbd
stop perf-predictd "$BASE/run/predictd.pid" python3 python3.11 python3.12 python "$py" perf-predictd
stop munged "$BASE/munge/run/munged.pid" munged

if [ "${PERFCAST_DEV_PURGE:-0}" = 1 ]; then
  rm -rf "$BASE"; say "removed $BASE"
fi
exit 0
