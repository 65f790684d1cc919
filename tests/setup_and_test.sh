#!/usr/bin/env bash
# README command 2: install what is missing, configure, build, run every test.
# GPU tests (label `gpu`) skip visibly when no device is present.
# Then the CPU suite again under sanitizers (plans/0016-integrity-and-test-infra.md, "Measured in
# CI terms" says what each stage covers and costs, and why not more):
#   - ASan+UBSan: every CPU test (store, math contract, executor, channel, service, client, the
#     daemon end to end, the fuzz targets) built with clang-14 when present (which also makes the
#     fuzz targets libFuzzer fuzzers that ctest runs a few seconds each), else with the default
#     compiler. Not the soak (its RSS bound measures ASan's quarantine there), the Python tests
#     (Debian's python3 is not instrumented), the deploy checks and the install-consumer build
#     (a plain project linking the instrumented library);
#   - TSan: the executor's concurrent tests. Not the service model check nor the soak: with
#     Debian's uninstrumented gRPC/abseil, TSan reports every hand-over of gRPC's callback API.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install_deps.sh --tests
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${BUILD:-build}
# The CUDA kernels only where a GPU can run their tests: a workstation with nvcc and no GPU would
# otherwise compile every kernel for three architectures (~25 of 27 minutes on 2 cores, FINDINGS)
# for tests that skip. VERIFYD_CMAKE_ARGS=-DVERIFYD_CUDA=ON builds them anyway.
cuda_args=()
if [[ " ${VERIFYD_CMAKE_ARGS:-} " != *VERIFYD_CUDA=* ]] && ! nvidia-smi -L >/dev/null 2>&1; then
  cuda_args=(-DVERIFYD_CUDA=OFF)
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" ${VERIFYD_CMAKE_ARGS:-}
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
stage "ASan+UBSan: the CPU suite"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$BUILD-asan" --output-on-failure -j "$(nproc)" --timeout 900 \
    -LE 'gpu|soak|python|deploy' -E '^client\.install_consumer$'

stage "TSan: build the executor tests"
cmake -S . -B "$BUILD-tsan" "${san_args[@]}" -DVERIFYD_SANITIZE=thread
cmake --build "$BUILD-tsan" -j "$(nproc)" --target verifyd_executor_tests
stage "TSan: executor tests"
# Label `concurrent` also holds service.* (model check, soak): not built here, see the header.
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
  ctest --test-dir "$BUILD-tsan" --output-on-failure -j "$(nproc)" --timeout 900 \
    -L concurrent -R '^executor\.'
stage "done"
