#!/usr/bin/env bash
# 2026-11-27 (19th session): DeepSpeed's engine against a plain loop on the GPU, twice more, and pipe1 once more.
set -u
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda OMP_WAIT_POLICY=PASSIVE
C=$PWD/.gpu-carry
export PYTHONPATH="$PWD:$C/ds:$C/site"
o=${OUT:-$PWD/out}; mkdir -p "$o"; log="$o/log.txt"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; uptime; python3 -c "import torch;print('torch',torch.__version__,'cuda',torch.version.cuda,'nccl',torch.cuda.nccl.version())"; } 2>&1 | tee "$o/gpu.txt"
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s)
  echo "== $name $(date -u +%T)" >> "$log"; timeout "$t" "$@" >> "$log" 2>&1; echo "== $name rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$log"; }
step engine2 205 python3 benchmarks/bench_engine_host.py --device cuda --modes engine --json "$o/engine-2.json"
step engine3 205 python3 benchmarks/bench_engine_host.py --device cuda --modes engine --json "$o/engine-3.json"
step pipe1-2 165 python3 benchmarks/bench_engine_host.py --device cuda --modes pipe1 --json "$o/pipe1-2.json"
grep -E "^== |deepspeed |plain |adds|Error" "$log" | tail -40
