#include "tools/bench/decode_step_fill.h"

#include "base/cuda_check.h"
#include "verify/kv_fp8_layout.h"

namespace verifyd {
namespace {

__global__ void FillRandomKernel(uint16_t* data, int64_t count, uint64_t seed, float amplitude) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.f - 1.f;
    const uint32_t bits = __float_as_uint(u * amplitude);
    data[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
}

__device__ uint64_t Mix(uint64_t i, uint64_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// One thread per 4-byte word of a row: latent codes, a scale, or two rope values.
__global__ void FillRandomFp8RowsKernel(uint32_t* data, int64_t words, uint64_t seed) {
  constexpr int kWordsPerRow = kFp8RowBytes / 4;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int offset = static_cast<int>(i % kWordsPerRow) * 4;
    const uint64_t x = Mix(static_cast<uint64_t>(i), seed);
    uint32_t word;
    if (offset < kFp8ScalesOffset) {
      word = static_cast<uint32_t>(x >> 16);
      for (int b = 0; b < 4; ++b) {  // a NaN code (S.1111.111) becomes the largest finite one
        const uint32_t code = (word >> (8 * b)) & 0xFFu;
        if ((code & 0x7Fu) == 0x7Fu) word ^= 1u << (8 * b);
      }
    } else if (offset < kFp8RopeOffset) {
      word = __float_as_uint(1.f / 448.f);
    } else {
      uint32_t halves[2];
      for (int h = 0; h < 2; ++h) {
        const uint64_t y = Mix(static_cast<uint64_t>(i) * 2 + h, seed ^ 0x5bd1e995ull);
        const float u = static_cast<float>(y >> 40) / static_cast<float>(1 << 24) * 2.f - 1.f;
        const uint32_t bits = __float_as_uint(u);
        halves[h] = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
      }
      word = halves[0] | halves[1] << 16;
    }
    data[i] = word;
  }
}

}  // namespace

absl::Status FillRandomFp8Rows(void* data, int64_t rows, uint64_t seed, cudaStream_t stream) {
  FillRandomFp8RowsKernel<<<1024, 256, 0, stream>>>(static_cast<uint32_t*>(data),
                                                    rows * (kFp8RowBytes / 4), seed);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status FillRandom(void* data, int64_t count, uint64_t seed, float amplitude,
                        cudaStream_t stream) {
  FillRandomKernel<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(data), count, seed, amplitude);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
