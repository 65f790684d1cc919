# shellcheck shell=bash
# Starting, waiting for and stopping daemons (verifyd, Prometheus) in the test drivers and the
# device runbooks (sourced, not run; bash 4.4+ and coreutils only). Only processes started through
# daemon_start are ever signalled, and only while they are listed: a reaped child's pid may belong
# to someone else by now.
#
#   daemon_start "$VERIFYD" --listen=... >"$log" 2>&1   # sets DAEMON_PID
#   daemon_wait_healthy "$VERIFYCTL" "$target" "$DAEMON_PID" 30 || fail "..."
#   daemon_stop "$DAEMON_PID" || fail "exited $? after SIGTERM"
#   trap daemon_kill_all EXIT                             # or call it from the script's own trap

DAEMON_PIDS=()

# daemon_start COMMAND [ARG...]: runs it in the background (redirect the call to place its output)
# and lists it; sets DAEMON_PID.
daemon_start() {
  "$@" &
  DAEMON_PID=$!
  DAEMON_PIDS+=("$DAEMON_PID")
}

# daemon_wait_healthy VERIFYCTL TARGET PID SECONDS: polls `verifyctl health` on TARGET every 0.1 s.
# Returns 0 once it answers, 1 when PID has exited, 2 when SECONDS have passed.
daemon_wait_healthy() {
  local ctl=$1 target=$2 pid=$3 seconds=$4 i
  for ((i = 0; i < seconds * 10; ++i)); do
    "$ctl" --target="$target" --deadline-seconds=1 health >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 2
}

# daemon_reap PID: waits for it, takes it off the list, and returns its exit status.
daemon_reap() {
  local rc=0 kept=() pid
  wait "$1" || rc=$?
  for pid in "${DAEMON_PIDS[@]}"; do [[ "$pid" == "$1" ]] || kept+=("$pid"); done
  DAEMON_PIDS=("${kept[@]}")
  return "$rc"
}

# daemon_stop PID: SIGTERM (verifyd drains and exits 0, SPEC §3), then daemon_reap: returns the
# exit status.
daemon_stop() {
  kill -TERM "$1" 2>/dev/null || true
  daemon_reap "$1"
}

# daemon_kill_all: SIGKILL to every daemon still listed, for an EXIT trap.
daemon_kill_all() {
  local pid
  for pid in "${DAEMON_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  DAEMON_PIDS=()
}
