// bf16 stored as raw uint16_t bits on the host, so host code needs no CUDA headers.
#pragma once

#include <cstdint>
#include <cstring>

namespace verifyd {

using bf16_bits = uint16_t;

inline float Bf16ToFloat(bf16_bits b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even, the rounding the GPU's __float2bfloat16_rn uses; NaN stays NaN.
inline bf16_bits FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>(u >> 16);
}

}  // namespace verifyd
