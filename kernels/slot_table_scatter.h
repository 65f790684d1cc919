// Places a Verify call's slot-list uploads into the device slot arena
// (backend/cuda/cuda_slot_mirror.h).
//
// Why a kernel and not one cudaMemcpyAsync per sequence: the number of pieces changes from call to
// call (a sequence with nothing new uploads nothing), and a memcpy node per piece would change the
// CUDA graph's topology every step. The kernel's launch is the same for every call of a shape
// bucket (fixed grid, device pointers only); what it moves is data read from device memory.
//
// The scatter has no launch of its own: it rides in the value check's launch, the one launch that
// consumes a call's upload (LaunchSlotScatterAndFirstOutOfBound, kernels/value_bound_check.h), so
// a call's graph has one node fewer (plans/0031, change 2).
#pragma once

#include <cstdint>

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

// One placement: header, runs and values in device memory (the uploaded region); arena: the
// device slot arena. All null: nothing to place.
struct SlotScatterArgs {
  const SlotScatterHeader* header = nullptr;
  const SlotScatterRun* runs = nullptr;
  const int32_t* values = nullptr;
  int32_t* arena = nullptr;
};

}  // namespace verifyd
