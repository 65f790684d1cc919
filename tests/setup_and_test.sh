#!/usr/bin/env bash
# README command 2: install what is missing, configure, build, run every test.
# GPU tests (label `gpu`) skip visibly when no device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh --tests
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${VERIFYD_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" --timeout 900
