#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle.tgz", "bundle-v6c", "bundle-v6d", "bundle-before"],
# made by tools/device/make_pending_bundles.sh): session 24's unchecked work in one call, tests
# first: plans/0031 change 2 and the fp8 pool on cuda (their GPU tests, the daemon end to end),
# then v6c and v6d against v3 (plans/0034: their flash tests and racecheck, the bench of all three
# on four shapes, one machine), then the decode step before / after change 2, interleaved.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -d bundle ] || tar xzf bundle.tgz
source tools/device/bundle_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if [ "${PROFILE:-0}" != 1 ]; then
for t in ${TESTS:-value_bound_check_test cuda_external_verify_test kv_fp8_write_test cuda_fp8_storage_test \
  cuda_fp8_backend_test cuda_backend_test data_plane_gpu_test}; do
  timeout 150 "$B/bin/$t" >"$OUT/$t.log" 2>&1
  echo "== $t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$OUT/$t.log" | tr -s ' \n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|SEED=" "$OUT/$t.log" | head -8
done
timeout 150 bash tests/integration/run_cuda_integration.sh "$B/bin/verifyd" "$B/bin/fake_scheduler" \
  "$B/bin/verifyctl" >"$OUT/cuda_integration.log" 2>&1
echo "== cuda_integration rc=$?"
tail -4 "$OUT/cuda_integration.log"
for v in v6c v6d; do
  for t in mla_verify_flash_test mla_verify_flash_fp8_test; do
    timeout 120 "bundle-$v/bin/$t" >"$OUT/$v-$t.log" 2>&1
    echo "== $v $t rc=$? $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/$v-$t.log" | tr -s ' \n' ' ')"
    grep -E "^\[  FAILED|Failure|Expected|Which is|seed=" "$OUT/$v-$t.log" | head -6
  done
  timeout 120 compute-sanitizer --tool racecheck --racecheck-report hazard "bundle-$v/bin/mla_verify_flash_test" \
    --gtest_filter='*prefix_64_forest*' >"$OUT/$v-racecheck.log" 2>&1
  echo "== $v racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/$v-racecheck.log")"
done
for v in bundle bundle-v6c bundle-v6d; do
  timeout 120 "$v/bin/mla_verify_bench" --iters 10 --no-naive --shapes "${SHAPES:-S1,S3,S5,SH}" \
    >"$OUT/bench-$v.log" 2>&1
  echo "== bench $v rc=$?"
  grep -E "^(shape|S[0-9H] +|measured|mma)" "$OUT/bench-$v.log" | head -12
done
for cfg in "before bf16" "after bf16" "after fp8" "before bf16" "after bf16"; do
  set -- $cfg
  bench=$B/bin/decode_step_bench
  [ "$1" = before ] && bench=bundle-before/bin/decode_step_bench
  timeout 100 "$bench" --ways=model,inproc --steps 20 --kv_dtype="$2" >"$OUT/ds-$1-$2.log" 2>&1
  echo "== decode $cfg rc=$?"
  grep -E "^\| (model|in-process)" "$OUT/ds-$1-$2.log" | head -3
done
fi
# PROFILE=1 (a second call: ~3 minutes): ncu on S3 for v3, v6c and v6d and on the mma.sync ceiling
# kernel: tensor-pipe share, shared-memory wavefronts (share of peak and count), instructions and
# stall reasons, to read whether shared memory bounds the portable layouts on this chip
# (plans/0034 asks; the ceiling kernel reads one ldmatrix.x4 per two mma).
if [ "${PROFILE:-0}" = 1 ]; then
  m=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  m=$m,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
  m=$m,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__inst_executed_pipe_tensor_op_hmma.sum
  m=$m,smsp__inst_executed.sum,sm__cycles_elapsed.avg
  for st in short_scoreboard wait barrier long_scoreboard math_pipe_throttle mio_throttle; do
    m="$m,smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio"
  done
  for v in bundle bundle-v6c bundle-v6d; do
    timeout 100 ncu --clock-control none -k regex:MlaVerifyFlashKernel -c 1 --metrics "$m" \
      "$v/bin/mla_verify_bench" --shapes S3 --iters 1 --no-naive >"$OUT/ncu-$v.txt" 2>&1
    echo "== ncu S3 $v rc=$?"
    grep -E "hmma|wavefronts|inst_executed|cycles_elapsed|stalled" "$OUT/ncu-$v.txt" | awk '{$1=$1};1' | head -14
  done
  timeout 100 ncu --clock-control none -k regex:MmaSyncRate -c 1 --metrics "$m" \
    bundle/bin/mla_verify_bench --shapes S3 --iters 1 --no-naive >"$OUT/ncu-ceiling.txt" 2>&1
  echo "== ncu mma.sync ceiling kernel rc=$?"
  grep -E "hmma|wavefronts|cycles_elapsed" "$OUT/ncu-ceiling.txt" | awk '{$1=$1};1' | head -6
fi
