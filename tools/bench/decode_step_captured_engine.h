// The engine of the decode-step bench's captured way (decode_step_captured.h; its process:
// decode_step_captured_engine_main.cc): an engine that captures its whole decode step in ONE CUDA
// graph and replays it every step (SPEC §3.1 "Inside the engine's CUDA graph", plans/0033),
// through the data-plane library's C ABI as Python's CapturedVerify does.
//
// Init registers its device memory (the model's per-layer tensors and flags, as every way's, and
// the bucket), opens a channel and prepares a capture for a bucket of one sequence of Q nodes over
// every layer. Capture records one step on the model stream:
//   StepPublish (the step's record: the tree, and the previous tree's accepted path: the commit
//   rides on the next step)
//   per layer: the GEMM stand-in; with bucket copies, the layer's q and tree KV copied into the
//   bucket (what CapturedVerify does when the engine's tensors are not the bucket's);
//   SignalReady; WaitDone; with bucket copies, out copied from the bucket to the layer's own;
//   the layer's clock event (decode_step_step_graph.h)
// Replay runs it warmup + steps times, the tree changing every step (decode_step_trees.h), the
// prefix growing by each commit; after every replay it checks the fault word and the daemon's
// word on the step, one replay behind so that the GPU never waits for this CPU, and fails on
// either. SpotCheck replays once more with the outputs poisoned: every checked out must come back
// written (finite, not all zero; with bucket copies, no layer's equal to the previous one's).
//
// It uses the C ABI and nothing of the client library: libverifyd_dataplane.so carries its own
// copy of the generated protobuf messages, and a process holding both aborts at start (protobuf:
// "File already exists in database: verifyd/v1/verifyd.proto").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/c_api/verifyd_dataplane.h"
#include "tools/bench/decode_step_model.h"
#include "tools/bench/decode_step_step_graph.h"
#include "tools/bench/decode_step_step_tensors.h"

namespace verifyd::decode_step {

struct EngineOptions {
  Dims dims{};
  std::string target;          // the daemon the bench started
  uint64_t sequence = 1;       // the sequence the bench prefilled (d.prefix tokens)
  int gemm_n = 1024;           // the model GEMM: 4096 x gemm_n x 4096 bf16
  bool bucket_copies = true;   // false: the graph verifies the bucket in place
  double done_timeout_s = 10;  // WaitDone's bound before it declares the daemon dead
};

class CapturedEngine {
 public:
  explicit CapturedEngine(EngineOptions options) : o_(std::move(options)) {}
  CapturedEngine(const CapturedEngine&) = delete;
  CapturedEngine& operator=(const CapturedEngine&) = delete;
  // After a failure: closes the channel first (the daemon ends the capture, so a graph still
  // replaying stops waiting at once), then waits for the stream and frees everything.
  ~CapturedEngine();

  absl::Status Init();
  absl::Status Capture();
  absl::StatusOr<Timing> Replay();
  absl::Status SpotCheck();
  // Closes the channel, frees the capture, releases the regions, disconnects.
  absl::Status Close();

  // What the daemon must hold for the sequence once SpotCheck's replay carried the last timed
  // step's commit: the prefix plus every accepted path.
  uint64_t expected_committed() const { return committed_; }
  // One line for the log: the graph, the bucket, the capture's epoch.
  std::string Describe() const;

 private:
  // The C ABI's handles, released in the order its header asks (the channel before its client).
  struct Handles {
    vd_client* client = nullptr;
    vd_channel* channel = nullptr;
    vd_capture* capture = nullptr;
    std::vector<uint64_t> regions;
    absl::Status Close();
  };
  // The bucket's q, tree KV and out (one sequence of Q nodes) in one registered allocation.
  struct Bucket {
    size_t q = 0, kv = 0, out = 0, bytes = 0;
    size_t q_bytes = 0, kv_bytes = 0, out_bytes = 0;
  };

  absl::Status Register();
  absl::Status FillSteps();
  // Replay `k` (step k + 1 of the capture: StepPublish counts from 0): its step tensors, the
  // graph, an event after it.
  absl::Status Launch(int k);
  // Waits for replay k on the check stream, then reads the fault word and the daemon's word.
  absl::Status CheckReplay(int k);

  EngineOptions o_;
  Region r_;
  Bucket b_;
  cudaStream_t model_ = nullptr;
  // Where the CPU waits for one replay's end (the fault word's read) without waiting for the
  // replay queued behind it on the model stream.
  cudaStream_t check_ = nullptr;
  uint8_t* region_ = nullptr;
  uint8_t* bucket_ = nullptr;
  Handles vd_;
  uint64_t region_id_ = 0, bucket_id_ = 0;
  StepTensors tensors_;
  vd_step_tensors step_tensors_{};
  uint64_t committed_ = 0;
  Gemm gemm_;
  StepGraph graph_;
  cudaEvent_t replayed_[2] = {nullptr, nullptr};
};

}  // namespace verifyd::decode_step
