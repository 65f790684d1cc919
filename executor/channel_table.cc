#include "executor/channel_table.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/random.h"
#include "base/status_macros.h"

namespace verifyd {
ChannelTable::ChannelTable(ChannelTableOptions options, Device* device,
                           ExternalRegionTable* regions)
    : options_(std::move(options)), device_(device), regions_(regions) {
  sweeper_ = std::thread([this] { Sweep(); });
}

ChannelTable::~ChannelTable() { CloseAll(absl::StatusCode::kUnavailable); }

absl::StatusOr<ChannelInfo> ChannelTable::Open(const std::string& owner, uint32_t entries) {
  if (!channel::ValidEntries(entries)) {
    return absl::InvalidArgumentError(
        absl::StrCat("entries = ", entries, " must be a power of two in [", channel::kMinEntries,
                     ", ", channel::kMaxEntries, "]"));
  }
  uint64_t id = 0;
  const uint64_t bytes = channel::RingFileBytes(entries);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return absl::UnavailableError("verifyd is shutting down");
    if (held_channels_ >= options_.max_channels) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the daemon has ", held_channels_, " open channels, the most allowed (--max-channels = ",
          options_.max_channels, "); close one first"));
    }
    if (held_ring_bytes_ + bytes > options_.max_ring_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "entries = ", entries, " takes a ring of ", bytes,
          " bytes; the open channels' rings hold ", held_ring_bytes_, " of --max-channel-bytes = ",
          options_.max_ring_bytes, "; close a channel or ask for fewer entries"));
    }
    // The ring's file takes a descriptor for a moment and its lock one for the channel's life.
    if (options_.descriptors != nullptr && !options_.descriptors->HasRoom(2)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the daemon has about ", options_.descriptors->counted(), " of its ",
                       options_.descriptors->limit(), " descriptors open and keeps ",
                       options_.descriptors->reserve(),
                       " free for new connections; close channels or raise its descriptor limit"));
    }
    ++held_channels_;
    held_ring_bytes_ += bytes;
    id = RandomNonzeroId();
    while (channels_.contains(id)) id = RandomNonzeroId();
  }
  ChannelOptions channel;
  channel.owner = owner;
  channel.entries = entries;
  channel.limits = options_.limits;
  channel.lease = options_.lease;
  channel.spin = options_.spin;
  channel.on_completion = options_.on_completion;
  channel.release_wait = options_.release_wait;
  channel.wait_ready = options_.wait_ready;
  channel.capture_poll = options_.capture_poll;
  channel.sleep_slice = std::min(absl::Milliseconds(100), options_.lease / 4);
  // 128 random bits: the ring's name cannot be guessed by another local user (mode 0600 already
  // keeps them out) nor reopened by a stale client after the daemon reused an id.
  const std::string name = absl::StrCat("/", options_.name_prefix, RandomHex());
  absl::StatusOr<std::unique_ptr<ChannelServer>> server =
      ChannelServer::Open(id, name, std::move(channel), device_, regions_);
  if (!server.ok()) {
    Unhold(entries);
    return server.status();
  }
  if (options_.descriptors != nullptr) options_.descriptors->Opened(1);
  ChannelInfo info{id, name, entries, bytes};
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) {
    --held_channels_;
    held_ring_bytes_ -= bytes;
    return absl::UnavailableError("verifyd is shutting down");  // closes `server`
  }
  channels_[id] = *std::move(server);
  if (options_.events != nullptr) options_.events->OnChannelOpened(id, owner, entries);
  return info;
}

void ChannelTable::Unhold(uint32_t entries, uint64_t area_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  --held_channels_;
  held_ring_bytes_ -= channel::RingFileBytes(entries) + area_bytes;
}

absl::StatusOr<CaptureInfo> ChannelTable::PrepareCapture(const std::string& owner, uint64_t id,
                                                         const CaptureSpec& spec) {
  // Under the lock throughout: a rare call, and the channel can neither close nor take a second
  // capture meanwhile.
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return absl::UnavailableError("verifyd is shutting down");
  VERIFYD_ASSIGN_OR_RETURN(auto it, FindOwned(owner, id));
  if (it->second->capture_bytes() != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "channel = ", id, " already serves a captured bucket; open a channel per captured bucket"));
  }
  const std::string name = absl::StrCat("/", options_.name_prefix, "step-", RandomHex());
  absl::StatusOr<std::shared_ptr<StepCapture>> capture =
      StepCapture::Create(spec, options_.limits, regions_, owner, name);
  if (!capture.ok()) return capture.status();
  const uint64_t bytes = (*capture)->info().bytes;
  if (held_ring_bytes_ + bytes > options_.max_ring_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_batch = ", spec.max_batch, " and max_q = ", spec.max_q, " take a step area of ", bytes,
        " bytes; the open channels' rings and step areas hold ", held_ring_bytes_,
        " of --max-channel-bytes = ", options_.max_ring_bytes,
        "; close a channel or capture a smaller bucket"));  // `capture` ends, its name unlinked
  }
  const CaptureInfo info = (*capture)->info();
  VERIFYD_RETURN_IF_ERROR(it->second->AttachCapture(*std::move(capture)));
  held_ring_bytes_ += bytes;
  return info;
}

absl::StatusOr<ChannelTable::Channels::iterator> ChannelTable::FindOwned(const std::string& owner,
                                                                         uint64_t id) {
  auto it = channels_.find(id);
  if (it == channels_.end()) {
    return absl::NotFoundError(
        absl::StrCat("channel = ", id, " is not open (closed, expired, or never opened)"));
  }
  if (it->second->owner() != owner) {
    return absl::PermissionDeniedError(
        absl::StrCat("channel = ", id, " belongs to another client"));
  }
  return it;
}

absl::Status ChannelTable::Close(const std::string& owner, uint64_t id) {
  std::unique_ptr<ChannelServer> server;
  {
    std::lock_guard<std::mutex> lock(mu_);
    VERIFYD_ASSIGN_OR_RETURN(auto it, FindOwned(owner, id));
    server = std::move(it->second);
    channels_.erase(it);
  }
  server->Close(absl::StatusCode::kCancelled);  // outside the lock: it joins a thread
  Closed(*server, "closed by its client");
  Unhold(server->entries(), server->capture_bytes());
  return absl::OkStatus();
}

void ChannelTable::CloseAll(absl::StatusCode reason) {
  absl::flat_hash_map<uint64_t, std::unique_ptr<ChannelServer>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    all.swap(channels_);
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  for (auto& [_, server] : all) {
    server->Close(reason);
    Unhold(server->entries(), server->capture_bytes());
    Closed(*server, "the daemon stops");
  }
}

void ChannelTable::Closed(const ChannelServer& server, const char* why) {
  if (options_.events != nullptr)
    options_.events->OnChannelClosed(server.id(), server.owner(), why);
}

int ChannelTable::ReapFinished() {
  std::vector<std::unique_ptr<ChannelServer>> done;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = channels_.begin(); it != channels_.end();) {
      if (it->second->ExpireIfIdle(now)) {
        done.push_back(std::move(it->second));
        channels_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& server : done) {
    server->Close(absl::StatusCode::kDeadlineExceeded);
    Closed(*server, "its lease expired (no heartbeat or descriptor within the lease)");
    Unhold(server->entries(), server->capture_bytes());
  }
  return static_cast<int>(done.size());
}

int ChannelTable::channels() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(channels_.size());
}

void ChannelTable::Sweep() {
  const auto period = absl::ToChronoNanoseconds(
      std::clamp(options_.lease / 4, absl::Milliseconds(20), absl::Milliseconds(250)));
  std::unique_lock<std::mutex> lock(mu_);
  while (!closing_) {
    sweeper_cv_.wait_for(lock, period, [this] { return closing_; });
    if (closing_) break;
    lock.unlock();
    ReapFinished();
    regions_->ExpireIdle();
    lock.lock();
  }
}

}  // namespace verifyd
