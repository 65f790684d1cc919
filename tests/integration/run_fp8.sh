#!/usr/bin/env bash
# Integration with --kv_dtype=fp8 (plans/0030-fp8-store.md): the real verifyd (cpu backend) with
# an fp8 store, the fake scheduler checking every output against its reference over the rows
# quantized as the daemon quantizes them (inline, then shared memory, then the channel, an
# operator Compact in the middle), verifyctl stats and the metrics reporting the dtype, and
# SIGTERM -> exit 0.
# usage: run_fp8.sh VERIFYD FAKE_SCHEDULER VERIFYCTL
set -euo pipefail
VERIFYD=$1 SCHEDULER=$2 VERIFYCTL=$3
source "$(dirname "$0")/../lib/daemon.sh"

work=$(mktemp -d /tmp/verifyd-fp8.XXXXXX)
target="unix://$work/verifyd.sock"
trap 'daemon_kill_all; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/daemon.log" || true; exit 1; }
ctl() { "$VERIFYCTL" --target="$target" "$@"; }

daemon_start "$VERIFYD" --listen="$target" --metrics=127.0.0.1:0 --backend=cpu --kv_dtype=fp8 \
  --layers=2 --heads=2 --max_tree_nodes=128 --kv_capacity_tokens=12288 \
  --max_message_bytes=1048576 >"$work/daemon.log" 2>&1
daemon_pid=$DAEMON_PID
daemon_wait_healthy "$VERIFYCTL" "$target" "$daemon_pid" 30 || fail "verifyd did not start"
grep -q "kv_dtype=fp8 kv_bytes_per_token=656" "$work/daemon.log" || fail "startup line lacks fp8"

ctl stats | tee "$work/stats0.txt" || fail "verifyctl stats"
grep -Eq "^kv dtype +fp8$" "$work/stats0.txt" || fail "stats: kv dtype is not fp8"
grep -Eq "^kv token bytes +656 " "$work/stats0.txt" || fail "stats: bytes per token not 656"
grep -Eq "^kv pool +15.38 MiB$" "$work/stats0.txt" || fail "stats: pool is not 12288 x 2 x 656 B"

for way in "" --shared_memory --channel; do
  "$SCHEDULER" --target="$target" --sequences=6 --steps=20 --threads=3 --batch=2 --seed=21 \
    --prefill_tokens=64-400 --tree_sizes=8-40 --compact_at_step=10 --max_message_bytes=1048576 \
    $way | tee "$work/scheduler.log" || fail "fake_scheduler $way reported errors"
  grep -q "OK: zero mismatches" "$work/scheduler.log" || fail "no success line ($way)"
done
grep -q "compaction .* DONE" "$work/scheduler.log" || fail "the mid-run Compact did not finish"
ctl stats | tee "$work/stats1.txt" || fail "verifyctl stats"
grep -Eq "^used tokens +0 " "$work/stats1.txt" || fail "slots left in use after every Release"

metrics_url=$(grep -o 'metrics=http://[^ ]*' "$work/daemon.log" | head -1 | cut -d= -f2-)
if [[ -n "$metrics_url" ]] && command -v curl >/dev/null; then
  curl -fsS "$metrics_url" >"$work/metrics.txt" || fail "scrape of $metrics_url"
  grep -q '^verifyd_kv_bytes_per_token{dtype="fp8"} 656$' "$work/metrics.txt" ||
    fail "no verifyd_kv_bytes_per_token{dtype=\"fp8\"} 656 in /metrics"
  grep -q '^verifyd_kv_pool_bytes 16121856$' "$work/metrics.txt" || fail "verifyd_kv_pool_bytes"
else
  echo "metrics scrape skipped (no metrics address in the log or no curl)"
fi

rc=0
daemon_stop "$daemon_pid" || rc=$?
[[ $rc == 0 ]] || fail "verifyd exited $rc after SIGTERM, want 0"
echo "PASS: fp8 store end to end"
