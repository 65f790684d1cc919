// One warp quantizes one bf16 KV row (576 values) into the fp8 row's 656 bytes
// (verify/kv_fp8_layout.h), with verify/kv_fp8_quantize_bits.h's steps, so the bytes are
// QuantizeFp8Row's (tests/verify/kv_fp8_quantize_bits_test.cc proves the steps on the host;
// tests/kernels/kv_fp8_write_test.cc the kernels on the device).
//
// The shape: the latent part is 64 16-byte words of 8 values; lane l takes words l and l + 32,
// which belong to groups l / 16 and 2 + l / 16, so each group's amax is a max over one half-warp
// (four xor shuffles). Each lane writes its 2 x 8 codes as two 8-byte stores; lane 0 the four
// scales (one 16-byte store), lanes 0..7 the rope part's 8 words. Every load is a coalesced
// 16-byte word; 656 = 41 x 16, so every row of the pool starts 16-byte aligned.
#pragma once

#include <cstdint>

#include "verify/bf16.h"
#include "verify/kv_fp8_layout.h"
#include "verify/kv_fp8_quantize_bits.h"
#include "verify/mla_dims.h"

namespace verifyd {

static_assert(kFp8RowBytes % 16 == 0, "fp8 rows stay 16-byte aligned in the pool");
static_assert(kFp8GroupSize == 128 && kFp8Groups == 4, "the lane mapping below assumes 4 x 128");

// The largest |v| bits of a 16-byte word of 8 bf16 values.
__device__ __forceinline__ uint32_t WordAmaxBits(const uint4& w) {
  const uint32_t parts[4] = {w.x, w.y, w.z, w.w};
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    amax = max(amax, fp8_bits::Bf16MagnitudeBits(static_cast<bf16_bits>(parts[i] & 0xffffu)));
    amax = max(amax, fp8_bits::Bf16MagnitudeBits(static_cast<bf16_bits>(parts[i] >> 16)));
  }
  return amax;
}

// The 8 codes of a word as one 8-byte value (code i in byte i: the pool is little-endian).
__device__ __forceinline__ uint2 WordCodes(const uint4& w, float scale) {
  const uint32_t parts[4] = {w.x, w.y, w.z, w.w};
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = fp8_bits::QuantizeValue(static_cast<bf16_bits>(parts[i] & 0xffffu), scale);
    const uint32_t hi = fp8_bits::QuantizeValue(static_cast<bf16_bits>(parts[i] >> 16), scale);
    packed[i / 2] |= (lo | (hi << 8)) << (16 * (i % 2));
  }
  return make_uint2(packed[0], packed[1]);
}

// Every lane of the warp calls it (full-warp shuffles). in: 576 bf16 values, 16-byte aligned;
// out: 656 bytes, 16-byte aligned.
__device__ __forceinline__ void QuantizeFp8RowWarp(const bf16_bits* in, uint8_t* out, int lane) {
  const uint4* words = reinterpret_cast<const uint4*>(in);
  const uint4 a = words[lane];       // group lane / 16
  const uint4 b = words[lane + 32];  // group 2 + lane / 16
  uint32_t amax_a = WordAmaxBits(a);
  uint32_t amax_b = WordAmaxBits(b);
#pragma unroll
  for (int offset = 8; offset >= 1; offset /= 2) {
    amax_a = max(amax_a, __shfl_xor_sync(0xffffffffu, amax_a, offset));
    amax_b = max(amax_b, __shfl_xor_sync(0xffffffffu, amax_b, offset));
  }
  const float scale_a = fp8_bits::GroupScale(amax_a);
  const float scale_b = fp8_bits::GroupScale(amax_b);
  uint2* codes = reinterpret_cast<uint2*>(out + kFp8LatentOffset);
  codes[lane] = WordCodes(a, scale_a);
  codes[lane + 32] = WordCodes(b, scale_b);
  // Lane 16 holds groups 1 and 3.
  const float scale_1 = __shfl_sync(0xffffffffu, scale_a, 16);
  const float scale_3 = __shfl_sync(0xffffffffu, scale_b, 16);
  if (lane == 0) {
    *reinterpret_cast<float4*>(out + kFp8ScalesOffset) =
        make_float4(scale_a, scale_1, scale_b, scale_3);
  }
  if (lane < kRopeDim * 2 / 16) {
    reinterpret_cast<uint4*>(out + kFp8RopeOffset)[lane] = words[kVDim / 8 + lane];
  }
}

}  // namespace verifyd
