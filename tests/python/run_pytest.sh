#!/usr/bin/env bash
# Runs python/tests with pytest against the daemon binary given (ctest: python.pytest).
# The interpreter: $VERIFYD_PYTHON, else the first of /usr/bin/python3 and python3 on PATH that
# imports grpc, google.protobuf, numpy and pytest (a pyenv/conda python3 earlier on PATH often
# lacks Debian's python3-grpcio). pytest's exit 5 ("no tests collected") is a failure here.
# usage: run_pytest.sh VERIFYD_BINARY [pytest args...]
set -euo pipefail
VERIFYD=$(realpath "$1"); shift
cd "$(dirname "$0")/../.."
py=""
for candidate in ${VERIFYD_PYTHON:-} /usr/bin/python3 "$(command -v python3 || true)"; do
  [[ -n "$candidate" && -x "$candidate" ]] || continue
  if "$candidate" -c "import grpc, google.protobuf, numpy, pytest" 2>/dev/null; then
    py=$candidate; break
  fi
done
if [[ -z "$py" ]]; then
  echo "FAIL: no python3 with grpc, protobuf, numpy and pytest (bash deploy/install_deps.sh" \
       "installs python3-grpcio python3-protobuf python3-numpy python3-pytest)" >&2
  exit 1
fi
bash python/build_stubs.sh
echo "python: $py ($("$py" --version 2>&1)); daemon: $VERIFYD"
set +e
VERIFYD_BINARY="$VERIFYD" "$py" -m pytest -q -rxXs -p no:cacheprovider python/tests "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "FAIL: pytest collected no tests" >&2
  exit 1
fi
exit $rc
