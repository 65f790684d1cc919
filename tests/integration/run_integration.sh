#!/usr/bin/env bash
# Integration: the real verifyd on a temporary Unix socket, driven by the fake scheduler (8
# sequences, 2 layers, 50 steps each, an operator Compact in the middle), then verifyctl, a
# Prometheus scrape checked by promtool, a short two-rank (tensor-parallel) run through GroupClient
# against a second daemon, and SIGTERM -> exit 0 for both.
# usage: run_integration.sh VERIFYD FAKE_SCHEDULER VERIFYCTL
set -euo pipefail
VERIFYD=$1 SCHEDULER=$2 VERIFYCTL=$3
source "$(dirname "$0")/../lib/daemon.sh"

work=$(mktemp -d /tmp/verifyd-it.XXXXXX)
target="unix://$work/verifyd.sock"
target1="unix://$work/verifyd-1.sock"
trap 'daemon_kill_all; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/daemon.log" || true; exit 1; }
ctl() { "$VERIFYCTL" --target="$target" "$@"; }

# Small geometry and capacity so the CPU backend finishes in seconds on 2 cores; messages of
# 1 MiB make the longer prefills arrive in several chunks.
daemon_flags=(--backend=cpu --layers=2 --heads=2 --max_tree_nodes=257 --kv_capacity_tokens=12288
  --max_message_bytes=1048576 --lease_seconds=120)
daemon_start "$VERIFYD" --listen="$target" --metrics=127.0.0.1:0 "${daemon_flags[@]}" \
  >"$work/daemon.log" 2>&1
daemon_pid=$DAEMON_PID
# Rank 1 of the tensor-parallel run below.
daemon_start "$VERIFYD" --listen="$target1" --metrics= "${daemon_flags[@]}" >"$work/daemon1.log" 2>&1
daemon1_pid=$DAEMON_PID

for rank in 0 1; do
  t=$target pid=$daemon_pid
  ((rank == 0)) || t=$target1 pid=$daemon1_pid
  daemon_wait_healthy "$VERIFYCTL" "$t" "$pid" 30 ||
    fail "verifyd $t exited or hung during startup: $(cat "$work/daemon1.log")"
  [[ "$("$VERIFYCTL" --target="$t" health)" == "SERVING" ]] || fail "$t never reached SERVING"
done

"$SCHEDULER" --target="$target" --sequences=8 --steps=50 --threads=4 --batch=2 --seed=11 \
  --prefill_tokens=64-640 --tree_sizes=8-40 --compact_at_step=25 --max_message_bytes=1048576 \
  | tee "$work/scheduler.log" || fail "fake_scheduler reported errors"
grep -q "OK: zero mismatches" "$work/scheduler.log" || fail "no success line from fake_scheduler"
grep -q "compaction .* DONE" "$work/scheduler.log" || fail "the mid-run Compact did not finish"

ctl stats | tee "$work/stats.txt" || fail "verifyctl stats"
grep -Eq "^sequences +0$" "$work/stats.txt" || fail "sequences left after every Release"
grep -Eq "^used tokens +0 " "$work/stats.txt" || fail "slots left in use after every Release"
# A second, shorter run with trees up to 257 nodes leaves its sequences live and fragmented
# for the operator commands.
"$SCHEDULER" --target="$target" --sequences=4 --steps=12 --threads=2 --batch=1 --seed=12 \
  --prefill_tokens=32-96 --tree_sizes=8-257 --release=false --max_message_bytes=1048576 \
  | tee "$work/kept.log" || fail "fake_scheduler (kept sequences) reported errors"
kept=$(grep -o 'kept sequences .*' "$work/kept.log" | cut -c16-)
[[ $(wc -w <<<"$kept") == 4 ]] || fail "want 4 kept sequence ids, got '$kept'"
ctl stats | tee "$work/stats2.txt" || fail "verifyctl stats"
grep -Eq "^sequences +4$" "$work/stats2.txt" || fail "stats must show the 4 kept sequences"
# The leak runbook's listing: exactly the kept ids, ascending, in the table and in the JSON.
ctl sequences | tee "$work/sequences.txt" || fail "verifyctl sequences"
listed=$(awk 'NR > 1 && NF == 6 && $1 ~ /^[0-9]+$/ {print $1}' "$work/sequences.txt" | tr '\n' ' ')
[[ "$listed" == "$(tr ' ' '\n' <<<"$kept" | grep . | sort -n | tr '\n' ' ')" ]] ||
  fail "verifyctl sequences listed '$listed', want the kept '$kept' ascending"
grep -q "^4 of 4 sequences$" "$work/sequences.txt" || fail "verifyctl sequences: no count line"
ctl -o json sequences >"$work/sequences.json" || fail "verifyctl -o json sequences"
for id in $kept; do
  grep -q "\"sequence_id\":\"$id\"" "$work/sequences.json" || fail "sequence $id not in the JSON"
done
runs=$(awk '/^fragment runs/ {print $3}' "$work/stats2.txt")
ctl compact --budget-bytes=0 --poll-ms=20 | tee "$work/compact.txt" || fail "verifyctl compact"
grep -Eq "^state +DONE" "$work/compact.txt" || fail "compact did not report DONE"
if ((runs > 4)); then
  ! grep -Eq "^bytes moved +0 B" "$work/compact.txt" || fail "$runs runs over 4 sequences but nothing moved"
  grep -Eq "^after +4 runs over 4 sequences" "$work/compact.txt" ||
    fail "a compaction until converged must leave one run per sequence"
fi
for id in $kept; do
  ctl release --sequence="$id" | grep -q "slots freed" || fail "verifyctl release --sequence=$id"
done
ctl stats | grep -Eq "^used tokens +0 " || fail "slots left in use after releasing the kept sequences"

# Two tensor-parallel ranks through GroupClient: the same sequences on both daemons, each rank its
# own heads, a Compact on both mid-run.
"$SCHEDULER" --target="$target,$target1" --sequences=4 --steps=10 --threads=2 --batch=2 --seed=14 \
  --prefill_tokens=32-128 --tree_sizes=8-32 --compact_at_step=5 --max_message_bytes=1048576 \
  | tee "$work/tp.log" || fail "fake_scheduler (2 ranks) reported errors"
grep -q "OK: zero mismatches" "$work/tp.log" || fail "no success line from the 2-rank run"

# The checker itself: a corrupted reference input must be reported as a mismatch, exit 1.
set +e
"$SCHEDULER" --target="$target" --sequences=1 --steps=3 --threads=1 --seed=13 --prefill_tokens=16 \
  --tree_sizes=8 --corrupt_reference_at_step=1 >"$work/corrupt.log" 2>&1; rc_corrupt=$?
set -e
[[ $rc_corrupt == 1 ]] && grep -q "MISMATCH sequence .* step 1 layer 0" "$work/corrupt.log" ||
  fail "a corrupted reference went unnoticed (exit $rc_corrupt): $(cat "$work/corrupt.log")"
grep -m1 MISMATCH "$work/corrupt.log"

set +e
ctl release --sequence=987654321 >/dev/null 2>&1; rc_missing=$?
ctl frobnicate >/dev/null 2>&1; rc_usage=$?
set -e
[[ $rc_missing == 1 ]] || fail "release of an unknown sequence: exit $rc_missing, want 1"
[[ $rc_usage == 2 ]] || fail "bad usage: exit $rc_usage, want 2"

metrics_url=$(grep -o 'metrics=http://[^ ]*' "$work/daemon.log" | head -1 | cut -d= -f2-)
if [[ -n "$metrics_url" ]] && command -v curl >/dev/null; then
  curl -fsS "$metrics_url" >"$work/metrics.txt" || fail "scrape of $metrics_url"
  grep -q '^verifyd_rpc_requests_total{.*method="Verify"' "$work/metrics.txt" ||
    fail "no Verify requests counted in /metrics"
  if command -v promtool >/dev/null; then
    problems=$(promtool check metrics <"$work/metrics.txt" 2>&1) || fail "promtool: $problems"
    [[ -z "$problems" ]] || fail "promtool reported: $problems"
    echo "promtool check metrics: no problems"
  fi
else
  echo "metrics scrape skipped (no metrics address in the log or no curl)"
fi

rc=0 rc1=0
kill -TERM "$daemon1_pid"  # both drain at once; daemon_stop signals the first and waits
daemon_stop "$daemon_pid" || rc=$?
daemon_reap "$daemon1_pid" || rc1=$?
[[ $rc == 0 && $rc1 == 0 ]] || fail "verifyd exited $rc and $rc1 after SIGTERM, want 0"
echo "integration: OK"
