#!/bin/bash
#SBATCH --job-name=@NAME@
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --output=@OUT@
# A Megatron-LM launch on one GPU that the watch's tests run for real (tests/slurm/test_watch.py).
export STANDIN_ITER_S=@ITER_S@ STANDIN_LOG_INTERVAL=@EVERY@ STANDIN_GATE_AFTER=@GATE@ STANDIN_GATE_MAX=@GATE_MAX@
@PRE@
srun python3 @STANDIN@ \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \
    --num-layers 2 --hidden-size 256 --num-attention-heads 4 \
    --seq-length 512 --max-position-embeddings 512 \
    --micro-batch-size 1 --global-batch-size 8 --train-iters @ITERS@ --save-interval @SAVE@ --save checkpoints \
    --bf16 --vocab-size 50257
