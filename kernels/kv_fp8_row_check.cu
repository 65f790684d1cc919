// Math: verify/kv_fp8_check.h's three rules, per 16-byte word of a 656-byte row (41 words): words
// 0-31 the latent codes (a NaN code is S.1111.111: with the sign cleared, byte 0x7F, found four
// bytes at a time: (x & 0x7F7F7F7F) + 0x01010101 carries into a byte's top bit only from 0x7F),
// word 32 the four float32 scales, words 33-40 the 64 rope bf16 (bits & 0x7FFF above 0x4780).
// Tiling: one word per thread per step of a grid-stride loop over count x 41 words. Schedule: a
// bounded grid (at most 1024 CTAs of 256 threads); a thread that finds a bad word takes one
// atomicMin of its row index, so clean rows cost one read of their bytes. Shared memory: none.
#include "kernels/kv_fp8_row_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "verify/kv_fp8_check.h"
#include "verify/kv_fp8_layout.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
constexpr int kWordsPerRow = kFp8RowBytes / 16;
constexpr int kLatentWords = (kFp8ScalesOffset - kFp8LatentOffset) / 16;
constexpr int kScalesWord = kFp8ScalesOffset / 16;
static_assert(
    kFp8RowBytes % 16 == 0 && kFp8ScalesOffset % 16 == 0 && kFp8RopeOffset % 16 == 0 &&
        kFp8RopeOffset - kFp8ScalesOffset == 16,
    "the rules split the row at 16-byte words: latent, then one word of scales, then rope");

__device__ __forceinline__ bool HasNanCode(uint32_t four_codes) {
  return (((four_codes & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u) != 0;
}

__device__ __forceinline__ bool BadScale(uint32_t bits) {
  const float scale = __uint_as_float(bits);
  // Written so that NaN fails: every comparison with NaN is false.
  return !(scale > 0.f && scale <= kMaxFp8Scale);
}

__device__ __forceinline__ bool BadRopePair(uint32_t two_values) {
  return (two_values & 0x7FFFu) > kMaxInputMagnitudeBits ||
         ((two_values >> 16) & 0x7FFFu) > kMaxInputMagnitudeBits;
}

__global__ void __launch_bounds__(kThreads)
    FirstBadFp8RowKernel(const uint4* rows, int64_t words, unsigned long long* first_bad_row) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < words;
       w += stride) {
    const int64_t row = w / kWordsPerRow;
    const int part = static_cast<int>(w - row * kWordsPerRow);
    const uint4 v = rows[w];
    const uint32_t x[4] = {v.x, v.y, v.z, v.w};
    bool bad = false;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      bad |= part < kLatentWords   ? HasNanCode(x[k])
             : part == kScalesWord ? BadScale(x[k])
                                   : BadRopePair(x[k]);
    }
    // Later words of this thread have larger rows: one hit is enough.
    if (bad) {
      atomicMin(first_bad_row, static_cast<unsigned long long>(row));
      return;
    }
  }
}

}  // namespace

absl::Status LaunchFirstBadFp8Row(const uint8_t* rows, int64_t count,
                                  unsigned long long* first_bad_row, cudaStream_t stream) {
  if (count < 0 || (count > 0 && (rows == nullptr || first_bad_row == nullptr)) ||
      reinterpret_cast<uintptr_t>(rows) % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("count = ", count,
                     " must be >= 0, with rows 16-byte aligned and rows and first_bad_row set"));
  }
  if (count == 0) return absl::OkStatus();
  const int64_t words = count * kWordsPerRow;
  const unsigned blocks =
      static_cast<unsigned>(std::min<int64_t>((words + kThreads - 1) / kThreads, kMaxBlocks));
  FirstBadFp8RowKernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(rows), words,
                                                        first_bad_row);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
