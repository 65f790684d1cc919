// DescriptorBudget (base/descriptor_budget.h, issue 33 N6): answers without scanning
// /proc/self/fd per question (the daemon's accept loop scanned at every accept, and with 8,000
// connections waiting a new process's health waited 20 s), refuses what would eat into the
// reserve, and counts descriptors opened elsewhere once it scans again.
#include "base/descriptor_budget.h"

#include <fcntl.h>
#include <unistd.h>

#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace verifyd {
namespace {

TEST(DescriptorBudgetTest, QuestionsWithRoomScanNothing) {
  DescriptorBudget budget(1 << 20);
  const int64_t scans = budget.scans();
  for (int i = 0; i < 10000; ++i) {
    ASSERT_TRUE(budget.HasRoom(1));
    budget.Opened(1);
  }
  EXPECT_EQ(budget.scans(), scans);
}

TEST(DescriptorBudgetTest, ItRefusesWhatWouldEatTheReserveAndSeesClosesWhenItScansAgain) {
  std::mt19937 rng(static_cast<uint32_t>(std::random_device{}()));
  const int64_t baseline = OpenDescriptors();
  const int64_t limit = baseline + DescriptorReserveFor(baseline + 64) + 32 + rng() % 32;
  DescriptorBudget budget(limit, std::chrono::milliseconds(0));
  const int64_t room = limit - budget.reserve() - baseline;
  ASSERT_GT(room, 0);
  std::vector<int> fds;
  for (int64_t i = 0; i < room; ++i) {
    ASSERT_TRUE(budget.HasRoom(1)) << i << " of " << room;
    fds.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_GE(fds.back(), 0);
    budget.Opened(1);
  }
  EXPECT_FALSE(budget.HasRoom(1));
  // A descriptor number past the limit's room answers at once, whatever the count says.
  EXPECT_FALSE(budget.HasRoom(1, static_cast<int>(limit - budget.reserve())));
  for (int fd : fds) close(fd);
  EXPECT_TRUE(budget.HasRoom(1)) << "the closes were not seen by a new scan";
  EXPECT_TRUE(budget.HasRoom(room));
  EXPECT_FALSE(budget.HasRoom(room + 1));
}

}  // namespace
}  // namespace verifyd
