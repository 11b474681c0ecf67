#!/bin/bash
# One node's `halo launch` in a SLURM job (halo.sbatch runs it once a node through srun): the node count and this
# node's index from SLURM's variables, the rendezvous from HALO_RDZV_ENDPOINT (HOST:PORT, the same on every node),
# one process per GPU of the node unless NPROC says otherwise. Arguments pass on as overrides (-- --field=value).
set -euo pipefail
: "${METHOD:?}" "${CONFIG:?}" "${HALO_RDZV_ENDPOINT:?set HALO_RDZV_ENDPOINT=HOST:PORT}"
nproc="${NPROC:-${SLURM_GPUS_ON_NODE:-1}}"
if [ "$#" -gt 0 ] && [ "$1" = "--" ]; then shift; fi
# HALO: the command that runs halo (default `halo`; word-split, so `python -m halo_cli` works).
exec ${HALO:-halo} launch "$METHOD" "$CONFIG" --nproc "$nproc" --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" \
    --rdzv-endpoint "$HALO_RDZV_ENDPOINT" -- "$@"
