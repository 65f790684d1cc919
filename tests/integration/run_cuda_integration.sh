#!/usr/bin/env bash
# GPU integration: the real verifyd with --backend=cuda, driven by the fake scheduler (every Verify
# checked against the CPU reference), with a Compact in the middle of concurrent Verify traffic and
# trees up to 257 nodes; then the graph counters in /metrics, SIGTERM -> exit 0, and the same run
# with graphs off when the daemon has the flag, and with --kv_dtype=fp8. Exits 77 (ctest: skipped)
# without a visible GPU.
# usage: run_cuda_integration.sh VERIFYD FAKE_SCHEDULER VERIFYCTL
set -euo pipefail
VERIFYD=$1 SCHEDULER=$2 VERIFYCTL=$3
source "$(dirname "$0")/../lib/daemon.sh"

work=$(mktemp -d /tmp/verifyd-cuda-it.XXXXXX)
target="unix://$work/verifyd.sock"
trap 'daemon_kill_all; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/daemon.log" || true; exit 1; }

start_daemon() {
  daemon_start "$VERIFYD" --listen="$target" --metrics=127.0.0.1:0 --backend=cuda --layers=3 \
    --heads=8 --max_tree_nodes=257 --kv_capacity_tokens=131072 --lease_seconds=120 "$@" \
    >"$work/daemon.log" 2>&1
  daemon_pid=$DAEMON_PID
  local rc=0
  daemon_wait_healthy "$VERIFYCTL" "$target" "$daemon_pid" 60 || rc=$?
  ((rc != 1)) || ! grep -q "is not visible" "$work/daemon.log" || {
    echo "SKIP: no visible CUDA device"
    exit 77
  }
  ((rc != 1)) || fail "verifyd exited during startup"
  ((rc != 2)) || fail "verifyd never became healthy"
}

scrape() {
  local url
  url=$(grep -o 'metrics=http://[^ ]*' "$work/daemon.log" | head -1 | cut -d= -f2-)
  [[ -n "$url" ]] && command -v curl >/dev/null || return 1
  curl -fsS "$url"
}

metric() { awk -v name="$1" '$1 == name {print $2}' "$work/metrics.txt"; }

stop_daemon() {
  local rc=0
  daemon_stop "$daemon_pid" || rc=$?
  [[ $rc == 0 ]] || fail "verifyd exited $rc after SIGTERM, want 0"
}

drive() {  # $1: log name
  "$SCHEDULER" --target="$target" --sequences=8 --steps=20 --threads=4 --batch=4 --seed=21 \
    --prefill_tokens=128-1500 --tree_sizes=8-257 --compact_at_step=8 \
    | tee "$work/$1" || fail "fake_scheduler reported errors ($1)"
  grep -q "OK: zero mismatches" "$work/$1" || fail "no success line from fake_scheduler ($1)"
  grep -q "compaction .* DONE" "$work/$1" || fail "the mid-run Compact did not finish ($1)"
}

start_daemon
drive graphs_on.log
"$VERIFYCTL" --target="$target" stats | tee "$work/stats.txt" || fail "verifyctl stats"
grep -Eq "^backend +cuda" "$work/stats.txt" || echo "note: stats did not print 'backend cuda'"
if scrape >"$work/metrics.txt"; then
  replays=$(metric verifyd_cuda_graph_replays_total)
  fallbacks=$(metric verifyd_cuda_graph_fallbacks_total)
  echo "graph captures $(metric verifyd_cuda_graph_captures_total), replays $replays," \
    "fallbacks $fallbacks"
  awk -v r="${replays:-0}" 'BEGIN {exit !(r > 0)}' || fail "no graph replays with graphs on"
  awk -v f="${fallbacks:-0}" 'BEGIN {exit !(f == 0)}' || fail "graph fallbacks: $fallbacks"
else
  echo "metrics scrape skipped (no metrics address in the log or no curl)"
fi
stop_daemon

# --helpfull exits 1 (absl), which pipefail would turn into "no flag": capture it first.
help_text=$("$VERIFYD" --helpfull 2>&1 || true)
if grep -q "cuda_graphs" <<<"$help_text"; then
  start_daemon --cuda-graphs=off
  drive graphs_off.log
  if scrape >"$work/metrics.txt"; then
    replays=$(metric verifyd_cuda_graph_replays_total)
    awk -v r="${replays:-0}" 'BEGIN {exit !(r == 0)}' || fail "graph replays with graphs off"
  fi
  stop_daemon
else
  echo "graphs-off run skipped: this verifyd has no --cuda_graphs flag"
fi

# An fp8 pool (plans/0030): the fake scheduler reads the dtype from Stats and checks every output
# against its reference over rows quantized the daemon's way; the device quantizes bf16 rows.
start_daemon --kv_dtype=fp8
drive fp8.log
"$VERIFYCTL" --target="$target" stats | tee "$work/stats_fp8.txt" || fail "verifyctl stats (fp8)"
grep -Eq "^kv dtype +fp8$" "$work/stats_fp8.txt" || fail "stats: kv dtype is not fp8"
grep -Eq "^kv token bytes +656 " "$work/stats_fp8.txt" || fail "stats: bytes per token not 656"
# An fp8 pool runs the portable kernel on every GPU (plans/0032); the startup line says so.
grep -q "attention_kernel=portable-mma-sync" "$work/daemon.log" || fail "fp8: startup line's attention_kernel"
stop_daemon
echo "cuda integration: OK"
