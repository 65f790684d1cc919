// The engine's step tensors of the decode-step bench's captured way (one sequence, a bucket of
// max_q nodes): what the captured StepPublish kernel copies into the daemon's step area at the
// start of every replay (vd_step_tensors in client/c_api/verifyd_dataplane.h: the sequence, its
// tree's parents, the previous tree's accepted path riding as the commit). An engine's drafter
// leaves them in device memory; here the CPU writes each step's values into a pinned slot of its
// own and the model's stream copies the slot into the device tensors just before the replay.
// One slot per replay, so a copy queued a step ahead never reads a slot being rewritten.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "client/c_api/verifyd_dataplane.h"

namespace verifyd::decode_step {

class StepTensors {
 public:
  StepTensors() = default;
  StepTensors(const StepTensors&) = delete;
  StepTensors& operator=(const StepTensors&) = delete;
  ~StepTensors();

  // Device tensors for a bucket of max_q nodes, and `slots` pinned host slots.
  absl::Status Init(int max_q, int slots);
  // Slot `slot`: sequence `sequence`, a tree of parents.size() <= max_q nodes, and the previous
  // tree's accepted path riding on it (none: nothing rides, the sequence's first step).
  absl::Status Fill(int slot, uint64_t sequence, const std::vector<int32_t>& parents,
                    const std::optional<std::vector<int32_t>>& commit);
  // Copies slot `slot` into the device tensors on `stream` (ordered before the next replay).
  absl::Status Upload(int slot, cudaStream_t stream) const;
  // The device tensors, for vd_capture_step_publish.
  vd_step_tensors pointers() const;

 private:
  int max_q_ = 0;
  int slots_ = 0;
  size_t stride_ = 0;
  uint8_t* host_ = nullptr;    // pinned, slots_ x stride_
  uint8_t* device_ = nullptr;  // one slot
};

}  // namespace verifyd::decode_step
