#!/usr/bin/env bash
# On the GPU machine (carry ["bundle.tgz"]): the data plane's death and cost checks
# (plans/0018-data-plane-gpu.md, plans/0013-python-package.md).
#   1. DataPlaneGpuTest's killed-scheduler test, without and with MPS; STACKS=1 dumps the daemon's
#      threads with cuda-gdb STACK_AFTER seconds after the kill (bundle/bin/verifyd.debug,
#      unstripped, when present) to $OUT/stacks_*.txt (not under MPS: no late attach there)
#   2. the Python data plane's checks without MPS, then under MPS (private directories, stopped
#      on every exit path); the per-call host cost is their last line
#   TESTS: whole test binaries of the bundle to run first
#   3. MEMCHECK=1: compute-sanitizer memcheck over the CUDA backend's tests (API errors not
#      reported: the tests refuse stale and foreign IPC handles on purpose)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
[ -d bundle ] || tar xzf bundle.tgz
B=$PWD/bundle
export LD_LIBRARY_PATH="$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
daemon=$B/bin/verifyd
[ -x "$B/bin/verifyd.debug" ] && daemon=$B/bin/verifyd.debug
export VERIFYD_BINARY=$daemon
summary=""

killed_test() {  # label
  local log="$OUT/killed_$1.txt"
  timeout -s KILL 120 "$B/bin/data_plane_gpu_test" --gtest_also_run_disabled_tests \
    --gtest_filter='*Killed*' >"$log" 2>&1 &
  local test_pid=$!
  # The test prints the daemon's pid when it has killed the scheduler; the threads are read
  # STACK_AFTER seconds later (while another client waits, if it does), and once more at 6 s.
  for _ in $(seq 1 300); do grep -q "killed the scheduler" "$log" 2>/dev/null && break; sleep 0.1; done
  local pid
  pid=$(grep -o "daemon pid [0-9]*" "$log" | grep -o "[0-9]*$")
  [ "${STACKS:-0}" = 1 ] || pid=""  # cuda-gdb cannot attach under MPS ("late attach")
  for at in "${STACK_AFTER:-1}" 5; do
    sleep "$at"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break
    {
      echo "== daemon $pid ($1), ${at}s more"
      for t in /proc/$pid/task/*; do echo "$(basename $t) $(cat $t/comm) $(cat $t/wchan) $(awk '{print $3}' $t/stat)"; done
      timeout 60 cuda-gdb -p "$pid" -batch -ex "set pagination off" -ex "thread apply all bt 30" 2>&1 \
        | grep -v "^\[New Thread\|^$" | head -500
    } >>"$OUT/stacks_$1.txt" 2>&1
  done
  wait $test_pid
  local rc=$?
  summary+="killed scheduler ($1): rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$log" | tr '\n' ' ')"$'\n'
  grep -E "Failure|Expected|Which is|actual|DEADLINE|error" "$log" | head -12
}

python_checks() {  # label, checks...
  local label=$1; shift
  env -u LD_LIBRARY_PATH timeout -s KILL 200 python3 tools/device/python_dataplane_gpu.py \
    --verifyd "$B/bin/verifyd" --python "$B/python" --lib "$B/pylib/libverifyd_dataplane.so" \
    --daemon-ld-path "$LD_LIBRARY_PATH" "$@" >"$OUT/python_$label.txt" 2>&1
  local rc=$?
  summary+="python ($label): rc=$rc $(tail -1 "$OUT/python_$label.txt")"$'\n'
  grep -E "^(PASS|FAIL)" "$OUT/python_$label.txt" | cut -c1-600
}

for t in ${TESTS:-}; do  # whole test binaries first (e.g. data_plane_gpu_test)
  timeout -s KILL 150 "$B/bin/$t" --gtest_brief=1 >"$OUT/test_$t.txt" 2>&1
  summary+="$t: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/test_$t.txt" | tr '\n' ' ')"$'\n'
  grep -E "Failure|FAILED" "$OUT/test_$t.txt" | head -8
done
echo "== killed scheduler, no MPS"
[ "${KILLED_PLAIN:-1}" = 1 ] && killed_test plain
if [ "${PYTHON:-1}" = 1 ]; then echo "== python, no MPS"; python_checks plain cost; fi

source tools/device/mps.sh
if start_mps; then
  if [ "${PYTHON:-1}" = 1 ]; then echo "== python, MPS"; python_checks mps; fi
  if [ "${KILLED_MPS:-1}" = 1 ]; then
    echo "== killed scheduler, MPS"
    killed_test mps
  fi
  stop_mps
fi

if [ "${MEMCHECK:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for t in ${MEMCHECK_TESTS:-cuda_backend_test cuda_kv_storage_test cuda_external_verify_test cuda_decode_mirror_test}; do
    timeout -s KILL 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$B/bin/$t" \
      --gtest_brief=1 >"$OUT/memcheck_$t.txt" 2>&1
    summary+="memcheck $t: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_$t.txt") $(grep -E '^\[  (PASSED|FAILED)' "$OUT/memcheck_$t.txt" | tr '\n' ' ')"$'\n'
  done
fi
(cd "$OUT" && tar czf logs.tgz *.txt && rm -f *.txt)
echo "== summary"; printf '%s' "$summary"
