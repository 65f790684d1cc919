#!/usr/bin/env bash
# Here (the build machine): builds the GPU tests and the kernel benchmark for sm_80, sm_90 and sm_120
# (plus the sm_90a-only Hopper kernel and its wgmma unit test)
# into build-gpu and collects them, with the non-system shared libraries they need (absl, gtest), into
# ./bundle (git-ignored) for tools/device/run_device.sh on the GPU machine. CUDA's own libraries (cudart
# is static; cuBLAS) and the C/C++ runtime come from the GPU machine's image.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${BUILD:-build-gpu}
# ARCHS=90 builds for the H200 alone (a quicker bundle for one device call).
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DVERIFYD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${ARCHS:-80;90;120}" \
  >/dev/null
# Kernel tests and bench; the CUDA backend's tests; the daemon, its tools and its test suite (which
# picks --backend=auto, so cuda, on the GPU machine).
# TARGETS (space-separated) builds and collects a subset instead, e.g. the kernel tests and bench:
#   TARGETS="wgmma_unit_test mla_verify_flash_test kv_slot_write_test split_planner_test
#            mla_verify_launch_test mla_verify_bench" bash tools/device/make_bundle.sh
default_targets=(wgmma_unit_test wgmma_rate_bench mla_verify_flash_test mla_verify_flash_fp8_test kv_slot_write_test kv_fp8_write_test value_bound_check_test split_planner_test mla_verify_launch_test
  mla_verify_bench cuda_kv_storage_test cuda_fp8_storage_test cuda_kv_store_test cuda_backend_test cuda_fp8_backend_test cuda_verify_staging_test
  cuda_backend_bench cuda_decode_mirror_test cuda_host_registration_test compaction_bench verifyd verifyctl fake_scheduler verifyd_load verifyd_service_tests
  verifyd_dying_client verifyd_executor_tests cuda_external_verify_test cuda_ipc_producer decode_step_bench
  decode_step_captured_engine
  data_plane_gpu_test data_plane_captured_gpu_test verifyd_dataplane)
read -r -a targets <<<"${TARGETS:-${default_targets[*]}}"
cmake --build "$BUILD" -j "${JOBS:-2}" --target "${targets[@]}"

rm -rf bundle
mkdir -p bundle/bin bundle/lib
for t in "${targets[@]}"; do
  [ "$t" = verifyd_dataplane ] && continue  # a library: below
  cp "$(find "$BUILD" -type f -name "$t" -perm -u+x | head -1)" bundle/bin/
done
strip bundle/bin/*
# The Python package for the GPU host's own Python (tools/device/python_dataplane_gpu.py): the
# data-plane library with its non-system libraries in pylib/ (found through its RPATH $ORIGIN, so
# the Python process keeps its LD_LIBRARY_PATH), the package with its generated stubs in python/.
if [[ " ${targets[*]} " == *" verifyd_dataplane "* ]]; then
  mkdir -p bundle/pylib bundle/python
  cp -L "$BUILD/client/c_api/libverifyd_dataplane.so" bundle/pylib/
  strip bundle/pylib/libverifyd_dataplane.so
  bash python/build_stubs.sh >/dev/null
  tar -C python --exclude=__pycache__ -cf - verifyd | tar -C bundle/python -xf -
fi
[ -f "$BUILD/kernels/libverifyd_kernels.a" ] && cp "$BUILD/kernels/libverifyd_kernels.a" bundle/lib/
# Non-system libraries: everything ldd resolves except glibc, the C++ runtime and CUDA's libraries.
bash tools/collect_libs.sh bundle/lib bundle/bin/*
if [ -f bundle/pylib/libverifyd_dataplane.so ]; then
  bash tools/collect_libs.sh bundle/pylib bundle/pylib/libverifyd_dataplane.so
  # The same library and package as a wheel for the GPU host's Python (tools/device/wheel_gpu.sh).
  bash python/build_wheel.sh --lib bundle/pylib/libverifyd_dataplane.so --out bundle/wheel
fi
# Quick local check: the binaries start (they skip their GPU tests without a device).
for t in split_planner_test kv_slot_write_test; do
  [ -x bundle/bin/$t ] && LD_LIBRARY_PATH=bundle/lib:/usr/local/cuda/lib64 bundle/bin/$t --gtest_brief=1 | tail -1
done
du -sh bundle
