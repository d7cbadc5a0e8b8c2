#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda OMP_WAIT_POLICY=PASSIVE
C=$PWD/.gpu-carry
export PYTHONPATH="$PWD:$C/ds:$C/site"
o=${OUT:-$PWD/out}; mkdir -p "$o"; log="$o/log-2.txt"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$o/gpu-2.txt"
note="a lent GPU node, nothing else running on it"
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s)
  echo "== $name" >> "$log"; timeout "$t" "$@" >> "$log" 2>&1; echo "== $name rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$log"; }
step zero3-1 60 python3 benchmarks/bench_stack_host.py --device cuda --deepspeed --load-note "$note" --json "$o/zero3-h100-1.json"
step zero3-2 60 python3 benchmarks/bench_stack_host.py --device cuda --deepspeed --load-note "$note" --json "$o/zero3-h100-2.json"
step ck3 70 python3 benchmarks/bench_stack_host.py --device cuda --checkpoint --repeats 20 --rounds 3 --load-note "$note" --json "$o/checkpoint-h100-ds-3.json"
step pipe1 190 python3 benchmarks/bench_engine_host.py --device cuda --modes pipe1 --json "$o/pipe1-h100-1.json"
grep -E "layers/stage|adds|^  (deepspeed|plain) |checkpoint wrapper|ZeRO-3|Error" "$log" | grep -v "^\[" | tail -30
