#include "kernels/slot_table_scatter.h"

#include "base/cuda_check.h"

namespace verifyd {
namespace {

// Small and fixed: a warm call moves a few hundred entries, a cold one ~100K (S5), which 8K
// threads cover in a dozen strided passes.
constexpr int kScatterBlocks = 32;
constexpr int kScatterThreads = 256;

__global__ void __launch_bounds__(kScatterThreads)
    SlotScatterKernel(const SlotScatterHeader* header, const SlotScatterRun* runs,
                      const int32_t* values, int32_t* arena) {
  const int num_runs = header->num_runs;
  const int num_values = header->num_values;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < num_values; i += gridDim.x * blockDim.x) {
    // The last run that starts at or before value i.
    int lo = 0, hi = num_runs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (runs[mid].value_begin <= i) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const SlotScatterRun run = runs[lo];
    arena[static_cast<int64_t>(run.arena_offset) + (i - run.value_begin)] = values[i];
  }
}

}  // namespace

absl::Status LaunchSlotScatter(const SlotScatterHeader* header, const SlotScatterRun* runs,
                               const int32_t* values, int32_t* arena, cudaStream_t stream) {
  if (header == nullptr || runs == nullptr || values == nullptr || arena == nullptr) {
    return absl::InvalidArgumentError("slot scatter: header, runs, values and arena must be set");
  }
  SlotScatterKernel<<<kScatterBlocks, kScatterThreads, 0, stream>>>(header, runs, values, arena);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
