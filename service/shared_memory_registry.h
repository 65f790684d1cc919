// SharedMemoryRegistry: the daemon's shared-memory regions for tensors (plans/0010). The daemon
// creates every region itself (shm_open O_CREAT|O_EXCL, mode 0600, pages allocated up front), so
// no client can shrink or replace a file the daemon has mapped (SIGBUS), and it unlinks every
// region on release, lease expiry and shutdown. Thread-safe: gRPC handler threads look regions up
// while validating; a call pins the regions it uses (shared_ptr), so a region released or expired
// during the call stays mapped until the call finishes.
//
// Mapping hooks (SetMappingHooks) let the compute backend register each mapping with its device
// (cudaHostRegister) right after mmap and unregister it right before munmap, so that Verify copies
// q / out / lse by DMA straight from and into the region. A registration that fails only costs
// speed: the region works through the backend's host staging, and the failure is counted.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/descriptor_budget.h"

namespace verifyd {

// What the daemon does with a region's pages after mapping them and before unmapping them.
// on_map runs on the thread that creates the region (a gRPC handler) or calls SetMappingHooks;
// on_unmap on whichever thread drops the mapping's last holder (a handler, the lease sweeper, or
// the executor when a call's pin was the last). Neither runs twice for one mapping.
struct SharedMemoryMappingHooks {
  std::function<absl::Status(void* data, uint64_t bytes)> on_map;
  std::function<void(void* data)> on_unmap;
};

struct HostRegistrationCounters {
  int64_t registered = 0;    // on_map succeeded (ever)
  int64_t failed = 0;        // on_map failed: that region goes through host staging
  int64_t unregistered = 0;  // on_unmap calls (ever)
  int64_t live = 0;          // registered now
};

// Which mappings the hooks registered; shared by the registry and its mappings (a mapping pinned
// by a call may outlive the registry's entry for it). Defined in the .cc.
class MappingHookTable;

// One region mapped read-write in the daemon; unmapped when its last holder lets go (after the
// mapping hooks' on_unmap, when on_map registered it).
class MappedSharedMemory {
 public:
  MappedSharedMemory(std::string region, uint8_t* data, uint64_t bytes,
                     std::shared_ptr<MappingHookTable> hooks = nullptr)
      : region_(std::move(region)), data_(data), bytes_(bytes), hooks_(std::move(hooks)) {}
  ~MappedSharedMemory();
  MappedSharedMemory(const MappedSharedMemory&) = delete;
  MappedSharedMemory& operator=(const MappedSharedMemory&) = delete;

  const std::string& region() const { return region_; }
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string region_;
  uint8_t* data_;
  uint64_t bytes_;
  std::shared_ptr<MappingHookTable> hooks_;
};

struct SharedMemoryLimits {
  // Over all live regions; 0 disables shared memory (CreateSharedMemory: FAILED_PRECONDITION).
  int64_t max_total_bytes = int64_t{1} << 30;
  int64_t max_region_bytes = int64_t{256} << 20;
  // Over the live regions of one client (Create's `client`) while no other client holds any; 0: no
  // bound of its own. With others holding some, a client may hold at most half of what they leave
  // of max_total_bytes: however many clients (or dead incarnations of one) hold regions, the next
  // one finds room (issue 33 N11).
  int64_t max_client_bytes = 0;
  // A region no request named for this long is released.
  absl::Duration lease = absl::Seconds(300);
  // Whether the client (Create's `client`) still lives: a region whose client is gone is released
  // at the next sweep instead of at its lease (issue 33 N11). Null: every client lives.
  std::function<bool(const std::string& client)> client_alive;
  // The process's descriptors (creating a region takes one for a moment). Null: not checked.
  DescriptorBudget* descriptors = nullptr;
  // Names are "/<name_prefix><32 random hex digits>".
  std::string name_prefix = "verifyd-";
};

struct SharedMemoryInfo {
  std::string region;  // what requests name
  std::string path;    // what clients shm_open
  uint64_t bytes = 0;
};

class SharedMemoryRegistry {
 public:
  using Clock = std::function<absl::Time()>;
  explicit SharedMemoryRegistry(
      SharedMemoryLimits limits, Clock clock = [] { return absl::Now(); });
  ~SharedMemoryRegistry();  // Stops the sweeper and unlinks every region.
  SharedMemoryRegistry(const SharedMemoryRegistry&) = delete;
  SharedMemoryRegistry& operator=(const SharedMemoryRegistry&) = delete;

  // FAILED_PRECONDITION when disabled; INVALID_ARGUMENT for 0 bytes; RESOURCE_EXHAUSTED naming the
  // bound (--shm-max-region-bytes, --shm-max-bytes, the client's share, the descriptors) or when
  // the system refuses the pages. `client` names who asks (a process: "pid:<n>"), for
  // max_client_bytes and client_alive.
  absl::StatusOr<SharedMemoryInfo> Create(uint64_t bytes, const std::string& client = "");
  // The region, its lease renewed; NOT_FOUND naming `field` when unknown or expired.
  absl::StatusOr<std::shared_ptr<MappedSharedMemory>> Find(const std::string& region,
                                                           const std::string& field);
  // Unlinks the name at once; the mapping lives on while calls hold it. Returns its bytes.
  absl::StatusOr<uint64_t> Release(const std::string& region);
  // Releases every region whose lease passed or whose client is gone (client_alive); returns how
  // many.
  int ExpireIdle();
  // Shutdown: unlinks every region (mappings held by calls stay valid until those finish).
  void UnlinkAll();
  // Runs ExpireIdle every `period` on a thread of its own until destruction or UnlinkAll.
  void StartLeaseSweeper(absl::Duration period);

  // Set once at startup, when the backend exists: every live region is registered now, every
  // later one right after its mmap. A failed on_map is counted and the region used as it is.
  void SetMappingHooks(SharedMemoryMappingHooks hooks);
  // Calls on_unmap for every mapping still registered (live regions and those pinned by calls),
  // waits for hook calls in progress on other threads, and forgets the hooks: later unmaps call
  // nothing. Call it before whatever the hooks use is destroyed, once no call can be copying
  // from or to a region (after the executor drained): those copies rely on the registration.
  void ClearMappingHooks();
  HostRegistrationCounters host_registration() const;

  int64_t total_bytes() const;
  int regions() const;
  const SharedMemoryLimits& limits() const { return limits_; }

 private:
  struct Entry {
    std::string path;
    std::string client;
    std::shared_ptr<MappedSharedMemory> mapping;
    absl::Time last_used;
  };
  // Caller holds mu_. Removes the entry, unlinks its name, returns its bytes. The mapping goes to
  // `unmapped`, which the caller destroys after releasing mu_: unmapping may run the on_unmap hook
  // (slow), which must not hold up lookups.
  uint64_t RemoveLocked(absl::flat_hash_map<std::string, Entry>::iterator it,
                        std::vector<std::shared_ptr<MappedSharedMemory>>* unmapped);
  void StopSweeper();
  // Caller holds mu_: `bytes` of `client` are no longer held or reserved.
  void UnreserveClientLocked(const std::string& client, uint64_t bytes);

  const SharedMemoryLimits limits_;
  const Clock clock_;
  const std::shared_ptr<MappingHookTable> hooks_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_;
  int64_t total_bytes_ = 0;  // live regions plus reservations of Creates in progress
  absl::flat_hash_map<std::string, int64_t> client_bytes_;  // the same, per client

  std::mutex sweeper_mu_;
  std::condition_variable sweeper_cv_;
  bool stop_sweeper_ = false;
  std::thread sweeper_;
};

}  // namespace verifyd
