#include "service/shared_memory_registry.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/random.h"
#include "base/shm_file.h"

namespace verifyd {
namespace {

// A fresh region (base/shm_file.h: pages allocated now, so a full /dev/shm is an error here).
absl::StatusOr<uint8_t*> CreateMapping(const std::string& path, uint64_t bytes) {
  absl::StatusOr<void*> data = CreateSharedMemoryFile(path, bytes, "shared memory");
  if (!data.ok()) return data.status();
  return static_cast<uint8_t*>(*data);
}

}  // namespace

// The hooks run with mu_ released (registering a large region with a device takes milliseconds;
// the executor may be the thread unmapping a region a call had pinned, and must not wait behind
// someone else's registration), and counted in in_flight_ so that Clear can wait for them.
class MappingHookTable {
 public:
  void Set(SharedMemoryMappingHooks hooks) {
    std::lock_guard<std::mutex> lock(mu_);
    hooks_ = std::make_shared<const SharedMemoryMappingHooks>(std::move(hooks));
  }

  // Registers `data` unless it is registered (or being registered) already. The caller holds the
  // mapping, so no Unmap of `data` can run meanwhile.
  void Map(void* data, uint64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    if (hooks_ == nullptr || !hooks_->on_map || mapped_.contains(data)) return;
    const Hooks hooks = hooks_;
    mapped_[data] = nullptr;  // being registered
    absl::Status status;
    Unlocked(lock, [&] { status = hooks->on_map(data, bytes); });
    if (!status.ok()) {
      mapped_.erase(data);
      ++counters_.failed;
      return;
    }
    ++counters_.registered;
    if (hooks_ == hooks) {
      mapped_[data] = hooks;
      ++counters_.live;
      return;
    }
    // Cleared while registering: nothing would unregister it later.
    mapped_.erase(data);
    ++counters_.unregistered;
    Unlocked(lock, [&] { CallUnmap(*hooks, data); });
  }

  void Unmap(void* data) {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = mapped_.find(data);
    if (it == mapped_.end() || it->second == nullptr) return;
    const Hooks hooks = std::move(it->second);
    mapped_.erase(it);
    --counters_.live;
    ++counters_.unregistered;
    Unlocked(lock, [&] { CallUnmap(*hooks, data); });
  }

  void Clear() {
    std::unique_lock<std::mutex> lock(mu_);
    hooks_ = nullptr;
    std::vector<std::pair<void*, Hooks>> registered;
    for (auto it = mapped_.begin(); it != mapped_.end();) {
      if (it->second == nullptr) {  // its Map sees the hooks gone and undoes it
        ++it;
        continue;
      }
      registered.emplace_back(it->first, std::move(it->second));
      mapped_.erase(it++);
    }
    counters_.live -= static_cast<int64_t>(registered.size());
    counters_.unregistered += static_cast<int64_t>(registered.size());
    Unlocked(lock, [&] {
      for (const auto& [data, hooks] : registered) CallUnmap(*hooks, data);
    });
    idle_.wait(lock, [this] { return in_flight_ == 0; });
  }

  HostRegistrationCounters counters() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

 private:
  using Hooks = std::shared_ptr<const SharedMemoryMappingHooks>;

  static void CallUnmap(const SharedMemoryMappingHooks& hooks, void* data) {
    if (hooks.on_unmap) hooks.on_unmap(data);
  }

  template <typename Call>
  void Unlocked(std::unique_lock<std::mutex>& lock, Call call) {
    ++in_flight_;
    lock.unlock();
    call();
    lock.lock();
    if (--in_flight_ == 0) idle_.notify_all();
  }

  mutable std::mutex mu_;
  std::condition_variable idle_;
  Hooks hooks_;
  // Mapping address -> the hooks that registered it; null while its on_map runs.
  absl::flat_hash_map<void*, Hooks> mapped_;
  int in_flight_ = 0;
  HostRegistrationCounters counters_;
};

MappedSharedMemory::~MappedSharedMemory() {
  // The device must let go of the pages before they disappear.
  if (hooks_ != nullptr) hooks_->Unmap(data_);
  munmap(data_, bytes_);
}

SharedMemoryRegistry::SharedMemoryRegistry(SharedMemoryLimits limits, Clock clock)
    : limits_(std::move(limits)),
      clock_(std::move(clock)),
      hooks_(std::make_shared<MappingHookTable>()) {}

SharedMemoryRegistry::~SharedMemoryRegistry() { UnlinkAll(); }

absl::StatusOr<SharedMemoryInfo> SharedMemoryRegistry::Create(uint64_t bytes,
                                                              const std::string& client) {
  if (limits_.max_total_bytes == 0) {
    return absl::FailedPreconditionError(
        "shared memory is disabled on this daemon (--shm-max-bytes = 0); send inline_data");
  }
  if (bytes == 0) return absl::InvalidArgumentError("bytes = 0 must be >= 1");
  if (bytes > static_cast<uint64_t>(limits_.max_region_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "bytes = ", bytes, " is more than --shm-max-region-bytes = ", limits_.max_region_bytes));
  }
  {
    // Reserve first so that concurrent Creates cannot pass the total together.
    std::lock_guard<std::mutex> lock(mu_);
    if (total_bytes_ + static_cast<int64_t>(bytes) > limits_.max_total_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "bytes = ", bytes, " with ", total_bytes_, " bytes already in regions is more than ",
          "--shm-max-bytes = ", limits_.max_total_bytes, "; release regions first"));
    }
    int64_t& mine = client_bytes_[client];
    if (limits_.max_client_bytes > 0) {
      // Half of what the other clients leave: the next client always finds room.
      const int64_t others = total_bytes_ - mine;
      const int64_t share =
          others == 0 ? limits_.max_client_bytes
                      : std::min(limits_.max_client_bytes, (limits_.max_total_bytes - others) / 2);
      if (mine + static_cast<int64_t>(bytes) > share) {
        const int64_t held = mine;
        if (held == 0) client_bytes_.erase(client);
        return absl::ResourceExhaustedError(absl::StrCat(
            "bytes = ", bytes, " with ", held, " bytes already in this client's regions is more ",
            "than its share of ", share, " bytes (half of what the other clients' ", others,
            " bytes leave of --shm-max-bytes = ", limits_.max_total_bytes,
            "); release regions first"));
      }
    }
    if (limits_.descriptors != nullptr && !limits_.descriptors->HasRoom(1)) {
      if (mine == 0) client_bytes_.erase(client);
      return absl::ResourceExhaustedError(
          absl::StrCat("the daemon has about ", limits_.descriptors->counted(), " of its ",
                       limits_.descriptors->limit(), " descriptors open and keeps ",
                       limits_.descriptors->reserve(), " free for new connections; retry later"));
    }
    mine += static_cast<int64_t>(bytes);
    total_bytes_ += static_cast<int64_t>(bytes);
  }
  auto unreserve = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    total_bytes_ -= static_cast<int64_t>(bytes);
    UnreserveClientLocked(client, bytes);
  };
  // 128 bits from the kernel's CSPRNG: a name another local user cannot guess (the mode already
  // keeps them out; the name also keeps a stale client from opening a newer region by accident).
  const std::string token = RandomHex();
  SharedMemoryInfo info{token, absl::StrCat("/", limits_.name_prefix, token), bytes};
  absl::StatusOr<uint8_t*> data = CreateMapping(info.path, bytes);
  if (!data.ok()) {
    unreserve();
    return data.status();
  }
  auto mapping = std::make_shared<MappedSharedMemory>(info.region, *data, bytes, hooks_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.emplace(info.region, Entry{info.path, client, mapping, clock_()});
  }
  // After the entry is in: a SetMappingHooks running now either sees the entry or has set the
  // hooks this Map reads (Map ignores a second registration). Before returning: the client cannot
  // name the region earlier, so its first call finds it registered.
  hooks_->Map(mapping->data(), bytes);
  return info;
}

absl::StatusOr<std::shared_ptr<MappedSharedMemory>> SharedMemoryRegistry::Find(
    const std::string& region, const std::string& field) {
  std::vector<std::shared_ptr<MappedSharedMemory>> unmapped;  // after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(region);
  const absl::Time now = clock_();
  // An expired region the sweeper has not reached yet is gone already: renewing it here would
  // make expiry depend on the sweep's timing.
  if (it != entries_.end() && now - it->second.last_used > limits_.lease) {
    RemoveLocked(it, &unmapped);
    it = entries_.end();
  }
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(
        field, " = '", region,
        "' is not a live shared-memory region (never created, released, or its lease of ",
        absl::FormatDuration(limits_.lease), " passed)"));
  }
  it->second.last_used = now;
  return it->second.mapping;
}

absl::StatusOr<uint64_t> SharedMemoryRegistry::Release(const std::string& region) {
  std::vector<std::shared_ptr<MappedSharedMemory>> unmapped;  // after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(region);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("region = '", region,
                                            "' is not a live shared-memory region (never created, "
                                            "already released, or its lease passed)"));
  }
  return RemoveLocked(it, &unmapped);
}

uint64_t SharedMemoryRegistry::RemoveLocked(
    absl::flat_hash_map<std::string, Entry>::iterator it,
    std::vector<std::shared_ptr<MappedSharedMemory>>* unmapped) {
  const uint64_t bytes = it->second.mapping->bytes();
  shm_unlink(it->second.path.c_str());
  total_bytes_ -= static_cast<int64_t>(bytes);
  UnreserveClientLocked(it->second.client, bytes);
  unmapped->push_back(std::move(it->second.mapping));
  entries_.erase(it);
  return bytes;
}

void SharedMemoryRegistry::UnreserveClientLocked(const std::string& client, uint64_t bytes) {
  auto it = client_bytes_.find(client);
  if (it == client_bytes_.end()) return;
  it->second -= static_cast<int64_t>(bytes);
  if (it->second <= 0) client_bytes_.erase(it);
}

int SharedMemoryRegistry::ExpireIdle() {
  std::vector<std::shared_ptr<MappedSharedMemory>> unmapped;  // after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_();
  std::vector<std::string> expired;
  // Each client asked once per sweep (a process's liveness is a system call).
  absl::flat_hash_map<std::string, bool> alive;
  for (const auto& [region, entry] : entries_) {
    bool gone = false;
    if (limits_.client_alive) {
      auto [it, inserted] = alive.emplace(entry.client, true);
      if (inserted) it->second = limits_.client_alive(entry.client);
      gone = !it->second;
    }
    if (gone || now - entry.last_used > limits_.lease) expired.push_back(region);
  }
  for (const std::string& region : expired) RemoveLocked(entries_.find(region), &unmapped);
  return static_cast<int>(expired.size());
}

void SharedMemoryRegistry::UnlinkAll() {
  StopSweeper();
  std::vector<std::shared_ptr<MappedSharedMemory>> unmapped;  // after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  while (!entries_.empty()) RemoveLocked(entries_.begin(), &unmapped);
}

void SharedMemoryRegistry::SetMappingHooks(SharedMemoryMappingHooks hooks) {
  hooks_->Set(std::move(hooks));
  std::vector<std::shared_ptr<MappedSharedMemory>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [region, entry] : entries_) live.push_back(entry.mapping);
  }
  // Held here, none of them can be unmapped while it is registered.
  for (const auto& mapping : live) hooks_->Map(mapping->data(), mapping->bytes());
}

void SharedMemoryRegistry::ClearMappingHooks() { hooks_->Clear(); }

HostRegistrationCounters SharedMemoryRegistry::host_registration() const {
  return hooks_->counters();
}

void SharedMemoryRegistry::StartLeaseSweeper(absl::Duration period) {
  std::lock_guard<std::mutex> lock(sweeper_mu_);
  if (sweeper_.joinable() || stop_sweeper_) return;
  sweeper_ = std::thread([this, period] {
    std::unique_lock<std::mutex> lock(sweeper_mu_);
    while (!sweeper_cv_.wait_for(lock, absl::ToChronoNanoseconds(period),
                                 [this] { return stop_sweeper_; })) {
      lock.unlock();
      ExpireIdle();
      lock.lock();
    }
  });
}

void SharedMemoryRegistry::StopSweeper() {
  {
    std::lock_guard<std::mutex> lock(sweeper_mu_);
    stop_sweeper_ = true;
  }
  sweeper_cv_.notify_all();
  if (sweeper_.joinable() && sweeper_.get_id() != std::this_thread::get_id()) sweeper_.join();
}

int64_t SharedMemoryRegistry::total_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_bytes_;
}

int SharedMemoryRegistry::regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace verifyd
