// ChannelServer: the daemon's end of one channel (plans/0017-data-plane.md). It creates the ring
// file, and a thread of its own takes descriptors from it: polls while traffic flows, sleeps on
// the ring's futex when idle (no busy core). Each descriptor is decoded from a private copy,
// validated by the rules the gRPC path uses (executor/verify_validation.h), its tensors and flags
// resolved in the client's registered regions, and then run on the device's executor in
// descriptor order (Device::Submit), which writes the completion record. Every descriptor
// completes: a refused one fails through the executor too (NaN outputs, done flag), so done flags
// are written in descriptor order even when a scheduler uses one counter for all of them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "channel/descriptor.h"
#include "channel/ring_ends.h"
#include "channel/ring_file.h"
#include "executor/channel_work.h"
#include "executor/device.h"
#include "executor/external_regions.h"
#include "executor/step_capture.h"
#include "executor/verify_validation.h"

namespace verifyd {

struct ChannelOptions {
  std::string owner;  // the client that opened it; descriptors may name only its regions
  uint32_t entries = 64;
  ValidationLimits limits;
  // Closed when the client neither enqueued, read completions nor sent a heartbeat this long.
  absl::Duration lease = absl::Seconds(300);
  // Polling after the last descriptor before sleeping on the futex.
  absl::Duration spin = absl::Microseconds(50);
  // The longest futex sleep: how soon an idle channel notices close.
  absl::Duration sleep_slice = absl::Milliseconds(100);
  // The longest sleep while a captured bucket is attached: the engine's graph publishes a step
  // with a store into host memory, which rings no futex, so the thread polls its step area.
  absl::Duration capture_poll = absl::Microseconds(20);
  // Called on the executor for every completed descriptor (metrics); may be empty.
  std::function<void(bool ok)> on_completion;
  // At close: releases a backend's device-side wait for a ready flag of a call already handed to
  // it (ComputeBackend::ReleaseExternalWait; a no-op on cpu). May be empty.
  std::function<void(const ExternalFlag& ready)> release_wait;
  // A backend whose ready wait blocks a host thread (ComputeBackend::waits_for_ready_on_host):
  // the channel's own thread waits for each call's ready flag before it hands the call to the
  // executor, so a flag that never comes holds this channel only, not every client's calls
  // (issue 33 N7). OK once up; DEADLINE_EXCEEDED / ABORTED (*cancelled) as the backend's wait
  // answers. Empty: the backend waits in its own order (cuda: on the device stream).
  std::function<absl::Status(const ExternalFlag& ready, const std::atomic<bool>* cancelled)>
      wait_ready;
};

struct ChannelCounters {
  std::atomic<int64_t> verifies{0};
  std::atomic<int64_t> commits{0};
  std::atomic<int64_t> failed{0};  // completions whose code was not OK
};

class ChannelServer {
 public:
  // Creates the ring under `name` (a POSIX shared-memory name) and starts the thread. `device`
  // and `regions` must outlive the channel.
  static absl::StatusOr<std::unique_ptr<ChannelServer>> Open(uint64_t id, std::string name,
                                                             ChannelOptions options, Device* device,
                                                             ExternalRegionTable* regions);
  ~ChannelServer();  // Close(kCancelled)

  // Marks the ring closed (the client's next enqueue fails), stops the thread, fails every
  // published descriptor not yet taken with ABORTED (NaN outputs and done flag, without waiting
  // for its ready flag: nobody may be left waiting), cancels the ready waits of the calls already
  // queued, and unlinks the name. Idempotent.
  void Close(absl::StatusCode reason);

  // The lease: true (and the ring closed, waits cancelled) when the client neither enqueued, read
  // completions nor sent a heartbeat for options.lease, or at once when the client's process has
  // ended (it held a lock on the ring: channel::RingMapping::ClientGone). One thread only (the
  // table's sweeper).
  bool ExpireIfIdle(std::chrono::steady_clock::time_point now);
  // The lease passed or the ring was corrupt (the thread stopped). The table reaps it.
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  const std::string& owner() const { return options_.owner; }
  uint32_t entries() const { return options_.entries; }
  const ChannelCounters& counters() const { return *counters_; }

  // A captured bucket (plans/0033) for this channel to serve: its thread polls the step area and
  // runs each step's layers as it runs descriptors. One per channel: FAILED_PRECONDITION for a
  // second (an engine opens a channel per captured bucket) or once the channel is closed.
  absl::Status AttachCapture(std::shared_ptr<StepCapture> capture);
  // The attached capture's step area bytes (0: none), counted against the table's byte bound.
  uint64_t capture_bytes() const;

 private:
  struct Shared;  // the mapping and what the executor's tasks need after the thread stopped
  ChannelServer(uint64_t id, std::string name, ChannelOptions options, Device* device,
                ExternalRegionTable* regions, channel::RingMapping mapping);
  void Loop();
  // One taken descriptor, from the private copy: validates and queues its work.
  void Handle(const uint8_t* copy, uint64_t number, bool closing);
  // The attached capture, if any (any thread).
  std::shared_ptr<StepCapture> capture() const;
  // Takes a step the engine published, if any, and queues its layers; true when it did.
  bool PollCapture();
  // Hands `task` to the executor, holding this channel while the queue is full (back-pressure);
  // a refusal it cannot queue (draining, closing) goes to `refused`.
  void Submit(std::function<void(DeviceOperations&)> task, bool closing,
              const std::function<void(const absl::Status&)>& refused);

  const uint64_t id_;
  const std::string name_;
  const ChannelOptions options_;
  Device* device_;
  ExternalRegionTable* regions_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<ChannelCounters> counters_;
  channel::RingConsumer consumer_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  bool closed_ = false;  // Close ran (caller's thread only)
  // ExpireIfIdle's (the sweeper's) view of the client's activity.
  uint64_t seen_activity_ = 0;
  std::chrono::steady_clock::time_point last_activity_{};
  mutable std::mutex capture_mu_;
  std::shared_ptr<StepCapture> capture_;  // guarded by capture_mu_
  bool capture_closed_ = false;           // guarded by capture_mu_: Close began
  std::atomic<bool> has_capture_{false};
  std::thread thread_;
};

}  // namespace verifyd
