#!/usr/bin/env bash
# Start a single-node Slurm on this machine (munge, slurmctld, slurmd on localhost) for the Slurm test
# of `k2bench suite submit --slurm`. Debian packages: slurmctld slurmd slurm-client munge (installed
# here with apt-get when missing and running as root). Idempotent: a running cluster is left alone.
# On success it prints `export` lines to eval; on failure it says why on stderr and exits 1, and the
# Slurm test then skips with that reason.
#
# usage: eval "$(bash ci/start_slurm.sh)"     bash ci/start_slurm.sh --stop  (ends the daemons it started)
set -euo pipefail

say() { echo "start_slurm: $*" >&2; }
fail() { say "$*"; exit 1; }

STATE=${K2BENCH_SLURM_DIR:-/tmp/k2bench-slurm}
CONF=$STATE/slurm.conf

if [ "${1:-}" = --stop ]; then
  for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" "$STATE/munged.pid"; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing slurmctld slurmd slurm-client munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurmctld slurmd slurm-client munge >"$STATE.apt.log" 2>&1 \
      || { apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y \
           --no-install-recommends slurmctld slurmd slurm-client munge >"$STATE.apt.log" 2>&1; } \
      || fail "apt-get could not install Slurm (see $STATE.apt.log)"
  else
    fail "Slurm is not installed (slurmctld, slurmd, sbatch, munged) and this is not root with apt-get"
  fi
fi
[ "$(id -u)" = 0 ] || fail "starting slurmd needs root (it runs jobs as their users)"

mkdir -p "$STATE"/{ctld,spool,log}
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))

# munge: a key, then the daemon (its socket is what sbatch and the daemons authenticate through)
if ! pgrep -x munged >/dev/null; then
  STARTED_MUNGE=1
  [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 \
                                   2>/dev/null; chmod 400 /etc/munge/munge.key; }
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  if id munge >/dev/null 2>&1; then
    su -s /bin/sh munge -c "munged" 2>"$STATE/log/munged.err" || munged --force 2>"$STATE/log/munged.err" \
      || fail "munged did not start: $(tail -1 "$STATE/log/munged.err")"
  else
    munged --force 2>"$STATE/log/munged.err" || fail "munged did not start: $(tail -1 "$STATE/log/munged.err")"
  fi
fi

cat >"$CONF" <<CONF
ClusterName=k2bench
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
export SLURM_CONF=$CONF

if [ -n "${STARTED_MUNGE:-}" ]; then pgrep -x munged | head -1 >"$STATE/munged.pid"; fi

pgrep -x slurmctld >/dev/null || slurmctld -f "$CONF" || fail "slurmctld did not start: $(tail -3 "$STATE/log/slurmctld.log" 2>/dev/null)"
pgrep -x slurmd >/dev/null || slurmd -f "$CONF" || fail "slurmd did not start: $(tail -3 "$STATE/log/slurmd.log" 2>/dev/null)"

for _ in $(seq 1 60); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    say "Slurm is up on $HOST ($CPUS CPUs); state in $STATE"
    echo "export SLURM_CONF=$CONF"
    exit 0
  fi
  scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
  sleep 1
done
fail "the node did not become idle within 60 s: $(sinfo -h -o '%T %E' 2>&1 | head -1); logs in $STATE/log"
