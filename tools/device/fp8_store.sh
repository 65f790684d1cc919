#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle"]): the fp8 store on the cuda backend in one call
# (issue 34, plans/0030's GPU section and plans/0032): the fp8 GPU tests and the storage / backend
# regressions they touch, the daemon end to end (tests/integration/run_cuda_integration.sh, bf16 and
# fp8), the capacity must-show (two daemons at one --kv_memory_fraction, Stats of each), and the
# decode step in process (bf16 Hopper, bf16 portable, fp8) with the stats of each.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/bundle_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv,noheader
status=0
for t in ${TESTS:-kv_fp8_write_test cuda_fp8_storage_test cuda_fp8_backend_test mla_verify_flash_fp8_test \
  cuda_kv_storage_test cuda_kv_store_test cuda_backend_test kv_slot_write_test cuda_external_verify_test \
  verifyd_executor_tests verifyd_service_tests}; do
  [ -x "$B/bin/$t" ] || { echo "== $t missing"; continue; }
  timeout 240 "$B/bin/$t" >"$OUT/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $t rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$OUT/$t.log" | tr -s ' \n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|SEED=" "$OUT/$t.log" | head -20
done
grep -E "^fp8 " "$OUT/mla_verify_flash_fp8_test.log" | head -3
if [ -x "$B/bin/fake_scheduler" ]; then
  timeout 300 bash tests/integration/run_cuda_integration.sh "$B/bin/verifyd" "$B/bin/fake_scheduler" \
    "$B/bin/verifyctl" >"$OUT/cuda_integration.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== cuda_integration rc=$rc"
  tail -6 "$OUT/cuda_integration.log"
fi
# Capacity: the same memory fraction, each dtype; Stats from verifyctl.
for dtype in bf16 fp8; do
  sock=/tmp/verifyd-cap-$dtype.sock
  "$B/bin/verifyd" --listen="unix://$sock" --metrics= --backend=cuda --layers=61 --heads=8 \
    --kv_memory_fraction=0.5 --kv_dtype=$dtype >"$OUT/cap-$dtype.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do "$B/bin/verifyctl" --target="unix://$sock" health >/dev/null 2>&1 && break; sleep 0.5; done
  echo "== capacity $dtype: $("$B/bin/verifyctl" --target="unix://$sock" stats 2>&1 | grep -iE 'capacity|kv dtype|token bytes|kv pool' | tr -s ' \n' ' ')"
  kill -TERM $pid; wait $pid
done
for cfg in "bf16 auto" "bf16 portable" "fp8 auto"; do
  set -- $cfg
  timeout 200 "$B/bin/decode_step_bench" --ways=model,inproc --kv_dtype=$1 --flash_kernel=$2 \
    >"$OUT/decode-$1-$2.log" 2>&1
  echo "== decode step kv=$1 flash=$2 rc=$?"
  grep -E "^\| (model|in-process)|verifyd side|host per call" "$OUT/decode-$1-$2.log" | head -6
done
echo "== status $status"
exit $status
