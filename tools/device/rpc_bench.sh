#!/usr/bin/env bash
# On the GPU machine (called by run_device.sh): the Verify RPC over the Unix socket against
# `verifyd --backend=cuda`, SPEC §5 / issue 5:
#   1. Verify latency p50/p99 at S1 (B=1 H=8 Q=16 L=65536) and S5 (B=32 H=8 Q=8 L=4096),
#      CUDA graphs on and off (verifyd_load, concurrency 1, closed loop); each with tensors inline
#      (shape "S1") and through shared memory (shape "S1-shm", verifyd_load --shared_memory,
#      plans/0010: q and tree_kv written into the region once per layer; "S1-shmcopy" copies them
#      in per call); the transport's own round trip ("ping", grpc.health.v1 Check) alongside;
#   2. Verify p99 while operator compactions run ÷ without: the fake scheduler keeps committing
#      trees (which fragments sequences) in both windows; in the second a loop of
#      `verifyctl compact` runs alongside. Compaction bytes/s is read from the operations.
# Writes CSV and logs under $OUT; prints a short summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/lib/daemon.sh
B=${BUNDLE:-bundle}
OUT=${OUT:-/tmp/verifyd-gpu-out}
mkdir -p "$OUT"
bin=$B/bin
work=$(mktemp -d /tmp/verifyd-rpc.XXXXXX)
sock="unix://$work/verifyd.sock"
pid=""
stop() {
  if [ -n "$pid" ]; then
    local rc=0
    daemon_stop "$pid" || rc=$?
    echo "daemon exit $rc" >>"$OUT/rpc_daemon.log"
    pid=""
  fi
}
trap 'stop; rm -rf "$work"' EXIT
start() {
  daemon_start "$bin/verifyd" --listen="$sock" --metrics= --backend="${BACKEND:-cuda}" \
    --layers="$LAYERS" --heads=8 --max_tree_nodes=257 --kv_capacity_tokens=1048576 \
    --lease_seconds=600 "$@" >>"$OUT/rpc_daemon.log" 2>&1
  pid=$DAEMON_PID
  local rc=0
  daemon_wait_healthy "$bin/verifyctl" "$sock" "$pid" 20 || rc=$?
  case $rc in
    0) return 0 ;;
    1) echo "verifyd died"; tail -5 "$OUT/rpc_daemon.log"; pid="" ;;
    *) echo "verifyd not healthy" ;;
  esac
  return 1
}
load() {  # name, then verifyd_load flags
  local name=$1
  shift
  "$bin/verifyd_load" --target="$sock" --concurrency=1 --warmup_seconds=1 --measure_seconds=4 "$@" \
    2>>"$OUT/rpc_load.log" | tail -1 | sed "s/^/$name,/"
}

echo "shape,graphs,concurrency,throughput_rps,p50_us,p90_us,p99_us" >"$OUT/rpc_latency.csv"
LAYERS=1
# RPC_LATENCY=0 skips the latency part (only the compaction windows run).
for graphs in $([ "${RPC_LATENCY:-1}" = 1 ] && echo on off); do
  start --cuda_graphs=$graphs || continue
  load "S1,$graphs" --tree_nodes=16 --prefix_tokens=65536 --batch=1 >>"$OUT/rpc_latency.csv"
  load "S1-shm,$graphs" --tree_nodes=16 --prefix_tokens=65536 --batch=1 --shared_memory --spin_wait \
    --ping_seconds=2 >>"$OUT/rpc_latency.csv"
  load "S1-shmcopy,$graphs" --tree_nodes=16 --prefix_tokens=65536 --batch=1 --shared_memory \
    --shared_memory_copy --spin_wait >>"$OUT/rpc_latency.csv"
  load "S5,$graphs" --tree_nodes=8 --prefix_tokens=4096 --batch=32 >>"$OUT/rpc_latency.csv"
  load "S5-shm,$graphs" --tree_nodes=8 --prefix_tokens=4096 --batch=32 --shared_memory --spin_wait \
    >>"$OUT/rpc_latency.csv"
  # Correctness of the shared-memory path on this backend: every output against the reference.
  "$bin/fake_scheduler" --target="$sock" --sequences=4 --steps=10 --threads=2 --batch=2 \
    --prefill_tokens=256-1024 --tree_sizes=8-64 --seed=5 --shared_memory \
    >>"$OUT/rpc_scheduler_shm.log" 2>&1
  echo "fake_scheduler --shared_memory (graphs $graphs) exit $?" >>"$OUT/rpc_scheduler_shm.log"
  stop
done

# Compaction under Verify traffic (2 layers: each move copies 2 rows). In both windows the fake
# scheduler commits trees (it checks every output on the CPU, so it is kept small) and a fragmenter
# keeps re-creating 64 sequences of 32 interleaved runs (verifyd_load --fragment_sequences); in the
# second window every fragmentation is followed by an operator Compact until converged.
LAYERS=2
echo "window,concurrency,throughput_rps,p50_us,p90_us,p99_us" >"$OUT/rpc_compaction.csv"
if start; then
  "$bin/fake_scheduler" --target="$sock" --sequences=16 --steps=100 --prefill_tokens=512-1024 \
    --tree_sizes=8-32 --threads=8 --seed=11 >>"$OUT/rpc_scheduler.log" 2>&1 &
  s1=$!
  touch "$work/running"
  (while [ -e "$work/running" ]; do
     "$bin/verifyd_load" --target="$sock" --fragment_sequences=64 --fragment_rounds=32 \
       --fragment_tokens=64 >>"$OUT/rpc_fragment.log" 2>&1
     if [ -e "$work/compacting" ]; then
       "$bin/verifyctl" --target="$sock" --deadline-seconds=30 compact --budget-bytes=0 \
         >>"$OUT/rpc_compact.log" 2>&1
     fi
   done) &
  f1=$!
  sleep 3
  load "quiet" --tree_nodes=8 --prefix_tokens=4096 --batch=8 --measure_seconds=5 >>"$OUT/rpc_compaction.csv"
  touch "$work/compacting"
  load "compacting" --tree_nodes=8 --prefix_tokens=4096 --batch=8 --measure_seconds=5 >>"$OUT/rpc_compaction.csv"
  rm -f "$work/running"
  wait $f1
  kill -TERM $s1 2>/dev/null
  wait $s1
  echo "fake_scheduler exit $? (stopped after the windows)" >>"$OUT/rpc_scheduler.log"
  "$bin/verifyctl" --target="$sock" stats >"$OUT/rpc_stats.txt" 2>&1
  stop
fi

# Compaction as a daemon operation at a realistic layer count (61, DeepSeek-V3 / Kimi): no Verify
# traffic, one fragmentation (64 sequences x 32 interleaved runs of 32 tokens: 4.6 GB of KV), one
# Compact until converged; its bytes/s ÷ the D2D bandwidth that
# compaction_bench prints in the same session is SPEC §5's compaction ratio.
LAYERS=61
if [ "${RPC_COMPACTION61:-1}" = 1 ] && start --kv_capacity_tokens=262144; then
  "$bin/verifyd_load" --target="$sock" --fragment_sequences=64 --fragment_rounds=32 \
    --fragment_tokens=32 >"$OUT/rpc_fragment61.log" 2>&1
  "$bin/verifyctl" --target="$sock" --deadline-seconds=120 compact --budget-bytes=0 \
    >"$OUT/rpc_compact61.log" 2>&1
  stop
fi

echo "== rpc latency (µs)"
column -s, -t "$OUT/rpc_latency.csv" 2>/dev/null || cat "$OUT/rpc_latency.csv"
grep -E "# ping|# concurrency 1 tail" "$OUT/rpc_load.log" 2>/dev/null
grep -E "^(OK|FAILED|  MISMATCH)|exit" "$OUT/rpc_scheduler_shm.log" 2>/dev/null
for s in S1 S5; do  # p50 inline / p50 shm, per graphs setting
  for g in on off; do
    awk -F, -v s="$s" -v g="$g" '$1==s&&$2==g{i=$5} $1==s"-shm"&&$2==g{m=$5}
      END{if(i&&m) printf "%s graphs %s: p50 inline %d us, shm %d us, inline/shm %.2f\n", s, g, i, m, i/m}' \
      "$OUT/rpc_latency.csv"
  done
done
echo "== Verify while compacting (µs)"
column -s, -t "$OUT/rpc_compaction.csv" 2>/dev/null || cat "$OUT/rpc_compaction.csv"
q=$(awk -F, '$1=="quiet"{print $6}' "$OUT/rpc_compaction.csv")
c=$(awk -F, '$1=="compacting"{print $6}' "$OUT/rpc_compaction.csv")
[ -n "$q" ] && [ -n "$c" ] && awk -v q="$q" -v c="$c" 'BEGIN{printf "p99 compacting / quiet = %.2f\n", c/q}'
echo "compactions: $(grep -c '^tokens moved' "$OUT/rpc_compact.log" 2>/dev/null || echo 0)"
grep -E "^(bytes moved|throughput)" "$OUT/rpc_compact.log" | tail -4
echo "== Compact at 61 layers, no traffic (daemon operation)"
tail -2 "$OUT/rpc_fragment61.log" 2>/dev/null
grep -E "^(state|bytes moved|tokens moved|throughput|fragment|error)" "$OUT/rpc_compact61.log" 2>/dev/null
tail -3 "$OUT/rpc_scheduler.log"
