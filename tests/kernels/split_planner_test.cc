// The split planner (host code, runs without a GPU): every row block's columns are covered exactly
// once, in order, by tile-aligned splits; partials and combine items line up; the SMs are filled.
#include "kernels/split_planner.h"

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "verify/mla_dims.h"

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

TEST(SplitPlanner, PlanningTilesRoundsUpToAnEighthOfThePowerOfTwo) {
  for (int64_t t = 1; t <= 16; ++t) EXPECT_EQ(PlanningTiles(t), t);
  EXPECT_EQ(PlanningTiles(17), 18);  // band of 2 in [16, 32)
  EXPECT_EQ(PlanningTiles(2048), 2048);
  EXPECT_EQ(PlanningTiles(2049), 2304);  // band of 256 in [2048, 4096)
  for (int64_t t = 1; t < 100000; t += 37) {
    const int64_t p = PlanningTiles(t);
    EXPECT_GE(p, t);
    EXPECT_LE(p, t + t / 8 + 1) << t;
    EXPECT_EQ(PlanningTiles(p), p) << t;  // a band's top is its own band
  }
}

// A decode loop: L grows a few tokens per step. Inside a band the plan's shape (what a CUDA graph
// bakes in) must not change, or every step re-captures; across the whole range it changes only
// at band edges.
TEST(SplitPlanner, ItemCountsStayFixedWhileThePrefixGrowsInsideABand) {
  std::mt19937_64 rng(7);
  for (const auto& [batch, heads, q] :
       {std::tuple{1, 8, 16}, std::tuple{1, 64, 9}, std::tuple{8, 16, 16}, std::tuple{4, 128, 8}}) {
    std::vector<int32_t> L(batch, 3000), Q(batch, q);
    for (int b = 0; b < batch; ++b) L[b] += static_cast<int32_t>(rng() % 5000);
    auto previous = PlanSplits(L, Q, heads, 132);
    ASSERT_TRUE(previous.ok());
    int changes = 0, steps = 0;
    for (; L[0] < 150000; ++steps) {
      std::vector<int64_t> bands_before;
      for (int b = 0; b < batch; ++b)
        bands_before.push_back(PlanningTiles((L[b] + q + kFlashBlockCols - 1) / kFlashBlockCols));
      for (int b = 0; b < batch; ++b) L[b] += 1 + static_cast<int32_t>(rng() % q);
      auto plan = PlanSplits(L, Q, heads, 132);
      ASSERT_TRUE(plan.ok());
      CheckCoverage(*plan, L, Q, heads);
      bool same_band = true;
      for (int b = 0; b < batch; ++b) {
        same_band &=
            bands_before[b] == PlanningTiles((L[b] + q + kFlashBlockCols - 1) / kFlashBlockCols);
      }
      const bool same_shape = plan->work.size() == previous->work.size() &&
                              plan->combine.size() == previous->combine.size() &&
                              plan->num_partials == previous->num_partials;
      if (same_band)
        EXPECT_TRUE(same_shape) << "L[0]=" << L[0] << " B=" << batch << " H=" << heads << " work "
                                << previous->work.size() << " -> " << plan->work.size();
      changes += !same_shape;
      previous = std::move(plan);
    }
    EXPECT_LT(changes * 20, steps) << "the plan's shape changed at " << changes << " of " << steps
                                   << " steps (B=" << batch << " H=" << heads << ")";
  }
}

TEST(SplitPlanner, FillsTheSmsOnSpecShapes) {
  struct Shape {
    int batch, heads, q, l;
  };
  // S1..S8 and SH of SPEC §5 on an H200's 132 SMs: at least 90% of a whole number of waves is
  // busy.
  for (const Shape& s :
       {Shape{1, 8, 16, 65536}, Shape{1, 64, 9, 16384}, Shape{1, 64, 33, 65536},
        Shape{8, 16, 16, 8192}, Shape{32, 8, 8, 4096}, Shape{1, 128, 64, 131072},
        Shape{1, 8, 16, 262144}, Shape{1, 8, 128, 131072}, Shape{1, 8, 16, 185000}}) {
    std::vector<int32_t> L(s.batch, s.l), Q(s.batch, s.q);
    auto plan = PlanSplits(L, Q, s.heads, 132);
    ASSERT_TRUE(plan.ok());
    const double items = plan->work.size();
    const double waves = std::ceil(items / 132);
    EXPECT_GE(items / (waves * 132), 0.9)
        << "B=" << s.batch << " H=" << s.heads << " items=" << items;
  }
}

// One long sequence of two row blocks (S1, S7, SH: H = 8, a 16-node tree) is cut 66 ways, so its
// 132 items take every SM once: at 126 items (SH, before session 11) each CTA ran 46 tiles of 64
// columns where 44 would do.
TEST(SplitPlanner, TwoRowBlocksOfOneLongSequenceTakeEverySm) {
  for (int32_t l : {65536, 185000, 262144}) {
    auto plan = PlanSplits(std::vector<int32_t>{l}, std::vector<int32_t>{16}, 8, 132);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->work.size(), 132u) << "L=" << l;
    int longest = 0;
    for (const FlashWorkItem& w : plan->work) longest = std::max(longest, w.col_end - w.col_begin);
    // The longest item is within one 64-column tile of an even cut.
    EXPECT_LE(longest, (l + 16) / 66 + 64) << "L=" << l;
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
            size_t(plan->num_partials) * kFlashBlockRows * kVDim * sizeof(bf16_bits));
  EXPECT_GE(layout.total_bytes - layout.partial_lse_offset,
            size_t(plan->num_partials) * kFlashBlockRows * 4);
  EXPECT_EQ(PackPlan(*plan, layout).size(), layout.partial_o_offset);
}

}  // namespace
}  // namespace verifyd
