// Issue 33 N11 through the daemon: shared-memory regions belong to a process (SO_PEERCRED's pid).
// Two schedulers, or two dead incarnations of one (each restart a new process), used to hold half
// the budget each and lock everyone else out until the 300 s lease. Here two client processes take
// their shares and are killed: while they live a third still finds room, and once they are gone
// their regions go at the next sweep, long before the lease.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/service/test_server.h"

namespace verifyd {
namespace {

const std::string kDyingClient = [] {
  const char* env = std::getenv("VERIFYD_DYING_CLIENT");
  return std::string(env != nullptr && *env != '\0' ? env : DYING_CLIENT_BINARY);
}();

// A client process that creates `count` regions of `bytes` and waits to be killed: its pid.
int RegionHolder(const std::string& address, int64_t bytes, int count) {
  const std::string command =
      absl::StrCat(kDyingClient, " ", address, " shm ", bytes, " ", count, " & echo $!");
  FILE* out = popen(command.c_str(), "r");
  if (out == nullptr) return 0;
  char line[256] = {};
  int pid = 0;
  if (fgets(line, sizeof(line), out) == nullptr ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &pid)) {
    pclose(out);
    return 0;
  }
  const bool sent = fgets(line, sizeof(line), out) != nullptr;
  EXPECT_TRUE(sent && std::string(line).starts_with("sent ok")) << line;
  pclose(out);  // waits for the shell only; the client sleeps on in the background
  return pid;
}

TEST(SharedMemoryOwnerTest, DeadClientsRegionsGoSoonAndTheLivingAlwaysFindRoom) {
  ServiceOptions options = testing::SmallOptions("shm-owner");
  options.lease_seconds = 300;
  options.shm_max_bytes = int64_t{64} << 20;
  options.shm_max_region_bytes = int64_t{32} << 20;
  testing::TestServer server(options);
  ASSERT_TRUE(server.status().ok()) << server.status();
  const std::string address = options.listen;
  SharedMemoryRegistry& regions = server.server().shared_memory();
  // The first takes half, the second half of the rest.
  const int first = RegionHolder(address, int64_t{16} << 20, 2);
  ASSERT_GT(first, 0);
  const int second = RegionHolder(address, int64_t{8} << 20, 2);
  ASSERT_GT(second, 0);
  EXPECT_EQ(regions.total_bytes(), int64_t{48} << 20);
  std::unique_ptr<Client> me = *Client::Connect(address);
  {
    // Room for a third while they live: half of the 16 MiB they leave.
    absl::StatusOr<SharedMemoryRegion> room = me->CreateSharedMemory(int64_t{8} << 20);
    EXPECT_TRUE(room.ok()) << room.status();
    const absl::StatusOr<SharedMemoryRegion> more = me->CreateSharedMemory(int64_t{8} << 20);
    EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
    EXPECT_THAT(std::string(more.status().message()), ::testing::HasSubstr("its share of"));
  }
  kill(first, SIGKILL);
  kill(second, SIGKILL);
  // Gone at the next sweep (a quarter of the lease at most 250 ms), not at the 300 s lease.
  for (int i = 0; i < 200 && regions.total_bytes() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(regions.total_bytes(), 0) << "a dead client's regions outlived it";
  EXPECT_EQ(regions.regions(), 0);
  // And the living client gets a lone client's share again.
  absl::StatusOr<SharedMemoryRegion> whole = me->CreateSharedMemory(int64_t{32} << 20);
  EXPECT_TRUE(whole.ok()) << whole.status();
}

}  // namespace
}  // namespace verifyd
