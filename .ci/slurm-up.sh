#!/usr/bin/env bash
# Start (or find running) a single-node Slurm cluster on this machine, for the tests
# that submit real Slurm jobs. Installs nothing: it needs Debian's `slurm-wlm` and
# `munge` packages (.ci/run installs them) and root. No systemd, no cgroups: munged,
# slurmctld and slurmd run as plain daemons from a slurm.conf generated here with this
# machine's hostname, CPU count ($CHZ_SLURM_CPUS overrides it) and memory, under
# $CHZ_SLURM_DIR (/tmp/chz-slurm).
#
#   .ci/slurm-up.sh          start, or reuse a running cluster; last line: SLURM_CONF=<path>
#   .ci/slurm-up.sh stop     stop the daemons this script started
#
# Exit status 2 with one line on stderr says why the cluster cannot start here.
set -euo pipefail
DIR="${CHZ_SLURM_DIR:-/tmp/chz-slurm}"
CONF="$DIR/slurm.conf"
export SLURM_CONF="$CONF"

cannot() { echo "slurm-up: $*" >&2; exit 2; }

stop() {
  for d in slurmd slurmctld munged; do
    if [ -f "$DIR/$d.pid" ]; then
      pid=$(cat "$DIR/$d.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      rm -f "$DIR/$d.pid"
    fi
  done
}

if [ "${1:-}" = "stop" ]; then stop; exit 0; fi

node_idle() {
  local state
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -n 1) || return 1
  case "$state" in idle|mixed|allocated|completing) return 0 ;; *) return 1 ;; esac
}

# already running (started by an earlier call): reuse it
if [ -f "$CONF" ] && scontrol ping >/dev/null 2>&1 && node_idle; then
  echo "SLURM_CONF=$CONF"; exit 0
fi

[ "$(id -u)" -eq 0 ] || cannot "needs root to start munged, slurmctld and slurmd (uid $(id -u))"
for b in munged slurmctld slurmd sbatch squeue scontrol sinfo; do
  command -v "$b" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$b" >/dev/null 2>&1 ||
    cannot "no '$b' on PATH: install Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge)"
done
export PATH="$PATH:/usr/sbin:/sbin"

stop  # leftovers of an earlier start whose daemons died
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
host=$(hostname -s)
cpus=${CHZ_SLURM_CPUS:-$(nproc)}   # more than nproc oversubscribes (fine for CPU-emulation tests)
mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)

# munge: the authentication every Slurm message carries
if ! pgrep -x munged >/dev/null 2>&1; then
  mkdir -p /run/munge /var/lib/munge /var/log/munge /etc/munge
  if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null 2>&1; then mungekey --create --keyfile=/etc/munge/munge.key >/dev/null
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; fi
  fi
  if id munge >/dev/null 2>&1; then
    chown -R munge:munge /run/munge /var/lib/munge /var/log/munge /etc/munge
    chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid || cannot "munged did not start"
    cp /run/munge/munged.pid "$DIR/munged.pid" 2>/dev/null || true
  else
    munged --force --pid-file="$DIR/munged.pid" || cannot "munged did not start"
  fi
fi
for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done
[ -S /run/munge/munge.socket.2 ] || cannot "munged started but its socket /run/munge/munge.socket.2 did not appear"

cat > "$CONF" <<EOF
# single-node test cluster written by .ci/slurm-up.sh
ClusterName=chz
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
KillWait=5
MinJobAge=600
SchedulerParameters=sched_interval=2
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Features=chz-emulate State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
# a second partition over the same node: stands for a second GPU type in the tests
PartitionName=second Nodes=ALL MaxTime=INFINITE State=UP
EOF

slurmctld -f "$CONF" || cannot "slurmctld did not start (see $DIR/log/slurmctld.log)"
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
scontrol ping >/dev/null 2>&1 || cannot "slurmctld does not answer (see $DIR/log/slurmctld.log)"
slurmd -f "$CONF" || cannot "slurmd did not start (see $DIR/log/slurmd.log)"
for _ in $(seq 150); do node_idle && break; sleep 0.2; done
if ! node_idle; then
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
fi
node_idle || cannot "node $host is not idle: $(sinfo -h -N -o '%T %E' | head -n 1) (see $DIR/log/slurmd.log)"
echo "slurm-up: started slurmctld and slurmd on $host ($cpus CPUs, partitions debug and second)" >&2
echo "SLURM_CONF=$CONF"
