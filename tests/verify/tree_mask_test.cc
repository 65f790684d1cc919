#include "verify/tree_mask.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::TreeShape;
using ::testing::HasSubstr;

void ExpectInvalid(const std::vector<int32_t>& parents, int max_nodes, const std::string& message,
                   const char* field = "parents") {
  absl::StatusOr<TreeMask> mask = TreeMask::FromParents(parents, max_nodes, field);
  ASSERT_FALSE(mask.ok());
  EXPECT_EQ(mask.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mask.status().message()), HasSubstr(message));
}

TEST(TreeMaskTest, RejectsEmptyAndOversizedTrees) {
  ExpectInvalid({}, kMaxTreeNodes, "parents has 0 nodes, must be in [1, 1024]");
  ExpectInvalid(std::vector<int32_t>(9, -1), 8, "parents has 9 nodes, must be in [1, 8]");
  EXPECT_TRUE(TreeMask::FromParents(std::vector<int32_t>(8, -1), 8).ok());
}

TEST(TreeMaskTest, RejectsParentsThatDoNotPrecedeTheirNode) {
  ExpectInvalid({0}, 8, "parents[0] = 0 must be < 0");
  ExpectInvalid({-1, 0, 1, 5}, 8, "parents[3] = 5 must be < 3");
  ExpectInvalid({-1, 1}, 8, "parents[1] = 1 must be < 1");
  ExpectInvalid({-1, 0, -2}, 8, "parents[2] = -2 must be -1 (a root) or an index >= 0");
  ExpectInvalid({-1, 0, 7}, 8, "tree_parents[2] = 7 must be < 2", "tree_parents");
}

// The independent check: walk parent links node by node.
std::vector<int32_t> NaiveDepth(const std::vector<int32_t>& parents) {
  std::vector<int32_t> depth(parents.size(), 0);
  for (size_t i = 0; i < parents.size(); ++i)
    for (int32_t j = parents[i]; j != -1; j = parents[j]) ++depth[i];
  return depth;
}

void ExpectMatchesNaiveWalk(const std::vector<int32_t>& parents) {
  const int n = static_cast<int>(parents.size());
  absl::StatusOr<TreeMask> mask = TreeMask::FromParents(parents, kMaxTreeNodes);
  ASSERT_TRUE(mask.ok()) << mask.status();
  ASSERT_EQ(mask->num_nodes(), n);
  ASSERT_EQ(mask->words_per_row(), (n + 63) / 64);
  const std::vector<uint64_t> naive = test::NaiveAncestorMask(parents);
  ASSERT_EQ(mask->bits(), naive);
  EXPECT_EQ(mask->depth(), NaiveDepth(parents));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(mask->row(i), mask->bits().data() + static_cast<size_t>(i) * mask->words_per_row());
    for (int j = 0; j < n; ++j) {
      const bool naive_bit =
          (naive[static_cast<size_t>(i) * mask->words_per_row() + j / 64] >> (j % 64)) & 1u;
      ASSERT_EQ(mask->Visible(i, j), naive_bit) << "i=" << i << " j=" << j;
    }
  }
}

TEST(TreeMaskTest, ChainSeesEveryEarlierNode) {
  std::mt19937_64 rng(1);
  const std::vector<int32_t> parents = test::MakeParents(TreeShape::kChain, 130, rng);
  absl::StatusOr<TreeMask> mask = TreeMask::FromParents(parents, kMaxTreeNodes);
  ASSERT_TRUE(mask.ok());
  for (int i = 0; i < 130; ++i) {
    EXPECT_EQ(mask->depth()[i], i);
    for (int j = 0; j < 130; ++j) ASSERT_EQ(mask->Visible(i, j), j <= i) << i << "," << j;
  }
  ExpectMatchesNaiveWalk(parents);
}

TEST(TreeMaskTest, StarSeesOnlyRootAndItself) {
  std::mt19937_64 rng(1);
  const std::vector<int32_t> parents = test::MakeParents(TreeShape::kStar, 100, rng);
  absl::StatusOr<TreeMask> mask = TreeMask::FromParents(parents, kMaxTreeNodes);
  ASSERT_TRUE(mask.ok());
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(mask->depth()[i], i == 0 ? 0 : 1);
    for (int j = 0; j < 100; ++j) ASSERT_EQ(mask->Visible(i, j), j == i || j == 0) << i << "," << j;
  }
}

TEST(TreeMaskTest, HandBuiltForest) {
  // Two trees: 0 -> {1, 3}, 1 -> 4; 2 -> 5.
  const std::vector<int32_t> parents = {-1, 0, -1, 0, 1, 2};
  absl::StatusOr<TreeMask> mask = TreeMask::FromParents(parents, 8);
  ASSERT_TRUE(mask.ok());
  const std::vector<uint64_t> expected = {0b1, 0b11, 0b100, 0b1001, 0b10011, 0b100100};
  EXPECT_EQ(mask->bits(), expected);
  EXPECT_EQ(mask->depth(), (std::vector<int32_t>{0, 1, 0, 1, 2, 1}));
}

TEST(TreeMaskTest, RandomShapesMatchNaiveWalk) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (TreeShape shape :
       {TreeShape::kChain, TreeShape::kStar, TreeShape::kForest, TreeShape::kRandom}) {
    for (int n : {1, 2, 63, 64, 65, 127, 128, 129, 257, 1000, 1024}) {
      SCOPED_TRACE(testing::Message() << "shape=" << static_cast<int>(shape) << " n=" << n);
      ExpectMatchesNaiveWalk(test::MakeParents(shape, n, rng));
    }
  }
}

}  // namespace
}  // namespace verifyd
