#!/bin/sh
# Start a one-node Slurm cluster on this machine (Debian's slurmctld, slurmd and munge) for the
# kit's Slurm executor and its tests, if none answers.
#
# Idempotent: does nothing when `sinfo` already shows this machine's node up. Otherwise it
# writes a munge key (if there is none) and a slurm.conf for one node with this machine's
# CPUs and memory, starts munged, slurmctld and slurmd, and waits until the node is idle.
# A node left DOWN or DRAINED by an earlier run (a killed slurmd, a test that downs it) is
# resumed.
#
# There is no accounting database (slurmdbd): `sacct` is unavailable, and the kit reads job
# states from `squeue` and `scontrol show job` (MinJobAge keeps finished jobs for an hour).
# Processes are tracked without cgroups (proctrack/linuxproc), which a machine that is itself
# an unprivileged container allows.
#
# Must run as root. Logs and state go under $SLURM_STATE_DIR (default /var/lib/repro-slurm).
# CI: apt-get install -y slurmctld slurmd slurm-client munge && sh containers/start-slurm.sh
set -eu

STATE=${SLURM_STATE_DIR:-/var/lib/repro-slurm}
CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
WAIT_S=${SLURM_WAIT_S:-60}
NODE=$(hostname -s)

node_state() {
    sinfo -h -n "$NODE" -o '%T' 2>/dev/null | head -n 1
}

case "$(node_state)" in
    idle | mixed | allocated | completing)
        echo "start-slurm: Slurm already answers (node $NODE $(node_state))"
        exit 0
        ;;
esac

for tool in munged slurmctld slurmd sinfo; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "start-slurm: $tool not found; install it: apt-get install -y slurmctld slurmd slurm-client munge" >&2
        exit 1
    fi
done
if [ "$(id -u)" != 0 ]; then
    echo "start-slurm: the Slurm daemons must be started as root (this is uid $(id -u))" >&2
    exit 1
fi

mkdir -p "$STATE/ctld" "$STATE/d" "$STATE/log" "$(dirname "$CONF")"

# munge: one key, readable by the munge user only; munged itself runs as that user.
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- munged
    sleep 1
fi

CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
cat >"$CONF" <<EOF
# Written by repro-kit's containers/start-slurm.sh: one node, this machine.
ClusterName=repro
SlurmctldHost=$NODE
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
# Cores only: memory is not a consumable (a job without --mem would otherwise take it all).
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
SlurmdTimeout=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName=$NODE CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=repro Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF

if ! scontrol ping 2>/dev/null | grep -q UP; then
    slurmctld
fi
if ! pgrep -F "$STATE/slurmd.pid" >/dev/null 2>&1; then
    slurmd
fi

i=0
while :; do
    state=$(node_state)
    case "$state" in
        idle | mixed | allocated) break ;;
        down* | drain* | fail*)
            scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
    esac
    i=$((i + 1))
    if [ "$i" -ge "$WAIT_S" ]; then
        echo "start-slurm: node $NODE is not up after ${WAIT_S}s (state: ${state:-none}); last log lines:" >&2
        tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
        exit 1
    fi
    sleep 1
done
echo "start-slurm: node $NODE $state after ${i}s (conf: $CONF, logs: $STATE/log)"
