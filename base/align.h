// The 256-byte alignment of every sub-allocation of a device buffer or workspace: what cudaMalloc
// guarantees for a whole allocation, and what the kernels' vector loads, the TMA maps and the
// graph parameters' offsets rely on for each piece carved from one. Header-only.
#pragma once

#include <cstddef>

namespace verifyd {

inline constexpr size_t kDeviceAlignment = 256;

// `bytes` rounded up to a multiple of kDeviceAlignment.
constexpr size_t AlignTo256(size_t bytes) {
  return (bytes + kDeviceAlignment - 1) & ~(kDeviceAlignment - 1);
}

}  // namespace verifyd
