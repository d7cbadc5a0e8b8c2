#!/usr/bin/env bash
# One lease (2026-11-27): Megatron-core's layer, DeepSpeed's ZeRO-1/2 hooks and ZeRO-3 around the
# transformer layer, on the GPU node's host (replacing the 2-core VM's figures).
set -u
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda OMP_WAIT_POLICY=PASSIVE
C=$PWD/.gpu-carry
export PYTHONPATH="$PWD:$C/ds:$C/site"
o=${OUT:-$PWD/out}; mkdir -p "$o/j"; log="$o/log.txt"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv;
  grep -m1 "model name" /proc/cpuinfo; nproc; python3 --version;
  timeout 60 python3 -c "import torch, deepspeed, megatron.core as m; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'deepspeed', deepspeed.__version__, 'megatron-core', m.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -3; } | tee "$o/gpu.txt"
note="a lent GPU node, nothing else running on it"
step() { local name=$1 t=$2; shift 2; local t0=$(date +%s)
  echo "== $name $(date -u +%T)" >> "$log"; timeout "$t" "$@" >> "$log" 2>&1; echo "== $name rc $? in $(( $(date +%s) - t0 )) s" | tee -a "$log"; }
B="python3 benchmarks/bench_stack_host.py --device cuda --load-note"
step fl1 100 $B "$note" --framework-layer --repeats 40 --rounds 4 --json "$o/j/framework-layer-h100-1.json"
step z12-1 80 $B "$note" --zero12 --repeats 40 --rounds 4 --json "$o/j/zero12-h100-1.json"
step z3tp-1 60 $B "$note" --deepspeed --zero3-layer transformer --zero3-persistence 257 --json "$o/j/zero3-layer-transformer-partitioned-h100-1.json"
step z3b-1 50 $B "$note" --deepspeed --zero3-layer block --json "$o/j/zero3-layer-block-h100-1.json"
step fl2 80 $B "$note" --framework-layer --repeats 40 --rounds 4 --json "$o/j/framework-layer-h100-2.json"
step z12-2 60 $B "$note" --zero12 --repeats 40 --rounds 4 --json "$o/j/zero12-h100-2.json"
step z3tp-2 50 $B "$note" --deepspeed --zero3-layer transformer --zero3-persistence 257 --json "$o/j/zero3-layer-transformer-partitioned-h100-2.json"
tar -czf "$o/json.tar.gz" -C "$o" j && rm -rf "$o/j"
grep -E "^== |Megatron-core layer|ATen|ZeRO-1 hooks|ZeRO-3 hooks|Error|error:" "$log" | tail -40
