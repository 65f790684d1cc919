// verifyd::Channel: the co-located data plane's per-thread channel (SPEC §3.1,
// plans/0017-data-plane.md). A scheduler on the daemon's host registers its buffers once
// (Client::RegisterExternalMemory: a cudaIpcMemHandle_t's bytes, or on the cpu backend a sealed
// memfd's handle, client/host_memory.h), opens a channel (Client::OpenChannel), and then enqueues
// Verify and Commit descriptors into a ring in shared memory: no gRPC round trip per call. Tensors
// are named by registered region + byte offset; the daemon waits for the `ready` flag (a uint32 in
// a registered region reaching `value`) before it reads q and tree_kv, and writes `done` after the
// last write of out and lse. Every descriptor completes: on failure the outputs are NaN, `done`
// is still written, and the completion record carries the gRPC code and message (the same as the
// gRPC Verify's for the same mistake). On the cuda backend a Verify's record is written once the
// device has run it: q and tree_kv are checked there (SPEC §1, values beyond 2^16 or not finite:
// INVALID_ARGUMENT naming the element, outputs NaN, and the tree's commit is refused until that
// layer is verified again), so a record is the call's final word.
// The client library holds a lock on the channel's ring for as long as the channel lives: when the
// scheduler's process ends, the daemon closes the channel within a fraction of a second and
// releases what it left waiting, without waiting for its lease.
//
//   auto client = *verifyd::Client::Connect("unix:///tmp/verifyd-0.sock");
//   // cudaIpcGetMemHandle(&h, buffer) on the cuda backend; HostMemory::handle() on the cpu backend
//   uint64_t region = client->RegisterExternalMemory(handle_bytes, buffer_bytes)->region();
//   std::unique_ptr<verifyd::Channel> channel = *client->OpenChannel();
//   verifyd::Channel::VerifyDescriptor d;
//   d.id = 1;
//   d.layer = 0;
//   d.sequences.push_back({/*sequence_id=*/7, /*parents=*/{-1, 0, 0}, std::nullopt});
//   d.q = {region, q_offset};  d.tree_kv = {region, kv_offset};  d.out = {region, out_offset};
//   d.ready = {region, flags_offset, step};  d.done = {region, flags_offset + 4, step};
//   absl::Status queued = channel->EnqueueVerify(d);  // RESOURCE_EXHAUSTED: ring full, poll first
//   ... the scheduler's stream writes q, tree_kv, then `ready`; waits for `done` ...
//   for (const auto& c : channel->PollCompletions()) { if (!c.status.ok()) ... }
//   channel->Close();
//
// One Channel per thread: its methods are not thread-safe. It must not outlive its Client.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace verifyd {

class Client;

class Channel {
 public:
  // A byte offset in a registered region (a multiple of 64); region 0: not given.
  struct TensorRef {
    uint64_t region = 0;
    uint64_t offset = 0;
  };
  // A uint32 in a registered region (offset a multiple of 4); region 0: no flag.
  struct Flag {
    uint64_t region = 0;
    uint64_t offset = 0;
    uint32_t value = 0;
  };
  struct Sequence {
    uint64_t sequence_id = 0;
    std::vector<int32_t> parents;  // [Q]: -1 for a root, else an index < i
    // The accepted path of this sequence's previous tree, committed before this Verify.
    std::optional<std::vector<int32_t>> commit_previous;
  };
  // q bf16 [sum Q, H, 576], tree_kv bf16 [sum Q, 576], out bf16 [sum Q, H, 512], lse fp32
  // [sum Q, H] (with return_lse only), as for the gRPC Verify.
  struct VerifyDescriptor {
    uint64_t id = 0;  // echoed in the completion
    uint32_t layer = 0;
    std::vector<Sequence> sequences;
    TensorRef q, tree_kv, out, lse;
    bool return_lse = false;
    std::optional<float> softmax_scale;
    Flag ready, done;
  };
  // No tensors and no flags: the completion record is the answer.
  struct CommitDescriptor {
    uint64_t id = 0;
    uint64_t sequence_id = 0;
    std::vector<int32_t> accepted_path;  // empty rejects the whole tree
  };
  struct Completion {
    uint64_t id = 0;
    absl::Status status;
    uint64_t committed_length = 0;  // Commit only
  };

  ~Channel();  // Close()
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Publishes a descriptor and wakes the daemon when it sleeps. Back-pressure:
  // RESOURCE_EXHAUSTED when entries() descriptors are in flight (completions not read yet): read
  // completions, then retry. FAILED_PRECONDITION after Close or once the daemon closed the channel
  // (lease, shutdown); INVALID_ARGUMENT when the descriptor does not fit a ring slot. Nothing is
  // published on an error.
  absl::Status EnqueueVerify(const VerifyDescriptor& descriptor);
  absl::Status EnqueueCommit(const CommitDescriptor& descriptor);
  // The completions written so far, in enqueue order (never blocks).
  std::vector<Completion> PollCompletions();
  // The next completion; DEADLINE_EXCEEDED when none came within `timeout` (polls for 20 µs, then
  // sleeps on the ring's futex until the daemon writes a record: no busy core during a long call).
  // FAILED_PRECONDITION when nothing is in flight.
  absl::StatusOr<Completion> WaitCompletion(absl::Duration timeout);
  // Tells the daemon the channel is still used when the thread has nothing to enqueue or read for
  // longer than the daemon's lease.
  void Heartbeat();
  // CloseChannel; descriptors still in flight complete with ABORTED. Idempotent.
  absl::Status Close();

  uint64_t id() const;
  uint32_t entries() const;
  uint64_t in_flight() const;

 private:
  friend class Client;
  struct State;
  explicit Channel(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace verifyd
