#!/usr/bin/env bash
# On a GPU machine: the cuda backend's gpu_uuid (backend/gpu_uuid.h over cudaDeviceProp::uuid,
# what backend/cuda/cuda_driver.cc's GpuUuid does) equals nvidia-smi's UUID for every visible
# device, so that verifyd_device_info{gpu_uuid} joins with DCGM's UUID label (plans/0003).
# Compared as sets: CUDA orders devices fastest first, nvidia-smi by PCI bus.
# usage: tools/device/gpu_uuid_check.sh   (needs g++, the CUDA toolkit and nvidia-smi)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/check.cc" <<'CC'
#include <cuda_runtime_api.h>

#include <array>
#include <cstdio>
#include <cstring>

#include "backend/gpu_uuid.h"

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 2;
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, device) != cudaSuccess) return 2;
    std::array<uint8_t, 16> bytes{};
    std::memcpy(bytes.data(), properties.uuid.bytes, bytes.size());
    std::printf("%s\n", verifyd::FormatGpuUuid(bytes).c_str());
  }
  return 0;
}
CC
g++ -std=c++20 -I"$root" -I"$cuda/include" "$work/check.cc" -L"$cuda/lib64" -lcudart \
  -Wl,-rpath,"$cuda/lib64" -o "$work/check"
ours=$("$work/check" | sort)
smi=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sort)
echo "FormatGpuUuid: $ours"
echo "nvidia-smi:    $smi"
if [[ -n "$ours" && "$ours" == "$smi" ]]; then echo "OK: equal"; else echo "FAIL: differ"; exit 1; fi
