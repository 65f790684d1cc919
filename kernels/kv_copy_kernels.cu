// The slot-list kernels move one 16-byte chunk (8 bf16) per thread: a 576-value row is 72
// consecutive chunks, so consecutive threads load and store consecutive 16-byte words of the same
// row (coalesced). The run kernel moves a run's bytes, contiguous in each layer, as 4 KB segments:
// one warp per segment, eight 16-byte loads per lane issued before any store.
#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/kv_copy_kernels.h"
#include "verify/mla_dims.h"

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

constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kWordsPerLane = kCopySegmentWords / 32;

// blockIdx.y is the layer; warp w of block b copies segment b * 8 + w of every run's words.
// The run table is read through the read-only cache: the warps of a block search for
// neighbouring segments, so their binary searches mostly hit the same lines.
__global__ void __launch_bounds__(kThreads)
    CopyRunsAllLayersKernel(uint4* pool, int64_t capacity, const int4* runs, int num_runs,
                            int64_t num_segments) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t segment =
      static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (segment >= num_segments) return;
  // The run that holds the segment: the last whose first segment is <= segment (warp-uniform).
  int lo = 0;
  int hi = num_runs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(&runs[mid].w) <= segment) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int4 run = __ldg(&runs[lo]);
  const int64_t first_word = (segment - run.w) * kCopySegmentWords;
  const int64_t run_words = static_cast<int64_t>(run.z) * kChunksPerRow;
  const int words =
      static_cast<int>(min(static_cast<int64_t>(kCopySegmentWords), run_words - first_word));
  uint4* layer = pool + static_cast<int64_t>(blockIdx.y) * capacity * kChunksPerRow;
  const uint4* src = layer + static_cast<int64_t>(run.x) * kChunksPerRow + first_word;
  uint4* dst = layer + static_cast<int64_t>(run.y) * kChunksPerRow + first_word;
  // All loads first, then all stores: 8 x 16 bytes in flight per lane. Streaming hints: the
  // copied rows are not read again soon, so they should not push Verify's KV out of L2.
  uint4 v[kWordsPerLane];
#pragma unroll
  for (int j = 0; j < kWordsPerLane; ++j) {
    const int w = lane + 32 * j;
    if (w < words) v[j] = __ldcs(src + w);
  }
#pragma unroll
  for (int j = 0; j < kWordsPerLane; ++j) {
    const int w = lane + 32 * j;
    if (w < words) __stcs(dst + w, v[j]);
  }
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

int64_t PackCopyRunTable(absl::Span<const SlotRunCopy> runs, int32_t* table) {
  int64_t segments = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    table[4 * k + 0] = runs[k].src_begin;
    table[4 * k + 1] = runs[k].dst_begin;
    table[4 * k + 2] = runs[k].length;
    // Clamped so a caller that overflows int32 sees a total it refuses, never a wrapped entry.
    table[4 * k + 3] = static_cast<int32_t>(std::min<int64_t>(segments, INT32_MAX));
    segments += (static_cast<int64_t>(runs[k].length) * kChunksPerRow + kCopySegmentWords - 1) /
                kCopySegmentWords;
  }
  return segments;
}

absl::Status LaunchCopyRunsAllLayers(bf16_bits* pool, int num_layers, int64_t capacity,
                                     const int32_t* run_table, int num_runs, int64_t num_segments,
                                     cudaStream_t stream) {
  if (num_runs < 0 || num_layers < 0 || num_segments < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_runs = ", num_runs, ", num_layers = ", num_layers,
                     " and num_segments = ", num_segments, " must be >= 0"));
  }
  if (num_runs == 0 || num_layers == 0) return absl::OkStatus();
  // Segment indices are compared with the table's int32 entries.
  if (num_segments > INT32_MAX || num_segments < num_runs || num_layers > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_segments = ", num_segments, " must be in [num_runs = ", num_runs, ", ",
                     INT32_MAX, "] and num_layers = ", num_layers, " <= 65535"));
  }
  if (pool == nullptr || run_table == nullptr) {
    return absl::InvalidArgumentError("pool and run_table must be set when num_runs > 0");
  }
  const dim3 grid(static_cast<unsigned>((num_segments + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(num_layers));
  CopyRunsAllLayersKernel<<<grid, kThreads, 0, stream>>>(reinterpret_cast<uint4*>(pool), capacity,
                                                         reinterpret_cast<const int4*>(run_table),
                                                         num_runs, num_segments);
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
