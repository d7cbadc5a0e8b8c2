#!/usr/bin/env bash
# A second short call (2026-11-27): DeepSpeed's engine against a plain loop on the GPU, twice more.
set -u
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda OMP_WAIT_POLICY=PASSIVE
C=$PWD/.gpu-carry
export PYTHONPATH="$PWD:$C/ds:$C/site"
o=${OUT:-$PWD/out}; mkdir -p "$o"; log="$o/log.txt"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uptime; } | tee "$o/gpu.txt"
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s)
  echo "== $name $(date -u +%T)" >> "$log"; timeout "$t" "$@" >> "$log" 2>&1; echo "== $name rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$log"; }
step engine2 140 python3 benchmarks/bench_engine_host.py --device cuda --modes engine --json "$o/engine-2.json"
step engine3 140 python3 benchmarks/bench_engine_host.py --device cuda --modes engine --json "$o/engine-3.json"
grep -E "^== |deepspeed |plain |adds|Error" "$log" | tail -20
