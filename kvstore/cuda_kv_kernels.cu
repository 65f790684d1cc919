// One 16-byte chunk (8 bf16) per thread: a 576-value row is 72 consecutive chunks,
// so consecutive threads load and store consecutive 16-byte words of the same row (coalesced).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/mla_dims.h"
#include "kvstore/cuda_kv_kernels.h"

namespace verifyd {
namespace {

constexpr int kChunksPerRow = kKvDim * 2 / 16;
constexpr int kThreads = 256;

// One thread per 16-byte chunk; blockIdx.y is the layer. 32-bit indices (the callers bound
// num_moves * 72 below 2^31) and a division by the constant 72, so the index math stays a few
// integer instructions per 16 bytes and the copy runs at memory speed.
__global__ void __launch_bounds__(kThreads)
    CopySlotsAllLayersKernel(uint4* pool, int64_t capacity, const int32_t* src, const int32_t* dst,
                             int num_moves) {
  const int i = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (i >= num_moves * kChunksPerRow) return;
  const int k = i / kChunksPerRow;
  const int chunk = i - k * kChunksPerRow;
  uint4* layer = pool + static_cast<int64_t>(blockIdx.y) * capacity * kChunksPerRow;
  layer[static_cast<int64_t>(dst[k]) * kChunksPerRow + chunk] =
      layer[static_cast<int64_t>(src[k]) * kChunksPerRow + chunk];
}

__global__ void __launch_bounds__(kThreads)
    GatherRowsKernel(const uint4* layer_rows, const int32_t* slots, int num_rows, uint4* out) {
  const int i = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (i >= num_rows * kChunksPerRow) return;
  const int k = i / kChunksPerRow;
  const int chunk = i - k * kChunksPerRow;
  out[i] = layer_rows[static_cast<int64_t>(slots[k]) * kChunksPerRow + chunk];
}

unsigned BlocksFor(int rows) {
  return static_cast<unsigned>((static_cast<int64_t>(rows) * kChunksPerRow + kThreads - 1) /
                               kThreads);
}

// Keeps rows * 72 (the thread index) inside int32.
constexpr int kMaxRows = INT32_MAX / kChunksPerRow - kThreads;

}  // namespace

absl::Status LaunchCopySlotsAllLayers(bf16_bits* pool, int num_layers, int64_t capacity,
                                      const int32_t* src, const int32_t* dst, int num_moves,
                                      cudaStream_t stream) {
  if (num_moves < 0 || num_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_moves = ", num_moves, " and num_layers = ", num_layers, " must be >= 0"));
  }
  if (num_moves == 0 || num_layers == 0) return absl::OkStatus();
  if (num_moves > kMaxRows || num_layers > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("num_moves = ", num_moves,
                                                   " must be <= ", kMaxRows,
                                                   " and num_layers = ", num_layers, " <= 65535"));
  }
  if (pool == nullptr || src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("pool, src and dst must be set when num_moves > 0");
  }
  const dim3 grid(BlocksFor(num_moves), static_cast<unsigned>(num_layers));
  CopySlotsAllLayersKernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<uint4*>(pool), capacity,
                                                          src, dst, num_moves);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchGatherRows(const bf16_bits* layer_rows, const int32_t* slots, int num_rows,
                              bf16_bits* out, cudaStream_t stream) {
  if (num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows, " must be >= 0"));
  }
  if (num_rows == 0) return absl::OkStatus();
  if (num_rows > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_rows = ", num_rows, " must be <= ", kMaxRows));
  }
  if (layer_rows == nullptr || slots == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("layer_rows, slots and out must be set when num_rows > 0");
  }
  GatherRowsKernel<<<BlocksFor(num_rows), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(layer_rows), slots, num_rows, reinterpret_cast<uint4*>(out));
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
