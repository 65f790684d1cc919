#!/usr/bin/env bash
# README command 1: install what is missing, build what the demo needs, start verifyd (backend
# auto: cpu without a GPU) on a temporary socket, drive it with the fake scheduler (every Verify
# checked against the reference), print the summary and verifyctl stats, stop the daemon with
# SIGTERM. Exits non-zero if any of it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
# Without a visible GPU the demo runs the CPU backend, so it does not compile the CUDA kernels
# (three architectures: most of a build on a small machine); its own build folder keeps that
# choice apart from the test command's build, which always compiles them when nvcc exists.
BUILD=${BUILD:-build-quickstart}
JOBS=$(nproc)
cuda=OFF
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then cuda=AUTO; fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DVERIFYD_CUDA=$cuda -DVERIFYD_BUILD_TESTS=OFF \
  ${VERIFYD_CMAKE_ARGS:-}
# libverifyd_dataplane too: what Python's data plane loads, and what `cmake --install` installs.
cmake --build "$BUILD" -j "$JOBS" --target verifyd fake_scheduler verifyctl verifyd_dataplane

VERIFYD="$BUILD/service/verifyd"
SCHEDULER="$BUILD/tools/fake_scheduler/fake_scheduler"
VERIFYCTL="$BUILD/client/verifyctl/verifyctl"
work=$(mktemp -d /tmp/verifyd-quickstart.XXXXXX)
target="unix://$work/verifyd.sock"
daemon_pid=""
cleanup() {
  if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then kill -KILL "$daemon_pid"; fi
  rm -rf "$work"
}
trap cleanup EXIT
die() { echo "quickstart: $*" >&2; echo "--- daemon log" >&2; cat "$work/daemon.log" >&2 || true; exit 1; }

# A demo geometry: 2 layers x 4 heads keeps the CPU backend (and the scheduler's own reference
# check of every output) to about half a minute on a small machine.
"$VERIFYD" --listen="$target" --backend=auto --metrics=127.0.0.1:0 --layers=2 --heads=4 \
  --max_tree_nodes=257 --kv_capacity_tokens=65536 >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 300); do
  if "$VERIFYCTL" --target="$target" --deadline-seconds=1 health >/dev/null 2>&1; then break; fi
  kill -0 "$daemon_pid" 2>/dev/null || die "verifyd exited during startup"
  sleep 0.2
done
[[ "$("$VERIFYCTL" --target="$target" health)" == "SERVING" ]] || die "verifyd never became SERVING"
head -1 "$work/daemon.log"

echo "== fake scheduler"
"$SCHEDULER" --target="$target" --sequences=8 --steps=60 --threads="$JOBS" --batch=2 \
  --prefill_tokens=128-512 --tree_sizes=8-48 --compact_at_step=30 --seed="${SEED:-1}" ||
  die "the fake scheduler reported errors"

echo "== verifyctl stats"
"$VERIFYCTL" --target="$target" stats || die "verifyctl stats failed"

kill -TERM "$daemon_pid"
set +e
wait "$daemon_pid"
rc=$?
set -e
daemon_pid=""
[[ $rc == 0 ]] || die "verifyd exited $rc after SIGTERM"
# What the build made installs (README: `cmake --install`), here into a scratch prefix.
cmake --install "$BUILD" --prefix "$work/prefix" >/dev/null || die "cmake --install failed"
echo "quickstart: OK (verifyd stopped cleanly; the build installs)"
