size=$1
if [ "$size" = "7b" ]; then
  MODEL_ARGS="--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048"
  MODEL_ARGS="$MODEL_ARGS --swiglu --normalization rmsnorm --use-rotary-position-embeddings --bf16"
else
  MODEL_ARGS="--num-layers 80"
fi
