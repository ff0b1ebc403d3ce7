#!/usr/bin/env bash
# A real Slurm cluster on one machine, for tests and trials (as root): munged, slurmctld and one
# slurmd per node, from Debian's slurm-wlm and munge, with a generated slurm.conf. Nodes are
# network namespaces (scripts/netns-nodes.sh: own network stack, hostname and /tmp for each
# node's daemon and the tasks it starts) where the machine allows them; else this host is the
# one node. srun's MPI plugin is PMIx (OpenMPI's ranks start directly from srun --mpi=pmix).
#
#   scripts/slurm-cluster.sh up [N] [CPUS]  start it: N nodes (default 2; 1 without namespaces)
#                                           of CPUS each (default 4, more than the machine has:
#                                           tasks share its cores)
#   scripts/slurm-cluster.sh down           stop every daemon and job, remove the nodes
#   scripts/slurm-cluster.sh check          exit 0 when Slurm and munge are installed and this is root
#   scripts/slurm-cluster.sh run CMD...     run CMD (sbatch, srun, squeue, ...) against the cluster:
#                                           SLURM_CONF and OpenMPI's network settings in its environment
#   scripts/slurm-cluster.sh env            print those settings as shell exports
#
# State (configuration, logs, spool, munge key and socket) lives in GPUCLOUD_SLURM_DIR (default
# /tmp/gpucloud-slurm). Nodes are PREFIX1..PREFIXN on SUBNET.0/24, the controller PREFIXctl at
# SUBNET.1 (the bridge), listening on PORT (slurmd on PORT+1): GPUCLOUD_SLURM_PREFIX (default gcsl),
# GPUCLOUD_SLURM_SUBNET (default 10.78.0) and GPUCLOUD_SLURM_PORT (default 16817). Their own names
# and subnet let the netns tests' nodes exist beside them; another set of the four variables
# starts a second cluster beside the first (tests/comm/slurm_two_clusters.sh).
set -euo pipefail
dir="${GPUCLOUD_SLURM_DIR:-/tmp/gpucloud-slurm}"
scripts="$(cd "$(dirname "$0")" && pwd)"
prefix="${GPUCLOUD_SLURM_PREFIX:-gcsl}" subnet="${GPUCLOUD_SLURM_SUBNET:-10.78.0}" ctld_port="${GPUCLOUD_SLURM_PORT:-16817}"
if [ "${1:-}" != up ] && [ -f "$dir/identity" ]; then
  read -r prefix subnet ctld_port <"$dir/identity" # a running cluster: as it was started
fi
export GPUCLOUD_NETNS_PREFIX=$prefix GPUCLOUD_NETNS_SUBNET=$subnet
slurmd_port=$((ctld_port + 1))
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "slurm-cluster: GPUCLOUD_SLURM_PREFIX must be 1-8 of [a-z0-9], a letter first (it names network interfaces), not '$prefix'"; exit 2; }
[[ "$subnet" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "slurm-cluster: GPUCLOUD_SLURM_SUBNET must be three octets (10.78.0), not '$subnet'"; exit 2; }
[[ "$ctld_port" =~ ^[0-9]+$ ]] && ((ctld_port >= 1024 && ctld_port < 65535)) || { echo "slurm-cluster: GPUCLOUD_SLURM_PORT must be a port from 1024 to 65534, not '$ctld_port'"; exit 2; }

settings() { # the environment every Slurm command and task gets
  echo "SLURM_CONF=$dir/slurm.conf"
  if [ -f "$dir/netns" ]; then
    # OpenMPI's ranks: TCP between nodes on the nodes' subnet only; shared memory inside a node.
    echo "OMPI_MCA_btl=self,vader,tcp"
    echo "OMPI_MCA_btl_tcp_if_include=${subnet}.0/24"
    echo "OMPI_MCA_oob_tcp_if_include=${subnet}.0/24"
  fi
  echo "OMPI_MCA_btl_vader_single_copy_mechanism=none" # containers without cross-memory attach
  echo "OMPI_MCA_mpi_yield_when_idle=1"                # more ranks than cores
  # PMIx's job data through the server's hash store instead of the ds21 shared-memory store:
  # Debian's PMIx 4.2 clients segfaulted once at MPI_Init under srun with ds21 (CI, a task of
  # the 3,1 layout, "Address not mapped" at (nil) before any rank printed: the known class of
  # ds21 lock-init crashes, openpmix#1114, ompi#7335); hash is the store every PMIx supports.
  echo "PMIX_MCA_gds=hash"
}

check() {
  local missing=()
  for p in slurmctld slurmd srun sbatch munged; do
    command -v "$p" >/dev/null 2>&1 || [ -x "/usr/sbin/$p" ] || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "slurm-cluster: not installed: ${missing[*]} (Debian: slurm-wlm munge)"
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm-cluster: needs root (daemons, namespaces, the munge user)"
    return 1
  fi
}

stop_pid() { # stop_pid FILE: TERM, then KILL after 5 s
  local f=$1 p
  [ -f "$f" ] || return 0
  p=$(cat "$f" 2>/dev/null || true)
  if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill "$p" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ]; then
    SLURM_CONF="$dir/slurm.conf" timeout 10 scancel --full --quiet --user root 2>/dev/null || true
  fi
  for f in "$dir"/slurmd-*.pid; do stop_pid "$f"; done
  stop_pid "$dir/slurmctld.pid"
  stop_pid "$dir/munge/pid"
  if [ -f "$dir/netns" ]; then
    local was=("$prefix" "$subnet")
    [ -f "$dir/identity" ] && read -r was[0] was[1] _ <"$dir/identity" # the nodes it started
    GPUCLOUD_NETNS_PREFIX=${was[0]} GPUCLOUD_NETNS_SUBNET=${was[1]} \
      "$scripts/netns-nodes.sh" down # also kills job steps left in the nodes
  else
    # One-node mode: job steps this cluster's slurmd left (their spool is under $dir).
    pkill -9 -f "slurmstepd: \[" 2>/dev/null || true
  fi
  rm -rf "$dir"
}

wait_idle() { # wait_idle N: until N nodes are idle, 30 s at most
  local want=$1 n=0
  for _ in $(seq 150); do
    n=$(SLURM_CONF="$dir/slurm.conf" sinfo -h -N -t idle -o %N 2>/dev/null | wc -l || true)
    [ "$n" -ge "$want" ] && return 0
    sleep 0.2
  done
  echo "slurm-cluster: $n of $want node(s) idle after 30 s; the logs say:"
  tail -n 20 "$dir"/log/*.log
  return 1
}

up() {
  local count=${1:-2} cpus=${2:-4}
  check
  down
  mkdir -p "$dir"/{state,spool,log,tmp,nodetmp,munge/etc}
  echo "$prefix $subnet $ctld_port" >"$dir/identity"
  # munge: a fresh key for this cluster; the socket directory must be reachable by everyone.
  chown -R munge:munge "$dir/munge"
  chmod 755 "$dir/munge"
  chmod 700 "$dir/munge/etc"
  dd if=/dev/urandom of="$dir/munge/etc/key" bs=1024 count=1 status=none
  chown munge:munge "$dir/munge/etc/key"
  chmod 600 "$dir/munge/etc/key"
  runuser -u munge -- /usr/sbin/munged --socket="$dir/munge/sock" --key-file="$dir/munge/etc/key" \
    --pid-file="$dir/munge/pid" --log-file="$dir/munge/log" --seed-file="$dir/munge/etc/seed"

  local netns=0 ctl_host ctl_addr nodes=()
  if "$scripts/netns-nodes.sh" check >/dev/null 2>&1; then
    netns=1
    touch "$dir/netns"
    "$scripts/netns-nodes.sh" up "$count" >/dev/null
    ctl_host=${prefix}ctl ctl_addr=${subnet}.1
    for i in $(seq 1 "$count"); do nodes+=("$prefix$i:${subnet}.$((10 + i))"); done
  else
    echo "slurm-cluster: no network namespaces here ($("$scripts/netns-nodes.sh" check || true)): one node, this host"
    ctl_host=$(hostname) ctl_addr=127.0.0.1
    nodes=("$(hostname):127.0.0.1")
  fi
  {
    echo "# Generated by scripts/slurm-cluster.sh: a test cluster on one machine."
    echo "ClusterName=gpucloud$prefix"
    echo "SlurmctldHost=${ctl_host}(${ctl_addr})"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    # cred_expire: also how long Slurm holds a requeued job back (default 120 s): 20 s keeps the
    # requeue tests short while a step's credential still outlives any launch here.
    echo "AuthInfo=socket=$dir/munge/sock,cred_expire=20"
    echo "SlurmctldPort=$ctld_port"
    echo "SlurmdPort=$slurmd_port"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmdSpoolDir=$dir/spool/%n"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmdPidFile=$dir/slurmd-%n.pid"
    echo "SlurmctldLogFile=$dir/log/slurmctld.log"
    echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
    # Each node's daemon sees its own $dir/tmp/NODE here (PMIx keeps per-job files in TmpFS).
    echo "TmpFS=$dir/nodetmp"
    # No cgroups for containers: processes tracked by parentage, no CPU binding, no accounting.
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SchedulerType=sched/backfill"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MpiDefault=pmix"
    echo "ReturnToService=2"
    echo "SlurmdParameters=config_overrides" # CPUs below, not the hardware's
    echo "SlurmdTimeout=30"
    echo "KillWait=5"
    for n in "${nodes[@]}"; do
      echo "NodeName=${n%%:*} NodeAddr=${n#*:} CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$dir/slurm.conf"
  export SLURM_CONF="$dir/slurm.conf"
  if ((netns)); then
    # The controller answers as PREFIXctl (slurmctld checks that its host name is SlurmctldHost).
    unshare --uts /bin/sh -c "hostname $ctl_host && exec slurmctld"
    for n in "${nodes[@]}"; do
      local name=${n%%:*}
      mkdir -p "$dir/spool/$name" "$dir/tmp/$name"
      # The node's network namespace (nsenter keeps the host's /sys, which slurmd reads), its
      # own host name, and its own mount namespace where TmpFS is the node's directory.
      nsenter --net="/run/netns/$name" unshare --uts --mount /bin/sh -c \
        "hostname $name && mount --bind $dir/tmp/$name $dir/nodetmp && exec slurmd -N $name"
    done
  else
    slurmctld
    mkdir -p "$dir/spool/$ctl_host"
    slurmd
  fi
  wait_idle "${#nodes[@]}"
  settings >"$dir/env"
  echo "slurm-cluster: ${#nodes[@]} node(s) ($(SLURM_CONF="$dir/slurm.conf" sinfo -h -o %N)) of $cpus CPUs, state in $dir"
}

case "${1:-}" in
  up) up "${2:-2}" "${3:-4}" ;;
  down) down ;;
  check) check ;;
  env) sed 's/^/export /' "$dir/env" ;;
  run)
    shift
    [ -f "$dir/env" ] || { echo "slurm-cluster: no cluster is up (scripts/slurm-cluster.sh up)"; exit 1; }
    exec env $(cat "$dir/env") "$@"
    ;;
  *)
    sed -n '2,23p' "$0"
    exit 2
    ;;
esac
