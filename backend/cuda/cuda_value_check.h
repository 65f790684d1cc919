// SPEC §1's check of one external call's q and tree_kv, answered by the device
// (ExternalValueCheck, backend/external_tensors.h): in the call's stream order the device found
// the first out-of-bound element of each tensor (kernels/value_bound_check.h), its NaN fill wrote
// the two packed words into mapped pinned host memory, and then the event was recorded. The answer
// is read once the event has completed (the kernel's writes are visible to the host then). The
// backend reuses the words and the event for a later call of the same ring position only after
// Settle(), so an answer never reads a later call's words.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "backend/external_tensors.h"

namespace verifyd {

class CudaValueCheck : public ExternalValueCheck {
 public:
  // words: mapped pinned host [2] (q's, tree_kv's), written before `event`; the shapes name the
  // bad element in the answer, as the gRPC path's check does.
  CudaValueCheck(int device, cudaEvent_t event, const unsigned long long* words,
                 std::vector<int64_t> q_shape, std::vector<int64_t> tree_kv_shape);

  std::optional<absl::Status> Poll() override;
  absl::Status Wait() override;
  // The caller has seen the event complete: the answer is read now, the event and words are
  // not touched again.
  void Settle();

 private:
  absl::Status ReadLocked();

  const int device_;
  const cudaEvent_t event_;
  const unsigned long long* const words_;
  const std::vector<int64_t> q_shape_, tree_kv_shape_;
  std::mutex mu_;
  std::optional<absl::Status> answer_;
};

}  // namespace verifyd
