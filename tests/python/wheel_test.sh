#!/usr/bin/env bash
# The wheel as an engine's image gets it (ctest python.wheel): python/build_wheel.sh from the
# library just built, `pip install --no-deps` into a fresh venv (python3 with
# --system-site-packages for grpcio, protobuf, numpy), then used from outside the checkout with no
# PYTHONPATH, LD_LIBRARY_PATH or $VERIFYD_DATAPLANE_LIB: the library loads from the wheel with
# every library it links (in an interpreter that loaded nothing else), and the installed package's
# fake scheduler drives a CPU daemon over gRPC and the data plane, every output against float64.
# usage: wheel_test.sh VERIFYD_BINARY LIBVERIFYD_DATAPLANE
set -euo pipefail
VERIFYD=$(realpath "$1")
LIB=$(realpath "$2")
cd "$(dirname "$0")/../.."
repo=$PWD
source tests/lib/daemon.sh
work=$(mktemp -d)
trap 'daemon_kill_all; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; [[ -f "$work/daemon.log" ]] && tail -20 "$work/daemon.log" >&2; exit 1; }

bash python/build_wheel.sh --lib "$LIB" --out "$work/dist"
base=${VERIFYD_PYTHON:-/usr/bin/python3}
"$base" -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
"$py" -m pip install --quiet --no-deps --no-index "$work"/dist/verifyd-*.whl
cd "$work"
run() { env -u PYTHONPATH -u LD_LIBRARY_PATH -u VERIFYD_DATAPLANE_LIB "$@"; }

run "$py" "$repo/tests/python/installed_wheel_check.py" --repo "$repo" ||
  fail "the installed wheel"

target="unix://$work/verifyd.sock"
daemon_start "$VERIFYD" --listen="$target" --metrics= --backend=cpu --layers=2 --heads=2 \
  --max_tree_nodes=64 --kv_capacity_tokens=16384 --drain_seconds=2 >"$work/daemon.log" 2>&1
run "$py" -c "import verifyd; verifyd.Client('$target').wait_until_serving(timeout=30)" ||
  fail "verifyd did not start"
for transport in grpc device; do
  run "$py" -m verifyd.tools.fake_scheduler --target "$target" --transport "$transport" \
    --steps 3 || fail "fake scheduler over $transport"
done
run "$py" -m verifyd --target "$target" stats >/dev/null || fail "python -m verifyd stats"
daemon_stop "$DAEMON_PID" || fail "verifyd exited $? after SIGTERM"
echo "PASS: the wheel installs with pip --no-deps and runs from its venv"
