#include "tools/bench/decode_step_captured_engine.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/align.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "tools/bench/decode_step_trees.h"
#include "verify/mla_dims.h"

namespace verifyd::decode_step {
namespace {

// A C ABI call's failure as a Status: its gRPC code (the same numbers as absl's) and message.
absl::Status Vd(int rc, const char* call) {
  if (rc >= 0) return absl::OkStatus();
  const int code = vd_last_error_code();
  return absl::Status(code > 0 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kInternal,
                      absl::StrCat(call, ": ", vd_last_error()));
}
#define VD_CHECK(expr) VERIFYD_RETURN_IF_ERROR(Vd((expr), #expr))

// channel::CaptureError's values (vd_capture_error).
const char* FaultName(uint32_t fault) {
  switch (fault) {
    case 1:
      return "the capture ended or the daemon restarted";
    case 2:
      return "a done flag did not come within the bound: the daemon died or stalled";
  }
  return "unknown";
}

// Every out the spot check's replay must have written: finite, not all zero, and (distinct
// inputs per layer) not a copy of the previous one.
absl::Status CheckOutputs(const std::vector<uint16_t>& outs, size_t per_layer, bool distinct) {
  const size_t layers = outs.size() / per_layer;
  for (size_t l = 0; l < layers; ++l) {
    const uint16_t* o = outs.data() + l * per_layer;
    bool nonzero = false;
    for (size_t k = 0; k < per_layer; ++k) {
      if ((o[k] & 0x7F80) == 0x7F80) {  // exponent all ones: NaN (the poison) or infinity
        return absl::DataLossError(absl::StrCat("checked out ", l, ", element ", k, " = 0x",
                                                absl::Hex(o[k]), ": not written by the replay"));
      }
      nonzero |= (o[k] & 0x7FFF) != 0;
    }
    if (!nonzero) return absl::DataLossError(absl::StrCat("checked out ", l, " is all zero"));
    if (distinct && l > 0 && std::memcmp(o, o - per_layer, per_layer * 2) == 0) {
      return absl::DataLossError(
          absl::StrCat("layer ", l, "'s out equals layer ", l - 1, "'s: a stale copy"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CapturedEngine::Handles::Close() {
  absl::Status status;
  if (channel != nullptr) status.Update(Vd(vd_channel_close(channel), "vd_channel_close"));
  channel = nullptr;
  if (capture != nullptr) vd_capture_free(capture);
  capture = nullptr;
  for (uint64_t r : regions) {
    status.Update(Vd(vd_release_memory(client, r, nullptr), "vd_release_memory"));
  }
  regions.clear();
  if (client != nullptr) vd_disconnect(client);
  client = nullptr;
  return status;
}

CapturedEngine::~CapturedEngine() {
  vd_.Close().IgnoreError();
  if (model_ != nullptr) cudaStreamSynchronize(model_);
  for (cudaEvent_t e : replayed_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  cudaFree(bucket_);
  cudaFree(region_);
  if (check_ != nullptr) cudaStreamDestroy(check_);
  if (model_ != nullptr) cudaStreamDestroy(model_);
}

absl::Status CapturedEngine::Init() {
  const Dims& d = o_.dims;
  if (d.layers < 1 || d.nodes < 1 || d.steps < 1 || d.warmup < 0) {
    return absl::InvalidArgumentError("layers, nodes and steps must be >= 1, warmup >= 0");
  }
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&model_, cudaStreamNonBlocking));
  VERIFYD_CUDA_CHECK(cudaStreamCreateWithFlags(&check_, cudaStreamNonBlocking));
  for (cudaEvent_t& e : replayed_) {
    VERIFYD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  r_ = LayOut(d);
  VERIFYD_ASSIGN_OR_RETURN(region_, MakeModelRegion(d, r_, model_));
  b_.q_bytes = size_t(d.nodes) * d.heads * kKvDim * 2;
  b_.kv_bytes = size_t(d.nodes) * kKvDim * 2;
  b_.out_bytes = size_t(d.nodes) * d.heads * kVDim * 2;
  b_.kv = AlignTo256(b_.q + b_.q_bytes);
  b_.out = AlignTo256(b_.kv + b_.kv_bytes);
  b_.bytes = AlignTo256(b_.out + b_.out_bytes);
  VERIFYD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&bucket_), b_.bytes));
  VERIFYD_CUDA_CHECK(cudaMemset(bucket_, 0, b_.bytes));
  if (!o_.bucket_copies) {  // in place: the bucket holds layer 0's inputs for every layer
    VERIFYD_CUDA_CHECK(
        cudaMemcpy(bucket_ + b_.q, region_ + r_.q[0], b_.q_bytes, cudaMemcpyDeviceToDevice));
    VERIFYD_CUDA_CHECK(
        cudaMemcpy(bucket_ + b_.kv, region_ + r_.kv[0], b_.kv_bytes, cudaMemcpyDeviceToDevice));
  }
  VERIFYD_RETURN_IF_ERROR(Register());
  VERIFYD_RETURN_IF_ERROR(FillSteps());
  VERIFYD_RETURN_IF_ERROR(gemm_.Init(o_.gemm_n, model_));
  VERIFYD_RETURN_IF_ERROR(gemm_.UseWorkspace(size_t{32} << 20));
  // Once outside the capture: cuBLAS picks and loads its kernel here, not while capturing.
  VERIFYD_RETURN_IF_ERROR(gemm_.Run(model_));
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(model_));
  return absl::OkStatus();
}

absl::Status CapturedEngine::Register() {
  const Dims& d = o_.dims;
  VD_CHECK(vd_connect(o_.target.c_str(), "decode-step-captured", "", 30, &vd_.client));
  uint64_t allocation = 0;
  VD_CHECK(vd_register_cuda(vd_.client, reinterpret_cast<uint64_t>(region_), r_.bytes, &region_id_,
                            &allocation));
  vd_.regions.push_back(region_id_);
  if (allocation != reinterpret_cast<uint64_t>(region_)) {
    return absl::InternalError("the model region is not its allocation's start");
  }
  VD_CHECK(vd_register_cuda(vd_.client, reinterpret_cast<uint64_t>(bucket_), b_.bytes, &bucket_id_,
                            &allocation));
  vd_.regions.push_back(bucket_id_);
  if (allocation != reinterpret_cast<uint64_t>(bucket_)) {
    return absl::InternalError("the bucket is not its allocation's start");
  }
  VD_CHECK(vd_channel_open(vd_.client, 8, &vd_.channel));
  vd_capture_desc desc{};
  desc.layer_begin = 0;
  desc.num_layers = static_cast<uint32_t>(d.layers);
  desc.max_batch = 1;
  desc.max_q = static_cast<uint32_t>(d.nodes);
  desc.q = {bucket_id_, b_.q};
  desc.tree_kv = {bucket_id_, b_.kv};
  desc.out = {bucket_id_, b_.out};
  desc.ready = {region_id_, r_.ready};
  desc.done = {region_id_, r_.done};
  desc.ready_pointer = reinterpret_cast<uint64_t>(region_ + r_.ready);
  desc.done_pointer = reinterpret_cast<uint64_t>(region_ + r_.done);
  desc.out_pointer = reinterpret_cast<uint64_t>(bucket_ + b_.out);
  VD_CHECK(vd_capture_prepare(vd_.client, vd_.channel, &desc, &vd_.capture));
  if (vd_capture_num_layers(vd_.capture) != static_cast<uint32_t>(d.layers)) {
    return absl::InternalError(absl::StrCat(
        "PrepareCapture gave ", vd_capture_num_layers(vd_.capture), " layers, not ", d.layers));
  }
  VD_CHECK(vd_capture_enable_device(vd_.capture, o_.done_timeout_s));
  return absl::OkStatus();
}

absl::Status CapturedEngine::FillSteps() {
  // One slot per replay; the last is SpotCheck's.
  const Dims& d = o_.dims;
  const int replays = d.total_steps();
  VERIFYD_RETURN_IF_ERROR(tensors_.Init(d.nodes, replays + 1));
  committed_ = static_cast<uint64_t>(d.prefix);
  std::vector<int32_t> previous;
  for (int s = 0; s <= replays; ++s) {
    std::vector<int32_t> parents = StepTreeParents(s, d.nodes, d.accept);
    std::optional<std::vector<int32_t>> commit;
    if (s > 0) commit = AcceptedPath(previous, d.accept);
    if (commit.has_value()) committed_ += commit->size();
    VERIFYD_RETURN_IF_ERROR(tensors_.Fill(s, o_.sequence, parents, commit));
    previous = std::move(parents);
  }
  step_tensors_ = tensors_.pointers();
  return absl::OkStatus();
}

absl::Status CapturedEngine::Capture() {
  const Dims& d = o_.dims;
  VERIFYD_RETURN_IF_ERROR(graph_.Begin(model_, d.layers));
  VD_CHECK(vd_capture_step_publish(vd_.capture, model_, &step_tensors_));
  for (int l = 0; l < d.layers; ++l) {
    VERIFYD_RETURN_IF_ERROR(gemm_.Run(model_));
    if (o_.bucket_copies) {
      VERIFYD_CUDA_CHECK(cudaMemcpyAsync(bucket_ + b_.q, region_ + r_.q[l], b_.q_bytes,
                                         cudaMemcpyDeviceToDevice, model_));
      VERIFYD_CUDA_CHECK(cudaMemcpyAsync(bucket_ + b_.kv, region_ + r_.kv[l], b_.kv_bytes,
                                         cudaMemcpyDeviceToDevice, model_));
    }
    VD_CHECK(vd_capture_signal_ready(vd_.capture, model_, static_cast<uint32_t>(l)));
    VD_CHECK(vd_capture_wait_done(vd_.capture, model_, static_cast<uint32_t>(l)));
    if (o_.bucket_copies) {
      VERIFYD_CUDA_CHECK(cudaMemcpyAsync(region_ + r_.out[l], bucket_ + b_.out, b_.out_bytes,
                                         cudaMemcpyDeviceToDevice, model_));
    }
    VERIFYD_RETURN_IF_ERROR(graph_.MarkLayer(l));
  }
  return graph_.End();
}

absl::Status CapturedEngine::Launch(int k) {
  VERIFYD_RETURN_IF_ERROR(tensors_.Upload(k, model_));
  VERIFYD_RETURN_IF_ERROR(graph_.Launch(model_));
  VERIFYD_CUDA_CHECK(cudaEventRecord(replayed_[k % 2], model_));
  return absl::OkStatus();
}

absl::Status CapturedEngine::CheckReplay(int k) {
  VERIFYD_CUDA_CHECK(cudaStreamWaitEvent(check_, replayed_[k % 2], 0));
  uint32_t fault = 0;
  VD_CHECK(vd_capture_error(vd_.capture, check_, &fault));
  if (fault != 0) {
    return absl::InternalError(absl::StrCat("replay ", k, ": the capture's fault word is ", fault,
                                            " (", FaultName(fault), "); its outputs are NaN"));
  }
  const absl::Status step =
      Vd(vd_capture_wait_step(vd_.capture, uint64_t(k) + 1, 30.0), "vd_capture_wait_step");
  if (!step.ok()) {
    return absl::Status(step.code(),
                        absl::StrCat("replay ", k, " (step ", k + 1, ") failed: ", step.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Timing> CapturedEngine::Replay() {
  const Dims& d = o_.dims;
  LayerClock clock;
  VERIFYD_RETURN_IF_ERROR(clock.Init(d));
  std::vector<cudaEvent_t> step_events(d.layers);
  // Replay k is checked after replay k + 1 is queued: the GPU always has the next step.
  for (int s = 0; s < d.total_steps(); ++s) {
    if (s == d.warmup) VERIFYD_RETURN_IF_ERROR(clock.Mark(0, model_));
    if (s >= d.warmup) {
      const size_t first = static_cast<size_t>(s - d.warmup) * d.layers + 1;
      for (int l = 0; l < d.layers; ++l) step_events[l] = clock.event(first + l);
      VERIFYD_RETURN_IF_ERROR(graph_.PointAt(step_events));
    }
    VERIFYD_RETURN_IF_ERROR(Launch(s));
    if (s > 0) VERIFYD_RETURN_IF_ERROR(CheckReplay(s - 1));
  }
  VERIFYD_RETURN_IF_ERROR(CheckReplay(d.total_steps() - 1));
  return clock.Read(d);
}

absl::Status CapturedEngine::SpotCheck() {
  const Dims& d = o_.dims;
  const bool copies = o_.bucket_copies;
  const size_t per_layer = b_.out_bytes / 2;
  std::vector<uint16_t> outs(per_layer * (copies ? d.layers : 1));
  // 0xFF bytes: bf16 NaN, what the replay must overwrite.
  VERIFYD_CUDA_CHECK(cudaMemsetAsync(bucket_ + b_.out, 0xFF, b_.out_bytes, model_));
  for (int l = 0; copies && l < d.layers; ++l) {
    VERIFYD_CUDA_CHECK(cudaMemsetAsync(region_ + r_.out[l], 0xFF, b_.out_bytes, model_));
  }
  VERIFYD_RETURN_IF_ERROR(Launch(d.total_steps()));
  VERIFYD_RETURN_IF_ERROR(CheckReplay(d.total_steps()));
  for (int l = 0; l < (copies ? d.layers : 1); ++l) {
    const uint8_t* from = copies ? region_ + r_.out[l] : bucket_ + b_.out;
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(outs.data() + l * per_layer, from, b_.out_bytes,
                                       cudaMemcpyDeviceToHost, model_));
  }
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(model_));
  return CheckOutputs(outs, per_layer, copies);
}

absl::Status CapturedEngine::Close() {
  VERIFYD_CUDA_CHECK(cudaStreamSynchronize(model_));
  return vd_.Close();
}

std::string CapturedEngine::Describe() const {
  return absl::StrFormat(
      "one graph of %d nodes (%d layers, bucket 1 x %d nodes, bucket copies %s), capture epoch "
      "%d",
      graph_.num_nodes(), o_.dims.layers, o_.dims.nodes, o_.bucket_copies ? "on" : "off",
      vd_.capture != nullptr ? vd_capture_epoch(vd_.capture) : 0);
}

}  // namespace verifyd::decode_step
