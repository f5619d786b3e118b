#!/usr/bin/env bash
# A one-node SLURM cluster on loopback, to try the array script where no cluster is at hand (as root,
# Debian/Ubuntu): controller + compute daemon on this host, FAKE_GPUS GPU slots as GRES backed by
# character devices, so SLURM hands each task its own CUDA_VISIBLE_DEVICES as on a GPU node.
#
#   apt-get install -y slurm-wlm munge && bash scripts/cluster/one_node_slurm.sh   # FAKE_GPUS=4
#
# Tested on this project's 2-core Debian 12 machine with slurm-wlm 22.05.8 (README, "Scaling out").
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "run as root: it writes /etc/slurm and starts munged, slurmctld, slurmd" >&2; exit 2; }
command -v slurmctld >/dev/null || { echo "slurmctld not found: apt-get install -y slurm-wlm munge" >&2; exit 2; }
gpus="${FAKE_GPUS:-4}"
host=$(hostname -s)
cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 8 / 10 ))
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/slurm-fakegpu
for i in $(seq 0 $((gpus - 1))); do
  [ -c "/var/lib/slurm-fakegpu/gpu$i" ] || mknod "/var/lib/slurm-fakegpu/gpu$i" c 1 3  # /dev/null's numbers
done
cat >/etc/slurm/slurm.conf <<CONF
ClusterName=capsnet
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:$gpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
echo "NodeName=$host Name=gpu File=/var/lib/slurm-fakegpu/gpu[0-$((gpus - 1))]" >/etc/slurm/gres.conf
[ -s /etc/munge/munge.key ] || mungekey --create
chown -R munge:munge /etc/munge /run/munge /var/log/munge 2>/dev/null || true
pgrep -x munged >/dev/null || munged --force
pkill -x slurmd || true; pkill -x slurmctld || true; sleep 1
slurmctld && slurmd
for _ in $(seq 30); do [[ $(sinfo -h -o %t 2>/dev/null) == *idle* ]] && break; sleep 1; done
sinfo
srun -n1 --gres=gpu:1 bash -c 'echo "a task sees CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES on $(hostname)"'
