// The split planner (host code, runs without a GPU): every row block's columns are covered exactly
// once, in order, by tile-aligned splits; partials and combine items line up; the SMs are filled.
#include "kernels/split_planner.h"

#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_dims.h"

namespace verifyd {
namespace {

void CheckCoverage(const SplitPlan& plan, const std::vector<int32_t>& L,
                   const std::vector<int32_t>& Q, int heads) {
  std::map<std::pair<int, int>, std::vector<FlashWorkItem>> by_block;
  for (const FlashWorkItem& w : plan.work) by_block[{w.seq, w.row_begin}].push_back(w);
  size_t expected_blocks = 0;
  for (size_t b = 0; b < L.size(); ++b)
    expected_blocks += (size_t(Q[b]) * heads + kFlashBlockRows - 1) / kFlashBlockRows;
  ASSERT_EQ(by_block.size(), expected_blocks);
  std::vector<int> partial_seen(plan.num_partials, 0);
  for (const auto& [key, items] : by_block) {
    const int cols = L[key.first] + Q[key.first];
    int next = 0;
    for (const FlashWorkItem& w : items) {
      EXPECT_EQ(w.col_begin, next);
      EXPECT_EQ(w.col_begin % kFlashBlockCols, 0);
      EXPECT_GT(w.col_end, w.col_begin);
      next = w.col_end;
      if (items.size() == 1) {
        EXPECT_EQ(w.partial, -1);
      } else {
        ASSERT_GE(w.partial, 0);
        ASSERT_LT(w.partial, plan.num_partials);
        ++partial_seen[w.partial];
      }
    }
    EXPECT_EQ(next, cols);
  }
  for (int seen : partial_seen) EXPECT_EQ(seen, 1);
  for (const CombineItem& c : plan.combine) {
    const auto& items = by_block.at({c.seq, c.row_begin});
    ASSERT_EQ(c.num_splits, static_cast<int>(items.size()));
    for (int s = 0; s < c.num_splits; ++s) EXPECT_EQ(items[s].partial, c.partial_begin + s);
  }
}

TEST(SplitPlanner, CoversEveryColumnOnceForRandomBatches) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + rng() % 6;
    const int heads = std::vector<int>{1, 8, 16, 64, 128}[rng() % 5];
    std::vector<int32_t> L(batch), Q(batch);
    for (int b = 0; b < batch; ++b) {
      L[b] = std::vector<int>{0, 1, 63, 64, 1000, 65536}[rng() % 6];
      Q[b] = std::vector<int>{1, 9, 16, 33, 64, 257, 1024}[rng() % 7];
    }
    const int sms = 1 + rng() % 200;
    auto plan = PlanSplits(L, Q, heads, sms);
    ASSERT_TRUE(plan.ok()) << plan.status();
    CheckCoverage(*plan, L, Q, heads);
  }
}

TEST(SplitPlanner, FillsTheSmsOnSpecShapes) {
  struct Shape {
    int batch, heads, q, l;
  };
  // S1..S7 of SPEC §5 on an H200's 132 SMs: at least 90% of a whole number of waves is busy.
  for (const Shape& s : {Shape{1, 8, 16, 65536}, Shape{1, 64, 9, 16384}, Shape{1, 64, 33, 65536},
                         Shape{8, 16, 16, 8192}, Shape{32, 8, 8, 4096}, Shape{1, 128, 64, 131072},
                         Shape{1, 8, 16, 262144}}) {
    std::vector<int32_t> L(s.batch, s.l), Q(s.batch, s.q);
    auto plan = PlanSplits(L, Q, s.heads, 132);
    ASSERT_TRUE(plan.ok());
    const double items = plan->work.size();
    const double waves = std::ceil(items / 132);
    EXPECT_GE(items / (waves * 132), 0.9)
        << "B=" << s.batch << " H=" << s.heads << " items=" << items;
  }
}

TEST(SplitPlanner, RejectsBadShapesNamingTheField) {
  auto bad_q = PlanSplits(std::vector<int32_t>{0}, std::vector<int32_t>{kMaxTreeNodes + 1}, 8, 132);
  ASSERT_FALSE(bad_q.ok());
  EXPECT_NE(bad_q.status().message().find("q_len[0] = 1025"), std::string::npos) << bad_q.status();
  auto bad_l = PlanSplits(std::vector<int32_t>{5, -1}, std::vector<int32_t>{1, 1}, 8, 132);
  ASSERT_FALSE(bad_l.ok());
  EXPECT_NE(bad_l.status().message().find("prefix_len[1] = -1"), std::string::npos)
      << bad_l.status();
  EXPECT_FALSE(PlanSplits(std::vector<int32_t>{}, std::vector<int32_t>{}, 8, 132).ok());
  EXPECT_FALSE(PlanSplits(std::vector<int32_t>{0}, std::vector<int32_t>{1}, 0, 132).ok());
}

TEST(SplitPlanner, WorkspaceRegionsAreAlignedAndDisjoint) {
  auto plan = PlanSplits(std::vector<int32_t>{65536, 100}, std::vector<int32_t>{16, 9}, 8, 132);
  ASSERT_TRUE(plan.ok());
  const WorkspaceLayout layout = LayoutWorkspace(*plan);
  EXPECT_EQ(layout.combine_offset % 256, 0u);
  EXPECT_EQ(layout.partial_o_offset % 256, 0u);
  EXPECT_EQ(layout.partial_lse_offset % 256, 0u);
  EXPECT_GE(layout.combine_offset, plan->work.size() * sizeof(FlashWorkItem));
  EXPECT_GE(layout.partial_lse_offset - layout.partial_o_offset,
            size_t(plan->num_partials) * kFlashBlockRows * kVDim * sizeof(float));
  EXPECT_GE(layout.total_bytes - layout.partial_lse_offset,
            size_t(plan->num_partials) * kFlashBlockRows * 4);
  EXPECT_EQ(PackPlan(*plan, layout).size(), layout.partial_o_offset);
}

}  // namespace
}  // namespace verifyd
