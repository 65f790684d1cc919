#include "kvstore/kv_storage.h"

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

}  // namespace
}  // namespace verifyd
