// SharedMemoryRegistry on its own: regions are real POSIX shared memory, the clock is the test's.
#include "service/shared_memory_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

// True when the POSIX name still exists (what a client would open).
bool NameExists(const std::string& path) {
  const int fd = shm_open(path.c_str(), O_RDWR, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

class RegistryTest : public ::testing::Test {
 protected:
  SharedMemoryLimits Limits() {
    SharedMemoryLimits l;
    l.max_total_bytes = 1 << 20;
    l.max_region_bytes = 512 << 10;
    l.lease = absl::Seconds(10);
    l.name_prefix = "verifyd-test-";
    return l;
  }
  absl::Time now_ = absl::FromUnixSeconds(1000);
  SharedMemoryRegistry::Clock clock_ = [this] { return now_; };
};

// One client cannot take the whole budget: past its share it is refused (naming the share), while
// another client still gets regions; a release or an expiry gives the share back.
TEST_F(RegistryTest, EachClientHoldsAtMostItsShare) {
  SharedMemoryLimits limits = Limits();
  limits.max_client_bytes = limits.max_total_bytes / 2;
  SharedMemoryRegistry registry(limits, clock_);
  std::mt19937 rng(17);
  // Random sizes until client a's next region would pass its share.
  std::vector<SharedMemoryInfo> held;
  int64_t a_bytes = 0;
  for (;;) {
    const uint64_t bytes = 4096 + rng() % (64 << 10);
    if (a_bytes + static_cast<int64_t>(bytes) > limits.max_client_bytes) {
      const auto refused = registry.Create(bytes, "pid:1");
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(std::string(refused.status().message()), HasSubstr("this client's regions"));
      break;
    }
    auto region = registry.Create(bytes, "pid:1");
    ASSERT_TRUE(region.ok()) << region.status();
    a_bytes += static_cast<int64_t>(bytes);
    held.push_back(*region);
  }
  EXPECT_EQ(registry.total_bytes(), a_bytes) << "a refused Create holds nothing";
  // Another client still gets half of what a leaves (its share while a holds regions).
  const int64_t b_share = (limits.max_total_bytes - a_bytes) / 2;
  auto other = registry.Create(b_share, "pid:2");
  ASSERT_TRUE(other.ok()) << other.status();
  // b's release gives a its whole share again, and a release of a's own gives a's bytes back.
  ASSERT_TRUE(registry.Release(other->region).ok());
  ASSERT_TRUE(registry.Release(held.back().region).ok());
  auto again = registry.Create(held.back().bytes, "pid:1");
  EXPECT_TRUE(again.ok()) << again.status();
  // So does expiry: after the lease every region of every client is gone, and a full share fits.
  now_ += limits.lease + absl::Seconds(1);
  registry.ExpireIdle();
  EXPECT_EQ(registry.total_bytes(), 0);
  EXPECT_TRUE(registry.Create(limits.max_client_bytes, "pid:1").ok());
}

// Issue 33 N11: with a client's share at half the budget, two clients (or two dead incarnations
// of one scheduler, each a new process) held it all and locked everyone else out until the lease.
// Now each holds at most half of what the others leave: however many hold regions, the next one
// gets some, and shares grow back as regions go.
TEST_F(RegistryTest, EveryNewClientFindsRoomHoweverManyHoldRegions) {
  SharedMemoryLimits limits = Limits();
  limits.max_client_bytes = limits.max_total_bytes / 2;
  limits.max_region_bytes = limits.max_total_bytes;
  SharedMemoryRegistry registry(limits, clock_);
  int64_t left = limits.max_total_bytes;
  for (int client = 1; client <= 6; ++client) {
    SCOPED_TRACE(absl::StrCat("client ", client));
    const std::string name = absl::StrCat("pid:", client);
    const int64_t share = std::min(limits.max_client_bytes, left / 2);
    const auto past = registry.Create(static_cast<uint64_t>(share) + 4096, name);
    EXPECT_EQ(past.status().code(), absl::StatusCode::kResourceExhausted) << past.status();
    EXPECT_THAT(std::string(past.status().message()),
                HasSubstr(absl::StrCat("its share of ", share, " bytes")));
    ASSERT_TRUE(registry.Create(static_cast<uint64_t>(share), name).ok());
    left -= share;
  }
  EXPECT_GT(limits.max_total_bytes - registry.total_bytes(), 0) << "the budget was taken whole";
}

// Issue 33 N11: a region whose client's process has ended goes at the next sweep, long before its
// lease; the living client's stay.
TEST_F(RegistryTest, ADeadClientsRegionsGoAtTheNextSweep) {
  SharedMemoryLimits limits = Limits();
  limits.max_client_bytes = limits.max_total_bytes / 2;
  std::set<std::string> dead;
  limits.client_alive = [&dead](const std::string& client) { return !dead.contains(client); };
  SharedMemoryRegistry registry(limits, clock_);
  std::vector<SharedMemoryInfo> first, second;
  for (int i = 0; i < 3; ++i) first.push_back(*registry.Create(64 << 10, "pid:101"));
  for (int i = 0; i < 2; ++i) second.push_back(*registry.Create(32 << 10, "pid:102"));
  EXPECT_EQ(registry.ExpireIdle(), 0);
  dead.insert("pid:101");
  EXPECT_EQ(registry.ExpireIdle(), 3);
  for (const SharedMemoryInfo& r : first) {
    EXPECT_FALSE(NameExists(r.path));
    EXPECT_EQ(registry.Find(r.region, "q.region").status().code(), absl::StatusCode::kNotFound);
  }
  for (const SharedMemoryInfo& r : second) EXPECT_TRUE(registry.Find(r.region, "q.region").ok());
  EXPECT_EQ(registry.total_bytes(), 2 * (32 << 10));
  // The next incarnation gets its share of what is left.
  EXPECT_TRUE(registry.Create(limits.max_client_bytes - (64 << 10), "pid:103").ok());
}

TEST_F(RegistryTest, CreateMapsAFreshPrivateNameThatAClientSeesAndWrites) {
  SharedMemoryRegistry registry(Limits(), clock_);
  auto a = registry.Create(10000);
  auto b = registry.Create(4096);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->region, b->region);
  EXPECT_EQ(a->region.size(), 32u);
  EXPECT_EQ(a->path, "/verifyd-test-" + a->region);
  EXPECT_EQ(a->bytes, 10000u);
  EXPECT_EQ(registry.total_bytes(), 14096);
  EXPECT_EQ(registry.regions(), 2);

  const int fd = shm_open(a->path.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, getuid());
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 10000u);
  auto* client =
      static_cast<uint8_t*>(mmap(nullptr, 10000, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(client, MAP_FAILED);
  // Random bytes written by the "client" are what the daemon's mapping reads, and back.
  std::mt19937 rng(5);
  for (int i = 0; i < 10000; ++i) client[i] = static_cast<uint8_t>(rng());
  auto mapped = registry.Find(a->region, "q.shared_memory.region");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(std::memcmp((*mapped)->data(), client, 10000), 0);
  (*mapped)->data()[9999] ^= 0x5a;
  EXPECT_EQ(std::memcmp((*mapped)->data(), client, 10000), 0);
  munmap(client, 10000);
}

TEST_F(RegistryTest, LimitsNameTheirBound) {
  SharedMemoryRegistry registry(Limits(), clock_);
  auto zero = registry.Create(0);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  auto big = registry.Create((512 << 10) + 1);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("--shm-max-region-bytes = 524288"));
  ASSERT_TRUE(registry.Create(512 << 10).ok());
  auto second = registry.Create(400 << 10);
  ASSERT_TRUE(second.ok());
  auto over = registry.Create(200 << 10);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("--shm-max-bytes = 1048576"));
  EXPECT_EQ(registry.total_bytes(), 912 << 10) << "a refused Create reserves nothing";
  ASSERT_TRUE(registry.Release(second->region).ok());
  EXPECT_TRUE(registry.Create(200 << 10).ok()) << "released bytes are free again";

  SharedMemoryLimits off = Limits();
  off.max_total_bytes = 0;
  SharedMemoryRegistry disabled(off, clock_);
  auto refused = disabled.Create(4096);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("--shm-max-bytes = 0"));
}

TEST_F(RegistryTest, ReleaseUnlinksAtOnceButAPinnedMappingStaysValid) {
  SharedMemoryRegistry registry(Limits(), clock_);
  auto info = registry.Create(8192);
  ASSERT_TRUE(info.ok());
  auto pinned = registry.Find(info->region, "kv.shared_memory.region");
  ASSERT_TRUE(pinned.ok());
  auto released = registry.Release(info->region);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(*released, 8192u);
  EXPECT_FALSE(NameExists(info->path));
  EXPECT_EQ(registry.total_bytes(), 0);
  // An in-flight call still reads and writes its pinned mapping.
  for (int i = 0; i < 8192; ++i) (*pinned)->data()[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ((*pinned)->data()[8191], static_cast<uint8_t>(8191 * 7));

  auto again = registry.Release(info->region);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  auto found = registry.Find(info->region, "q.shared_memory.region");
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(found.status().message(),
              HasSubstr("q.shared_memory.region = '" + info->region + "' is not a live"));
}

TEST_F(RegistryTest, LeaseExpiresUnusedRegionsAndEveryLookupRenewsIt) {
  SharedMemoryRegistry registry(Limits(), clock_);
  auto used = registry.Create(4096);
  auto idle = registry.Create(4096);
  ASSERT_TRUE(used.ok() && idle.ok());
  for (int i = 0; i < 5; ++i) {
    now_ += absl::Seconds(4);
    ASSERT_TRUE(registry.Find(used->region, "f").ok()) << i;
    EXPECT_EQ(registry.ExpireIdle(), i < 2 ? 0 : (i == 2 ? 1 : 0)) << i;
  }
  EXPECT_FALSE(NameExists(idle->path));
  EXPECT_TRUE(NameExists(used->path));
  EXPECT_EQ(registry.Find(idle->region, "f").status().code(), absl::StatusCode::kNotFound);
  // Past the lease, a lookup finds it gone even before a sweep.
  now_ += absl::Seconds(11);
  EXPECT_EQ(registry.Find(used->region, "f").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(NameExists(used->path));
  EXPECT_EQ(registry.total_bytes(), 0);
}

TEST_F(RegistryTest, SweeperExpiresWithoutAnyCall) {
  SharedMemoryLimits limits = Limits();
  limits.lease = absl::Milliseconds(50);
  SharedMemoryRegistry registry(limits);  // the real clock
  auto info = registry.Create(4096);
  ASSERT_TRUE(info.ok());
  registry.StartLeaseSweeper(absl::Milliseconds(10));
  // Bounded wait for the sweep, not a timing assertion: the loop ends as soon as it happened.
  for (int i = 0; i < 500 && registry.regions() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(registry.regions(), 0);
  EXPECT_FALSE(NameExists(info->path));
}

TEST_F(RegistryTest, DestructionUnlinksEveryRegion) {
  std::vector<std::string> paths;
  {
    SharedMemoryRegistry registry(Limits(), clock_);
    registry.StartLeaseSweeper(absl::Milliseconds(10));
    for (int i = 0; i < 3; ++i) paths.push_back(registry.Create(4096 * (i + 1))->path);
    for (const std::string& p : paths) EXPECT_TRUE(NameExists(p));
  }
  for (const std::string& p : paths) EXPECT_FALSE(NameExists(p)) << p;
}

// What the mapping hooks saw. on_map writes and reads the whole range (a range not mapped yet would
// fault) and on_unmap reads it back (a range already unmapped would fault); `live` catches a
// second registration of an address, or an unmap of one never registered: with munmap before
// on_unmap, the kernel could hand the address to the next region while it still counts as live.
class HookLog {
 public:
  // Registrations whose ordinal (from 0) `fail` answers true for are refused.
  SharedMemoryMappingHooks Hooks(std::function<bool(int)> fail = [](int) { return false; }) {
    return SharedMemoryMappingHooks{
        [this, fail](void* data, uint64_t bytes) -> absl::Status {
          auto* bytes_at = static_cast<uint8_t*>(data);
          for (uint64_t i = 0; i < bytes; ++i) bytes_at[i] = static_cast<uint8_t>(i * 31 + 7);
          std::lock_guard<std::mutex> lock(mu_);
          const int ordinal = maps_++;
          if (fail(ordinal)) return absl::ResourceExhaustedError("pinned-memory limit (test)");
          EXPECT_TRUE(live_.emplace(data, bytes).second) << "registered twice";
          ++registered_;
          return absl::OkStatus();
        },
        [this](void* data) {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = live_.find(data);
          ASSERT_NE(it, live_.end()) << "unregistered without a registration";
          // Read for its fault, not its value.
          for (uint64_t i = 0; i < it->second; ++i) checksum_ += static_cast<uint8_t*>(data)[i];
          live_.erase(it);
          ++unregistered_;
        }};
  }
  int registered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return registered_;
  }
  int unregistered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unregistered_;
  }
  int maps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return maps_;
  }
  bool live(const void* data) const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.count(const_cast<void*>(data)) > 0;
  }
  size_t live_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<void*, uint64_t> live_;
  int maps_ = 0, registered_ = 0, unregistered_ = 0;
  uint64_t checksum_ = 0;
};

TEST_F(RegistryTest, MappingHooksRunOnceAfterMapAndOnceBeforeUnmap) {
  HookLog log;
  std::vector<uint8_t*> data;
  {
    SharedMemoryRegistry registry(Limits(), clock_);
    registry.SetMappingHooks(log.Hooks());
    std::mt19937 rng(11);
    std::vector<SharedMemoryInfo> infos;
    for (int i = 0; i < 5; ++i) {
      auto info = registry.Create(1 + rng() % 100000);
      ASSERT_TRUE(info.ok()) << info.status();
      infos.push_back(*info);
      auto mapped = registry.Find(info->region, "f");
      ASSERT_TRUE(mapped.ok());
      data.push_back((*mapped)->data());
      EXPECT_TRUE(log.live(data.back())) << "registered before Create returned";
    }
    EXPECT_EQ(log.registered(), 5);
    EXPECT_EQ(log.unregistered(), 0);
    // Released with nothing pinning it: unregistered at once.
    ASSERT_TRUE(registry.Release(infos[0].region).ok());
    EXPECT_FALSE(log.live(data[0]));
    EXPECT_EQ(log.unregistered(), 1);
    // Pinned by a call: registered (and mapped) until the pin goes.
    auto pin = registry.Find(infos[1].region, "q.shared_memory.region");
    ASSERT_TRUE(pin.ok());
    ASSERT_TRUE(registry.Release(infos[1].region).ok());
    EXPECT_TRUE(log.live(data[1]));
    (*pin)->data()[0] ^= 1;  // still mapped
    pin->reset();
    EXPECT_FALSE(log.live(data[1]));
    // Expired by its lease (region 2 idle; 3 and 4 renewed).
    now_ += absl::Seconds(6);
    ASSERT_TRUE(registry.Find(infos[3].region, "f").ok());
    ASSERT_TRUE(registry.Find(infos[4].region, "f").ok());
    now_ += absl::Seconds(6);
    EXPECT_EQ(registry.ExpireIdle(), 1);
    EXPECT_FALSE(log.live(data[2]));
    EXPECT_EQ(log.unregistered(), 3);
    const HostRegistrationCounters c = registry.host_registration();
    EXPECT_EQ(c.registered, 5);
    EXPECT_EQ(c.failed, 0);
    EXPECT_EQ(c.unregistered, 3);
    EXPECT_EQ(c.live, 2);
  }
  // Destruction unlinks and unmaps the rest, each unregistered first.
  EXPECT_EQ(log.registered(), 5);
  EXPECT_EQ(log.unregistered(), 5);
  EXPECT_EQ(log.live_count(), 0u);
}

TEST_F(RegistryTest, RegistrationFailureIsCountedAndTheRegionWorks) {
  HookLog log;
  SharedMemoryRegistry registry(Limits(), clock_);
  registry.SetMappingHooks(log.Hooks([](int ordinal) { return ordinal % 2 == 1; }));
  std::vector<SharedMemoryInfo> infos;
  for (int i = 0; i < 6; ++i) {
    auto info = registry.Create(4096 * (i + 1));
    ASSERT_TRUE(info.ok()) << "a refused registration must not fail Create: " << info.status();
    infos.push_back(*info);
    auto mapped = registry.Find(info->region, "f");
    ASSERT_TRUE(mapped.ok());
    EXPECT_EQ(log.live((*mapped)->data()), i % 2 == 0);
    (*mapped)->data()[(*mapped)->bytes() - 1] = 0x42;  // usable either way
  }
  HostRegistrationCounters c = registry.host_registration();
  EXPECT_EQ(c.registered, 3);
  EXPECT_EQ(c.failed, 3);
  EXPECT_EQ(c.live, 3);
  // Releasing all: only the registered ones are unregistered.
  for (const SharedMemoryInfo& info : infos) ASSERT_TRUE(registry.Release(info.region).ok());
  EXPECT_EQ(log.unregistered(), 3);
  EXPECT_EQ(log.live_count(), 0u);
  c = registry.host_registration();
  EXPECT_EQ(c.unregistered, 3);
  EXPECT_EQ(c.live, 0);
}

TEST_F(RegistryTest, SetHooksRegistersLiveRegionsAndClearUnregistersEveryOne) {
  HookLog log;
  SharedMemoryRegistry registry(Limits(), clock_);
  auto early = registry.Create(4096);
  auto pinned_early = registry.Create(8192);
  ASSERT_TRUE(early.ok() && pinned_early.ok());
  EXPECT_EQ(registry.host_registration().registered, 0);  // no hooks yet: nothing registered
  registry.SetMappingHooks(log.Hooks());
  EXPECT_EQ(log.registered(), 2);
  auto later = registry.Create(12288);
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(log.registered(), 3);
  // One released while a call pins it: still registered, out of the registry's table.
  auto pin = registry.Find(pinned_early->region, "out_shared_memory.region");
  ASSERT_TRUE(pin.ok());
  ASSERT_TRUE(registry.Release(pinned_early->region).ok());
  EXPECT_TRUE(log.live((*pin)->data()));

  registry.ClearMappingHooks();
  EXPECT_EQ(log.unregistered(), 3) << "live and pinned mappings alike";
  EXPECT_EQ(log.live_count(), 0u);
  pin->reset();  // unmapped now, without a second unregistration
  auto after = registry.Create(4096);
  ASSERT_TRUE(after.ok());
  registry.UnlinkAll();
  EXPECT_EQ(log.maps(), 3) << "no hooks after Clear";
  EXPECT_EQ(log.unregistered(), 3);
  const HostRegistrationCounters c = registry.host_registration();
  EXPECT_EQ(c.registered, 3);
  EXPECT_EQ(c.unregistered, 3);
  EXPECT_EQ(c.live, 0);
}

// Creates, releases and pinned releases on four threads while the hooks are set midway: every
// mapping is registered at most once and unregistered exactly once iff it was registered, always
// before its munmap (HookLog fails otherwise when the kernel reuses the address).
TEST_F(RegistryTest, HooksStayBalancedUnderConcurrentCreatesAndReleases) {
  HookLog log;
  {
    SharedMemoryRegistry registry(Limits(), clock_);
    std::atomic<int> created{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(100 + t);
        std::vector<std::shared_ptr<MappedSharedMemory>> pins;
        for (int i = 0; i < 60; ++i) {
          auto info = registry.Create(4096 * (1 + rng() % 4));
          if (!info.ok()) continue;  // the total limit under contention
          ++created;
          if (rng() % 2 == 0) {
            auto pin = registry.Find(info->region, "f");
            if (pin.ok()) pins.push_back(*pin);
          }
          // The last two stay for the registry's destruction to unmap.
          if (i < 58) registry.Release(info->region).IgnoreError();
          if (pins.size() > 3) pins.erase(pins.begin());
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(2));
    registry.SetMappingHooks(log.Hooks());
    for (std::thread& thread : threads) thread.join();
    EXPECT_GT(created.load(), 100);
    const HostRegistrationCounters c = registry.host_registration();
    EXPECT_EQ(c.live, static_cast<int64_t>(log.live_count()));
    EXPECT_EQ(c.registered, log.registered());
    EXPECT_EQ(c.unregistered, log.unregistered());
  }
  EXPECT_EQ(log.live_count(), 0u);
  EXPECT_EQ(log.registered(), log.unregistered());
}

}  // namespace
}  // namespace verifyd
