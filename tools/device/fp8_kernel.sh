#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle"]): the fp8 pool's kernel checks and measurements in
# one call (issue 34, plans/0032): the fp8 flash tests (against float64 on the dequantized KV), the
# bf16 flash tests (the load stage is a template of the same kernel), racecheck on the fp8 kernel
# (gathered and copied layouts), then the kernel bench with --fp8 (both paths, ceilings in the same
# run; fp8 / bf16 per shape on both paths).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/bundle_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
status=0
for t in ${TESTS:-mla_verify_flash_fp8_test mla_verify_flash_test}; do
  timeout 300 "$B/bin/$t" >"$OUT/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $t rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/$t.log" | tr -s ' \n' ' ')"
  grep -E "FAILED|Failure|Expected|Which is|seed=" "$OUT/$t.log" | head -30
done
grep -E "^fp8 " "$OUT/mla_verify_flash_fp8_test.log" | head -40
for filter in '*IssueMatrix*prefix_64_forest*' '*EveryPlanAndLayout*'; do
  timeout 300 compute-sanitizer --tool racecheck --racecheck-report hazard "$B/bin/mla_verify_flash_fp8_test" \
    --gtest_filter="$filter" >"$OUT/racecheck.log" 2>&1
  echo "== racecheck fp8 $filter rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log")"
  grep -E "hazard|ERROR" "$OUT/racecheck.log" | head -5
done
echo "== bench --fp8"
timeout "${BENCH_TIMEOUT:-400}" "$B/bin/mla_verify_bench" --fp8 --iters "${ITERS:-30}" ${SHAPES:+--shapes $SHAPES} 2>&1 |
  tee "$OUT/bench.log" | grep -E "^(shape|S[0-9H] +|ceilings|measured)"
echo "== status $status"
exit $status
