// The fp8 row's quantizer (verify/kv_fp8_layout.h) as the device computes it, in steps that compile
// for the host and the device alike, so that a CPU test can prove them byte-identical to
// QuantizeFp8Row on any machine and the GPU kernels (kernels/kv_fp8_quantize_warp.cuh) run the same
// code.
//
// Why not QuantizeFp8Row on the device: it leans on std::frexp / ldexp / nearbyint and the host's
// float environment. Here everything but one division is integer arithmetic on the bits:
//   - amax is the largest |v| as bf16 bits (for non-NaN values the order of magnitudes is the order
//     of their sign-cleared bits), so no float max, which a flush-to-zero build would get wrong on
//     bf16 subnormals;
//   - the scale is one IEEE float32 division, __fdiv_rn on the device (round to nearest, whatever
//     -prec-div or -use_fast_math say; the build uses neither, this makes sure), `/` on the host;
//   - the quotient v / scale is the same correctly rounded division, and its e4m3 code is taken
//     from its bits with an explicit round-to-nearest-even (no __nv_cvt_float_to_fp8: its
//     behaviour on pre-sm_89 devices is a software path we would have to trust as well).
// Division and bits need denormals kept (no -ftz): the build sets no such flag.
#pragma once

#include <cstdint>
#include <cstring>

#include "verify/bf16.h"
#include "verify/kv_fp8_layout.h"

#if defined(__CUDACC__)
#define VERIFYD_FP8_HD __host__ __device__ __forceinline__
#else
#define VERIFYD_FP8_HD inline
#endif

namespace verifyd::fp8_bits {

VERIFYD_FP8_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

VERIFYD_FP8_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// a / b rounded to nearest even, as IEEE float32 (what QuantizeFp8Row's `/` computes on the host).
VERIFYD_FP8_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// |v| of a bf16 value as its bits (the sign cleared): max over a group gives amax's bits.
VERIFYD_FP8_HD uint32_t Bf16MagnitudeBits(bf16_bits v) {
  return static_cast<uint32_t>(v) & 0x7fffu;
}

// The group's scale from amax's bf16 bits: fl32(amax / 448), or 1 when that is 0.
VERIFYD_FP8_HD float GroupScale(uint32_t amax_bits) {
  const float scale = DivRn(BitsToFloat(amax_bits << 16), kE4m3Max);
  return scale == 0.f ? 1.f : scale;
}

// m / 2^shift rounded to nearest, ties to even (m < 2^24; shift >= 0).
VERIFYD_FP8_HD uint32_t ShiftRoundEven(uint32_t m, uint32_t shift) {
  if (shift == 0) return m;
  if (shift > 25) return 0;  // m / 2^shift < 2^-2: nearest is 0
  const uint32_t q = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rest > half || (rest == half && (q & 1u) != 0)) ? 1u : 0u);
}

// FloatToE4m3 from the bits: nearest e4m3 code, ties to even, saturating at +-448 (NaN and Inf too,
// as FloatToE4m3's !(a < 448) does); the sign is kept, so -0 and negatives that round to 0 give
// 0x80.
VERIFYD_FP8_HD uint8_t E4m3Code(float x) {
  const uint32_t u = FloatBits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | kE4m3MaxCode);  // |x| >= 448
  const uint32_t biased = a >> 23;
  if (biased == 0) return static_cast<uint8_t>(sign);  // a float32 subnormal: < 2^-126, rounds to 0
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;      // |x| = m x 2^(biased - 150)
  if (biased < 121) {
    // |x| < 2^-6: an e4m3 subnormal, k x 2^-9 with k = round(|x| x 2^9) = round(m / 2^(141 -
    // biased)); k = 8 is 2^-6, the least normal, whose code is 0x08 as well.
    return static_cast<uint8_t>(sign | ShiftRoundEven(m, 141u - biased));
  }
  // |x| in [2^e, 2^(e+1)), e = biased - 127 in [-6, 8]: significand round(m / 2^20) in [8, 16].
  int exponent = static_cast<int>(biased) - 127;
  uint32_t significand = ShiftRoundEven(m, 20);
  if (significand == 16) {
    significand = 8;
    ++exponent;
  }
  // 448 is exponent 8, significand 14 (15 would be the NaN code).
  if (exponent > 8 || (exponent == 8 && significand > 14)) {
    return static_cast<uint8_t>(sign | kE4m3MaxCode);
  }
  return static_cast<uint8_t>(sign | (static_cast<uint32_t>(exponent + 7) << 3) |
                              (significand - 8));
}

// One latent value's code given its group's scale.
VERIFYD_FP8_HD uint8_t QuantizeValue(bf16_bits v, float scale) {
  return E4m3Code(DivRn(BitsToFloat(static_cast<uint32_t>(v) << 16), scale));
}

}  // namespace verifyd::fp8_bits

#undef VERIFYD_FP8_HD
