#include "kvstore/slot_copy_check.h"

#include <random>
#include <set>

#include "gtest/gtest.h"

namespace verifyd {
namespace {

// The contract, written the obvious way.
bool NaiveOk(const std::vector<int32_t>& src, const std::vector<int32_t>& dst, int64_t capacity) {
  if (src.size() != dst.size()) return false;
  for (int32_t s : src) {
    if (s < 0 || s >= capacity) return false;
  }
  std::set<int32_t> seen;
  for (int32_t d : dst) {
    if (d < 0 || d >= capacity || !seen.insert(d).second) return false;
  }
  for (int32_t s : src) {
    if (seen.count(s)) return false;
  }
  return true;
}

TEST(SlotCopyCheckTest, NamesTheOffendingEntry) {
  SlotCopyCheck check(16);
  EXPECT_EQ(check.Check({1, 2}, {3}).message(), "dst has 1 slots, must equal src's 2");
  EXPECT_EQ(check.Check({1, 16}, {3, 4}).message(), "src[1] = 16 must be in [0, 16)");
  EXPECT_EQ(check.Check({1, 2}, {-1, 4}).message(), "dst[0] = -1 must be in [0, 16)");
  EXPECT_EQ(check.Check({1, 2}, {5, 5}).message(), "dst lists slot 5 twice");
  EXPECT_EQ(check.Check({1, 2}, {2, 5}).message(),
            "src[1] = 2 is also a destination; src and dst must be disjoint");
  EXPECT_TRUE(check.Check({}, {}).ok());
  // A later call does not see an earlier call's destinations.
  EXPECT_TRUE(check.Check({1, 2}, {3, 4}).ok());
  EXPECT_TRUE(check.Check({3, 4}, {1, 2}).ok());
}

TEST(SlotCopyCheckTest, AgreesWithTheNaiveContractOnRandomRequests) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const int64_t capacity = 64;
  SlotCopyCheck check(capacity);
  for (int trial = 0; trial < 20000; ++trial) {
    const int n = static_cast<int>(rng() % 8);
    std::vector<int32_t> src(n), dst(n + (rng() % 50 == 0 ? 1 : 0));
    for (auto& s : src) s = static_cast<int32_t>(rng() % (capacity + 1)) - (rng() % 100 == 0);
    for (auto& d : dst) d = static_cast<int32_t>(rng() % (capacity + 1));
    EXPECT_EQ(check.Check(src, dst).ok(), NaiveOk(src, dst, capacity)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace verifyd
