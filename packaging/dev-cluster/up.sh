#!/usr/bin/env bash
# A throwaway, real Slurm 22.05 on localhost (as root) with perfcast's job_submit.lua and
# perf-predictd from this checkout.  64 nodes x 8 fake GPUs are defined so that big training jobs
# are accepted (and stay pending); one slurmd (dev001) runs, so small jobs really run.
#
#   eval "$(packaging/dev-cluster/up.sh)"     # prints: export SLURM_CONF=... PERFCAST_CONFIG=...
#   packaging/dev-cluster/down.sh
#
# Accounting is real: a private MariaDB (own datadir, socket and port under $BASE; no system
# service) holds slurm_acct_db, slurmdbd serves it, slurmctld stores jobs there, so `sacct` answers
# for jobs run here (as `perf-calibrate harvest` uses it on a real cluster).  If MariaDB or slurmdbd
# cannot start, up.sh fails and says why: a cluster that silently lost accounting would let the
# sacct path of the harvest go untested.  PERFCAST_DEV_NO_ACCOUNTING=1 opts out explicitly
# (accounting_storage/none; sacct then has nothing, the harvest falls back to scontrol); refused
# under CI=true, where the accounting path must run.
#
# Idempotent: what already runs (pid file + /proc/PID/comm) is left alone.  Everything lives under
# $PERFCAST_DEV_BASE (default <repo>/.dev-cluster).  Only our own messages go to stderr; stdout
# carries the export line only.
# Environment: PERFCAST_DEV_BASE, PERFCAST_DEV_PORT (slurmctld port, default 6817; slurmd +1,
# unused +2, slurmdbd +3, MariaDB +4; or PERFCAST_DEV_DBD_PORT, PERFCAST_DEV_DB_PORT),
# PERFCAST_PYTHON (python for perf-predictd; default: python3 on PATH), PERFCAST_DEV_NO_DAEMON=1,
# PERFCAST_DEV_NO_ACCOUNTING=1, PERFCAST_DEV_NO_WATCH=1 (no `perf-calibrate watch --every 15`),
# PERFCAST_DEV_LOG_LEVEL=debug + PERFCAST_DEV_TIMING=true (per-phase timings of each submission in
# predictd.log and slurmctld.log; restart the daemon and touch job_submit.lua to apply),
# PERFCAST_DEV_PLATFORMS=DIR[:DIR...] (given to perf-predictd as PERFCAST_PLATFORMS, which env -i
# would drop: an overlay made by `perf-calibrate harvest --refit --root DIR --pid-file
# $BASE/run/predictd.pid` is then hot-reloaded; unset: the daemon searches /var/lib/perfcast/platforms
# and the shipped platforms, as before; read when up.sh starts the daemon, not by a running one).
#
# The watch (docs/watch.md) runs every 15 s with a policy that also extends limits users set,
# small margins (1 min) and shrinks that return 2 min or more, so that test jobs of a few minutes
# show every action, in partitions `watch` (MaxTime 1 h) and `watchshort` (MaxTime 5 min: a job
# outgrows it quickly); the other partitions are not watched.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BASE="${PERFCAST_DEV_BASE:-$REPO/.dev-cluster}"
PORT="${PERFCAST_DEV_PORT:-6817}"
SLURMD_PORT=$((PORT + 1))
DEAD_PORT=$((PORT + 2))     # nodes dev002-064 "live" here; nothing listens, so they stay down
DBD_PORT="${PERFCAST_DEV_DBD_PORT:-$((PORT + 3))}"   # slurmdbd
DB_PORT="${PERFCAST_DEV_DB_PORT:-$((PORT + 4))}"     # MariaDB (127.0.0.1 only)
ACCOUNTING=1
[ "${PERFCAST_DEV_NO_ACCOUNTING:-0}" = 1 ] && ACCOUNTING=0
PY="${PERFCAST_PYTHON:-$(command -v python3)}"
PY="$("$PY" -c 'import sys; print(sys.executable)')"   # pyenv shims do not survive env -i
HOST="$(hostname -s)"
CLEAN_ENV=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)

say() { echo "dev-cluster: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (slurmctld, slurmd and munged run as root here)"
if [ "$ACCOUNTING" = 0 ] && [ "${CI:-}" = true ]; then
  die "PERFCAST_DEV_NO_ACCOUNTING=1 under CI=true: CI must run the accounting path (slurmdbd + MariaDB)"
fi

# ---- packages (CI installs them; a fresh machine gets them here)
need=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
[ -e /usr/share/lua/5.1/socket.lua ] || need+=(lua-socket)
if [ "$ACCOUNTING" = 1 ]; then
  command -v slurmdbd >/dev/null 2>&1 || need+=(slurmdbd)
  { command -v mariadbd && command -v mariadb-install-db; } >/dev/null 2>&1 || need+=(mariadb-server)
fi
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
     --no-install-recommends "${need[@]}") >&2 || die "apt-get install ${need[*]} failed"
fi

alive() {  # alive PIDFILE COMM
  local pid
  [ -s "$1" ] || return 1
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ]
}

# ---- layout (BASE must be traversable by all: non-root sbatch needs munge's socket and slurm.conf)
mkdir -p "$BASE"/{etc,state,spool,log,run,dev,jobs,var} "$BASE"/munge/{etc,lib,log,run}
chmod 0755 "$BASE" "$BASE"/etc "$BASE"/run "$BASE"/munge "$BASE"/munge/run "$BASE"/dev
chmod 1777 "$BASE"/jobs            # tests write scripts here as any user
chmod 0700 "$BASE"/munge/{etc,lib,log} "$BASE"/state
d="$BASE"; while [ "$d" != / ]; do   # parents too, or nobody cannot reach the munge socket
  [ -x "$d" ] && perm=$(stat -c %A "$d") && [ "${perm:9:1}" = x -o "${perm:9:1}" = t ] \
    || chmod o+x "$d"; d="$(dirname "$d")"; done
for i in 0 1 2 3 4 5 6 7; do ln -sfn /dev/null "$BASE/dev/gpu$i"; done

CONF="$BASE/etc/slurm.conf"
write_if_changed() {  # write_if_changed FILE [MODE]  (content on stdin); returns 0 when it changed
  local tmp; tmp="$(mktemp "$1.XXXXXX")"; cat >"$tmp"; chmod "${2:-0644}" "$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
  mv -f "$tmp" "$1"; return 0
}

if [ "$ACCOUNTING" = 1 ]; then
  # jobacct_gather stays none: elapsed time, state and limits come from slurmctld itself; per-task
  # memory/CPU sampling is not what the harvest reads.  AccountingStoragePass names the munge
  # socket for connections to slurmdbd (AuthInfo covers only slurmctld's).
  ACCT_CONF="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$BASE/munge/run/munge.socket"
else
  ACCT_CONF="AccountingStorageType=accounting_storage/none"
fi
# slurmctld picks a new accounting storage up only when it restarts (not on reconfigure).
old_acct="$(grep '^AccountingStorage' "$CONF" 2>/dev/null || true)"
changed=0
write_if_changed "$CONF" <<CONF && changed=1 || true
# perfcast dev cluster (generated by packaging/dev-cluster/up.sh; edits are overwritten)
ClusterName=perfcastdev
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/munge/run/munge.socket
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$ACCT_CONF
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
# benchmarks/bench_sbatch.py --concurrent 50 --n 100 holds ~11k jobs (cancelled ones stay MinJobAge)
MaxJobCount=50000
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout=300
JobSubmitPlugins=lua
GresTypes=gpu
NodeName=dev001 NodeHostname=$HOST NodeAddr=127.0.0.1 CPUs=64 RealMemory=512000 Gres=gpu:8 State=UNKNOWN
NodeName=dev[002-064] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$DEAD_PORT CPUs=64 RealMemory=512000 Gres=gpu:8 State=DOWN Reason=dev-cluster-no-slurmd
PartitionName=gpu Nodes=dev[001-064] Default=YES MaxTime=2-00:00:00 State=UP
PartitionName=short Nodes=dev[001-064] MaxTime=01:00:00 State=UP
PartitionName=h100 Nodes=dev[001-064] MaxTime=1-00:00:00 State=UP
PartitionName=cpu Nodes=dev001 MaxTime=INFINITE State=UP
PartitionName=watch Nodes=dev001 MaxTime=01:00:00 State=UP
PartitionName=watchshort Nodes=dev001 MaxTime=00:05:00 State=UP
CONF
acct_changed=0
[ "$old_acct" = "$(grep '^AccountingStorage' "$CONF")" ] || acct_changed=1

write_if_changed "$BASE/etc/gres.conf" <<GRES && changed=1 || true
AutoDetect=off
NodeName=dev[001-064] Name=gpu File=$BASE/dev/gpu[0-7]
GRES

write_if_changed "$BASE/etc/perfcast.toml" <<TOML || true
# perfcast site config of the dev cluster (generated by up.sh)
[daemon]
socket = "$BASE/run/predictd.sock"
socket_mode = "0666"        # so the refusal of untrusted peers is testable (SO_PEERCRED decides)
slurm_user = "root"
deadline_ms = 250
user_socket = "$BASE/run/predictd-user.sock"   # for etc-cli (cli_filter.lua)
workers = $(( $(nproc) < 16 ? $(nproc) + 1 : 17 ))   # cores + 1, as INSTALL.md §5 advises with the warm-up
log_level = "${PERFCAST_DEV_LOG_LEVEL:-info}"   # debug: per-phase timings of each request
records = "$BASE/var/records.sqlite"           # for perf-calibrate harvest / report

[defaults]
policy = "fill"
margin = 0.15
startup_minutes = 5

[partitions.gpu]
platform = "perlmutter-a100"

[partitions.short]
platform = "perlmutter-a100"

[partitions.h100]
platform = "dgx-h100"

[partitions.watch]
platform = "perlmutter-a100"

[partitions.watchshort]
platform = "perlmutter-a100"

# perf-calibrate watch, run by up.sh every 15 s: a dev policy that shows every action within minutes.
# Only the two watch partitions, so that jobs of other tests keep the limits they were given.
[watch]
enabled = true
partitions = ["watch", "watchshort"]
extend_user_limits = true      # users' --time too (production default: only limits perfcast set)
max_growth = 10.0
margin = 0.10
margin_minutes = 1
shrink = true
shrink_user_limits = false
shrink_min_minutes = 2
backfill_allowance_minutes = 0
min_samples = 3
stall_minutes = 5
read_timeout_seconds = 5
TOML

# job_submit.lua's settings (Lua reads this small Lua table beside slurm.conf)
write_if_changed "$BASE/etc/perfcast_settings.lua" <<LUA || true
return { socket = "$BASE/run/predictd.sock", timeout_ms = 300, timing = ${PERFCAST_DEV_TIMING:-false} }
LUA
# The plugin comes from the checkout (slurmctld reloads it when its mtime changes); a benchmark
# may point this link at a trivial script for comparison.
[ -L "$BASE/etc/job_submit.lua" ] || [ ! -e "$BASE/etc/job_submit.lua" ] \
  || rm -f "$BASE/etc/job_submit.lua"
[ -e "$BASE/etc/job_submit.lua" ] || ln -sfn "$REPO/slurm_plugin/lua/job_submit.lua" "$BASE/etc/job_submit.lua"

# A client-side config with cli_filter.lua (the login-node alternative), same cluster.
mkdir -p "$BASE/etc-cli"; chmod 0755 "$BASE/etc-cli"
sed -e 's/^JobSubmitPlugins=lua$/CliFilterPlugins=lua/' "$CONF" \
  | write_if_changed "$BASE/etc-cli/slurm.conf" || true
ln -sfn "$BASE/etc/gres.conf" "$BASE/etc-cli/gres.conf"
ln -sfn "$REPO/slurm_plugin/lua/cli_filter.lua" "$BASE/etc-cli/cli_filter.lua"
write_if_changed "$BASE/etc-cli/perfcast_settings.lua" <<LUA || true
return { socket = "$BASE/run/predictd-user.sock", timeout_ms = 1000 }
LUA

# The deployment with cli_filter.lua warming perf-predictd up for job_submit.lua (packaging/
# INSTALL.md §5): sbatch with SLURM_CONF=$BASE/etc-warm/slurm.conf.  A benchmark may point its
# cli_filter.lua link at a trivial one for comparison.
mkdir -p "$BASE/etc-warm"; chmod 0755 "$BASE/etc-warm"
sed -e 's/^JobSubmitPlugins=lua$/JobSubmitPlugins=lua\nCliFilterPlugins=lua/' "$CONF" \
  | write_if_changed "$BASE/etc-warm/slurm.conf" || true
ln -sfn "$BASE/etc/gres.conf" "$BASE/etc-warm/gres.conf"
[ -L "$BASE/etc-warm/cli_filter.lua" ] \
  || ln -sfn "$REPO/slurm_plugin/lua/cli_filter.lua" "$BASE/etc-warm/cli_filter.lua"
write_if_changed "$BASE/etc-warm/perfcast_settings.lua" <<LUA || true
return { socket = "$BASE/run/predictd-user.sock", timeout_ms = 300, prewarm = true }
LUA

# ---- munge
if ! alive "$BASE/munge/run/munged.pid" munged; then
  if [ ! -s "$BASE/munge/etc/munge.key" ]; then
    dd if=/dev/urandom of="$BASE/munge/etc/munge.key" bs=1024 count=1 status=none
  fi
  chmod 0400 "$BASE/munge/etc/munge.key"
  rm -f "$BASE/munge/run/munge.socket" "$BASE/munge/run/munge.socket.lock"
  "${CLEAN_ENV[@]}" munged -S "$BASE/munge/run/munge.socket" \
      --key-file="$BASE/munge/etc/munge.key" --log-file="$BASE/munge/log/munged.log" \
      --pid-file="$BASE/munge/run/munged.pid" --seed-file="$BASE/munge/lib/munged.seed" \
      || die "munged did not start (see $BASE/munge/log/munged.log)"
  say "munged started"
fi

# ---- accounting: MariaDB -> slurmdbd -> the cluster registered (before slurmctld, which sends
# its job records to slurmdbd from the start)
acct_fail() {  # acct_fail WHAT LOG...
  local what="$1"; shift
  say "ERROR: $what; the last lines of its log:"
  for f in "$@"; do [ -s "$f" ] && tail -n 8 "$f" | sed 's/^/    /' >&2; done
  die "accounting unavailable (see $*); PERFCAST_DEV_NO_ACCOUNTING=1 runs the dev cluster without it"
}
if [ "$ACCOUNTING" = 1 ]; then
  DB="$BASE/mysql"
  mkdir -p "$DB"/{data,run,log}
  chmod 0700 "$DB" "$DB"/data "$DB"/run "$DB"/log     # root only: the data and the password
  mycnf_changed=0
  write_if_changed "$DB/my.cnf" <<MYCNF && mycnf_changed=1 || true
# private MariaDB of the perfcast dev cluster (generated by up.sh)
[mysqld]
datadir=$DB/data
socket=$DB/run/mysqld.sock
pid-file=$DB/run/mariadbd.pid
log-error=$DB/log/mariadbd.log
port=$DB_PORT
bind-address=127.0.0.1
skip-name-resolve
# a handful of small tables: little memory, and start/stop in about a second
innodb_buffer_pool_size=32M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=2
performance_schema=OFF
MYCNF
  MYSQL=(mariadb --no-defaults --socket="$DB/run/mysqld.sock" -u root)
  if alive "$DB/run/mariadbd.pid" mariadbd && [ "$mycnf_changed" = 1 ]; then   # a new port, say
    say "mariadb settings changed: restarting it"
    kill -TERM "$(cat "$DB/run/mariadbd.pid")" 2>/dev/null || true
    for _ in $(seq 1 300); do alive "$DB/run/mariadbd.pid" mariadbd || break; sleep 0.1; done
  fi
  if ! alive "$DB/run/mariadbd.pid" mariadbd; then
    # A datadir without our marker is a half-made one (an interrupted first start): make it anew.
    if [ ! -e "$DB/data/.perfcast-initialized" ]; then
      rm -rf "$DB/data"; mkdir -m 0700 "$DB/data"
      "${CLEAN_ENV[@]}" mariadb-install-db --defaults-file="$DB/my.cnf" --user=root \
          --auth-root-authentication-method=socket --skip-test-db >"$DB/log/install.log" 2>&1 \
        || acct_fail "mariadb-install-db failed" "$DB/log/install.log"
      touch "$DB/data/.perfcast-initialized"
    fi
    rm -f "$DB/run/mysqld.sock" "$DB/run/mariadbd.pid"
    "${CLEAN_ENV[@]}" setsid mariadbd --defaults-file="$DB/my.cnf" --user=root \
        </dev/null >>"$DB/log/mariadbd.out" 2>&1 &
    dbpid=$!
    for _ in $(seq 1 300); do
      mariadb-admin --no-defaults --socket="$DB/run/mysqld.sock" -u root ping >/dev/null 2>&1 && break
      kill -0 "$dbpid" 2>/dev/null || break; sleep 0.1
    done
    mariadb-admin --no-defaults --socket="$DB/run/mysqld.sock" -u root ping >/dev/null 2>&1 \
      || acct_fail "MariaDB did not start (port $DB_PORT)" "$DB/log/mariadbd.log" "$DB/log/mariadbd.out"
    say "mariadb started (port $DB_PORT)"
  fi
  # slurmdbd's database password: made once, kept with the data (root only).
  if [ ! -s "$DB/slurm.pw" ]; then
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DB/slurm.pw")
  fi
  PW="$(cat "$DB/slurm.pw")"
  # Idempotent: the user gets the current password and the grant every time (cheap, silent).
  "${MYSQL[@]}" >"$DB/log/setup.log" 2>&1 <<SQL || acct_fail "cannot create slurm_acct_db and its user" "$DB/log/setup.log"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$PW';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$PW';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$PW';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$PW';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

  # slurmdbd reads slurmdbd.conf beside $SLURM_CONF and refuses it unless it is mode 0600 and
  # owned by its SlurmUser (root here): it holds the database password.
  dbd_changed=0
  write_if_changed "$BASE/etc/slurmdbd.conf" 0600 <<DBD && dbd_changed=1 || true
# slurmdbd of the perfcast dev cluster (generated by up.sh; edits are overwritten)
AuthType=auth/munge
AuthInfo=socket=$BASE/munge/run/munge.socket
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$BASE/run/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$PW
StorageLoc=slurm_acct_db
DBD
  chown root:root "$BASE/etc/slurmdbd.conf"
  if alive "$BASE/run/slurmdbd.pid" slurmdbd && [ "$dbd_changed" = 1 ]; then
    kill -TERM "$(cat "$BASE/run/slurmdbd.pid")" 2>/dev/null || true
    for _ in $(seq 1 100); do alive "$BASE/run/slurmdbd.pid" slurmdbd || break; sleep 0.1; done
  fi
  if ! alive "$BASE/run/slurmdbd.pid" slurmdbd; then
    rm -f "$BASE/run/slurmdbd.pid"
    "${CLEAN_ENV[@]}" SLURM_CONF="$CONF" slurmdbd >>"$BASE/log/slurmdbd.out" 2>&1 \
      || acct_fail "slurmdbd did not start" "$BASE/log/slurmdbd.log" "$BASE/log/slurmdbd.out"
    say "slurmdbd starting (port $DBD_PORT)"
  fi
  # The first start creates the tables (a few seconds); sacctmgr answers once slurmdbd serves.
  # slurmdbd daemonizes and writes its pid file a moment later: wait for it before taking a
  # missing process for a dead one.
  for _ in $(seq 1 100); do [ -s "$BASE/run/slurmdbd.pid" ] && break; sleep 0.1; done
  ok=0; deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if clusters="$(SLURM_CONF="$CONF" timeout 10 sacctmgr -n -P show cluster format=cluster 2>/dev/null)"; then
      ok=1; break; fi
    alive "$BASE/run/slurmdbd.pid" slurmdbd || break
    sleep 0.2
  done
  [ "$ok" = 1 ] || acct_fail "slurmdbd not answering on port $DBD_PORT" "$BASE/log/slurmdbd.log" "$BASE/log/slurmdbd.out"
  if ! grep -qx perfcastdev <<<"$clusters"; then
    SLURM_CONF="$CONF" sacctmgr -i add cluster perfcastdev >"$BASE/log/sacctmgr.log" 2>&1 \
      || acct_fail "sacctmgr add cluster perfcastdev failed" "$BASE/log/sacctmgr.log"
    say "cluster perfcastdev added to the accounting database"
  fi
fi

# ---- perf-predictd (before slurmctld, so the first submissions already get predictions)
if [ "${PERFCAST_DEV_NO_DAEMON:-0}" != 1 ] && ! alive "$BASE/run/predictd.pid" python3 \
   && ! alive "$BASE/run/predictd.pid" "$(basename "$PY")" && ! alive "$BASE/run/predictd.pid" perf-predictd; then
  rm -f "$BASE/run/predictd.pid"
  # python3 from the checkout, detached into its own session: down.sh stops it by pid.
  # PERFCAST_PLATFORMS only when PERFCAST_DEV_PLATFORMS is set (":+": nothing at all otherwise).
  "${CLEAN_ENV[@]}" PYTHONPATH="$REPO" PYTHONDONTWRITEBYTECODE=1 SLURM_CONF="$CONF" MALLOC_ARENA_MAX=2 \
      ${PERFCAST_DEV_PLATFORMS:+"PERFCAST_PLATFORMS=$PERFCAST_DEV_PLATFORMS"} setsid "$PY" -m slurm_plugin.daemon \
      --config "$BASE/etc/perfcast.toml" --pid-file "$BASE/run/predictd.pid" \
      --log-file "$BASE/log/predictd.log" </dev/null >>"$BASE/log/predictd.out" 2>&1 &
  for _ in $(seq 1 300); do [ -s "$BASE/run/predictd.pid" ] && break; sleep 0.1
    kill -0 $! 2>/dev/null || break; done
  [ -s "$BASE/run/predictd.pid" ] || die "perf-predictd did not start: $(tail -n 5 "$BASE/log/predictd.out" "$BASE/log/predictd.log" 2>/dev/null)"
  say "perf-predictd started (pid $(cat "$BASE/run/predictd.pid"))${PERFCAST_DEV_PLATFORMS:+ with PERFCAST_PLATFORMS=$PERFCAST_DEV_PLATFORMS}"
fi

# ---- slurmctld
export SLURM_CONF="$CONF"
if alive "$BASE/run/slurmctld.pid" slurmctld && [ "$acct_changed" = 1 ]; then
  say "accounting storage changed: restarting slurmctld"
  kill -TERM "$(cat "$BASE/run/slurmctld.pid")" 2>/dev/null || true
  for _ in $(seq 1 100); do alive "$BASE/run/slurmctld.pid" slurmctld || break; sleep 0.1; done
fi
if ! alive "$BASE/run/slurmctld.pid" slurmctld; then
  "${CLEAN_ENV[@]}" SLURM_CONF="$CONF" slurmctld -f "$CONF" || die "slurmctld did not start"
  say "slurmctld starting"
elif [ "$changed" = 1 ]; then
  scontrol reconfigure >&2 || true
fi
for _ in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
scontrol ping 2>/dev/null | grep -q 'is UP' || die "slurmctld not answering (see $BASE/log/slurmctld.log)"

# ---- slurmd (dev001 only)
if ! alive "$BASE/run/slurmd-dev001.pid" slurmd; then
  mkdir -p "$BASE/spool/dev001"
  "${CLEAN_ENV[@]}" SLURM_CONF="$CONF" slurmd -f "$CONF" -N dev001 || die "slurmd did not start"
  say "slurmd (dev001) starting"
fi
for _ in $(seq 1 100); do
  st="$(sinfo -h -n dev001 -p cpu -o %t 2>/dev/null || true)"
  case "$st" in idle|mix|alloc|comp) break ;;
    drain*|drng|down*) scontrol update nodename=dev001 state=resume 2>/dev/null || true ;; esac
  sleep 0.1
done
case "$st" in idle|mix|alloc|comp) ;; *) die "node dev001 is '$st' (see $BASE/log/slurmd-dev001.log)";; esac

# ---- perf-predictd's lookup of Slurm's partitions (for its user socket: cli_filter.lua's
# requests name none), which could only succeed once slurmctld answered: "up" means it is done,
# so that the first submission through cli_filter.lua finds the partitions known.
if [ "${PERFCAST_DEV_NO_DAEMON:-0}" != 1 ] && [ -s "$BASE/run/predictd.pid" ]; then
  dpid="$(cat "$BASE/run/predictd.pid")"
  for _ in $(seq 1 150); do
    awk -v ready="event=ready pid=$dpid " 'index($0, ready) {seen = 1}
      seen && /event=slurm_partitions/ {found = 1} END {exit !found}' "$BASE/log/predictd.log" && break
    sleep 0.1
  done
fi

# ---- perf-calibrate watch, every 15 s (after slurmctld: it asks it for the running jobs)
if [ "${PERFCAST_DEV_NO_WATCH:-0}" != 1 ] && ! alive "$BASE/run/watch.pid" "$(basename "$PY")" \
   && ! alive "$BASE/run/watch.pid" python3; then
  mkdir -p "$BASE/var/runs"
  "${CLEAN_ENV[@]}" PYTHONPATH="$REPO" PYTHONDONTWRITEBYTECODE=1 SLURM_CONF="$CONF" setsid "$PY" -m calibrate.cli \
      watch --every 15 --config "$BASE/etc/perfcast.toml" --out "$BASE/var/runs" \
      </dev/null >>"$BASE/log/watch.log" 2>&1 &
  echo $! >"$BASE/run/watch.pid"
  say "perf-calibrate watch started (every 15 s, pid $!, log $BASE/log/watch.log)"
fi

say "up: $(sinfo -h -o '%P %D %t' | tr '\n' ' ')"
echo "export SLURM_CONF=$CONF PERFCAST_CONFIG=$BASE/etc/perfcast.toml"
