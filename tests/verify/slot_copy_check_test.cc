#include "verify/slot_copy_check.h"

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

// The run contract, written the obvious way: expand to slots.
bool NaiveRunsOk(const std::vector<SlotRunCopy>& runs, int64_t capacity) {
  std::set<int64_t> dst;
  for (const SlotRunCopy& run : runs) {
    if (run.length < 1) return false;
    for (int64_t begin : {int64_t{run.src_begin}, int64_t{run.dst_begin}}) {
      if (begin < 0 || begin + run.length > capacity) return false;
    }
    for (int32_t i = 0; i < run.length; ++i) {
      if (!dst.insert(int64_t{run.dst_begin} + i).second) return false;
    }
  }
  for (const SlotRunCopy& run : runs) {
    for (int32_t i = 0; i < run.length; ++i) {
      if (dst.count(int64_t{run.src_begin} + i)) return false;
    }
  }
  return true;
}

TEST(SlotCopyCheckTest, RunsNameTheOffendingRun) {
  const SlotCopyCheck check(16);
  EXPECT_EQ(check.CheckRuns({{1, 4, 0}}).message(), "runs[0].length = 0 must be >= 1");
  EXPECT_EQ(check.CheckRuns({{1, 4, 2}, {14, 8, 3}}).message(),
            "runs[1].src_begin = 14 with length 3 must lie in [0, 16)");
  EXPECT_EQ(check.CheckRuns({{1, 8, 4}, {5, 11, 2}}).message(),
            "runs[1].dst_begin: the destination ranges of runs[0] and runs[1] overlap");
  EXPECT_EQ(check.CheckRuns({{1, 8, 4}, {12, 3, 2}}).message(),
            "runs[0].src_begin = 1: the source range meets the destination range of runs[1]; "
            "sources and destinations must be disjoint");
  EXPECT_TRUE(check.CheckRuns({}).ok());
  EXPECT_TRUE(check.CheckRuns({{1, 8, 4}, {1, 12, 4}}).ok());  // a source copied twice
}

TEST(SlotCopyCheckTest, RunsAgreeWithTheExpandedContractOnRandomRequests) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const int64_t capacity = 64;
  const SlotCopyCheck check(capacity);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<SlotRunCopy> runs(rng() % 5);
    for (SlotRunCopy& run : runs) {
      run.length = static_cast<int32_t>(rng() % 6) - (rng() % 50 == 0);
      run.src_begin = static_cast<int32_t>(rng() % (capacity + 2)) - 1;
      run.dst_begin = static_cast<int32_t>(rng() % (capacity + 2)) - 1;
    }
    const bool ok = check.CheckRuns(runs).ok();
    accepted += ok;
    EXPECT_EQ(ok, NaiveRunsOk(runs, capacity)) << "trial " << trial;
  }
  EXPECT_GT(accepted, 1000);  // both verdicts are exercised
}

}  // namespace
}  // namespace verifyd
