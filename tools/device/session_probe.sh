#!/usr/bin/env bash
# On the GPU machine: a shorter pass than run_device.sh for the service's hot path: GPU test
# binaries (summaries only), optionally the CUDA integration run and compaction_bench, the
# backend's overhead around the kernel (staged vs registered host memory), the handler-mode A/B
# (rpc_probe.sh) and rpc_bench. Logs under $OUT.
#   TESTS: regex of test binaries to run (default all); BACKEND_BENCH=0 skips the backend bench;
#   INTEGRATION=1 / COMPACTION=1 add those; RPC_COMPACTION61=1 adds rpc_bench's 61-layer Compact.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-bundle}
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VERIFYD_BINARY="$PWD/$B/bin/verifyd"
summary=""
for t in $(ls $B/bin/*_test $B/bin/*_tests | grep -E "${TESTS:-.}"); do
  n=$(basename $t); timeout 180 $t > $OUT/t-$n.log 2>&1; rc=$?
  summary="$summary\n$n rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' $OUT/t-$n.log | tr '\n' ' ')"
done
echo "== tests"; echo -e "$summary"
if [ "${INTEGRATION:-0}" = 1 ]; then
  timeout 240 bash tests/integration/run_cuda_integration.sh "$B/bin/verifyd" "$B/bin/fake_scheduler" \
    "$B/bin/verifyctl" >"$OUT/cuda_integration.log" 2>&1
  echo "== cuda_integration rc=$?"; tail -4 "$OUT/cuda_integration.log"
fi
if [ "${COMPACTION:-0}" = 1 ]; then
  echo "== compaction_bench"
  BUNDLE=$B COMPACTION_CHUNK_SWEEP=0 timeout 200 bash tools/device/compaction_bench.sh 2>&1 \
    | grep -E "D2D|all .* operations|compaction [(]|own figure|mismatch" | tail -12
fi
if [ "${BACKEND_BENCH:-1}" = 1 ]; then
  echo "== cuda_backend_bench --overhead-only"
  timeout 120 $B/bin/cuda_backend_bench 30 --overhead-only 2>&1 | tee $OUT/cuda_backend_bench.log | tail -24
fi
echo "== rpc_probe"
BUNDLE=$B timeout 150 bash tools/device/rpc_probe.sh 2>&1 | tee $OUT/rpc_probe.txt \
  | grep -E "client|ping|tail:|rpc_duration|queue_duration|kernel=.verify"
echo "== rpc_bench"
BUNDLE=$B RPC_COMPACTION61=${RPC_COMPACTION61:-0} timeout 240 bash tools/device/rpc_bench.sh 2>&1 | tail -42
