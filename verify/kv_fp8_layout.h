// DeepSeek's FP8 MLA cache row, byte for byte as FlashMLA's fp8 decode kernels read it (its
// csrc/ "sparse fp8" KV layout, the cache DeepSeek-V3.2's inference code writes):
//
//   bytes [0, 512)    the 512 latent values c_latent as float8 e4m3 (e4m3fn: no Inf, NaN = 0x7F /
//                     0xFF, largest finite 448), four groups of 128 values, group g = [128g,
//                     128g+128)
//   bytes [512, 528)  four float32 scales (little-endian), scale g for group g
//   bytes [528, 656)  the 64 rope values k_rope as bf16 (little-endian), unquantized
//
// 512 + 16 + 128 = 656 bytes per token and layer (bf16: 1152). SPEC §1 "KV storage dtype";
// plans/0030-fp8-store.md has the decisions below and why.
//
// Quantization (the daemon's, and both clients' helpers: they must agree byte for byte):
//   per group, amax = max |v| over its 128 bf16 values, scale = fl32(amax / 448) (a float32
//   division); a group whose scale is 0 (amax == 0, or amax below float32's reach / 448) gets
//   scale 1. Each value becomes e4m3 of fl32(v / scale), rounded to nearest, ties to even,
//   saturating at +-448 (fl32(v / scale) can pass 448 by an ulp; never a NaN code). -0 stays -0.
// Dequantized value of a latent element: its e4m3 value x scale, computed exactly (float64 holds
// it: 4 significant bits times 24). The CPU reference takes it in float32 (within 2^-24 relative).
//
// Header-only and std-only: the C++ client library quantizes with it too (client/fp8_rows.h).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "verify/bf16.h"
#include "verify/mla_dims.h"

namespace verifyd {

inline constexpr int kFp8Groups = 4;
inline constexpr int kFp8GroupSize = kVDim / kFp8Groups;  // 128
inline constexpr int kFp8LatentOffset = 0;
inline constexpr int kFp8ScalesOffset = kVDim;                            // 512
inline constexpr int kFp8RopeOffset = kFp8ScalesOffset + kFp8Groups * 4;  // 528
inline constexpr int kFp8RowBytes = kFp8RopeOffset + kRopeDim * 2;        // 656
static_assert(kFp8RowBytes == 656, "DeepSeek's FP8 MLA row is 656 bytes");
// The largest finite e4m3 (e4m3fn) value, and its code (exponent 15, mantissa 6).
inline constexpr float kE4m3Max = 448.f;
inline constexpr uint8_t kE4m3MaxCode = 0x7E;

// The e4m3 NaN encodings (S.1111.111); every other code is finite.
inline constexpr bool IsE4m3Nan(uint8_t code) { return (code & 0x7F) == 0x7F; }

namespace fp8_internal {

constexpr float E4m3Magnitude(int code7) {
  const int exponent = code7 >> 3;
  const int mantissa = code7 & 7;
  // Subnormal: m x 2^-9; normal: (8 + m) x 2^(e - 10). Built by exact halvings and doublings.
  float value = static_cast<float>(exponent == 0 ? mantissa : 8 + mantissa);
  int power = exponent == 0 ? -9 : exponent - 10;
  for (; power < 0; ++power) value *= 0.5f;
  for (; power > 0; --power) value *= 2.f;
  return value;
}

constexpr std::array<float, 256> MakeE4m3Table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const float magnitude = E4m3Magnitude(code & 0x7F);
    table[code] = (code & 0x80) ? -magnitude : magnitude;
  }
  // The NaN codes decode as NaN (never stored: the value check refuses them).
  table[0x7F] = __builtin_nanf("");
  table[0xFF] = -__builtin_nanf("");
  return table;
}

inline constexpr std::array<float, 256> kE4m3Values = MakeE4m3Table();

}  // namespace fp8_internal

inline float E4m3ToFloat(uint8_t code) { return fp8_internal::kE4m3Values[code]; }

// Round to nearest, ties to even, saturating at +-448. `x` must not be NaN.
inline uint8_t FloatToE4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (!(a < kE4m3Max)) return sign | kE4m3MaxCode;
  if (a < 0x1p-6f) {
    // Subnormals are multiples of 2^-9; 8 x 2^-9 (a round up) is the least normal, code 0x08.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.f));
  }
  int e = 0;
  std::frexp(a, &e);
  int exponent = e - 1;  // a in [2^exponent, 2^(exponent+1)), exponent in [-6, 8]
  int significand = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exponent)));  // [8, 16]
  if (significand == 16) {
    significand = 8;
    ++exponent;
  }
  // 448 is exponent 8, significand 14; 15 there would be the NaN code.
  if (exponent > 8 || (exponent == 8 && significand > 14)) return sign | kE4m3MaxCode;
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | (significand - 8));
}

// The float32 scale of group g of an fp8 row.
inline float Fp8RowScale(const uint8_t* row, int group) {
  float scale;
  std::memcpy(&scale, row + kFp8ScalesOffset + 4 * group, sizeof(scale));
  return scale;
}

// in: 576 bf16 values (within SPEC §1's bound); out: one 656-byte row.
inline void QuantizeFp8Row(const bf16_bits* in, uint8_t* out) {
  for (int g = 0; g < kFp8Groups; ++g) {
    const bf16_bits* values = in + g * kFp8GroupSize;
    float amax = 0.f;
    for (int i = 0; i < kFp8GroupSize; ++i)
      amax = std::fmax(amax, std::fabs(Bf16ToFloat(values[i])));
    float scale = amax / kE4m3Max;
    if (scale == 0.f) scale = 1.f;
    uint8_t* codes = out + kFp8LatentOffset + g * kFp8GroupSize;
    for (int i = 0; i < kFp8GroupSize; ++i) codes[i] = FloatToE4m3(Bf16ToFloat(values[i]) / scale);
    std::memcpy(out + kFp8ScalesOffset + 4 * g, &scale, sizeof(scale));
  }
  std::memcpy(out + kFp8RopeOffset, in + kVDim, kRopeDim * sizeof(bf16_bits));
}

// in: one 656-byte row; out: its 576 dequantized values in float32 (the latent ones as
// fl32(e4m3 value x scale), the rope ones exactly).
inline void DequantizeFp8Row(const uint8_t* in, float* out) {
  for (int g = 0; g < kFp8Groups; ++g) {
    const float scale = Fp8RowScale(in, g);
    const uint8_t* codes = in + kFp8LatentOffset + g * kFp8GroupSize;
    for (int i = 0; i < kFp8GroupSize; ++i) {
      out[g * kFp8GroupSize + i] = E4m3ToFloat(codes[i]) * scale;
    }
  }
  for (int i = 0; i < kRopeDim; ++i) {
    bf16_bits v;
    std::memcpy(&v, in + kFp8RopeOffset + 2 * i, sizeof(v));
    out[kVDim + i] = Bf16ToFloat(v);
  }
}

}  // namespace verifyd
