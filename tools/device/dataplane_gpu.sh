#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle.tgz"], after tools/device/make_bundle.sh and
# `tar czf bundle.tgz bundle`): the data plane's GPU checks and the decode-step bench, without and
# with MPS (plans/0018-data-plane-gpu.md).
#   1. the CUDA backend's GPU tests that cover the external path and the refactored Verify path,
#      the device-row Append, and the data plane end to end (data_plane_gpu_test: the daemon
#      binary on cuda, this bundle's verifyd); initcheck over the backend's oracle test
#   2. the bench without MPS
#   3. MPS on a private pipe directory: the same external test (IPC handles under MPS, the MPS
#      attribute), then the bench; MPS is stopped before the script ends, whatever happened
# The bench runs every way by default, the captured-graph ways last (captured, captured_inplace:
# the whole step captured once in a CUDA graph and replayed; their engine process,
# bundle/bin/decode_step_captured_engine, logs its checks to the bench's stderr: "captured
# engine: ..."). Full logs under $OUT; the tables last. BENCH_ARGS passes flags to the bench (e.g.
# --prefix=20000, or --ways=model,inproc,stream,captured,captured_inplace for the captured rows
# and what they are compared with); BENCH_TIMEOUT (280 s) bounds each bench.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
[ -d bundle ] || tar xzf bundle.tgz
B=bundle
cublas_dir=$(bash tools/device/cublas_dir.sh)
export LD_LIBRARY_PATH="$PWD/$B/lib${cublas_dir:+:$cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm --format=csv,noheader | tee "$OUT/device.txt"

# verifyd's own report (startup line, Stats, gauge): started, asked, stopped; argument = label.
daemon_report() {
  [ -x "$B/bin/verifyd" ] || return 0
  local sock=unix:///tmp/verifyd-mps-check.sock
  "$B/bin/verifyd" --listen="$sock" --metrics=127.0.0.1:9479 --backend=cuda --layers=1 --heads=8 \
    --max_tree_nodes=64 --kv_capacity_tokens=65536 >"$OUT/daemon_$1.txt" 2>&1 &
  local pid=$!
  for _ in $(seq 1 200); do "$B/bin/verifyctl" --target="$sock" health >/dev/null 2>&1 && break; sleep 0.1; done
  echo "$1: $(grep -o 'backend=[a-z]* mps=[a-z]*' "$OUT/daemon_$1.txt")" \
    "stats: $("$B/bin/verifyctl" --target="$sock" stats 2>&1 | grep -i mps | tr -s ' ')" \
    "gauge: $(curl -fsS http://127.0.0.1:9479/metrics 2>/dev/null | grep '^verifyd_mps_active')"
  kill -TERM $pid; wait $pid
}
summary=""
run_test() {  # name, log suffix
  local t=$1 log="$OUT/$1$2.txt"
  timeout -s KILL 90 "$B/bin/$t" --gtest_brief=1 >"$log" 2>&1
  local rc=$?
  summary+="$t$2: rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$log" | tr '\n' ' ')"$'\n'
  grep -E 'FAILED|Failure|error|MPS active' "$log" | head -20
}
export VERIFYD_BINARY="$PWD/$B/bin/verifyd"
for t in ${TESTS:-cuda_external_verify_test data_plane_gpu_test data_plane_captured_gpu_test cuda_kv_storage_test cuda_kv_store_test cuda_backend_test cuda_decode_mirror_test}; do
  run_test "$t" ""
done
if [ "${INITCHECK:-1}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  timeout -s KILL 240 compute-sanitizer --tool initcheck "$B/bin/cuda_backend_test" \
    --gtest_filter='*RandomBatchesMatchTheFloat64Oracle*:*GraphReplay*' >"$OUT/initcheck.txt" 2>&1
  summary+="initcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/initcheck.txt")"$'\n'
  grep -E "Uninitialized" -A3 "$OUT/initcheck.txt" | grep -E "Uninitialized|at 0x|by thread" | sort | uniq -c | sort -rn | head -8
fi
daemon_report plain
timeout -s KILL ${BENCH_TIMEOUT:-280} "$B/bin/decode_step_bench" ${BENCH_ARGS:-} >"$OUT/bench_plain.txt" 2>"$OUT/bench_plain.err"
echo "bench (no MPS) rc=$?"

source tools/device/mps.sh
if start_mps; then
  run_test cuda_external_verify_test "_mps"
  daemon_report mps
  timeout -s KILL ${BENCH_TIMEOUT:-280} "$B/bin/decode_step_bench" ${BENCH_ARGS:-} >"$OUT/bench_mps.txt" 2>"$OUT/bench_mps.err"
  echo "bench (MPS) rc=$?"
  # SMALL_ARGS: a second bench where attention is short, so the per-layer overheads stand out.
  if [ -n "${SMALL_ARGS:-}" ]; then
    timeout -s KILL 100 "$B/bin/decode_step_bench" $SMALL_ARGS >"$OUT/bench_small_mps.txt" 2>>"$OUT/bench_mps.err"
    echo "small bench (MPS) rc=$?"
  fi
  ls "$CUDA_MPS_PIPE_DIRECTORY" >"$OUT/mps_pipe_dir.txt" 2>&1
  cp "$CUDA_MPS_LOG_DIRECTORY"/control.log "$OUT/mps_control.log" 2>/dev/null
  stop_mps
fi
echo "== bench logs (short)"; grep -E "failed|rror" "$OUT/bench_plain.err" "$OUT/bench_mps.err" 2>/dev/null | head -5
echo "== captured engine"; grep -h "captured engine" "$OUT/bench_plain.err" "$OUT/bench_mps.err" 2>/dev/null
echo "== tests"; printf '%s' "$summary"
echo "== bench logs"; cat "$OUT/bench_plain.err" "$OUT/bench_mps.err" 2>/dev/null | grep -v '^$' | tail -30
echo "== bench, no MPS"; cat "$OUT/bench_plain.txt"
echo "== bench, MPS"; cat "$OUT/bench_mps.txt" 2>/dev/null
if [ -n "${SMALL_ARGS:-}" ]; then echo "== small bench, MPS"; cat "$OUT/bench_small_mps.txt"; fi
echo "== tests (again, last)"; printf '%s' "$summary"
