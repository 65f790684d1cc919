// SequenceModel's reference after prefill and commits equals the float64 oracle computed over the
// rows the sequence should hold, assembled here independently.
#include "tools/fake_scheduler/sequence_model.h"

#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/problem_builder.h"
#include "tools/fake_scheduler/draft_tree.h"
#include "tools/fake_scheduler/input_generator.h"
#include "verify/mla_dims.h"

namespace verifyd::sched {
namespace {

std::vector<bf16_bits> Rows(RowKey key, int count, float amplitude, bool vary_node) {
  std::vector<bf16_bits> out(static_cast<size_t>(count) * kKvDim);
  for (int i = 0; i < count; ++i) {
    RowKey k = key;
    (vary_node ? k.node : k.position) += i;
    FillRow(k, amplitude, absl::MakeSpan(out).subspan(i * kKvDim, kKvDim));
  }
  return out;
}

TEST(SequenceModelTest, ReferenceMatchesTheOracleAfterCommits) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  constexpr int kLayers = 2, kHeads = 3;
  const float scale = 0.0721f;
  SequenceModel model(5, kLayers);
  const int prefill = 20 + rng() % 50;
  std::vector<std::vector<bf16_bits>> expect(kLayers);  // rows in position order, per layer
  std::vector<bf16_bits> prefill_kv;
  for (int l = 0; l < kLayers; ++l) {
    expect[l] =
        Rows({RowKey::kPrefixKv, seed, 5, static_cast<uint64_t>(l), 0}, prefill, 1.f, false);
    prefill_kv.insert(prefill_kv.end(), expect[l].begin(), expect[l].end());
  }
  model.Append(prefill, prefill_kv);

  for (int step = 0; step < 4; ++step) {
    const int nodes = 3 + rng() % 40;
    const std::vector<int32_t> parents = MakeDraftTree(static_cast<TreeKind>(step % 3), nodes, rng);
    model.StartTree(parents);
    std::vector<std::vector<bf16_bits>> tree(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      tree[l] =
          Rows({RowKey::kTreeKv, seed, 5, static_cast<uint64_t>(l), static_cast<uint64_t>(step), 0},
               nodes, 1.f, true);
      model.SetTreeKv(l, tree[l]);
      std::vector<bf16_bits> q(static_cast<size_t>(nodes) * kHeads * kKvDim);
      for (int i = 0; i < nodes * kHeads; ++i) {
        FillRow({RowKey::kQuery, seed, 5, static_cast<uint64_t>(l), static_cast<uint64_t>(step),
                 static_cast<uint64_t>(i)},
                2.f, absl::MakeSpan(q).subspan(i * kKvDim, kKvDim));
      }
      std::vector<bf16_bits> out;
      std::vector<float> lse;
      ASSERT_TRUE(model.Reference(l, q, kHeads, scale, &out, &lse).ok());

      // The oracle's problem: expected prefix rows then the tree rows, contiguous.
      std::vector<bf16_bits> kv = expect[l];
      kv.insert(kv.end(), tree[l].begin(), tree[l].end());
      const int n = static_cast<int>(expect[l].size() / kKvDim);
      std::vector<int32_t> slots(n + nodes);
      std::iota(slots.begin(), slots.end(), 0);
      std::vector<uint64_t> mask = test::NaiveAncestorMask(parents);
      const int32_t qo[] = {0, nodes}, prefix[] = {n}, slot_ptr[] = {0, n + nodes},
                    mask_ptr[] = {0, static_cast<int32_t>(mask.size())};
      VerifyProblem p{kv.data(),    n + nodes, q.data(),   nullptr, nullptr, kHeads,
                      scale,        1,         nodes,      qo,      prefix,  slot_ptr,
                      slots.data(), mask_ptr,  mask.data()};
      std::vector<double> want, want_lse;
      test::ComputeVerifyF64(p, &want, &want_lse);
      EXPECT_LE(test::RelativeError(out, want), 1e-2) << "step " << step << " layer " << l;
      for (size_t k = 0; k < lse.size(); ++k) ASSERT_NEAR(lse[k], want_lse[k], 1e-3) << k;
    }
    const std::vector<int32_t> path = PickAcceptedPath(parents, rng);
    model.Commit(path);
    for (int l = 0; l < kLayers; ++l) {
      for (int32_t node : path) {
        expect[l].insert(expect[l].end(), tree[l].begin() + node * kKvDim,
                         tree[l].begin() + (node + 1) * kKvDim);
      }
    }
    ASSERT_EQ(model.committed(), static_cast<int64_t>(expect[0].size() / kKvDim));
  }
}

TEST(SequenceModelTest, RelativeErrorSeesNaNAndSizeMismatch) {
  std::vector<bf16_bits> a = {FloatToBf16(1.f), FloatToBf16(2.f)};
  std::vector<bf16_bits> b = {FloatToBf16(1.f), FloatToBf16(2.5f)};
  EXPECT_NEAR(RelativeError(b, a), 0.5 / std::sqrt(5.0), 1e-12);
  b[0] = 0x7fc0;  // NaN
  EXPECT_TRUE(std::isinf(RelativeError(b, a)));
  EXPECT_TRUE(std::isinf(RelativeError(absl::MakeSpan(a).subspan(1), a)));
}

}  // namespace
}  // namespace verifyd::sched
