#!/bin/bash
# A one-node Slurm on this machine, for the study engine's Slurm tests (issue 47) and for trying `--executor slurm`:
# Debian's slurm-wlm and munge, a slurm.conf without cgroups (proctrack/linuxproc, task/none), slurmctld and slurmd.
#   bash scripts/slurm.sh up      install if missing, write the config, start munged (if none answers), slurmctld and
#                                 slurmd; wait until the node takes jobs (make slurm-up). With ours running it leaves
#                                 them be, unless the config they run on differs from this script's: then it
#                                 restarts them on this script's
#   bash scripts/slurm.sh down    stop the daemons this script started, and no other (make slurm-down); the packages
#                                 stay
#   bash scripts/slurm.sh status  sinfo, or why not
# Needs root (or sudo) for apt-get and the daemons. The partition is "debug" (every CPU of this machine; memory as
# the OS reports it, less 1 GiB); jobs may be requeued (JobRequeue=1). Ours are the daemons whose pid files are under
# /var/spool/angpt-slurm; a slurmctld or slurmd that some other Slurm started is left alone, and up stops there.
# No accounting: each job's end is written to /var/log/angpt-slurm/jobcomp.log (jobcomp/filetxt).
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

config() {  # the slurm.conf this script runs its daemons on
  local host cpus mem
  host=$(hostname -s); cpus=$(nproc); mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  cat <<CONF
# written by angpt's scripts/slurm.sh: one node, no cgroups, no accounting (jobcomp.log: each job's end)
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
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait=30
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$(pid_file slurmctld)
SlurmdPidFile=$(pid_file slurmd)
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

write_config() {
  $ROOT mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" "$LOGS"
  config | $ROOT tee "$CONF" > /dev/null
}

pid_file() {  # where daemon $1 of this script keeps its pid (munged writes as the munge user: a folder of its own)
  case $1 in
    munged) echo "$STATE/munge/munged.pid" ;;
    *) echo "$STATE/$1.pid" ;;
  esac
}

running() {  # whether pid $1 is a $2 that runs (a zombie, left for its parent to reap, has stopped)
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  [[ $stat == *"($2) "* && $stat != *"($2) Z"* ]]
}

ours() {  # the pid of this script's daemon $1 while it runs; fails when it does not
  local pid
  pid=$(cat "$(pid_file "$1")" 2> /dev/null) || return 1
  running "$pid" "$1" && echo "$pid"
}

others() {  # the pids of the $1 processes that this script did not start
  local pid mine
  mine=$(ours "$1") || true
  for pid in $(pgrep -x "$1"); do
    if [ "$pid" != "$mine" ] && running "$pid" "$1"; then echo "$pid"; fi
  done
}

stop_ours() {  # stop the daemons named, those of this script only, and wait until they have exited
  local name pid stopping=() left
  for name in "$@"; do
    pid=$(ours "$name") || continue
    $ROOT kill "$pid" && stopping+=("$pid:$name")
  done
  for _ in $(seq 1 30); do
    left=$(for p in "${stopping[@]}"; do if running "${p%%:*}" "${p#*:}"; then echo "$p"; fi; done)
    [ -z "$left" ] && return 0
    sleep 1
  done
  echo "slurm: still running after 30 s: $left" >&2; return 1
}

munge_up() {
  # a munged that answers, ours or not (a dead one's zombie or stale socket does not: start ours over it)
  munge -n 2> /dev/null | unmunge > /dev/null 2>&1 && return
  if [ ! -s /etc/munge/munge.key ]; then
    $ROOT mkdir -p /etc/munge && $ROOT dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  $ROOT mkdir -p /run/munge /var/lib/munge /var/log/munge "$STATE/munge"
  $ROOT chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge "$STATE/munge"
  $ROOT chmod 0400 /etc/munge/munge.key && $ROOT chmod 0755 /run/munge
  $ROOT runuser -u munge -- /usr/sbin/munged --force --pid-file="$(pid_file munged)"
}

up() {
  local name busy
  install
  for name in slurmctld slurmd; do
    busy=$(others "$name")
    if [ -n "$busy" ]; then
      echo "slurm: a $name this script did not start runs here (pid $busy): stop it, or use that Slurm" >&2; exit 1
    fi
  done
  if ours slurmctld > /dev/null || ours slurmd > /dev/null; then
    if [ "$(config)" != "$(cat "$CONF" 2> /dev/null)" ]; then  # never rewritten under running daemons
      echo "slurm: $CONF differs from this script's: restarting our daemons on this script's" >&2
      stop_ours slurmd slurmctld
    fi
  fi
  ours slurmctld > /dev/null || ours slurmd > /dev/null || write_config
  munge_up
  ours slurmctld > /dev/null || $ROOT slurmctld -i
  ours slurmd > /dev/null || $ROOT slurmd
  for _ in $(seq 1 60); do
    if sinfo -h -o "%t" 2> /dev/null | grep -qE "^(idle|mix|alloc)"; then
      sinfo; return 0
    fi
    sleep 1
  done
  echo "slurm: the node did not come up in 60 s; see $LOGS" >&2; sinfo >&2 || true; exit 1
}

down() {
  stop_ours slurmd slurmctld
  stop_ours munged  # after the daemons that use it, and only if this script started it
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) sinfo ;;
  *) echo "usage: bash scripts/slurm.sh up|down|status" >&2; exit 2 ;;
esac
