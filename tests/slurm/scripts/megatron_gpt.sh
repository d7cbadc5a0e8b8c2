#!/bin/bash
#SBATCH --job-name=gpt-1.3b
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
# FAKE iters=@ITERS@ iter_s=1.5
# A Megatron-LM launch: 16 GPUs, TP 2 x PP 2 x DP 4.
set -euo pipefail
TP=2
PP=2
export CUDA_DEVICE_MAX_CONNECTIONS=1
srun python pretrain_gpt.py \
    --tensor-model-parallel-size $TP \
    --pipeline-model-parallel-size $PP \
    --num-layers 24 \
    --hidden-size 2048 \
    --num-attention-heads 16 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --micro-batch-size 4 \
    --global-batch-size 256 \
    --train-iters @ITERS@ \
    --lr 1.0e-4 \
    --fp16 \
    --vocab-size 50257 \
    --eval-iters 0 \
    --save-interval 0
