// StepCapture: one captured bucket of a channel (plans/0033, SPEC §3.1 "Inside the engine's CUDA
// graph"). PrepareCapture checks the bucket and the memory it names before anything is captured,
// and creates the step area (channel/step_area.h) the engine's graph publishes each step's record
// into. The channel's thread then calls Take as it polls its ring: a new step becomes the work of
// every captured layer, in order (each a ChannelWork, built by the same PrepareVerify as a ring
// descriptor, with the step's ready / done values), and each layer's outcome comes back through
// LayerDone, which writes the step's status into the area once all of them are in. Thread-safe:
// Take runs on the channel's thread, LayerDone on the executor's or the channel's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "channel/descriptor.h"
#include "channel/step_area_file.h"
#include "executor/channel_work.h"
#include "executor/external_regions.h"
#include "executor/verify_validation.h"

namespace verifyd {

// What PrepareCapture asks for: the bucket (at most max_batch sequences of at most max_q nodes,
// over the layers [layer_begin, layer_begin + num_layers)) and where every step's tensors and
// flags are, fixed for the capture's life (the graph replays the same addresses).
struct CaptureSpec {
  uint32_t layer_begin = 0;
  uint32_t num_layers = 0;  // 0: every layer from layer_begin on
  uint32_t max_batch = 0;
  uint32_t max_q = 0;
  // q bf16 [rows, H, 576], tree_kv bf16 [rows, 576], out bf16 [rows, H, 512], lse fp32 [rows, H]
  // (return_lse only), rows = max_batch x max_q; a step uses the first sum-of-q_len rows.
  channel::TensorRef q, tree_kv, out, lse;
  // uint32 words; their values are each step's (channel::ReadyValue), not the refs'.
  channel::FlagRef ready, done;
  bool return_lse = false;
  std::optional<float> softmax_scale;
};

struct CaptureInfo {
  uint64_t epoch = 0;
  std::string path;  // the step area's POSIX shared-memory name
  uint64_t bytes = 0;
  uint32_t layer_begin = 0;
  uint32_t num_layers = 0;
};

class StepCapture {
 public:
  // Checks the bucket (INVALID_ARGUMENT naming the field and its bound: max_q against
  // --max-tree-nodes, max_batch against channel::kMaxCaptureBatch, the layers against --layers,
  // softmax_scale as Verify's) and every ref in `owner`'s regions at the bucket's largest size
  // (NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT as a descriptor's), then creates the area
  // under `area_name` with a fresh epoch. Nothing is left behind on an error.
  static absl::StatusOr<std::shared_ptr<StepCapture>> Create(CaptureSpec spec,
                                                             const ValidationLimits& limits,
                                                             ExternalRegionTable* regions,
                                                             const std::string& owner,
                                                             const std::string& area_name);
  ~StepCapture();  // End()

  struct Step {
    uint64_t seq = 0;
    // One per captured layer, in order. A record the daemon refuses (num_seqs, q_len or
    // commit_len out of the bucket) refuses every layer, which then NaN-fills the bucket's
    // whole out (and lse) and writes its done flag.
    std::vector<std::shared_ptr<ChannelWork>> layers;
  };
  // The step the engine published since the last Take, if any: its record copied, its layers'
  // work built (refs resolved again, so a region released since fails the step, naming it).
  // Channel thread only.
  std::optional<Step> Take();
  // Layer i of step `seq` completed with `status`. When every layer of the step has, the area
  // gets the step's status (the first failure's code and message) and completed_step = seq.
  void LayerDone(uint64_t seq, uint32_t i, const absl::Status& status);
  // Whether a layer of step `seq` has failed already (the executor refuses its later layers).
  bool StepFailed(uint64_t seq);
  // The capture is over (the channel closed): epoch 0 tells a graph still replaying, whose waits
  // then give up and NaN-fill (the engine raises); the area's name is unlinked. Idempotent.
  void End();

  // The engine's step_seq (the channel's lease counts it as activity).
  uint64_t published() const;
  const CaptureInfo& info() const { return info_; }
  const channel::StepAreaMapping& area() const { return area_; }

 private:
  StepCapture(CaptureSpec spec, const ValidationLimits& limits, ExternalRegionTable* regions,
              std::string owner, channel::StepAreaMapping area, CaptureInfo info);
  // The record's form against the bucket; OK or INVALID_ARGUMENT naming the entry's field.
  absl::Status CopyRecord(std::vector<channel::SequenceEntry>* sequences) const;
  std::shared_ptr<ChannelWork> LayerWork(uint64_t seq, uint32_t i,
                                         const std::vector<channel::SequenceEntry>& sequences,
                                         const absl::Status& record) const;

  const CaptureSpec spec_;
  const ValidationLimits limits_;
  ExternalRegionTable* regions_;
  const std::string owner_;
  channel::StepAreaMapping area_;
  const CaptureInfo info_;
  uint64_t taken_ = 0;  // channel thread only

  struct Progress {
    uint64_t seq = 0;
    uint32_t remaining = 0;
    absl::Status first;  // the first failure
  };
  std::mutex mu_;
  std::vector<Progress> progress_;  // steps taken whose layers are not all in; guarded by mu_
  bool ended_ = false;              // guarded by mu_
};

}  // namespace verifyd
