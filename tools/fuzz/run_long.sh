#!/usr/bin/env bash
# The long fuzz run (issue 17): builds the libFuzzer targets with clang under ASan+UBSan (CPU only)
# and runs each for SECONDS from its seed corpus, then prints executions, coverage (libFuzzer's
# edge "cov" and feature "ft" counts) and crashes per target. New inputs go to build-fuzz/corpus
# (MERGE=1 merges the ones that add coverage into tests/fuzz/corpus/, libFuzzer's -merge=1, so the
# seed corpus keeps growing run after run; commit what it added); a crash leaves its input in
# build-fuzz/artifacts.
#   [TARGETS="kv_store_fuzz ..."] [MERGE=1] tools/fuzz/run_long.sh [seconds per target, default
#   3600] [jobs per target, default 1]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${1:-3600}
JOBS=${2:-1}
BUILD=${BUILD:-build-fuzz}
command -v clang++-14 >/dev/null || { echo "run_long.sh: clang++-14 is missing (deploy/install_deps.sh)"; exit 1; }
CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DVERIFYD_CUDA=OFF \
  -DVERIFYD_SANITIZE=address,undefined -DVERIFYD_FUZZ=ON ${VERIFYD_CMAKE_ARGS:-} >/dev/null
read -r -a targets <<<"${TARGETS:-request_fuzz tree_mask_fuzz kv_store_fuzz descriptor_fuzz}"
cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"
status=0
for t in "${targets[@]}"; do
  corpus="$BUILD/corpus/$t"
  artifacts="$BUILD/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  log="$BUILD/$t.log"
  set +e
  "$BUILD/tests/fuzz/$t" "$corpus" "tests/fuzz/corpus/$t" -max_total_time="$SECS" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts" \
    $([ "$JOBS" -gt 1 ] && echo "-fork=$JOBS") >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{s+=$2} END {print s+0}')
  if [ "$execs" = 0 ]; then  # fork mode: the parent's status lines start with the total
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  fi
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  crashes=$(find "$artifacts" -type f | wc -l)
  printf '%-16s %14s executions  %-22s crashes %s  (exit %s, log %s)\n' "$t" "$execs" "$cov" \
    "$crashes" "$rc" "$log"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then status=1; fi
  if [ "${MERGE:-0}" = 1 ]; then
    before=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
    "$BUILD/tests/fuzz/$t" -merge=1 "tests/fuzz/corpus/$t" "$corpus" >"$BUILD/$t.merge.log" 2>&1
    after=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
    echo "$t: merged $((after - before)) inputs that add coverage into tests/fuzz/corpus/$t"
  fi
done
exit $status
