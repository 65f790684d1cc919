// The slot-list kernels move one 16-byte chunk per thread: a row is 72 (bf16: 576 values) or 41
// (fp8: 656 bytes) consecutive chunks, so consecutive threads load and store consecutive 16-byte
// words of the same row (coalesced). The run kernel moves a run's bytes, contiguous in each layer,
// as 4 KB segments: one warp per segment, eight 16-byte loads per lane issued before any store.
// Every kernel is a template on the row's chunk count, instantiated for the two dtypes, so the
// index math divides by a constant as it did when rows were bf16 only.
#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/kv_copy_kernels.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kBf16Chunks = kKvRowBytes / 16;
constexpr int kFp8Chunks = kFp8RowBytes / 16;
static_assert(kKvRowBytes % 16 == 0 && kFp8RowBytes % 16 == 0, "rows are whole 16-byte words");
constexpr int kThreads = 256;

// One thread per 16-byte chunk; blockIdx.y is the layer. 32-bit indices (the callers bound
// num_moves * chunks below 2^31) and a division by a constant, so the index math stays a few
// integer instructions per 16 bytes and the copy runs at memory speed.
template <int kChunksPerRow>
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
template <int kChunksPerRow>
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

template <int kChunksPerRow>
__global__ void __launch_bounds__(kThreads)
    GatherRowsKernel(const uint4* layer_rows, const int32_t* slots, int num_rows, uint4* out) {
  const int i = static_cast<int>(blockIdx.x) * kThreads + static_cast<int>(threadIdx.x);
  if (i >= num_rows * kChunksPerRow) return;
  const int k = i / kChunksPerRow;
  const int chunk = i - k * kChunksPerRow;
  out[i] = layer_rows[static_cast<int64_t>(slots[k]) * kChunksPerRow + chunk];
}

// The row's 16-byte chunks for the dtypes the kernels are built for, else INVALID_ARGUMENT.
absl::StatusOr<int> ChunksPerRow(int row_bytes) {
  if (row_bytes == kKvRowBytes || row_bytes == kFp8RowBytes) return row_bytes / 16;
  return absl::InvalidArgumentError(absl::StrCat(
      "row_bytes = ", row_bytes, " must be ", kKvRowBytes, " (bf16) or ", kFp8RowBytes, " (fp8)"));
}

unsigned BlocksFor(int rows, int chunks_per_row) {
  return static_cast<unsigned>((static_cast<int64_t>(rows) * chunks_per_row + kThreads - 1) /
                               kThreads);
}

// Keeps rows * chunks (the thread index) inside int32.
int MaxRows(int chunks_per_row) { return INT32_MAX / chunks_per_row - kThreads; }

}  // namespace

absl::Status LaunchCopySlotsAllLayers(void* pool, int row_bytes, int num_layers, int64_t capacity,
                                      const int32_t* src, const int32_t* dst, int num_moves,
                                      cudaStream_t stream) {
  VERIFYD_ASSIGN_OR_RETURN(const int chunks, ChunksPerRow(row_bytes));
  const int max_rows = MaxRows(chunks);
  if (num_moves < 0 || num_layers < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_moves = ", num_moves, " and num_layers = ", num_layers, " must be >= 0"));
  }
  if (num_moves == 0 || num_layers == 0) return absl::OkStatus();
  if (num_moves > max_rows || num_layers > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("num_moves = ", num_moves,
                                                   " must be <= ", max_rows,
                                                   " and num_layers = ", num_layers, " <= 65535"));
  }
  if (pool == nullptr || src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("pool, src and dst must be set when num_moves > 0");
  }
  const dim3 grid(BlocksFor(num_moves, chunks), static_cast<unsigned>(num_layers));
  auto* words = static_cast<uint4*>(pool);
  if (chunks == kBf16Chunks) {
    CopySlotsAllLayersKernel<kBf16Chunks>
        <<<grid, kThreads, 0, stream>>>(words, capacity, src, dst, num_moves);
  } else {
    CopySlotsAllLayersKernel<kFp8Chunks>
        <<<grid, kThreads, 0, stream>>>(words, capacity, src, dst, num_moves);
  }
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

int64_t PackCopyRunTable(absl::Span<const SlotRunCopy> runs, int row_bytes, int32_t* table) {
  const int64_t chunks_per_row = row_bytes / 16;
  int64_t segments = 0;
  for (size_t k = 0; k < runs.size(); ++k) {
    table[4 * k + 0] = runs[k].src_begin;
    table[4 * k + 1] = runs[k].dst_begin;
    table[4 * k + 2] = runs[k].length;
    // Clamped so a caller that overflows int32 sees a total it refuses, never a wrapped entry.
    table[4 * k + 3] = static_cast<int32_t>(std::min<int64_t>(segments, INT32_MAX));
    segments += (static_cast<int64_t>(runs[k].length) * chunks_per_row + kCopySegmentWords - 1) /
                kCopySegmentWords;
  }
  return segments;
}

absl::Status LaunchCopyRunsAllLayers(void* pool, int row_bytes, int num_layers, int64_t capacity,
                                     const int32_t* run_table, int num_runs, int64_t num_segments,
                                     cudaStream_t stream) {
  VERIFYD_ASSIGN_OR_RETURN(const int chunks, ChunksPerRow(row_bytes));
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
  auto* words = static_cast<uint4*>(pool);
  const auto* table = reinterpret_cast<const int4*>(run_table);
  if (chunks == kBf16Chunks) {
    CopyRunsAllLayersKernel<kBf16Chunks>
        <<<grid, kThreads, 0, stream>>>(words, capacity, table, num_runs, num_segments);
  } else {
    CopyRunsAllLayersKernel<kFp8Chunks>
        <<<grid, kThreads, 0, stream>>>(words, capacity, table, num_runs, num_segments);
  }
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchGatherRows(const void* layer_rows, int row_bytes, const int32_t* slots,
                              int num_rows, void* out, cudaStream_t stream) {
  VERIFYD_ASSIGN_OR_RETURN(const int chunks, ChunksPerRow(row_bytes));
  const int max_rows = MaxRows(chunks);
  if (num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows, " must be >= 0"));
  }
  if (num_rows == 0) return absl::OkStatus();
  if (num_rows > max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_rows = ", num_rows, " must be <= ", max_rows));
  }
  if (layer_rows == nullptr || slots == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("layer_rows, slots and out must be set when num_rows > 0");
  }
  const auto* rows = static_cast<const uint4*>(layer_rows);
  auto* gathered = static_cast<uint4*>(out);
  if (chunks == kBf16Chunks) {
    GatherRowsKernel<kBf16Chunks>
        <<<BlocksFor(num_rows, chunks), kThreads, 0, stream>>>(rows, slots, num_rows, gathered);
  } else {
    GatherRowsKernel<kFp8Chunks>
        <<<BlocksFor(num_rows, chunks), kThreads, 0, stream>>>(rows, slots, num_rows, gathered);
  }
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
