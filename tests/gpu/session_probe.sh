#!/usr/bin/env bash
# On the GPU machine: a shorter pass than run_device.sh for the service's hot path: every GPU test
# binary (summaries only), the backend's overhead around the kernel (staged vs registered host
# memory), the handler-mode A/B (rpc_probe.sh) and rpc_bench's latency rows. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-bundle}
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VERIFYD_BINARY="$PWD/$B/bin/verifyd"
summary=""
# TESTS: a regex of test binaries to run (default: all); BACKEND_BENCH=0 skips the backend bench.
for t in $(ls $B/bin/*_test $B/bin/*_tests | grep -E "${TESTS:-.}"); do
  n=$(basename $t); timeout 180 $t > $OUT/t-$n.log 2>&1; rc=$?
  summary="$summary\n$n rc=$rc $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' $OUT/t-$n.log | tr '\n' ' ')"
done
echo "== tests"; echo -e "$summary"
if [ "${BACKEND_BENCH:-1}" = 1 ]; then
  echo "== cuda_backend_bench --overhead-only"
  timeout 120 $B/bin/cuda_backend_bench 30 --overhead-only 2>&1 | tee $OUT/cuda_backend_bench.log | tail -24
fi
echo "== rpc_probe"; BUNDLE=$B timeout 150 bash tests/gpu/rpc_probe.sh 2>&1 | tee $OUT/rpc_probe.txt
echo "== rpc_bench (latency)"
BUNDLE=$B RPC_COMPACTION61=${RPC_COMPACTION61:-0} timeout 240 bash tests/gpu/rpc_bench.sh 2>&1 | tail -30
