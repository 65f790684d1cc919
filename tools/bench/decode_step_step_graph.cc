#include "tools/bench/decode_step_step_graph.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"

namespace verifyd::decode_step {

StepGraph::~StepGraph() {
  if (capturing_) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial != nullptr) {
      cudaGraphDestroy(partial);
    }
    cudaGetLastError();  // an invalidated capture's error is not the next call's
  }
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
}

absl::Status StepGraph::Begin(cudaStream_t stream, int layers) {
  if (capturing_ || exec_ != nullptr) return absl::FailedPreconditionError("captured already");
  for (int l = 0; l < layers; ++l) {
    cudaEvent_t e;
    VERIFYD_CUDA_CHECK(cudaEventCreate(&e));
    marks_.push_back(e);
  }
  stream_ = stream;
  VERIFYD_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  return absl::OkStatus();
}

absl::Status StepGraph::MarkLayer(int layer) {
  if (!capturing_ || layer < 0 || layer >= static_cast<int>(marks_.size())) {
    return absl::FailedPreconditionError(absl::StrCat("MarkLayer(", layer, ") outside a capture"));
  }
  // External: without the flag a captured record only orders the capture's streams and leaves
  // no node behind.
  VERIFYD_CUDA_CHECK(cudaEventRecordWithFlags(marks_[layer], stream_, cudaEventRecordExternal));
  return absl::OkStatus();
}

absl::Status StepGraph::End() {
  if (!capturing_) return absl::FailedPreconditionError("End() without Begin()");
  capturing_ = false;
  VERIFYD_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
  VERIFYD_CUDA_CHECK(cudaGraphGetNodes(graph_, nullptr, &num_nodes_));
  std::vector<cudaGraphNode_t> nodes(num_nodes_);
  VERIFYD_CUDA_CHECK(cudaGraphGetNodes(graph_, nodes.data(), &num_nodes_));
  // Which node records which layer's mark: the event each one names.
  layer_nodes_.assign(marks_.size(), nullptr);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    VERIFYD_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeEventRecord) continue;
    cudaEvent_t e;
    VERIFYD_CUDA_CHECK(cudaGraphEventRecordNodeGetEvent(node, &e));
    const auto at = std::find(marks_.begin(), marks_.end(), e);
    if (at != marks_.end()) layer_nodes_[at - marks_.begin()] = node;
  }
  for (size_t l = 0; l < layer_nodes_.size(); ++l) {
    if (layer_nodes_[l] == nullptr) {
      return absl::InternalError(absl::StrCat("the captured graph has no event node of layer ", l,
                                              " (MarkLayer not called for it?)"));
    }
  }
  VERIFYD_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  return absl::OkStatus();
}

absl::Status StepGraph::PointAt(absl::Span<const cudaEvent_t> events) {
  if (exec_ == nullptr || events.size() != layer_nodes_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("PointAt: ", events.size(), " events for ", layer_nodes_.size(),
                     " layer nodes of ", exec_ == nullptr ? "no" : "an instantiated", " graph"));
  }
  for (size_t l = 0; l < events.size(); ++l) {
    VERIFYD_CUDA_CHECK(cudaGraphExecEventRecordNodeSetEvent(exec_, layer_nodes_[l], events[l]));
  }
  return absl::OkStatus();
}

absl::Status StepGraph::Launch(cudaStream_t stream) {
  if (exec_ == nullptr) return absl::FailedPreconditionError("Launch() before End()");
  VERIFYD_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
  return absl::OkStatus();
}

}  // namespace verifyd::decode_step
