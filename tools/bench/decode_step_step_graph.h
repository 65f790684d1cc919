// A decode step captured once into a CUDA graph and replayed every step, timed per layer: the
// captured way of the decode-step bench (decode_step_captured_engine.cc). The step's work is
// captured between Begin and End on the model's stream; MarkLayer puts an event-record node after
// each layer. A graph's event nodes record the same event at every replay, so before each timed
// replay PointAt moves them to that step's events of the bench's LayerClock
// (cudaGraphExecEventRecordNodeSetEvent: it changes later launches only, never a replay already
// queued), and the clock reads per-layer times exactly as it does for the ways that record on the
// stream.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace verifyd::decode_step {

class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  // Ends a capture left open by a failure and frees the graph.
  ~StepGraph();

  // Starts capturing `stream` (thread-local mode: another thread's CUDA calls are not caught).
  absl::Status Begin(cudaStream_t stream, int layers);
  // The end of layer `layer`: an event-record node (an external one, kept in the graph).
  absl::Status MarkLayer(int layer);
  // Ends the capture and instantiates it; finds the layers' event nodes.
  absl::Status End();

  // Layer l's node records events[l] from the next launch on (events.size() == layers).
  absl::Status PointAt(absl::Span<const cudaEvent_t> events);
  absl::Status Launch(cudaStream_t stream);
  size_t num_nodes() const { return num_nodes_; }

 private:
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;
  std::vector<cudaEvent_t> marks_;  // what the nodes record until PointAt
  std::vector<cudaGraphNode_t> layer_nodes_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t num_nodes_ = 0;
};

}  // namespace verifyd::decode_step
