// Places a Verify call's slot-list uploads into the device slot arena
// (backend/cuda/cuda_slot_mirror.h).
//
// Why a kernel and not one cudaMemcpyAsync per sequence: the number of pieces changes from call to
// call (a sequence with nothing new uploads nothing), and a memcpy node per piece would change the
// CUDA graph's topology every step. The kernel's launch is the same for every call of a shape
// bucket (fixed grid, device pointers only); what it moves is data read from device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace verifyd {

// The upload region of a Verify, as packed in the staging buffer and uploaded by its one H2D copy:
//   SlotScatterHeader | SlotScatterRun[num_runs] | int32 values[num_values]
// Run r writes values [runs[r].value_begin, runs[r+1].value_begin) (the last run: up to
// num_values) to arena[runs[r].arena_offset ...]. Runs are sorted by value_begin and non-empty.
struct SlotScatterHeader {
  int32_t num_runs = 0;
  int32_t num_values = 0;
};
struct SlotScatterRun {
  int32_t arena_offset = 0;
  int32_t value_begin = 0;
};

// Enqueues the placement. header, runs and values: device memory (the uploaded region); arena:
// the device slot arena. Allocates nothing, never synchronizes (graph-capturable).
absl::Status LaunchSlotScatter(const SlotScatterHeader* header, const SlotScatterRun* runs,
                               const int32_t* values, int32_t* arena, cudaStream_t stream);

}  // namespace verifyd
