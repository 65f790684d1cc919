// The shared test library checks itself: problems are laid out as documented, and the float64
// oracle agrees with softmax attention written out by hand.
#include "tests/testing/problem_builder.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

class ProblemBuilderTest : public ::testing::Test {
 protected:
  const uint64_t seed_ = TestSeed();
  const ::testing::ScopedTrace trace_{__FILE__, __LINE__,
                                      testing::Message() << "VERIFYD_TEST_SEED=" << seed_};
};

TEST_F(ProblemBuilderTest, ParentsHaveTheirShape) {
  std::mt19937_64 rng(seed_);
  for (TreeShape shape :
       {TreeShape::kChain, TreeShape::kStar, TreeShape::kForest, TreeShape::kRandom}) {
    for (int n : {1, 2, 9, 257}) {
      const std::vector<int32_t> parents = MakeParents(shape, n, rng);
      ASSERT_EQ(parents.size(), static_cast<size_t>(n));
      EXPECT_EQ(parents[0], -1);
      int roots = 0;
      for (int i = 0; i < n; ++i) {
        ASSERT_GE(parents[i], -1);
        ASSERT_LT(parents[i], i);
        roots += parents[i] == -1;
        if (i == 0) continue;
        if (shape == TreeShape::kChain) {
          EXPECT_EQ(parents[i], i - 1);
        } else if (shape == TreeShape::kStar) {
          EXPECT_EQ(parents[i], 0);
        }
      }
      if (shape != TreeShape::kForest) {
        EXPECT_EQ(roots, 1);
      } else if (n > 1) {
        EXPECT_GE(roots, 2);
      }
    }
  }
}

TEST_F(ProblemBuilderTest, NaiveAncestorMaskOfAHandBuiltTree) {
  // 0 -> 1 -> 2, 0 -> 3, and a second root 4.
  EXPECT_EQ(NaiveAncestorMask(std::vector<int32_t>{-1, 0, 1, 0, -1}),
            (std::vector<uint64_t>{0b1, 0b11, 0b111, 0b1001, 0b10000}));
  std::vector<int32_t> chain(70);
  for (int i = 0; i < 70; ++i) chain[i] = i - 1;
  const std::vector<uint64_t> bits = NaiveAncestorMask(chain);
  ASSERT_EQ(bits.size(), 140u);
  EXPECT_EQ(bits[2 * 69], ~uint64_t{0});
  EXPECT_EQ(bits[2 * 69 + 1], (uint64_t{1} << 6) - 1);
}

TEST_F(ProblemBuilderTest, LayoutMatchesTheSpecs) {
  const std::vector<SequenceSpec> seqs = {{10, 3, TreeShape::kChain}, {0, 70, TreeShape::kForest}};
  for (bool scattered : {false, true}) {
    HostProblem hp = MakeRandomProblem(seqs, 3, seed_, scattered, /*extra_slots=*/11);
    EXPECT_EQ(hp.num_slots, 83 + 11);
    EXPECT_EQ(hp.qo_indptr, (std::vector<int32_t>{0, 3, 73}));
    EXPECT_EQ(hp.slot_indptr, (std::vector<int32_t>{0, 13, 83}));
    EXPECT_EQ(hp.mask_indptr, (std::vector<int32_t>{0, 3, 143}));
    EXPECT_FLOAT_EQ(hp.scale, 1 / std::sqrt(192.f));
    ASSERT_EQ(hp.kv.size(), 94u * kKvDim);
    ASSERT_EQ(hp.q.size(), 73u * 3 * kKvDim);
    ASSERT_EQ(hp.out.size(), 73u * 3 * kVDim);
    ASSERT_EQ(hp.lse.size(), 73u * 3);
    EXPECT_TRUE(std::all_of(hp.out.begin(), hp.out.end(), [](bf16_bits b) { return b == 0xFFFF; }));
    EXPECT_TRUE(std::all_of(hp.lse.begin(), hp.lse.end(), [](float x) { return std::isnan(x); }));
    const std::set<int32_t> distinct(hp.slots.begin(), hp.slots.end());
    EXPECT_EQ(distinct.size(), hp.slots.size()) << "a slot is used twice";
    EXPECT_GE(*distinct.begin(), 0);
    EXPECT_LT(*distinct.rbegin(), hp.num_slots);
    bool consecutive = true;
    for (int k = 1; k < 13; ++k) consecutive &= hp.slots[k] == hp.slots[k - 1] + 1;
    for (int k = 14; k < 83; ++k) consecutive &= hp.slots[k] == hp.slots[k - 1] + 1;
    EXPECT_EQ(consecutive, !scattered);
    const VerifyProblem p = hp.problem();
    EXPECT_EQ(p.batch, 2);
    EXPECT_EQ(p.total_q, 73);
    EXPECT_EQ(p.lse, hp.lse.data());
    EXPECT_EQ(p.slots, hp.slots.data());
  }
}

TEST_F(ProblemBuilderTest, ValuesAreRandomAndScoresSpread) {
  HostProblem hp = MakeRandomProblem({{2000, 1, TreeShape::kChain}}, 4, seed_, true);
  float kv_max = 0;
  int kv_zero = 0;
  for (bf16_bits b : hp.kv) {
    kv_max = std::max(kv_max, std::abs(Bf16ToFloat(b)));
    kv_zero += Bf16ToFloat(b) == 0.f;
  }
  EXPECT_LE(kv_max, 1.f);
  EXPECT_GT(kv_max, 0.99f);
  EXPECT_LT(kv_zero, 20);
  // Scores of head 0 over the prefix: std between 1 and 3, as documented.
  double sum = 0, sum2 = 0;
  for (int t = 0; t < 2000; ++t) {
    double dot = 0;
    for (int d = 0; d < kKvDim; ++d)
      dot +=
          Bf16ToFloat(hp.q[d]) * Bf16ToFloat(hp.kv[static_cast<size_t>(hp.slots[t]) * kKvDim + d]);
    sum += hp.scale * dot;
    sum2 += hp.scale * dot * hp.scale * dot;
  }
  const double std_dev = std::sqrt(sum2 / 2000 - (sum / 2000) * (sum / 2000));
  EXPECT_GT(std_dev, 1.0);
  EXPECT_LT(std_dev, 3.0);
}

TEST_F(ProblemBuilderTest, OracleMatchesHandWrittenSoftmax) {
  // Forest {-1, 0, -1}: node 2 sees the prefix and itself only; node 1 sees the prefix, 0 and 1.
  HostProblem hp = MakeRandomProblem({{2, 3, TreeShape::kChain}}, 2, seed_, true, 4);
  hp.parents[0] = {-1, -1, 1};
  hp.mask_bits = NaiveAncestorMask(hp.parents[0]);
  std::vector<double> out, lse;
  ComputeVerifyF64(hp.problem(), &out, &lse);
  auto kv = [&](int col, int d) {
    return double{Bf16ToFloat(hp.kv[static_cast<size_t>(hp.slots[col]) * kKvDim + d])};
  };
  // Visible columns (prefix 0,1 then tree nodes at columns 2,3,4) per node.
  const std::vector<std::vector<int>> visible = {{0, 1, 2}, {0, 1, 3}, {0, 1, 3, 4}};
  for (int node = 0; node < 3; ++node) {
    for (int h = 0; h < 2; ++h) {
      std::vector<double> e;
      double denom = 0;
      for (int col : visible[node]) {
        double dot = 0;
        for (int d = 0; d < kKvDim; ++d)
          dot += Bf16ToFloat(hp.q[(node * 2 + h) * kKvDim + d]) * kv(col, d);
        e.push_back(std::exp(hp.scale * dot));
        denom += e.back();
      }
      const int r = node * 2 + h;
      EXPECT_NEAR(lse[r], std::log(denom), 1e-12);
      for (int d = 0; d < kVDim; ++d) {
        double o = 0;
        for (size_t k = 0; k < e.size(); ++k) o += e[k] / denom * kv(visible[node][k], d);
        ASSERT_NEAR(out[r * kVDim + d], o, 1e-12) << "node " << node << " head " << h << " d " << d;
      }
    }
  }
}

TEST_F(ProblemBuilderTest, ContiguousRelayoutKeepsTheProblem) {
  HostProblem hp = MakeRandomProblem({{40, 5, TreeShape::kRandom}, {3, 9, TreeShape::kStar}}, 2,
                                     seed_, true, 20);
  HostProblem c = WithContiguousSlots(hp);
  EXPECT_EQ(c.num_slots, hp.num_slots);
  for (size_t k = 0; k < c.slots.size(); ++k) ASSERT_EQ(c.slots[k], static_cast<int32_t>(k));
  std::vector<double> out1, lse1, out2, lse2;
  ComputeVerifyF64(hp.problem(), &out1, &lse1);
  ComputeVerifyF64(c.problem(), &out2, &lse2);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(lse1, lse2);
  // Pool rows nobody referenced are kept too (a multiset of rows is preserved).
  std::multiset<std::vector<bf16_bits>> rows1, rows2;
  for (int64_t s = 0; s < hp.num_slots; ++s) {
    rows1.insert({hp.kv.begin() + s * kKvDim, hp.kv.begin() + (s + 1) * kKvDim});
    rows2.insert({c.kv.begin() + s * kKvDim, c.kv.begin() + (s + 1) * kKvDim});
  }
  EXPECT_EQ(rows1, rows2);
}

TEST_F(ProblemBuilderTest, RelativeErrorFlagsNonFiniteAndMismatch) {
  const std::vector<double> ref = {3.0, -4.0};
  EXPECT_DOUBLE_EQ(RelativeError(std::vector<float>{3.0f, -4.0f}, ref), 0.0);
  EXPECT_DOUBLE_EQ(RelativeError(std::vector<float>{3.0f, -3.0f}, ref), 0.2);
  EXPECT_DOUBLE_EQ(RelativeError(std::vector<bf16_bits>{FloatToBf16(0.f), FloatToBf16(-4.f)}, ref),
                   0.6);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(RelativeError(std::vector<float>{3.0f, std::nanf("")}, ref), inf);
  EXPECT_EQ(RelativeError(std::vector<float>{3.0f, std::numeric_limits<float>::infinity()}, ref),
            inf);
  EXPECT_EQ(RelativeError(std::vector<bf16_bits>{0xFFFF, FloatToBf16(-4.f)}, ref), inf);
  EXPECT_EQ(RelativeError(std::vector<float>{3.0f}, ref), inf);
}

}  // namespace
}  // namespace verifyd::test
