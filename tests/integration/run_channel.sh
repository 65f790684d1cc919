#!/usr/bin/env bash
# The real verifyd (CPU backend) and the fake scheduler binary with --channel: every Verify through
# a channel with its tensors in registered memory (plans/0017), every output checked against the
# reference, a Compact in the middle; the checker's own failure; then SIGTERM -> exit 0 with no
# ring of this daemon left in /dev/shm.
# usage: run_channel.sh VERIFYD FAKE_SCHEDULER VERIFYCTL
set -euo pipefail
VERIFYD=$1 SCHEDULER=$2 VERIFYCTL=$3

work=$(mktemp -d /tmp/verifyd-channel-it.XXXXXX)
target="unix://$work/verifyd.sock"
# A device number of its own: ring names are /dev/shm/verifyd-<device>-<instance>-channel-<hex>.
device=$((800 + $$ % 100))
daemon_pid=""
cleanup() {
  if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then kill -KILL "$daemon_pid"; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- daemon log"; cat "$work/daemon.log" || true; exit 1; }

"$VERIFYD" --listen="$target" --metrics= --backend=cpu --device="$device" --layers=2 --heads=2 \
  --max_tree_nodes=257 --kv_capacity_tokens=12288 --compute_threads=2 >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 150); do
  if "$VERIFYCTL" --target="$target" --deadline-seconds=1 health >/dev/null 2>&1; then break; fi
  kill -0 "$daemon_pid" 2>/dev/null || fail "verifyd exited during startup"
  sleep 0.2
done

# The daemon checks a registration's device against its own (--device).
"$SCHEDULER" --target="$target" --sequences=6 --steps=20 --threads=3 --batch=2 --seed=31 \
  --prefill_tokens=64-400 --tree_sizes=8-64 --compact_at_step=10 --channel --device="$device" \
  | tee "$work/scheduler.log" || fail "fake_scheduler --channel reported errors"
grep -q "through a channel" "$work/scheduler.log" || fail "the run was not through a channel"
grep -q "OK: zero mismatches" "$work/scheduler.log" || fail "no success line from fake_scheduler"

# The checker itself fails through the channel too.
if "$SCHEDULER" --target="$target" --sequences=2 --steps=3 --threads=1 --seed=32 \
  --prefill_tokens=32-64 --channel --device="$device" --corrupt_reference_at_step=1 \
  >"$work/corrupt.log"; then
  fail "a corrupted reference was not reported"
fi
grep -q "MISMATCH" "$work/corrupt.log" || fail "no MISMATCH line for the corrupted reference"

kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "verifyd exited $? after SIGTERM"
daemon_pid=""
left=$(find /dev/shm -maxdepth 1 -name "verifyd-$device-*" | wc -l)
[[ "$left" == 0 ]] || fail "$left channel rings left after shutdown"
echo "OK: channel integration"
