// ChannelTable: a device's open channels (OpenChannel / CloseChannel, plans/0017). Each belongs
// to the client that opened it. A sweeper thread closes channels whose own thread stopped (lease
// passed, corrupt ring) and expires idle external regions; it never runs on the executor, because
// closing a channel queues its last failures there. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/descriptor_budget.h"
#include "executor/channel_server.h"
#include "executor/executor_events.h"

namespace verifyd {

struct ChannelTableOptions {
  ValidationLimits limits;
  absl::Duration lease = absl::Seconds(300);
  absl::Duration spin = absl::Microseconds(50);
  // Daemon-wide, whoever asks (a client names itself, so a per-client bound bounds nothing;
  // issue 33 N6): open channels (a thread and a descriptor each) and the /dev/shm their rings and
  // captured buckets' step areas take.
  int max_channels = 64;
  uint64_t max_ring_bytes = uint64_t{256} << 20;
  // The process's descriptors (each channel holds one): refused while opening one would eat into
  // the reserve kept for new connections. Null: not checked.
  DescriptorBudget* descriptors = nullptr;
  // Ring names are "/<name_prefix><32 random hex digits>", step areas' "/<name_prefix>step-<...>".
  std::string name_prefix = "verifyd-channel-";
  std::function<void(bool ok)> on_completion;  // ChannelOptions::on_completion of every channel
  absl::Duration capture_poll = absl::Microseconds(20);         // ChannelOptions::capture_poll
  std::function<void(const ExternalFlag& ready)> release_wait;  // ChannelOptions::release_wait
  ExecutorEvents* events = nullptr;                 // opens and closes (null: none told)
  decltype(ChannelOptions::wait_ready) wait_ready;  // ChannelOptions::wait_ready
};

struct ChannelInfo {
  uint64_t id = 0;
  std::string path;  // what the client shm_opens
  uint32_t entries = 0;
  uint64_t bytes = 0;
};

class ChannelTable {
 public:
  ChannelTable(ChannelTableOptions options, Device* device, ExternalRegionTable* regions);
  ~ChannelTable();  // CloseAll(kUnavailable)

  // INVALID_ARGUMENT for entries that are not a power of two in [2, 4096]; RESOURCE_EXHAUSTED
  // past max_channels, max_ring_bytes or the descriptor budget (or when the system refuses the
  // ring's pages or descriptors), naming the bound.
  absl::StatusOr<ChannelInfo> Open(const std::string& owner, uint32_t entries);
  // NOT_FOUND when unknown (closed already, expired), PERMISSION_DENIED when another client's.
  absl::Status Close(const std::string& owner, uint64_t id);
  // PrepareCapture (plans/0033): a captured bucket served by channel `id` of `owner`, its step
  // area made. NOT_FOUND / PERMISSION_DENIED as Close; StepCapture::Create's refusals (the
  // bucket, the memory it names); RESOURCE_EXHAUSTED when the area would take the rings and
  // areas past max_ring_bytes; FAILED_PRECONDITION when the channel serves one already. Nothing
  // is held on an error.
  absl::StatusOr<CaptureInfo> PrepareCapture(const std::string& owner, uint64_t id,
                                             const CaptureSpec& spec);
  // Shutdown: closes every channel (their published descriptors complete ABORTED) and stops the
  // sweeper. Call before the executor drains.
  void CloseAll(absl::StatusCode reason);
  // Closes channels whose lease passed or whose ring was corrupt; returns how many. The sweeper
  // calls it (and only it: ChannelServer::ExpireIfIdle is single-threaded).
  int ReapFinished();
  int channels() const;

 private:
  // Tells the events that `server` was closed, and why.
  void Closed(const ChannelServer& server, const char* why);
  void Sweep();
  // Gives back what a closed (or never opened) channel of `entries` held, and its step area's
  // `area_bytes`.
  void Unhold(uint32_t entries, uint64_t area_bytes = 0);

  const ChannelTableOptions options_;
  Device* device_;
  ExternalRegionTable* regions_;
  mutable std::mutex mu_;
  using Channels = absl::flat_hash_map<uint64_t, std::unique_ptr<ChannelServer>>;
  // Channel `id` of `owner`, under mu_: NOT_FOUND when unknown, PERMISSION_DENIED when another's.
  absl::StatusOr<Channels::iterator> FindOwned(const std::string& owner, uint64_t id);
  Channels channels_;
  // Channels and ring bytes open or being opened (reserved under the lock before the slow part).
  int held_channels_ = 0;
  uint64_t held_ring_bytes_ = 0;
  bool closing_ = false;
  std::condition_variable sweeper_cv_;
  std::thread sweeper_;
};

}  // namespace verifyd
