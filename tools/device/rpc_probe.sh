#!/usr/bin/env bash
# On the GPU machine: where a Verify RPC's time goes, and an A/B of the service's handler modes
# (plans/0012). One daemon per case (cuda, metrics on) so its histograms hold that case alone;
# verifyd_load at a tiny shape (the fixed path: gRPC, the executor, the backend around a trivial
# kernel) and at S1 (shared-memory tensors written once per layer, or copied per call, or inline),
# with the daemon's Verify handler polled or callback and idle requests run inline or queued.
# Each case prints the client's percentiles and the daemon's own histograms (RPC handler time,
# queue time, ComputeVerify time, means); the first case also times two pings: grpc.health.v1
# (gRPC's synchronous server) and an immediate NOT_FOUND from a callback handler.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/lib/daemon.sh
B=${BUNDLE:-bundle}
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
bin=$B/bin
export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=$(mktemp -d /tmp/verifyd-probe.XXXXXX)
sock="unix://$work/verifyd.sock"
trap 'daemon_kill_all; rm -rf "$work"' EXIT
port=${PROBE_METRICS_PORT:-19464}
scrape() {
  python3 - "$port" "$1" <<'PY'
import sys, urllib.request, re
port, label = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
vals = {}
for line in text.splitlines():
    m = re.match(r'^(verifyd_\w+?)_(sum|count)\{([^}]*)\} ([0-9.e+-]+)$', line)
    if not m: continue
    name, kind, labels, v = m.groups()
    if 'verify' not in labels.lower() and 'Verify' not in labels: continue
    vals.setdefault((name, labels), {})[kind] = float(v)
for (name, labels), d in sorted(vals.items()):
    if d.get('count'):
        print(f"{label}: {name}{{{labels}}} mean {1e6*d['sum']/d['count']:.1f} us over {int(d['count'])}")
PY
}
run_case() {  # name, daemon flags (one word), then verifyd_load flags
  local name=$1 daemon_flags=$2
  shift 2
  # shellcheck disable=SC2086  # daemon_flags: words separated by commas, split on purpose
  daemon_start "$bin/verifyd" --listen="$sock" --metrics=127.0.0.1:$port --backend=cuda --layers=1 \
    --heads=8 --max_tree_nodes=257 --kv_capacity_tokens=1048576 --lease_seconds=600 \
    ${daemon_flags//,/ } >"$OUT/probe_daemon.log" 2>&1
  pid=$DAEMON_PID
  daemon_wait_healthy "$bin/verifyctl" "$sock" "$pid" 20
  "$bin/verifyd_load" --target="$sock" --concurrency=1 --warmup_seconds=1 --measure_seconds=3 "$@" \
    2>"$OUT/probe_load_$name.log" | tail -1 | sed "s/^/$name client (c,rps,p50,p90,p99): /"
  grep -E "# ping|tail:" "$OUT/probe_load_$name.log" | sed "s/^/$name /"
  scrape "$name daemon"
  daemon_stop "$pid"
}
tiny="--tree_nodes=1 --prefix_tokens=1 --batch=1 --shared_memory"
s1="--tree_nodes=16 --prefix_tokens=65536 --batch=1 --shared_memory"
# Daemon defaults: polled Verify handler, queued to the device thread, spin auto (2000 µs with
# >= 8 cores); the client polls for its reply (--spin_wait) unless said.
run_case tiny-pinghealth "" $tiny --spin_wait --ping_seconds=2
run_case tiny-pingcallback --verify_handler=callback $tiny --spin_wait --ping_seconds=2 --ping_rpc=callback
run_case S1-default "" $s1 --spin_wait
run_case S1-clientsleeps "" $s1
run_case S1-nospin --executor_spin_us=0 $s1 --spin_wait
run_case S1-callback --verify_handler=callback $s1 --spin_wait
run_case S1-polled-inline --run_idle_inline=true $s1 --spin_wait
run_case S1-default-again "" $s1 --spin_wait
run_case S5-default "" --tree_nodes=8 --prefix_tokens=4096 --batch=32 --shared_memory --spin_wait
