#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle.tgz"] or a bundle/): where the portable kernel's
# shared-memory traffic comes from (plans/0034): ncu on S3, one launch of the portable flash
# kernel and one of the mma.sync ceiling kernel, the shared-memory wavefronts, bank conflicts and
# instructions split by operation (ld, st, ldsm, ldgsts, atom), then the Memory Workload Analysis
# tables as a cross-check of the metric names. ~1 minute.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -d bundle ] || tar xzf bundle.tgz
source tools/device/bundle_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
m='regex:^(l1tex__data_pipe_lsu_wavefronts_mem_shared|l1tex__data_bank_conflicts_pipe_lsu_mem_shared'
m="$m|smsp__sass_inst_executed_op_(shared|ldsm|ldgsts)|sm__inst_executed_pipe_tensor_op_hmma"
m="$m|sm__cycles_elapsed).*\.(sum|avg)$"
for k in MlaVerifyFlashKernel MmaSyncRate; do
  timeout 120 ncu --clock-control none -k "regex:$k" -c 1 --metrics "$m" \
    "$B/bin/mla_verify_bench" --shapes S3 --iters 1 --no-naive >"$OUT/smem-$k.txt" 2>&1
  echo "== ncu $k rc=$?"
  grep -E "^ +(l1tex|smsp|sm__)" "$OUT/smem-$k.txt" | awk '$NF != "0" {$1=$1; print}' | head -40
  timeout 120 ncu --clock-control none -k "regex:$k" -c 1 --section MemoryWorkloadAnalysis_Tables \
    --print-details all "$B/bin/mla_verify_bench" --shapes S3 --iters 1 --no-naive \
    >"$OUT/mwa-$k.txt" 2>&1
  echo "== ncu tables $k rc=$?"
  grep -iE "shared|ldsm|ldgsts|wavefront|conflict" "$OUT/mwa-$k.txt" | awk '{$1=$1};1' | head -30
done
