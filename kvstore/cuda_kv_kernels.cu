// One 16-byte chunk (8 bf16) per thread and iteration: a 576-value row is 72 consecutive chunks,
// so consecutive threads load and store consecutive 16-byte words of the same row (coalesced).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda_check.h"
#include "kernels/mla_dims.h"
#include "kvstore/cuda_kv_kernels.h"

namespace verifyd {
namespace {

constexpr int kChunksPerRow = kKvDim * 2 / 16;
constexpr int kThreads = 256;
// Enough CTAs to fill any current GPU several times; a grid-stride loop covers the rest.
constexpr int64_t kMaxBlocks = 8192;

__global__ void __launch_bounds__(kThreads)
    CopySlotsAllLayersKernel(uint4* pool, int num_layers, int64_t capacity, const int32_t* src,
                             const int32_t* dst, int num_moves) {
  const int64_t per_layer = static_cast<int64_t>(num_moves) * kChunksPerRow;
  const int64_t total = per_layer * num_layers;
  const int64_t layer_chunks = capacity * kChunksPerRow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t layer = i / per_layer;
    const int64_t rest = i - layer * per_layer;
    const int64_t k = rest / kChunksPerRow;
    const int64_t chunk = rest - k * kChunksPerRow;
    uint4* base = pool + layer * layer_chunks;
    base[static_cast<int64_t>(dst[k]) * kChunksPerRow + chunk] =
        base[static_cast<int64_t>(src[k]) * kChunksPerRow + chunk];
  }
}

__global__ void __launch_bounds__(kThreads)
    GatherRowsKernel(const uint4* layer_rows, const int32_t* slots, int num_rows, uint4* out) {
  const int64_t total = static_cast<int64_t>(num_rows) * kChunksPerRow;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t k = i / kChunksPerRow;
    const int64_t chunk = i - k * kChunksPerRow;
    out[i] = layer_rows[static_cast<int64_t>(slots[k]) * kChunksPerRow + chunk];
  }
}

unsigned BlocksFor(int64_t chunks) {
  return static_cast<unsigned>(std::min<int64_t>((chunks + kThreads - 1) / kThreads, kMaxBlocks));
}

}  // namespace

absl::Status LaunchCopySlotsAllLayers(bf16_bits* pool, int num_layers, int64_t capacity,
                                      const int32_t* src, const int32_t* dst, int num_moves,
                                      cudaStream_t stream) {
  if (num_moves < 0 || num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_moves = ", num_moves, " and num_layers = ",
                                                   num_layers, " must be >= 0"));
  }
  if (num_moves == 0 || num_layers == 0) return absl::OkStatus();
  if (pool == nullptr || src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("pool, src and dst must be set when num_moves > 0");
  }
  const int64_t chunks = static_cast<int64_t>(num_moves) * kChunksPerRow * num_layers;
  CopySlotsAllLayersKernel<<<BlocksFor(chunks), kThreads, 0, stream>>>(
      reinterpret_cast<uint4*>(pool), num_layers, capacity, src, dst, num_moves);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchGatherRows(const bf16_bits* layer_rows, const int32_t* slots, int num_rows,
                              bf16_bits* out, cudaStream_t stream) {
  if (num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows, " must be >= 0"));
  }
  if (num_rows == 0) return absl::OkStatus();
  if (layer_rows == nullptr || slots == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("layer_rows, slots and out must be set when num_rows > 0");
  }
  const int64_t chunks = static_cast<int64_t>(num_rows) * kChunksPerRow;
  GatherRowsKernel<<<BlocksFor(chunks), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(layer_rows), slots, num_rows, reinterpret_cast<uint4*>(out));
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
