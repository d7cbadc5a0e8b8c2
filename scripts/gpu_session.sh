#!/usr/bin/env bash
# Measure one GPU for perfcast in a bounded time: host costs, operator samples (resumable) and
# real training steps of a small GPT family.  Everything lands in $OUT (or ./out).
#   OPS_SECONDS=300 FP8_SECONDS=150 STACK_HOST_SECONDS=120 ENGINE_SECONDS=240 FAMILY_SECONDS=150 \
#       bash scripts/gpu_session.sh [SAMPLES_DIR]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-$PWD/out}; mkdir -p "$out"
store=${1:-$out/samples}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$out/gpu.txt"
[ -f "$store/host.toml" ] || python3 -m calibrate.cli host --device cuda --precision bf16 --out "$out/host.toml"
timeout "${OPS_SECONDS:-300}" python3 -m calibrate.cli -v run --device cuda --no-progress \
    --plan benchmarks/data/plan-single-gpu.toml --out "$store" --part operators
echo "operators: exit $?"
timeout "${FP8_SECONDS:-150}" python3 -m calibrate.cli -v run --device cuda --no-progress \
    --plan benchmarks/data/plan-single-gpu-fp8.toml --out "$store" --part operators
echo "fp8 operators: exit $?"
[ -f "$out/host.toml" ] && cp "$out/host.toml" "$store/host.toml"
# The stacks' host costs on this node: the TP collective through NCCL, and the checkpoint wrappers
# around the GPT-shaped layer (DeepSpeed's where the package is installed).
timeout "${STACK_HOST_SECONDS:-120}" python3 benchmarks/bench_stack_host.py --device cuda \
    --load-note "a lent GPU node" --json "$store/stack-host-nccl.json"
timeout "${STACK_HOST_SECONDS:-120}" python3 benchmarks/bench_stack_host.py --device cuda --checkpoint \
    --repeats 20 --load-note "a lent GPU node" --json "$store/stack-host-checkpoint.json"
echo "stack host: exit $?"
# DeepSpeed's own host costs, where the package imports (a lent node has none and reaches no index:
# carry its source distribution and its dependencies' wheels for the node's Python on PYTHONPATH,
# as benchmarks/data/stack-host/README.md says).
if DS_ACCELERATOR=cuda python3 -c "import deepspeed" 2>/dev/null; then
    DS_ACCELERATOR=cuda timeout "${STACK_HOST_SECONDS:-120}" python3 benchmarks/bench_stack_host.py --device cuda \
        --deepspeed --load-note "a lent GPU node" --json "$store/stack-host-zero3.json"
    DS_ACCELERATOR=cuda timeout "${STACK_HOST_SECONDS:-120}" python3 benchmarks/bench_stack_host.py --device cuda \
        --deepspeed --zero3-layer transformer --zero3-persistence 257 --load-note "a lent GPU node" \
        --json "$store/stack-host-zero3-layer.json"
    DS_ACCELERATOR=cuda timeout "${STACK_HOST_SECONDS:-120}" python3 benchmarks/bench_stack_host.py --device cuda \
        --zero12 --repeats 40 --rounds 4 --load-note "a lent GPU node" --json "$store/stack-host-zero12.json"
    DS_ACCELERATOR=cuda timeout "${ENGINE_SECONDS:-240}" python3 benchmarks/bench_engine_host.py --device cuda \
        --modes engine --json "$store/engine-host-engine.json"
    echo "deepspeed: exit $?"
fi
# Megatron's own layer against the reference layer, the host's issue time on this node, where
# megatron-core imports (carry its wheel for the node's Python: pip download --no-deps
# --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 megatron-core==0.16.1).
if python3 -c "import megatron.core" 2>/dev/null; then
    timeout "${STACK_HOST_SECONDS:-120}" python3 benchmarks/bench_stack_host.py --device cuda --framework-layer \
        --repeats 20 --rounds 4 --load-note "a lent GPU node" --json "$store/stack-host-framework-layer.json"
    echo "megatron layer: exit $?"
fi
timeout "${FAMILY_SECONDS:-150}" python3 benchmarks/bench_train_family.py --device cuda \
    --out "$store/train-family.json"
echo "family: exit $?"
tar -czf "$out/samples.tar.gz" -C "$(dirname "$store")" "$(basename "$store")"
ls -la "$out"
