# shellcheck shell=bash
# Shared helpers of the tests/deploy drivers (sourced, not run). Needs bash, curl and coreutils only.
# Daemons are started and stopped through tests/lib/daemon.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/daemon.sh"

DEPLOY_TMP=$(mktemp -d "${TMPDIR:-/tmp}/verifyd-deploy.XXXXXX")
trap 'daemon_kill_all; rm -rf "$DEPLOY_TMP"' EXIT
# A command that fails under `set -e` says where, instead of ending the test silently.
trap 'echo "FAIL: ${BASH_SOURCE[0]##*/}:$LINENO: $BASH_COMMAND exited $?" >&2' ERR

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# A loopback port nobody listens on now (the caller retries if it loses a race for it).
pick_port() {
  local port
  for _ in $(seq 50); do
    port=$((20000 + RANDOM % 40000))
    port_in_use "$port" || {
      echo "$port"
      return 0
    }
  done
  fail "no free loopback port found"
}

# Waits up to $2 seconds for `curl -fsS $1` to succeed while pid $3 stays alive.
wait_http() {
  local url=$1 seconds=$2 pid=$3
  for _ in $(seq $((seconds * 10))); do
    curl -fsS -o /dev/null --max-time 1 "$url" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# Starts a CPU-backend verifyd on a temp Unix socket with metrics on a free loopback port.
# Sets VERIFYD_PID, VERIFYD_TARGET (gRPC URI) and VERIFYD_METRICS_ADDR (host:port).
start_verifyd() {
  local binary=$1 attempt log
  for attempt in 1 2 3; do
    VERIFYD_METRICS_ADDR=127.0.0.1:$(pick_port)
    VERIFYD_TARGET=unix://$DEPLOY_TMP/verifyd-$attempt.sock
    log=$DEPLOY_TMP/verifyd-$attempt.log
    daemon_start "$binary" --backend=cpu --listen="$VERIFYD_TARGET" \
      --metrics="$VERIFYD_METRICS_ADDR" --layers=2 --heads=2 --max-tree-nodes=64 \
      --kv-capacity-tokens=16384 --compute-threads=1 --drain-seconds=5 >"$log" 2>&1
    VERIFYD_PID=$DAEMON_PID
    if wait_http "http://$VERIFYD_METRICS_ADDR/metrics" 30 "$VERIFYD_PID"; then
      echo "verifyd pid $VERIFYD_PID: $VERIFYD_TARGET, metrics on $VERIFYD_METRICS_ADDR"
      return 0
    fi
    kill -KILL "$VERIFYD_PID" 2>/dev/null || true
    daemon_reap "$VERIFYD_PID" || true
    echo "verifyd attempt $attempt did not come up; its log:" >&2
    cat "$log" >&2
  done
  fail "verifyd did not start"
}

# SIGTERM must drain and exit 0 (SPEC §3).
stop_verifyd() {
  local rc=0
  daemon_stop "$VERIFYD_PID" || rc=$?
  ((rc == 0)) || fail "verifyd exited $rc after SIGTERM (want 0)"
  echo "verifyd drained and exited 0 on SIGTERM"
}

# Runs the fake scheduler against the daemon; its output goes to the test log.
drive_traffic() {
  local fake_scheduler=$1
  "$fake_scheduler" --target="$VERIFYD_TARGET" --sequences=3 --steps=4 --seed=20261129 \
    --threads=2 --compact_at_step=2 ||
    fail "fake_scheduler exited $? against $VERIFYD_TARGET"
}

# The sum of the samples of metric $2 in the scraped text $1 whose labels contain $3 (e.g.
# 'method="Verify"'); "absent" when there is none.
sum_samples() {
  awk -v name="$2" -v label="${3:-}" '
    /^#/ { next }
    { n = $1; sub(/\{.*/, "", n) }
    n == name && index($1, label) > 0 { total += $2; found = 1 }
    END { if (found) printf "%.17g\n", total; else print "absent" }' "$1"
}
