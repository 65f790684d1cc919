// The fp8 pool's device writers (kernels/kv_fp8_write.h, kernels/tree_kv_write.h) against the
// host quantizer QuantizeFp8Row (verify/kv_fp8_layout.h), byte for byte over the whole pool: each
// row lands quantized in its slot (random slot lists, edge-case rows: zero groups and -0, tiny and
// subnormal values, values that reach 448 after the division, saturation), a bad slot is skipped
// and no other byte of the pool changes. GPU tests: they skip without a device.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kv_fp8_write.h"
#include "kernels/tree_kv_write.h"
#include "tests/kernels/device_problem.h"
#include "tests/testing/fp8_test_rows.h"
#include "tests/testing/problem_builder.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

class KvFp8WriteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
    seed_ = TestSeed();
    rng_.seed(seed_);
  }
  // A pool of random bytes: a byte the kernels should not touch keeps its value.
  std::vector<uint8_t> RandomPool(int64_t slots) {
    std::vector<uint8_t> pool(static_cast<size_t>(slots) * kFp8RowBytes);
    for (uint8_t& b : pool) b = static_cast<uint8_t>(rng_());
    return pool;
  }
  std::vector<bf16_bits> EdgeRows(int count) { return RandomFp8EdgeRows(rng_, count); }
  std::vector<int32_t> DistinctSlots(int64_t capacity, int count) {
    std::vector<int32_t> all(static_cast<size_t>(capacity));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(static_cast<size_t>(count));
    return all;
  }
  template <typename T>
  DeviceBuffer Upload(const std::vector<T>& host) {
    DeviceBuffer d;
    EXPECT_TRUE(d.Allocate(std::max<size_t>(host.size() * sizeof(T), 16)).ok());
    EXPECT_TRUE(d.Upload(host.data(), host.size() * sizeof(T)).ok());
    return d;
  }
  std::vector<uint8_t> Download(const DeviceBuffer& d, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), d.get(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  // Every byte of the pool against `want`, naming the first difference's slot and byte.
  static void ExpectSamePool(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "slot " << i / kFp8RowBytes << " byte " << i % kFp8RowBytes;
    }
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_F(KvFp8WriteTest, SlotWriteQuantizesEachRowIntoItsSlotAsTheHostDoes) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int64_t capacity = 6000;
  for (const int num_rows : {1, 7, 8, 9, 777, 4096}) {
    std::vector<uint8_t> pool = RandomPool(capacity);
    const std::vector<bf16_bits> rows = EdgeRows(num_rows);
    std::vector<int32_t> slots = DistinctSlots(capacity, num_rows);
    // One out-of-range slot (when there are several rows): skipped, nothing written for it.
    const int skipped = num_rows > 1 ? static_cast<int>(rng_() % num_rows) : -1;
    if (skipped >= 0) slots[skipped] = static_cast<int32_t>(capacity + rng_() % 100);
    DeviceBuffer d_pool = Upload(pool), d_rows = Upload(rows), d_slots = Upload(slots);
    ASSERT_TRUE(LaunchKvSlotWriteFp8(static_cast<uint8_t*>(d_pool.get()), capacity,
                                     static_cast<const bf16_bits*>(d_rows.get()),
                                     static_cast<const int32_t*>(d_slots.get()), num_rows, nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int k = 0; k < num_rows; ++k) {
      if (k == skipped) continue;
      QuantizeFp8Row(rows.data() + static_cast<size_t>(k) * kKvDim,
                     pool.data() + static_cast<size_t>(slots[k]) * kFp8RowBytes);
    }
    SCOPED_TRACE("num_rows " + std::to_string(num_rows));
    ExpectSamePool(Download(d_pool, pool.size()), pool);
  }
}

// The edge cases one by one, each a whole group: zeros of both signs, -0 among tiny values, bf16
// subnormals only (scale a float32 subnormal), a value exactly 448 x scale, values just past it.
TEST_F(KvFp8WriteTest, NamedEdgeGroupsQuantizeAsTheHostDoes) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  std::vector<bf16_bits> rows = EdgeRows(6);
  auto group = [&](int row, int g) { return rows.data() + row * kKvDim + g * kFp8GroupSize; };
  for (int i = 0; i < kFp8GroupSize; ++i) {
    group(0, 0)[i] = (i % 2) ? 0x8000 : 0x0000;                    // +-0: scale 1, codes 0x00/0x80
    group(0, 1)[i] = i == 9 ? 0x8000 : static_cast<bf16_bits>(i);  // -0 and bf16 subnormals
    group(1, 2)[i] = static_cast<bf16_bits>(0x8001 + i % 3);       // negative subnormals only
    group(2, 3)[i] = FloatToBf16(i == 0 ? 448.f : -448.f * (i % 7) / 7);  // scale exactly 1
    group(3, 0)[i] = FloatToBf16(i == 64 ? -0x1.fep+15f : 0x1.fdp+15f);   // near 2^16: saturation
    group(4, 1)[i] = FloatToBf16(std::ldexp(1.f + (i % 16) / 16.f, -30 - i % 40));  // tiny
  }
  const std::vector<int32_t> slots = {3, 0, 5, 1, 4, 2};
  std::vector<uint8_t> pool = RandomPool(6);
  DeviceBuffer d_pool = Upload(pool), d_rows = Upload(rows), d_slots = Upload(slots);
  ASSERT_TRUE(LaunchKvSlotWriteFp8(static_cast<uint8_t*>(d_pool.get()), 6,
                                   static_cast<const bf16_bits*>(d_rows.get()),
                                   static_cast<const int32_t*>(d_slots.get()), 6, nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int k = 0; k < 6; ++k) {
    QuantizeFp8Row(rows.data() + k * kKvDim, pool.data() + slots[k] * kFp8RowBytes);
  }
  const std::vector<uint8_t> got = Download(d_pool, pool.size());
  ExpectSamePool(got, pool);
  // The rule's named outcomes, read from the device's bytes (row k is in slot slots[k]): row 0's
  // zero group has scale 1 and keeps -0 as 0x80; row 2's last group has amax 448, so scale 1 and
  // its 448 is the largest code.
  EXPECT_EQ(Fp8RowScale(got.data() + 3 * kFp8RowBytes, 0), 1.f);
  EXPECT_EQ(got[3 * kFp8RowBytes + 1], 0x80);
  EXPECT_EQ(Fp8RowScale(got.data() + 5 * kFp8RowBytes, 3), 1.f);
  EXPECT_EQ(got[5 * kFp8RowBytes + 3 * kFp8GroupSize], kE4m3MaxCode);
}

TEST_F(KvFp8WriteTest, EncodedRowsAreCopiedAsTheyAre) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int64_t capacity = 3000;
  const int num_rows = 1111;
  std::vector<uint8_t> pool = RandomPool(capacity);
  const std::vector<uint8_t> rows = RandomPool(num_rows);  // any bytes: the writer only moves them
  std::vector<int32_t> slots = DistinctSlots(capacity, num_rows);
  slots[17] = -1;  // skipped
  DeviceBuffer d_pool = Upload(pool), d_rows = Upload(rows), d_slots = Upload(slots);
  ASSERT_TRUE(LaunchFp8RowSlotWrite(static_cast<uint8_t*>(d_pool.get()), capacity,
                                    static_cast<const uint8_t*>(d_rows.get()),
                                    static_cast<const int32_t*>(d_slots.get()), num_rows, nullptr)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int k = 0; k < num_rows; ++k) {
    if (slots[k] < 0) continue;
    std::memcpy(pool.data() + static_cast<size_t>(slots[k]) * kFp8RowBytes,
                rows.data() + static_cast<size_t>(k) * kFp8RowBytes, kFp8RowBytes);
  }
  ExpectSamePool(Download(d_pool, pool.size()), pool);
}

// The tree-KV form: nodes of a random batch find their slots after each sequence's prefix in the
// call's slot lists.
TEST_F(KvFp8WriteTest, TreeWriteQuantizesEachNodeIntoItsListedSlot) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int64_t capacity = 20000;
  for (int round = 0; round < 6; ++round) {
    const int batch = 1 + static_cast<int>(rng_() % 9);
    std::vector<int32_t> qo_indptr = {0}, prefix_len, slot_indptr = {0};
    for (int b = 0; b < batch; ++b) {
      const int q = 1 + static_cast<int>(rng_() % (round == 5 ? 1024 : 100));
      prefix_len.push_back(static_cast<int32_t>(rng_() % 300));
      qo_indptr.push_back(qo_indptr.back() + q);
      slot_indptr.push_back(slot_indptr.back() + prefix_len.back() + q);
    }
    const int total_q = qo_indptr.back();
    // Distinct slots for every list entry; the prefix entries must not be written.
    const std::vector<int32_t> slots = DistinctSlots(capacity, slot_indptr.back());
    const std::vector<bf16_bits> rows = EdgeRows(total_q);
    std::vector<uint8_t> pool = RandomPool(capacity);
    DeviceBuffer d_pool = Upload(pool), d_rows = Upload(rows), d_qo = Upload(qo_indptr),
                 d_prefix = Upload(prefix_len), d_indptr = Upload(slot_indptr),
                 d_slots = Upload(slots);
    ASSERT_TRUE(LaunchTreeKvWriteFp8(static_cast<uint8_t*>(d_pool.get()), capacity,
                                     static_cast<const bf16_bits*>(d_rows.get()), total_q, batch,
                                     static_cast<const int32_t*>(d_qo.get()),
                                     static_cast<const int32_t*>(d_prefix.get()),
                                     static_cast<const int32_t*>(d_indptr.get()),
                                     static_cast<const int32_t*>(d_slots.get()), nullptr)
                    .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int b = 0; b < batch; ++b) {
      for (int i = 0; i < qo_indptr[b + 1] - qo_indptr[b]; ++i) {
        const int32_t slot = slots[slot_indptr[b] + prefix_len[b] + i];
        QuantizeFp8Row(rows.data() + static_cast<size_t>(qo_indptr[b] + i) * kKvDim,
                       pool.data() + static_cast<size_t>(slot) * kFp8RowBytes);
      }
    }
    SCOPED_TRACE("round " + std::to_string(round));
    ExpectSamePool(Download(d_pool, pool.size()), pool);
  }
}

TEST(KvFp8Write, RefusesBadArguments) {
  alignas(16) uint8_t pool[2 * kFp8RowBytes];
  alignas(16) bf16_bits rows[kKvDim];
  const int32_t slot = 0;
  EXPECT_FALSE(LaunchKvSlotWriteFp8(pool, 2, rows, &slot, -1, nullptr).ok());
  EXPECT_FALSE(LaunchKvSlotWriteFp8(nullptr, 2, rows, &slot, 1, nullptr).ok());
  EXPECT_FALSE(LaunchKvSlotWriteFp8(pool + 1, 2, rows, &slot, 1, nullptr).ok());
  EXPECT_FALSE(LaunchFp8RowSlotWrite(pool, 2, pool + 8, &slot, 1, nullptr).ok());
  EXPECT_TRUE(LaunchKvSlotWriteFp8(nullptr, 2, nullptr, nullptr, 0, nullptr).ok());
  EXPECT_FALSE(
      LaunchTreeKvWriteFp8(pool + 4, 2, rows, 1, 1, &slot, &slot, &slot, &slot, nullptr).ok());
  EXPECT_FALSE(
      LaunchTreeKvWriteFp8(pool, 2, rows, -1, 1, &slot, &slot, &slot, &slot, nullptr).ok());
}

}  // namespace
}  // namespace verifyd::test
