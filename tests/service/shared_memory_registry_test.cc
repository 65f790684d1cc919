// SharedMemoryRegistry on its own: regions are real POSIX shared memory, the clock is the test's.
#include "service/shared_memory_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>

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

}  // namespace
}  // namespace verifyd
