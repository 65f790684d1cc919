#include "tools/bench/decode_step_fill.h"

#include "base/cuda_check.h"

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

}  // namespace

absl::Status FillRandom(void* data, int64_t count, uint64_t seed, float amplitude,
                        cudaStream_t stream) {
  FillRandomKernel<<<1024, 256, 0, stream>>>(static_cast<uint16_t*>(data), count, seed, amplitude);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
