#!/usr/bin/env bash
# On the GPU machine (run tool, carry ["bundle.tgz", "bundle-before.tgz"]): a per-layer change of
# the decode step measured the way plans/0031 records its changes (session 26, changes 3-6).
#   1. the GPU tests named in TESTS (default: the data plane's and the value check's) from the new
#      bundle; cuda_ipc_producer must be in it for cuda_external_verify_test
#   2. the in-process step (decode_step_bench --ways=model,inproc --steps 20), the two bundles
#      interleaved RUNS times (default 3): the change's effect is the pairs' difference, since a
#      machine's step drifts by more than a change's few microseconds between calls
#   3. the headline of the new bundle: the SH kernel bench before and after the five ways with MPS
#      on (in-process ÷ (GEMMs + 61 x SH flash + combine), SPEC §5; both SH readings printed)
# Make the bundles here with tools/device/make_bundle.sh (TARGETS: decode_step_bench
# decode_step_captured_engine verifyd verifyctl mla_verify_bench cuda_ipc_producer and the tests),
# `tar czf bundle.tgz --exclude=bundle/pylib --exclude=bundle/wheel bundle`, once before the
# change (renamed bundle-before.tgz) and once after. The bench links verifyd statically, so the two
# bundles may share the new one's library path. A third bundle, bundle-mid.tgz (a build between the
# two), joins the interleave when it is carried. KERNEL_SHAPES (e.g. S1,S3,S5,SH): the kernel bench
# of the first and the last bundle on those shapes, interleaved twice (a kernel change's A/B).
# RACECHECK: a gtest filter of mla_verify_flash_test run under compute-sanitizer racecheck.
# STEP=0 leaves out the step's parts (the interleave, the SH bench and the MPS ways): a kernel call.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p before && tar xzf bundle-before.tgz -C before && tar xzf bundle.tgz
bundles="before/bundle bundle"
if [ -f bundle-mid.tgz ]; then
  mkdir -p mid && tar xzf bundle-mid.tgz -C mid && bundles="before/bundle mid/bundle bundle"
fi
source tools/device/bundle_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
summary=""
for t in ${TESTS:-value_bound_check_test cuda_external_verify_test data_plane_gpu_test data_plane_captured_gpu_test}; do
  [ -x "$B/bin/$t" ] || { summary+="$t: not in the bundle"$'\n'; continue; }
  timeout -s KILL 150 "$B/bin/$t" --gtest_brief=1 >"$OUT/$t.txt" 2>&1
  summary+="$t: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/$t.txt" | tr '\n' ' ')"$'\n'
  grep -E '^\[  FAILED|Failure|Expected|Which is' "$OUT/$t.txt" | head -8
done
printf '%s' "$summary"
[ "${STEP:-1}" = 0 ] && RUNS=0
for r in $(seq 1 "${RUNS:-3}"); do
  for b in $bundles; do
    log="$OUT/inproc_${r}_${b%%/*}.txt"
    timeout 100 "$b/bin/decode_step_bench" --ways=model,inproc --steps 20 >"$log" 2>/dev/null
    echo "$b run $r: $(grep -E '^\| (model|in-process, graphs)' "$log" | awk -F'|' '{printf "%s %s; ", $2, $3}')"
  done
done
if [ -n "${KERNEL_SHAPES:-}" ]; then
  for r in 1 2; do
    for b in before/bundle bundle; do
      echo "kernel bench $b run $r:"
      timeout 150 "$b/bin/mla_verify_bench" --iters 20 --no-naive --shapes "$KERNEL_SHAPES" \
        >"$OUT/kernel_${r}_${b%%/*}.txt" 2>&1
      f="$OUT/kernel_${r}_${b%%/*}.txt"
      grep -E '^measured' "$f"
      sed -n '/^shape /,/^$/p' "$f" | awk '{print $1, $2, $3, $8, $9, $10, $11}'
    done
  done
fi
if [ -n "${RACECHECK:-}" ] && command -v compute-sanitizer >/dev/null; then
  timeout -s KILL 200 compute-sanitizer --tool racecheck "$B/bin/mla_verify_flash_test" \
    --gtest_filter="$RACECHECK" >"$OUT/racecheck.txt" 2>&1
  echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|PASSED|FAILED' "$OUT/racecheck.txt" | tr '\n' ' ')"
fi
if [ "${STEP:-1}" = 0 ]; then
  printf '%s' "$summary"
  exit 0
fi
timeout 100 "$B/bin/mla_verify_bench" --iters 20 --no-naive --shapes SH 2>&1 | grep -E '^SH  '
source tools/device/mps.sh
if start_mps; then
  timeout -s KILL 150 "$B/bin/decode_step_bench" --ways=model,inproc,stream,captured,captured_inplace \
    >"$OUT/mps.txt" 2>"$OUT/mps.err"
  echo "bench (MPS) rc=$?"
  stop_mps
fi
timeout 100 "$B/bin/mla_verify_bench" --iters 20 --no-naive --shapes SH 2>&1 | grep -E '^SH  '
echo "captured engine checks: $(grep -h 'captured engine' "$OUT/mps.err" | grep -c 'replays checked') of 2 ways"
grep -E '^\|' "$OUT/mps.txt"
printf '%s' "$summary"
