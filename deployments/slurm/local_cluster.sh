#!/usr/bin/env bash
# A one-machine Slurm cluster (slurmctld and slurmd on this host, Debian's slurm-wlm and munge),
# for the tests of `--cluster slurm` and for trying it out. Safe to run again.
#   bash deployments/slurm/local_cluster.sh start    install if missing, configure, start, wait for an idle node
#   bash deployments/slurm/local_cluster.sh stop     stop slurmd, slurmctld and munged
#   bash deployments/slurm/local_cluster.sh status
# The plugins are the cgroup-free ones (proctrack/linuxproc, task/none, no accounting), so it runs
# in containers and VMs without a delegated cgroup tree: no cgroup.conf is needed. The node offers
# HERMES_SLURM_CPUS CPUs (default 8) whatever the machine has (config_overrides), so that several
# worker jobs fit on a small machine; jobs run as the submitting user with its environment.
set -euo pipefail

log() { printf '[slurm] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

CONF=/etc/slurm/slurm.conf
NODE="$(hostname -s)"
CPUS="${HERMES_SLURM_CPUS:-8}"
MEMORY_MB="${HERMES_SLURM_MEMORY_MB:-16000}"

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
  log "installing slurm-wlm and munge"
  as_root apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
    --no-install-recommends slurm-wlm munge >/dev/null
}

configure() {
  as_root mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/munge
  as_root tee "$CONF" >/dev/null <<CONF
# written by deployments/slurm/local_cluster.sh: one node, this host
ClusterName=hermes-local
SlurmctldHost=$NODE
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$NODE CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  if [ ! -s /etc/munge/munge.key ]; then
    as_root mkdir -p /etc/munge
    as_root sh -c 'dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null'
  fi
  as_root chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  as_root chmod 0700 /etc/munge
  as_root chmod 0400 /etc/munge/munge.key
}

running() { pgrep -x "$1" >/dev/null 2>&1; }

idle() { timeout 10 sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; }

start() {
  install
  if running slurmctld && running slurmd && idle; then log "already running: $(sinfo -h -N -o '%N %t %c')"; return; fi
  configure
  running munged || as_root runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 20); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
  running slurmctld || as_root /usr/sbin/slurmctld
  running slurmd || as_root /usr/sbin/slurmd
  for _ in $(seq 60); do
    idle && { log "up: $(sinfo -h -N -o '%N %t %c CPUs')"; return; }
    # a node left down by an earlier unclean stop comes back on its own with ReturnToService=2; a drained one does not
    as_root scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  log "no idle node after 60 s; see /var/log/slurm/slurmctld.log and slurmd.log"; sinfo -N -l >&2 || true
  exit 1
}

stop() {
  for d in slurmd slurmctld; do
    if [ -s "/run/$d.pid" ]; then as_root kill "$(cat "/run/$d.pid")" 2>/dev/null || true; fi
  done
  if [ -s /run/munge/munged.pid ]; then as_root kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true; fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) sinfo -N -l ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
