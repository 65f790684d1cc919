// e4m3 codes times their group's scale as bf16 (DeepSeek's fp8 MLA row, verify/kv_fp8_layout.h):
// the one conversion both flash kernels' fp8 load stages make (mla_verify_kv_fp8_load.cuh for the
// portable kernel, mla_verify_flash_sm90_fp8_load.cuh for the Hopper kernel).
//
// Math. value = bf16_rn(e4m3(code) x scale), the product taken in float32: the CPU reference's
// dequantized value (DequantizeFp8Row, one rounding), then rounded to bf16 for the mma (one more,
// ~2^-9 relative, below the output's own bf16 rounding). The code widens exactly (e4m3 -> f16 ->
// f32: `cvt.rn.f16x2.e4m3x2` on sm_89+, cuda_fp8.h's software path on sm_80).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/mla_verify_mma.cuh"

namespace verifyd::fp8 {

// Eight e4m3 codes (two words, code k of value base + k) times their group's scale, as four bf16
// pairs.
__device__ __forceinline__ uint4 WidenEight(uint2 codes, float scale) {
  const uint32_t words[2] = {codes.x, codes.y};
  uint32_t out[4];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * h));
      const __half2_raw halves = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&halves));
      out[2 * w + h] = mma::PackBf16x2(v.x * scale, v.y * scale);
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

}  // namespace verifyd::fp8
