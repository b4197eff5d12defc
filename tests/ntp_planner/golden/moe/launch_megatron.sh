#!/usr/bin/env bash
# ntp-planner plan a4ca0e13fd40: mixtral-8x7b on 64 x H100-SXM (dgx-h100)
# for Megatron-LM's pretrain_gpt.py (flags as megatron-core 0.19.2's megatron/training/arguments.py reads them)
# Run on every host with NODE_RANK set; MASTER_ADDR is host 0. MEGATRON_LM points at a checkout.
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
NNODES=${NNODES:-8}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
MEGATRON_LM=${MEGATRON_LM:-.}
torchrun --nproc_per_node 8 --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$MEGATRON_LM/pretrain_gpt.py" \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 \
    --context-parallel-size 1 \
    --micro-batch-size 1 \
    --global-batch-size 128 \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 14336 \
    --num-attention-heads 32 \
    --kv-channels 128 \
    --seq-length 4096 \
    --max-position-embeddings 32768 \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --tokenizer-type NullTokenizer \
    --vocab-size 32000 \
    --group-query-attention \
    --swiglu \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --sequence-parallel \
    --cross-entropy-loss-fusion \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --num-query-groups 8 \
    --bf16 \
    --num-experts 8 \
    --moe-router-topk 2 \
    --moe-ffn-hidden-size 14336 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall \
    --expert-model-parallel-size 8 \
    --expert-tensor-parallel-size 2 \
    --moe-layer-freq 1 \
    --mock-data \
    --save checkpoints/mixtral-8x7b \
    --load checkpoints/mixtral-8x7b \
    --train-iters 100000 \
    --lr 3.0e-4 \
    --min-lr 3.0e-5 \
    --lr-decay-style cosine \
    --lr-warmup-iters 2000 \
    --clip-grad 1.0 \
    --weight-decay 0.1 \
    --log-interval 10 \
    --save-interval 1000
