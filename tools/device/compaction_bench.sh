#!/usr/bin/env bash
# On the GPU machine (from run_device.sh, or alone with the run tool, carry ["bundle"]): compaction
# bytes/s ÷ cudaMemcpy D2D bytes/s in one run (SPEC §5: must >= 0.5, goal >= 0.7), the way the
# daemon compacts (CompactionManager, auto chunk) on a 61-layer and a 2-layer pool, with every
# sequence read back afterwards; plus the run-copy kernel alone. Needs compaction_bench in the
# bundle (tools/device/make_bundle.sh's target list). Extra arguments go to the program
# (e.g. --chunk_bytes=268435456, --capacity=131072). Log: $OUT/compaction_bench.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-bundle}
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -x "$B/bin/compaction_bench" ]; then
  echo "compaction_bench is not in $B/bin (add it to make_bundle.sh's targets)"
  exit 1
fi
status=0
# The auto chunk first (what the daemon does), then larger and smaller chunks on 61 layers.
timeout 300 "$B/bin/compaction_bench" --layers=61,2 "$@" 2>&1 | tee "$OUT/compaction_bench.log"
[ "${PIPESTATUS[0]}" -ne 0 ] && status=1
if [ "${COMPACTION_CHUNK_SWEEP:-1}" = 1 ]; then
  for chunk in 16777216 268435456; do
    echo "== chunk $chunk bytes"
    timeout 200 "$B/bin/compaction_bench" --layers=61,2 --chunk_bytes=$chunk "$@" 2>&1 \
      | tee -a "$OUT/compaction_bench.log" | grep -E "^==|compaction|ratio|mismatch"
    [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
  done
fi
exit $status
