#!/bin/bash
# Starts configs/cluster_example.toml under Slurm: one areal process per host.
# The topology's host names must be the hosts Slurm gives the job (edit them,
# or generate the topology from $SLURM_JOB_NODELIST before this script runs).
#   sbatch configs/slurm_example.sh
#SBATCH --job-name=areal
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --time=12:00:00
set -euo pipefail

CONFIG=${CONFIG:-configs/cluster_example.toml}
NODES=(head scorer gen-1 gen-2)   # the [[nodes]] names, in the order of the job's hosts

# Once per cluster: the private CA and the node certificates (on a shared file system).
if [ ! -f certs/cluster/ca.pem ]; then
  ./build/areal --config "$CONFIG" --make-certs
fi

# Task i runs node NODES[i]; the head node resumes a run it finds checkpointed.
srun --kill-on-bad-exit=0 bash -c '
  NODES=('"${NODES[*]}"')
  NODE=${NODES[$SLURM_PROCID]}
  EXTRA=()
  if [ "$NODE" = head ] && [ -f runs/cluster/checkpoint/controller_state.capnp ]; then EXTRA=(--resume); fi
  exec ./build/areal --config '"$CONFIG"' --node "$NODE" "${EXTRA[@]}"
'
