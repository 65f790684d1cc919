#!/usr/bin/env bash
# On the GPU machine: where a Verify RPC's time goes. Starts verifyd (cuda, metrics on), runs
# verifyd_load at S1 with shared-memory tensors and at a tiny shape (the fixed path: gRPC, the
# executor, the backend around a trivial kernel), then prints the daemon's own histograms (RPC
# handler time and ComputeVerify time, means) next to the client's p50.
set -uo pipefail
cd "$(dirname "$0")/../.."
B=${BUNDLE:-bundle}
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
bin=$B/bin
export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
work=$(mktemp -d /tmp/verifyd-probe.XXXXXX)
sock="unix://$work/verifyd.sock"
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
# One daemon per (shape, transport), so its histograms hold that case alone.
for shape in "tiny --tree_nodes=1 --prefix_tokens=1 --batch=1" "S1 --tree_nodes=16 --prefix_tokens=65536 --batch=1"; do
  set -- $shape
  name=$1; shift
  for mode in inline shm; do
    flag=""; [ $mode = shm ] && flag=--shared_memory
    "$bin/verifyd" --listen="$sock" --metrics=127.0.0.1:$port --backend=cuda --layers=1 --heads=8 \
      --max_tree_nodes=257 --kv_capacity_tokens=1048576 --lease_seconds=600 >"$OUT/probe_daemon.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 200); do "$bin/verifyctl" --target="$sock" health >/dev/null 2>&1 && break; sleep 0.1; done
    "$bin/verifyd_load" --target="$sock" --concurrency=1 --warmup_seconds=1 --measure_seconds=3 "$@" $flag \
      2>>"$OUT/probe_load.log" | tail -1 | sed "s/^/$name-$mode client (rps,p50,p90,p99): /"
    scrape "$name-$mode daemon"
    kill -TERM $pid; wait $pid
  done
done
rm -rf "$work"
