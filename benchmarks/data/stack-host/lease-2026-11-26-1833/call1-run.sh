#!/usr/bin/env bash
# One lease: DeepSpeed's host costs on a GPU node (its engine, its checkpoint wrapper, ZeRO-3's hooks).
set -u
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda OMP_WAIT_POLICY=PASSIVE
C=$PWD/.gpu-carry
export PYTHONPATH="$PWD:$C/ds:$C/site"
o=${OUT:-$PWD/out}; mkdir -p "$o"
date -u +%FT%TZ | tee "$o/gpu.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee -a "$o/gpu.txt"
grep -m1 "model name" /proc/cpuinfo | tee -a "$o/gpu.txt"; nproc | tee -a "$o/gpu.txt"
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'deepspeed', deepspeed.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -4 | tee -a "$o/gpu.txt"
note="a lent GPU node, nothing else running on it"
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout "$t" "$@" > "$o/log-$name.txt" 2>&1; echo "== $name rc $? in $(( $(date +%s) - t0 )) s"
  grep -E "layers/stage|adds|^  (deepspeed|plain) |checkpoint wrapper|slopes|ZeRO-3|Error|error" "$o/log-$name.txt" | grep -v "^\[" | tail -16; }
step engine 150 python3 benchmarks/bench_engine_host.py --device cuda --modes engine --json "$o/engine-h100-1.json"
step ck1 90 python3 benchmarks/bench_stack_host.py --device cuda --checkpoint --repeats 20 --rounds 3 --load-note "$note" --json "$o/checkpoint-h100-ds-1.json"
step zero3 90 python3 benchmarks/bench_stack_host.py --device cuda --deepspeed --load-note "$note" --json "$o/zero3-h100-1.json"
step pipe1 130 python3 benchmarks/bench_engine_host.py --device cuda --modes pipe1 --json "$o/pipe1-h100-1.json"
step ck2 80 python3 benchmarks/bench_stack_host.py --device cuda --checkpoint --repeats 20 --rounds 3 --load-note "$note" --json "$o/checkpoint-h100-ds-2.json"
ls -la "$o"
