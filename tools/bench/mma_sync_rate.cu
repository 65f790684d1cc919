// mma.sync rate kernels for the benchmark's portable ceiling (mma_sync_rate.h says what is
// measured). Each warp keeps 8 independent accumulator chains so that the tensor pipe, not the
// mma latency, bounds it; the ldmatrix form reads a 64 x 64 bf16 tile stored with the flash ring's
// 128-byte swizzle, 8 consecutive rows per matrix (no bank conflicts, no broadcast: each lane's
// address differs), its addresses moving with the step so that no load repeats within an iteration.
#include "tools/bench/mma_sync_rate.h"

#include <cstdint>

#include "kernels/mla_verify_mma.cuh"

namespace verifyd::bench {
namespace {

constexpr int kMmaPerIter = 16;  // 8 chains x 2
constexpr int kTileRows = 64;
constexpr int kTileBytes = kTileRows * 128;

template <MmaOperands kOperands>
__global__ void MmaSyncRateKernel(int iters, float* sink) {
  __shared__ __align__(1024) uint8_t tile[kTileBytes];
  for (int i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) {
    // Random-looking bf16 pairs (a hash of the index), never zeros.
    uint32_t h = (i + 1) * 0x9E3779B9u;
    h ^= h >> 15;
    reinterpret_cast<uint32_t*>(tile)[i] = (h & 0x3f7f3f7fu) | 0x3c003c00u;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  uint32_t a[4];
  for (int i = 0; i < 4; ++i) a[i] = 0x3f803f80u ^ (lane * 0x00010001u * (i + 1));
  uint32_t breg[4];
  for (int i = 0; i < 4; ++i) breg[i] = 0x3f003f00u ^ (lane * 0x00030003u * (i + 1));
  float acc[8][4];
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 4; ++i) acc[c][i] = 0.f;
  const uint32_t base = mma::SmemAddr(tile);
  const int row = (lane & 7) + ((lane >> 4) << 3);
  const int hi = (lane >> 3) & 1;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int step = 0; step < 4; ++step) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint32_t b[4];
        if (kOperands == MmaOperands::kLdmatrixB) {
          const int r = (step * 2 + half) * 16 % kTileRows + row;
          const int unit = (step * 2 + hi) & 7;
          mma::LdMatrixX4(b, base + r * 128 + ((unit ^ (r & 7)) << 4));
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) b[i] = breg[i];
        }
        const int chain = step * 2 + half;
        mma::MmaBf16(acc[chain], a, b[0], b[1]);
        mma::MmaBf16(acc[(chain + 4) % 8], a, b[2], b[3]);
      }
    }
  }
  float total = 0.f;
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 4; ++i) total += acc[c][i];
  sink[blockIdx.x * blockDim.x / 32 + threadIdx.x / 32] = total;
}

}  // namespace

double MmaSyncRateFlops(int grid, int warps_per_cta, int iters) {
  return double(grid) * warps_per_cta * iters * kMmaPerIter * 4096.0;
}

cudaError_t LaunchMmaSyncRate(MmaOperands operands, int grid, int warps_per_cta, int iters,
                              float* sink, cudaStream_t stream) {
  if (operands == MmaOperands::kLdmatrixB) {
    MmaSyncRateKernel<MmaOperands::kLdmatrixB>
        <<<grid, warps_per_cta * 32, 0, stream>>>(iters, sink);
  } else {
    MmaSyncRateKernel<MmaOperands::kRegisters>
        <<<grid, warps_per_cta * 32, 0, stream>>>(iters, sink);
  }
  return cudaGetLastError();
}

}  // namespace verifyd::bench
