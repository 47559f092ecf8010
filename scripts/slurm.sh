#!/bin/bash
# A one-node Slurm on this machine, for the study engine's Slurm tests (issue 47) and for trying `--executor slurm`:
# Debian's slurm-wlm and munge, a slurm.conf without cgroups (proctrack/linuxproc, task/none), slurmctld and slurmd.
#   bash scripts/slurm.sh up      install if missing, write the config, start munged, slurmctld and slurmd; wait
#                                 until the node takes jobs (make slurm-up)
#   bash scripts/slurm.sh down    stop the daemons (make slurm-down); the packages stay
#   bash scripts/slurm.sh status  sinfo, or why not
# Needs root (or sudo) for apt-get and the daemons. The partition is "debug" (every CPU of this machine; memory as
# the OS reports it, less 1 GiB); jobs may be requeued (JobRequeue=1).
set -euo pipefail
ROOT=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
CONF=/etc/slurm/slurm.conf
STATE=/var/spool/angpt-slurm
LOGS=/var/log/angpt-slurm

install() {
  command -v slurmctld > /dev/null && command -v munged > /dev/null && return
  $ROOT apt-get update -q > /dev/null
  DEBIAN_FRONTEND=noninteractive $ROOT apt-get install -y -q slurm-wlm munge > /dev/null
}

config() {
  local host cpus mem
  host=$(hostname -s); cpus=$(nproc); mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  $ROOT mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" "$LOGS"
  $ROOT tee "$CONF" > /dev/null <<CONF
# written by angpt's scripts/slurm.sh: one node, no cgroups, no accounting
ClusterName=angpt
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait=30
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

munge_up() {
  # a munged that answers (a dead one's zombie or stale socket does not: start another over it)
  munge -n 2> /dev/null | unmunge > /dev/null 2>&1 && return
  if [ ! -s /etc/munge/munge.key ]; then
    $ROOT mkdir -p /etc/munge && $ROOT dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  $ROOT mkdir -p /run/munge /var/lib/munge /var/log/munge
  $ROOT chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
  $ROOT chmod 0400 /etc/munge/munge.key && $ROOT chmod 0755 /run/munge
  $ROOT runuser -u munge -- /usr/sbin/munged --force
}

up() {
  install; config; munge_up
  pgrep -x slurmctld > /dev/null || $ROOT slurmctld -i
  pgrep -x slurmd > /dev/null || $ROOT slurmd
  for _ in $(seq 1 60); do
    if sinfo -h -o "%t" 2> /dev/null | grep -qE "^(idle|mix|alloc)"; then
      sinfo; return 0
    fi
    sleep 1
  done
  echo "slurm: the node did not come up in 60 s; see $LOGS" >&2; sinfo >&2 || true; exit 1
}

down() {
  $ROOT pkill -x slurmd || true
  $ROOT pkill -x slurmctld || true
  for _ in $(seq 1 30); do
    pgrep -x slurmd > /dev/null || pgrep -x slurmctld > /dev/null || return 0
    sleep 1
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) sinfo ;;
  *) echo "usage: bash scripts/slurm.sh up|down|status" >&2; exit 2 ;;
esac
