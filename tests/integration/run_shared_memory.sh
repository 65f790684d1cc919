#!/usr/bin/env bash
# The real verifyd (CPU backend) and the fake scheduler binary with --shared_memory: every Append
# and Verify through shared-memory regions, every output checked against the reference, a Compact
# in the middle; then SIGTERM -> exit 0 with no region of this daemon left in /dev/shm.
# usage: run_shared_memory.sh VERIFYD FAKE_SCHEDULER VERIFYCTL
set -euo pipefail
VERIFYD=$1 SCHEDULER=$2 VERIFYCTL=$3
source "$(dirname "$0")/../lib/daemon.sh"

work=$(mktemp -d /tmp/verifyd-shm-it.XXXXXX)
target="unix://$work/verifyd.sock"
# A device number of its own: region names are /dev/shm/verifyd-<device>-<instance>-<hex>.
device=$((900 + $$ % 100))
trap 'daemon_kill_all; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/daemon.log" || true; exit 1; }

daemon_start "$VERIFYD" --listen="$target" --metrics= --backend=cpu --device="$device" --layers=2 \
  --heads=2 --max_tree_nodes=257 --kv_capacity_tokens=12288 --compute_threads=2 \
  >"$work/daemon.log" 2>&1
daemon_pid=$DAEMON_PID
daemon_wait_healthy "$VERIFYCTL" "$target" "$daemon_pid" 30 || fail "verifyd exited or hung during startup"

"$SCHEDULER" --target="$target" --sequences=6 --steps=20 --threads=3 --batch=2 --seed=21 \
  --prefill_tokens=64-400 --tree_sizes=8-64 --compact_at_step=10 --shared_memory \
  | tee "$work/scheduler.log" || fail "fake_scheduler --shared_memory reported errors"
grep -q "tensors in shared memory" "$work/scheduler.log" || fail "the run was not in shared memory"
grep -q "OK: zero mismatches" "$work/scheduler.log" || fail "no success line from fake_scheduler"

# The checker itself fails through shared memory too.
if "$SCHEDULER" --target="$target" --sequences=2 --steps=3 --threads=1 --seed=22 \
  --prefill_tokens=32-64 --shared_memory --corrupt_reference_at_step=1 >"$work/corrupt.log"; then
  fail "a corrupted reference was not reported"
fi
grep -q "MISMATCH" "$work/corrupt.log" || fail "no MISMATCH line for the corrupted reference"

daemon_stop "$daemon_pid" || fail "verifyd exited $? after SIGTERM"
left=$(find /dev/shm -maxdepth 1 -name "verifyd-$device-*" | wc -l)
[[ "$left" == 0 ]] || fail "$left shared-memory regions left after shutdown"
echo "OK: shared-memory integration"
