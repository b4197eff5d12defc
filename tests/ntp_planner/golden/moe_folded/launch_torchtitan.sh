#!/usr/bin/env bash
# ntp-planner plan 7d0e84916ee7: deepseek-v3 on 256 x H100-SXM (dgx-h100)
# Run on every host with NODE_RANK set; MASTER_ADDR is host 0. Needs torchtitan 0.3.0 installed.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
NNODES=${NNODES:-32}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
torchrun --nproc_per_node 8 --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    -m torchtitan.train --module torchtitan_config --config ntp_plan "$@"
