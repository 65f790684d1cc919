#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle"]): the portable kernel's checks and measurements in
# one call (plans/0026): its tests on every path, racecheck on the gathered and the copied layouts,
# the SASS counts of its sm_90 build (and of an sm_120 cubin in bundle/, if make_bundle put one
# there), the kernel bench (both paths, ceilings in the same run), and, with
# PROFILE=1, ncu's tensor-pipe share and stall reasons for the portable kernel on S1 and S3.
# plans/0027.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/bundle_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
sass_counts() {  # file label
  printf '%s: ' "$2"
  for op in HMMA LDSM LDGSTS UTMALDG SYNCS LDL STL BAR MUFU SHFL; do printf '%s=%s ' $op "$(grep -c "$op" "$1")"; done
  echo
}
cuobjdump -sass -arch sm_90 "$B"/lib/libverifyd_kernels.a 2>/dev/null |
  awk '/Function : .*MlaVerifyFlashKernel/{f=1} /Function : /&&!/MlaVerifyFlashKernel/{f=0} f' >"$OUT/portable_sm90.sass"
sass_counts "$OUT/portable_sm90.sass" "portable sm_90 SASS"
for cubin in "$B"/*.sm_120.cubin; do
  [ -f "$cubin" ] || continue
  cuobjdump -sass "$cubin" >"$OUT/$(basename "$cubin" .cubin).sass" 2>&1
  sass_counts "$OUT/$(basename "$cubin" .cubin).sass" "$(basename "$cubin")"
  cuobjdump --dump-resource-usage "$cubin" 2>&1 | grep -E "Function|REG|STACK|SHARED|LOCAL" | head -12
done
status=0
for t in mla_verify_flash_test mla_verify_launch_test split_planner_test; do
  timeout 300 "$B/bin/$t" >"$OUT/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $t rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]' "$OUT/$t.log" | tr -s ' \n' ' ')"
  grep -E "FAILED|Failure|Expected|Which is|seed=" "$OUT/$t.log" | head -30
done
grep -E "portable-mma-sync" "$OUT/mla_verify_flash_test.log" | head -40
for filter in '*prefix_64_forest*' '*ContiguousAndRandomRuns*'; do
  timeout 300 compute-sanitizer --tool racecheck --racecheck-report hazard "$B/bin/mla_verify_flash_test" \
    --gtest_filter="$filter" >"$OUT/racecheck.log" 2>&1
  echo "== racecheck $filter rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log")"
  grep -E "hazard|ERROR" "$OUT/racecheck.log" | head -5
done
echo "== bench"
timeout 400 "$B/bin/mla_verify_bench" --iters "${ITERS:-30}" 2>&1 | tee "$OUT/bench.log" | grep -E "^(shape|S[0-9H] +|ceilings|measured)"
if [ "${PROFILE:-0}" = 1 ]; then
  for shape in ${PROFILE_SHAPES:-S1 S3}; do
    stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
      short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected dispatch_stall \
      no_instruction branch_resolving misc sleeping membar lg_throttle)
    timeout 200 ncu --clock-control none -k regex:MlaVerifyFlashKernel -c 1 --section SpeedOfLight \
      --metrics "${stalls%,},sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__inst_executed.sum" \
      "$B/bin/mla_verify_bench" --shapes $shape --iters 1 --no-naive >"$OUT/ncu-$shape.txt" 2>&1
    echo "== ncu $shape rc=$?"
    grep -E "Duration|Throughput|stalled|hmma|inst_executed" "$OUT/ncu-$shape.txt" | sed 's/smsp__average_warps_issue_stalled_//' | awk '{$1=$1};1' | head -30
  done
fi
# SOURCE=1: ncu's per-instruction stall samples (the source page, SASS) of the portable kernel on
# S3, as CSV in $OUT, for reading where the warps wait (plans/0027 read them this way).
if [ "${SOURCE:-0}" = 1 ]; then
  timeout 200 ncu --clock-control none -k regex:MlaVerifyFlashKernel -c 1 --section SourceCounters \
    --section WarpStateStats -o "$OUT/source-S3" "$B/bin/mla_verify_bench" --shapes S3 --iters 1 \
    --no-naive >/dev/null 2>&1
  ncu -i "$OUT/source-S3.ncu-rep" --page source --csv --print-source sass >"$OUT/source-S3.csv" 2>&1
  echo "== source S3 rc=$? $(wc -l <"$OUT/source-S3.csv") lines"
  rm -f "$OUT/source-S3.ncu-rep"
fi
echo "== status $status"
exit $status
