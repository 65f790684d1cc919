#include "kvstore/kv_storage.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

using testing_kv::HashedRows;

TEST(HostKvStorageTest, WrittenRowsReadBackPerLayerAndLayersAreIndependent) {
  HostKvStorage storage(3, 16);
  const std::vector<int32_t> slots = {9, 2, 15, 0};
  for (int layer = 0; layer < 3; ++layer) {
    const std::vector<bf16_bits> rows = HashedRows(100 + layer, 4);
    ASSERT_TRUE(storage.WriteRows(layer, slots, rows.data()).ok());
  }
  for (int layer = 0; layer < 3; ++layer) {
    const std::vector<bf16_bits> expected = HashedRows(100 + layer, 4);
    std::vector<bf16_bits> out(expected.size());
    ASSERT_TRUE(storage.ReadRows(layer, slots, out.data()).ok());
    EXPECT_EQ(out, expected) << "layer " << layer;
    // layer_data is [slot][576]: row k sits at slots[k] * 576.
    for (size_t k = 0; k < slots.size(); ++k) {
      EXPECT_TRUE(std::equal(expected.begin() + k * kKvDim, expected.begin() + (k + 1) * kKvDim,
                             storage.layer_data(layer) + slots[k] * kKvDim));
    }
  }
}

TEST(HostKvStorageTest, CopySlotsMovesEveryLayer) {
  HostKvStorage storage(2, 8);
  const std::vector<int32_t> src = {1, 2, 5};
  const std::vector<int32_t> dst = {7, 0, 3};
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE(storage.WriteRows(layer, src, HashedRows(7 + layer, 3).data()).ok());
  }
  ASSERT_TRUE(storage.CopySlots(src, dst).ok());
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<bf16_bits> out(3 * kKvDim);
    ASSERT_TRUE(storage.ReadRows(layer, dst, out.data()).ok());
    EXPECT_EQ(out, HashedRows(7 + layer, 3));
  }
}

TEST(HostKvStorageTest, BoundsAreCheckedAndNamed) {
  HostKvStorage storage(2, 8);
  const std::vector<bf16_bits> row = HashedRows(1, 1);
  const std::vector<int32_t> bad_slot = {8};
  const std::vector<int32_t> good_slot = {3};
  absl::Status status = storage.WriteRows(0, bad_slot, row.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("slots[0] = 8 must be in [0, 8)"), std::string::npos) << status;
  EXPECT_EQ(storage.WriteRows(2, good_slot, row.data()).code(), absl::StatusCode::kInvalidArgument);
  std::vector<bf16_bits> out(kKvDim);
  EXPECT_EQ(storage.ReadRows(-1, good_slot, out.data()).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> negative = {-1};
  EXPECT_EQ(storage.ReadRows(0, negative, out.data()).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> src = {1, 2};
  const std::vector<int32_t> overlapping = {2, 4};
  const std::vector<int32_t> repeated = {4, 4};
  const std::vector<int32_t> short_dst = {4};
  EXPECT_EQ(storage.CopySlots(src, overlapping).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(storage.CopySlots(src, repeated).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(storage.CopySlots(src, short_dst).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(storage.CopySlots(src, bad_slot).code(), absl::StatusCode::kInvalidArgument);
}

// Random disjoint runs on a pool with every row written: the result must equal copying the same
// rows one slot at a time, and every other row must stay as it was.
TEST(HostKvStorageTest, CopyRunsEqualsCopyingEachSlotOfEveryLayer) {
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(testing::Message() << "VERIFYD_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  const int layers = 3;
  const int64_t capacity = 400;
  for (int trial = 0; trial < 50; ++trial) {
    HostKvStorage storage(layers, capacity);
    std::vector<std::vector<bf16_bits>> expected(layers);
    for (int layer = 0; layer < layers; ++layer) {
      std::vector<int32_t> all(capacity);
      for (int32_t s = 0; s < capacity; ++s) all[s] = s;
      expected[layer] = HashedRows(rng(), capacity);
      ASSERT_TRUE(storage.WriteRows(layer, all, expected[layer].data()).ok());
    }
    const std::vector<SlotRunCopy> runs = testing_kv::RandomDisjointRuns(rng, capacity, 12);
    for (int layer = 0; layer < layers; ++layer) {
      testing_kv::CopyRunsReference(runs, expected[layer]);
    }
    ASSERT_TRUE(storage.CopyRuns(runs).ok());
    ASSERT_TRUE(storage.WaitForCopies().ok());
    for (int layer = 0; layer < layers; ++layer) {
      ASSERT_TRUE(
          std::equal(expected[layer].begin(), expected[layer].end(), storage.layer_data(layer)))
          << "trial " << trial << " layer " << layer;
    }
  }
}

TEST(HostKvStorageTest, MalformedRunsAreRefusedAndChangeNothing) {
  HostKvStorage storage(2, 16);
  std::vector<int32_t> all(16);
  for (int32_t s = 0; s < 16; ++s) all[s] = s;
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE(storage.WriteRows(layer, all, HashedRows(40 + layer, 16).data()).ok());
  }
  const std::vector<std::vector<SlotRunCopy>> bad = {
      {{0, 8, 0}},              // empty run
      {{0, 14, 3}},             // destination past the end
      {{-1, 8, 2}},             // source before the start
      {{0, 8, 4}, {4, 10, 2}},  // destinations overlap
      {{0, 4, 4}, {6, 10, 2}},  // a source range meets a destination range
  };
  for (const auto& runs : bad) {
    EXPECT_EQ(storage.CopyRuns(runs).code(), absl::StatusCode::kInvalidArgument);
  }
  for (int layer = 0; layer < 2; ++layer) {
    const std::vector<bf16_bits> rows = HashedRows(40 + layer, 16);
    EXPECT_TRUE(std::equal(rows.begin(), rows.end(), storage.layer_data(layer)));
  }
}

}  // namespace
}  // namespace verifyd
