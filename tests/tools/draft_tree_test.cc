#include "tools/fake_scheduler/draft_tree.h"

#include <random>

#include "gtest/gtest.h"
#include "tools/fake_scheduler/input_generator.h"
#include "verify/tree_mask.h"

namespace verifyd::sched {
namespace {

TEST(DraftTreeTest, EveryKindIsAValidTreeOfTheAskedSize) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (TreeKind kind : {TreeKind::kChain, TreeKind::kBestFirst, TreeKind::kForest}) {
    for (int trial = 0; trial < 200; ++trial) {
      const int nodes = 1 + static_cast<int>(rng() % 300);
      const std::vector<int32_t> parents = MakeDraftTree(kind, nodes, rng);
      ASSERT_EQ(static_cast<int>(parents.size()), nodes);
      auto mask = TreeMask::FromParents(parents, 1024);
      ASSERT_TRUE(mask.ok()) << TreeKindName(kind) << ": " << mask.status();
      int roots = 0, max_depth = 0;
      for (int i = 0; i < nodes; ++i) {
        roots += parents[i] == -1;
        max_depth = std::max(max_depth, mask->depth()[i]);
      }
      if (kind == TreeKind::kChain) {
        EXPECT_EQ(max_depth, nodes - 1);
      } else if (kind == TreeKind::kBestFirst) {
        EXPECT_EQ(roots, 1);
        if (nodes >= 32) {
          EXPECT_LT(max_depth, nodes - 1) << "a best-first tree must branch";
        }
      } else if (nodes >= 5) {
        EXPECT_GE(roots, 2);
      }
    }
  }
}

TEST(DraftTreeTest, AcceptedPathsAreRootedChainsOfEveryLength) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<int> lengths(70, 0);
  for (int trial = 0; trial < 3000; ++trial) {
    const TreeKind kind = static_cast<TreeKind>(trial % 3);
    const std::vector<int32_t> parents = MakeDraftTree(kind, 8 + rng() % 57, rng);
    const std::vector<int32_t> path = PickAcceptedPath(parents, rng);
    ++lengths[path.size()];
    if (path.empty()) continue;
    EXPECT_EQ(parents[path[0]], -1);
    for (size_t k = 1; k < path.size(); ++k) ASSERT_EQ(parents[path[k]], path[k - 1]);
  }
  EXPECT_GT(lengths[0], 0) << "k = 0 (reject the whole tree) must occur";
  EXPECT_GT(lengths[1], 0);
  int long_paths = 0;
  for (int k = 5; k < 70; ++k) long_paths += lengths[k];
  EXPECT_GT(long_paths, 100);
}

TEST(DraftTreeTest, SameSeedSameTrees) {
  std::mt19937_64 a(42), b(42);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(MakeDraftTree(TreeKind::kForest, 100, a), MakeDraftTree(TreeKind::kForest, 100, b));
  }
}

TEST(InputGeneratorTest, RowsAreDeterministicDistinctAndInRange) {
  std::vector<bf16_bits> a(576), b(576), c(576);
  const uint64_t seed = std::random_device{}();
  FillRow({RowKey::kQuery, seed, 3, 1, 7, 2, 5}, 2.0f, absl::MakeSpan(a));
  FillRow({RowKey::kQuery, seed, 3, 1, 7, 2, 5}, 2.0f, absl::MakeSpan(b));
  FillRow({RowKey::kQuery, seed, 3, 1, 7, 2, 6}, 2.0f, absl::MakeSpan(c));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double sum = 0, sq = 0;
  for (bf16_bits v : a) {
    const float f = Bf16ToFloat(v);
    ASSERT_LE(std::fabs(f), 2.0f);
    sum += f;
    sq += f * f;
  }
  // Uniform on [-2, 2]: mean 0, variance 4/3.
  EXPECT_NEAR(sum / 576, 0.0, 0.25);
  EXPECT_NEAR(sq / 576, 4.0 / 3, 0.3);
}

}  // namespace
}  // namespace verifyd::sched
