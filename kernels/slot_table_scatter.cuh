// The slot-table scatter's device part (kernels/slot_table_scatter.h), for the launch it rides in.
// Math: value i goes to arena[run.arena_offset + (i - run.value_begin)], run being the last run
// that starts at or before i (a binary search over the runs). Tiling: one value per thread per
// step, a stride loop over the values across the blocks given to it. Schedule: a fixed number of
// blocks (kSlotScatterBlocks): a warm call moves a few hundred entries, a cold one ~100K (S5),
// which 8K threads cover in a dozen strided passes. Shared memory: none.
#pragma once

#include <cstdint>

#include "kernels/slot_table_scatter.h"

namespace verifyd {

inline constexpr int kSlotScatterBlocks = 32;

// Block `block` of `blocks` (blockDim.x threads each) places its share of the values.
__device__ __forceinline__ void SlotScatterBlock(const SlotScatterArgs& s, int block, int blocks) {
  const int num_runs = s.header->num_runs;
  const int num_values = s.header->num_values;
  for (int i = block * blockDim.x + threadIdx.x; i < num_values; i += blocks * blockDim.x) {
    // The last run that starts at or before value i.
    int lo = 0, hi = num_runs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s.runs[mid].value_begin <= i) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const SlotScatterRun run = s.runs[lo];
    s.arena[static_cast<int64_t>(run.arena_offset) + (i - run.value_begin)] = s.values[i];
  }
}

}  // namespace verifyd
