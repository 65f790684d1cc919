// ComputeBackend: where Verify's arithmetic runs and where the KV pool lives. The CPU backend
// computes on host memory; a CUDA backend (later) supplies device storage and its kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/verify_problem.h"
#include "kvstore/kv_storage.h"

namespace verifyd {

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  // "cpu" or "cuda": the backend label of metrics and Stats.
  virtual const char* name() const = 0;
  // The pool the KvStore will own. Called once, before any ComputeVerify.
  virtual absl::StatusOr<std::unique_ptr<KvStorage>> CreateStorage(int num_layers,
                                                                   int64_t capacity_slots) = 0;
  // Computes `problem` over `layer` of the storage: the caller fills everything but kv and
  // num_slots, with host pointers (q, out, lse and the index arrays).
  virtual absl::Status ComputeVerify(int layer, VerifyProblem problem) = 0;

  // What a ComputeVerify did with CUDA graphs, for verifyd_cuda_graph_*_total. A backend without
  // graphs (cpu) never reports.
  enum class GraphEvent { kCapture, kReplay, kFallback };
  // Called once before any ComputeVerify; the observer runs on the executor thread.
  virtual void SetGraphObserver(std::function<void(GraphEvent)> observer) { (void)observer; }
};

}  // namespace verifyd
