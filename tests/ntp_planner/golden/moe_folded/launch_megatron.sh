#!/usr/bin/env bash
# ntp-planner plan 7d0e84916ee7: deepseek-v3 on 256 x H100-SXM (dgx-h100)
# for Megatron-LM's pretrain_gpt.py (flags as megatron-core 0.19.2's megatron/training/arguments.py reads them)
# Run on every host with NODE_RANK set; MASTER_ADDR is host 0. MEGATRON_LM points at a checkout.
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
NNODES=${NNODES:-32}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
MEGATRON_LM=${MEGATRON_LM:-.}
torchrun --nproc_per_node 8 --nnodes "$NNODES" --node_rank "$NODE_RANK" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$MEGATRON_LM/pretrain_gpt.py" \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 8 \
    --context-parallel-size 1 \
    --micro-batch-size 1 \
    --global-batch-size 256 \
    --num-layers 61 \
    --hidden-size 7168 \
    --ffn-hidden-size 18432 \
    --num-attention-heads 128 \
    --kv-channels 192 \
    --seq-length 4096 \
    --max-position-embeddings 163840 \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --tokenizer-type NullTokenizer \
    --vocab-size 129280 \
    --swiglu \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --sequence-parallel \
    --cross-entropy-loss-fusion \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --bf16 \
    --pipeline-model-parallel-layout 'Etttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|tttt|ttt|ttt|tttmL' \
    --num-experts 256 \
    --moe-router-topk 8 \
    --moe-ffn-hidden-size 2048 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type flex \
    --moe-flex-dispatcher-backend deepep \
    --expert-model-parallel-size 16 \
    --expert-tensor-parallel-size 1 \
    --overlap-moe-expert-parallel-comm \
    --moe-layer-freq '[0,0,0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]' \
    --moe-shared-expert-intermediate-size 2048 \
    --multi-latent-attention \
    --q-lora-rank 1536 \
    --kv-lora-rank 512 \
    --qk-head-dim 128 \
    --qk-pos-emb-head-dim 64 \
    --v-head-dim 128 \
    --qk-layernorm \
    --mtp-num-layers 1 \
    --mock-data \
    --save checkpoints/deepseek-v3 \
    --load checkpoints/deepseek-v3 \
    --train-iters 100000 \
    --lr 3.0e-4 \
    --min-lr 3.0e-5 \
    --lr-decay-style cosine \
    --lr-warmup-iters 2000 \
    --clip-grad 1.0 \
    --weight-decay 0.1 \
    --log-interval 10 \
    --save-interval 1000
