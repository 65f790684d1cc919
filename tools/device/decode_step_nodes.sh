#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle"] with decode_step_bench): the per-node times of
# the decode step's in-process way (issue 35, plans/0031): each kernel node of a few layers timed
# by ncu, as CSV in $OUT.
# FLASH=portable times the portable kernel's step too. plans/0031 took the medians by kernel name.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/bundle_env.sh
# No nsys on the lent machine: ncu times each kernel node of one step's layers alone
# (--graph-profiling node, caches and clocks left alone); the gaps are the layer span the bench
# prints minus the nodes.
for flash in auto ${FLASH:-}; do
  "$B/bin/decode_step_bench" --ways=model,inproc --steps=10 --warmup=3 --flash_kernel=$flash \
    2>&1 | grep -E "model only|in-process|host per call" | head -4
  timeout 240 ncu --graph-profiling node --cache-control none --clock-control none --csv \
    --metrics gpu__time_duration.sum --launch-skip ${SKIP:-600} --launch-count ${COUNT:-48} \
    "$B/bin/decode_step_bench" --ways=inproc --steps=2 --warmup=1 --flash_kernel=$flash \
    >"$OUT/ncu-nodes-$flash.csv" 2>"$OUT/ncu-nodes-$flash.err"
  echo "== ncu $flash rc=$? $(grep -c gpu__time_duration "$OUT/ncu-nodes-$flash.csv") kernels"
done
