#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle"]): runs every GPU test binary of ./bundle (the wgmma
# unit test first; the flash test checks both flash paths on a Hopper device: FlashPath::kHopper and
# kPortable), a race check of the flash kernels, then the benchmark (every path). Full logs go to $OUT; stdout gets summaries, the table last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/bundle_env.sh
# BUNDLE: which collected build to run (default ./bundle; a second one lets one call compare two).
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  echo "cubins per architecture in libverifyd_kernels.a:"
  cuobjdump --list-elf "$B"/lib/libverifyd_kernels.a | grep -o 'sm_[0-9]*' | sort | uniq -c
  # The flash kernel's sm_90 machine code: tensor-core, ldmatrix, local-memory (spill) and barrier counts.
  cuobjdump -sass -arch sm_90 "$B"/lib/libverifyd_kernels.a >"$OUT/sass.txt" 2>/dev/null
  awk '/Function : .*MlaVerifyFlashKernel/{f=1} /Function : /&&!/MlaVerifyFlashKernel/{f=0} f' "$OUT/sass.txt" >"$OUT/flash.sass"
  for op in HMMA LDSM LDGSTS LDL STL BAR MUFU SHFL; do printf '%s=%s ' $op "$(grep -c "$op" "$OUT/flash.sass")"; done
  echo
  # The Hopper kernel (sm_90a cubin): wgmma shows as HGMMA; HMMA here would mean a slower path.
  cuobjdump -sass -arch sm_90a "$B"/lib/libverifyd_kernels.a 2>/dev/null \
    | awk '/Function : .*MlaVerifyFlashSm90/{f=1} /Function : /&&!/MlaVerifyFlashSm90/{f=0} f' >"$OUT/flash_sm90a.sass"
  printf 'sm90a: '
  for op in HGMMA HMMA LDGSTS LDL STL BAR MUFU SHFL WARPGROUP; do printf '%s=%s ' $op "$(grep -c "$op" "$OUT/flash_sm90a.sass")"; done
  echo
  rm -f "$OUT/sass.txt"
} 2>&1 | tee "$OUT/device.txt"

status=0
summary=""  # one line per test binary and check, printed again after the bench table
# TESTS: a regex of the test binaries to run (default: all of them).
for t in $({ echo "$B"/bin/wgmma_unit_test; ls "$B"/bin/*_test "$B"/bin/*_tests; } | awk '!seen[$0]++' \
  | grep -E "${TESTS:-.}"); do
  name=$(basename "$t")
  timeout 180 "$t" >"$OUT/test.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $name rc=$rc"
  grep -E "err|FAILED|Failure|Expected|Which is|seed=|PASSED|SKIPPED" "$OUT/test.log" | head -60
  # The seed a failed test ran with (the service tests print VERIFYD_TEST_SEED= at set-up, the
  # kernel tests seed= in their trace): the last one seen before the test's FAILED line.
  awk '/SEED=|seed=/{s=$0} /^\[  FAILED  \] .*\(/{print "  seed of " $4 ": " s}' "$OUT/test.log" | head -20
  summary="$summary$(printf '%-30s rc=%d %s' "$name" $rc \
    "$(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$OUT/test.log" | tr -s ' \n' ' ')")\n"
  cat "$OUT/test.log" >>"$OUT/tests.log"
done
rm -f "$OUT/test.log"

# Races between the pipeline's barriers show up here (racecheck: shared memory hazards).
if [ "${VERIFYD_RACECHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  timeout 180 compute-sanitizer --tool racecheck --racecheck-report hazard "$B"/bin/mla_verify_flash_test \
    --gtest_filter='*prefix_64_forest*' >"$OUT/racecheck.log" 2>&1
  echo "== racecheck rc=$?"
  grep -E "RACECHECK SUMMARY|hazard|ERROR" "$OUT/racecheck.log" | head -10
  summary="${summary}racecheck: $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck.log" | sed 's/.*SUMMARY: //')\n"
fi

# Uninitialised device bytes moved by a copy or read by a kernel (FINDINGS: the backend's D2H
# copies of whole size bands once reported 100+): initcheck over the backend's oracle test.
if [ "${VERIFYD_INITCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  timeout 240 compute-sanitizer --tool initcheck "$B"/bin/cuda_backend_test \
    --gtest_filter='*RandomBatchesMatchTheFloat64Oracle*:*GraphReplay*' >"$OUT/initcheck.log" 2>&1
  echo "== initcheck rc=$?"
  grep -E "ERROR SUMMARY|Uninitialized" "$OUT/initcheck.log" | sort | uniq -c | head -10
  summary="${summary}initcheck: $(grep -E 'ERROR SUMMARY' "$OUT/initcheck.log" | sed 's/.*SUMMARY: //')\n"
fi

# Hardware counters for one flash launch (S3: compute-bound, S5: memory-bound) when asked for.
if [ "${VERIFYD_PROFILE:-0}" = 1 ] && command -v ncu >/dev/null; then
  for shape in ${VERIFYD_PROFILE_SHAPES:-S3 S5}; do
    stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
      short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected dispatch_stall lg_throttle \
      no_instruction branch_resolving misc tex_throttle drain sleeping membar imc_miss)
    timeout 240 ncu --clock-control none -k regex:MlaVerifyFlash -c 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters \
      --metrics "${stalls%,},sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
      "$B"/bin/mla_verify_bench --shapes $shape --iters 1 --no-naive --launcher-path-only >"$OUT/ncu-$shape.txt" 2>&1
    echo "== ncu $shape rc=$?"
    grep -E "Throughput|Issued Ipc|stalled|hmma" "$OUT/ncu-$shape.txt" | sed 's/smsp__average_warps_issue_stalled_//' \
      | awk '{$1=$1};1' | head -40
  done
fi

# The daemon on the GPU: its own test suite ran above (verifyd_service_tests: --backend=auto picks
# cuda); now the fake scheduler end to end with a Compact under load, graphs on and off.
if [ "${VERIFYD_SERVICE:-1}" = 1 ] && [ -x "$B/bin/verifyd" ]; then
  timeout 240 bash tests/integration/run_cuda_integration.sh "$B/bin/verifyd" "$B/bin/fake_scheduler" \
    "$B/bin/verifyctl" >"$OUT/cuda_integration.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== cuda_integration rc=$rc"
  summary="${summary}cuda_integration rc=$rc\n"
  tail -8 "$OUT/cuda_integration.log"
  echo "== cuda_backend_bench"
  timeout 120 "$B/bin/cuda_backend_bench" 2>&1 | tee "$OUT/cuda_backend_bench.log" | tail -20
  echo "== compaction_bench"
  BUNDLE=$B COMPACTION_CHUNK_SWEEP=${COMPACTION_CHUNK_SWEEP:-0} timeout 300 bash tools/device/compaction_bench.sh \
    2>&1 | grep -E "D2D|compaction|ratio|mismatch|copy kernel|layers" | tail -20
  echo "== rpc_bench"
  BUNDLE=$B timeout 300 bash tools/device/rpc_bench.sh 2>&1 | tee "$OUT/rpc_bench.txt" | tail -30
  # Where a Verify's time goes, and the handler modes side by side (plans/0012).
  if [ "${VERIFYD_RPC_PROBE:-1}" = 1 ]; then
    echo "== rpc_probe"
    BUNDLE=$B timeout 150 bash tools/device/rpc_probe.sh 2>&1 | tee "$OUT/rpc_probe.txt" \
      | grep -E "client|ping|tail:|rpc_duration"
  fi
fi

# The Python data plane (python/verifyd over libverifyd_dataplane.so): torch CUDA tensors registered
# with a cuda daemon, stream-ordered Verify, the adapter with a GEMM between layers, every output
# against float64 (tools/device/python_dataplane_gpu.py). The Python keeps its own libraries: only
# the daemon gets the bundle's lib/ (the data-plane library finds pylib/ through its RPATH).
if [ "${VERIFYD_PYTHON_DATAPLANE:-1}" = 1 ] && [ -f "$B/pylib/libverifyd_dataplane.so" ]; then
  env -u LD_LIBRARY_PATH timeout 300 python3 tools/device/python_dataplane_gpu.py \
    --verifyd "$B/bin/verifyd" --python "$B/python" --lib "$B/pylib/libverifyd_dataplane.so" \
    --daemon-ld-path "$LD_LIBRARY_PATH" >"$OUT/python_dataplane.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== python_dataplane rc=$rc"
  grep -E "^(PASS|FAIL|python )|passed" "$OUT/python_dataplane.log"
  summary="${summary}python_dataplane rc=$rc $(tail -1 "$OUT/python_dataplane.log")\n"
fi

echo "== bench"
timeout 360 "$B"/bin/mla_verify_bench "$@" 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" -ne 0 ] && status=1
# Last, so that the tail of the output holds the verdicts too.
echo "== summary (status $status)"
echo -e "$summary"
exit $status
