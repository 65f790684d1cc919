// verifyd::CapturedStep: the engine's side of a decode step captured in a CUDA graph (SPEC §3.1
// "Inside the engine's CUDA graph", plans/0033; the protocol is channel/step_area.h).
//
// Before capturing, the engine prepares the bucket on one of its channels (PrepareCapture: the
// daemon refuses a bucket or memory it cannot serve here, not at replay) and maps the step area.
// Then per replay its graph runs, as kernels of the data-plane library (client/c_api, CUDA):
// StepPublish (the step's record from the engine's own tensors into the area), and per layer
// SignalReady (ready = the step's value, after checking the area's epoch) and WaitDone (until
// done reaches it). The host versions below do exactly the same on host memory: the cpu
// backend's stand-in for device memory, which is how CI and the Python adapter's tests run the
// protocol without a GPU.
//
// Faults never leave a replay with stale outputs: a changed epoch (the channel closed, the daemon
// restarted) or a done flag that does not come within the bound (the daemon died) NaN-fills the
// layer's outputs and sets the error word, which stays set (later layers skip their waits); the
// engine checks it after the replay (error()) and prepares again.
//
// Not thread-safe; one per captured bucket. It must not outlive its Client.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "channel/step_area_file.h"
#include "client/channel.h"
#include "client/client.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd {

class CapturedStep {
 public:
  // Where this process sees the bucket's flags and outputs (host pointers for the host versions,
  // device pointers for the kernels): what SignalReady writes, WaitDone reads, and a fault
  // NaN-fills (out bf16 [rows, H, 512], lse fp32 [rows, H] or null).
  struct Targets {
    uint32_t* ready = nullptr;
    const uint32_t* done = nullptr;
    uint16_t* out = nullptr;
    uint64_t out_elements = 0;
    float* lse = nullptr;
    uint64_t lse_elements = 0;
  };

  // PrepareCapture for `channel` (request.channel is set here) and maps the step area.
  static absl::StatusOr<std::unique_ptr<CapturedStep>> Prepare(Client& client,
                                                               const Channel& channel,
                                                               v1::PrepareCaptureRequest request,
                                                               Targets targets,
                                                               const CallOptions& call = {});

  // The host versions of the graph's kernels. PublishHost writes the record as given (lengths
  // beyond the bucket are written as they are, for the daemon to refuse: the kernel cannot refuse
  // either; only what fits is copied) and returns the new step.
  uint64_t PublishHost(const std::vector<Channel::Sequence>& sequences);
  // Layer i (of the captured layers) of the last published step.
  void SignalReadyHost(uint32_t i);
  void WaitDoneHost(uint32_t i, absl::Duration bound);

  // channel::CaptureError: kCaptureOk until a fault (sticky).
  uint32_t error() const { return error_; }
  // The daemon's word on step `step`: waits up to `timeout` for completed_step to reach it, then
  // OK, or the step's failure (its code, the daemon's message). DEADLINE_EXCEEDED when it did not
  // complete in time; FAILED_PRECONDITION once the capture ended (epoch changed).
  absl::Status WaitStep(uint64_t step, absl::Duration timeout) const;

  uint64_t epoch() const { return epoch_; }
  uint64_t step() const { return step_; }  // the last step published (host versions)
  const v1::PrepareCaptureResponse& info() const { return info_; }
  const channel::StepAreaMapping& area() const { return area_; }
  const Targets& targets() const { return targets_; }
  uint32_t max_batch() const { return area_.header().max_batch; }
  uint32_t max_q() const { return area_.header().max_q; }
  uint32_t num_layers() const { return info_.num_layers(); }

 private:
  CapturedStep(v1::PrepareCaptureResponse info, channel::StepAreaMapping area, Targets targets)
      : info_(std::move(info)), area_(std::move(area)), targets_(targets), epoch_(info_.epoch()) {}
  void Poison();

  v1::PrepareCaptureResponse info_;
  channel::StepAreaMapping area_;
  Targets targets_;
  uint64_t epoch_ = 0;  // what the graph captured
  uint64_t step_ = 0;   // the engine's step counter (the device state's, on the host)
  uint32_t error_ = channel::kCaptureOk;
};

}  // namespace verifyd
