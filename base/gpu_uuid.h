// A GPU's UUID as nvidia-smi, NVML and DCGM print it, so that verifyd's metrics join with DCGM's
// (dcgm-exporter labels every series with UUID="GPU-..."): the 16 bytes of cudaDeviceProp::uuid
// as "GPU-" and lower-case hex grouped 8-4-4-4-12. Plain C++ (no CUDA header), so that the
// formatting is tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace verifyd {

inline std::string FormatGpuUuid(std::span<const uint8_t, 16> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xf];
  }
  return out;
}

}  // namespace verifyd
