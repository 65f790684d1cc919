#include "backend/cuda/cuda_graph_cache.h"

#include "base/cuda_check.h"
#include "base/status_macros.h"

namespace verifyd {

int TotalQBucket(int total_q) {
  int bucket = 8;
  while (bucket < total_q) bucket *= 2;
  return bucket;
}

VerifyGraphCache::~VerifyGraphCache() { Clear(); }

void VerifyGraphCache::Clear() {
  for (auto& [bucket, entry] : graphs_) {
    if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);
  }
  graphs_.clear();
}

cudaGraph_t VerifyGraphCache::Capture(absl::FunctionRef<absl::Status(cudaStream_t)> enqueue,
                                      cudaStream_t stream, absl::Status* enqueue_status) {
  // Thread-local mode: a CUDA call of another thread cannot invalidate this capture.
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  *enqueue_status = enqueue(stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess || !enqueue_status->ok()) {
    // Errors swallowed here must not surface in a later launch check.
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return nullptr;
  }
  return graph;
}

absl::StatusOr<GraphOutcome> VerifyGraphCache::Run(
    const VerifyGraphBucket& bucket, const VerifyGraphParams& params,
    absl::FunctionRef<absl::Status(cudaStream_t)> enqueue, cudaStream_t stream) {
  auto it = graphs_.find(bucket);
  if (it == graphs_.end()) {
    if (static_cast<int>(graphs_.size()) >= max_graphs_) Clear();
    graphs_.emplace(bucket, Entry{});
    ++counters_.warmups;
    VERIFYD_RETURN_IF_ERROR(enqueue(stream));
    return GraphOutcome::kWarmup;
  }
  if (it->second.exec != nullptr && it->second.params == params) {
    VERIFYD_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream));
    ++counters_.replays;
    return GraphOutcome::kReplayed;
  }

  absl::Status enqueue_status;
  cudaGraph_t graph = Capture(enqueue, stream, &enqueue_status);
  if (graph == nullptr) {
    ++counters_.fallbacks;
    VERIFYD_RETURN_IF_ERROR(enqueue(stream));
    return GraphOutcome::kEager;
  }

  GraphOutcome outcome = GraphOutcome::kUpdated;
  if (it->second.exec != nullptr) {
    cudaGraphExecUpdateResultInfo info;
    if (cudaGraphExecUpdate(it->second.exec, graph, &info) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphExecDestroy(it->second.exec);
      it->second.exec = nullptr;
      ++counters_.update_refusals;
    } else {
      ++counters_.updates;
    }
  }
  if (it->second.exec == nullptr) {
    cudaGraphExec_t exec = nullptr;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      cudaGetLastError();
      cudaGraphDestroy(graph);
      ++counters_.fallbacks;
      VERIFYD_RETURN_IF_ERROR(enqueue(stream));
      return GraphOutcome::kEager;
    }
    it->second.exec = exec;
    ++counters_.captures;
    outcome = GraphOutcome::kInstantiated;
  }
  cudaGraphDestroy(graph);
  it->second.params = params;
  VERIFYD_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream));
  ++counters_.replays;
  return outcome;
}

}  // namespace verifyd
