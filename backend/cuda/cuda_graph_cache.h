// CUDA graphs of the Verify hot path (inputs H2D → attention → combine → outputs D2H), one
// executable graph per shape bucket.
//
// The first call of a bucket runs eagerly (a warm-up: one-off shapes never pay for a capture, and
// every kernel module is loaded before any capture). Later calls bring the exact parameters their
// launch sequence would use. Same parameters as the bucket's last launch: the graph is replayed as
// is (the copies re-read the staging buffer, so new inputs flow in). Different parameters: the
// sequence is captured and the executable graph updated in place (cudaGraphExecUpdate), or
// re-instantiated when the update is refused. Anything the graph path cannot do falls back to
// eager launches of the same sequence, so graph and eager runs execute the same kernels on the
// same bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/cuda/cuda_verify_staging.h"

namespace verifyd {

// What selects an executable graph: everything that changes the graph's topology or would make
// updates frequent. The node-count bucket is Σ Q rounded up to a power of two.
struct VerifyGraphBucket {
  int layer = 0;
  int batch = 0;
  int total_q_bucket = 0;
  int num_heads = 0;
  bool lse = false;
  bool combine = false;  // the plan has split partials to merge (one more kernel node)
  // Tensors copied straight from / into registered host memory, outside the graph: the graph's
  // own copies then cover only the staged rest (other copy nodes, or none).
  DirectCopies direct;
  // A call on external tensors (ComputeVerifyExternal): q, tree KV, out and lse in a registered
  // device region, read and written by the kernels in place; the tree-KV write (in the scatter's
  // launch on a bf16 pool, a kernel of its own on an fp8 pool), the NaN fill, and no output copy.
  bool external = false;

  bool operator==(const VerifyGraphBucket&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const VerifyGraphBucket& b) {
    return H::combine(std::move(h), b.layer, b.batch, b.total_q_bucket, b.num_heads, b.lse,
                      b.combine, b.direct.q, b.direct.out, b.direct.lse, b.external);
  }
};

// Every value a captured launch sequence bakes in. Equal parameters mean the executable graph
// would do exactly what a fresh capture would. What flows through device memory is not here: the
// prefix lengths, slot lists (the mirror's upload), masks, q and the plan's work items are all
// uploaded by the graph's own H2D copy, so a decode step whose L grew replays the graph as is as
// long as the plan's item counts (the kernels' grid sizes) and the buffers stay the same.
struct VerifyGraphParams {
  const void* staging = nullptr;
  void* device_inputs = nullptr;
  void* device_outputs = nullptr;
  void* host_outputs = nullptr;
  const void* slot_arena = nullptr;
  const void* kv = nullptr;
  int64_t num_slots = 0;
  int num_work = 0;     // flash grid
  int num_combine = 0;  // combine grid
  int num_partials = 0;
  float scale = 0.f;
  int total_q = 0;
  VerifyStagingLayout layout;
  // External calls: the caller's device tensors, baked into the kernels' parameters. A scheduler
  // reuses its per-layer buffers from step to step, so these repeat and the graph is replayed;
  // other addresses update it (a capture, no new instantiation).
  const void* external_q = nullptr;
  const void* external_tree_kv = nullptr;
  const void* external_out = nullptr;
  const void* external_lse = nullptr;

  bool operator==(const VerifyGraphParams&) const = default;
};

enum class GraphOutcome { kReplayed, kUpdated, kInstantiated, kWarmup, kEager };

struct GraphCounters {
  int64_t captures = 0;         // instantiations of a captured graph
  int64_t updates = 0;          // successful cudaGraphExecUpdate
  int64_t replays = 0;          // graph launches (every call that ran as a graph)
  int64_t warmups = 0;          // first calls of a bucket, run eagerly on purpose
  int64_t fallbacks = 0;        // calls that ran eagerly because the graph path failed
  int64_t update_refusals = 0;  // updates refused (topology changed): re-instantiated
};

class VerifyGraphCache {
 public:
  // max_graphs: executable graphs kept; past it all are dropped (a workload with that many live
  // buckets is not one graphs help).
  explicit VerifyGraphCache(int max_graphs) : max_graphs_(max_graphs) {}
  ~VerifyGraphCache();
  VerifyGraphCache(const VerifyGraphCache&) = delete;
  VerifyGraphCache& operator=(const VerifyGraphCache&) = delete;

  // Runs `enqueue` (which must enqueue the whole sequence on the stream it is given, allocate
  // nothing and never synchronize) as a graph of `bucket`. Returns how it ran; an error only when
  // even the eager fallback failed or a graph launch failed.
  absl::StatusOr<GraphOutcome> Run(const VerifyGraphBucket& bucket, const VerifyGraphParams& params,
                                   absl::FunctionRef<absl::Status(cudaStream_t)> enqueue,
                                   cudaStream_t stream);

  const GraphCounters& counters() const { return counters_; }
  size_t size() const { return graphs_.size(); }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;  // null after the warm-up until the first capture
    VerifyGraphParams params;
  };
  // Captures `enqueue` into a graph; nullptr (error cleared) when capture is not possible.
  cudaGraph_t Capture(absl::FunctionRef<absl::Status(cudaStream_t)> enqueue, cudaStream_t stream,
                      absl::Status* enqueue_status);
  void Clear();

  int max_graphs_;
  absl::flat_hash_map<VerifyGraphBucket, Entry> graphs_;
  GraphCounters counters_;
};

// Σ Q rounded up to a power of two (at least 8).
int TotalQBucket(int total_q);

}  // namespace verifyd
