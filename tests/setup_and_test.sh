#!/usr/bin/env bash
# README command 2: install what is missing, configure, build, run every test.
# GPU tests (label `gpu`) skip visibly when no device is present.
# Then the CPU suite again under sanitizers (plans/0016-integrity-and-test-infra.md):
#   - ASan+UBSan: every CPU test, built with clang-14 when present (which also makes the fuzz
#     targets libFuzzer fuzzers that ctest runs a few seconds each), else with the default compiler;
#   - TSan: the tests labelled `concurrent` (executor, service model check, soak), built alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh --tests
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${VERIFYD_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" --timeout 900

stage() { echo "== $1 ($(date +%T))"; }
san_args=(-DCMAKE_BUILD_TYPE=Release -DVERIFYD_CUDA=OFF ${VERIFYD_CMAKE_ARGS:-})
asan_compiler=()
if command -v clang++-14 >/dev/null; then
  asan_compiler=(-DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 -DVERIFYD_FUZZ=ON)
fi
stage "ASan+UBSan: build"
cmake -S . -B "$BUILD-asan" "${san_args[@]}" "${asan_compiler[@]}" \
  -DVERIFYD_SANITIZE=address,undefined
cmake --build "$BUILD-asan" -j "$(nproc)"
stage "ASan+UBSan: CPU suite"
# The deploy checks run the same binaries as the plain suite and test files, not memory.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$BUILD-asan" --output-on-failure -j "$(nproc)" --timeout 900 -LE 'gpu|deploy'

stage "TSan: build the concurrent tests"
tsan_targets=(verifyd_executor_tests service_model_check_test soak)
cmake -S . -B "$BUILD-tsan" "${san_args[@]}" -DVERIFYD_SANITIZE=thread
cmake --build "$BUILD-tsan" -j "$(nproc)" --target "${tsan_targets[@]}"
stage "TSan: concurrent tests"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
  ctest --test-dir "$BUILD-tsan" --output-on-failure -j "$(nproc)" --timeout 900 -L concurrent
stage "done"
