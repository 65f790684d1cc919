// The KV slot writer puts each new row exactly into its slot and touches no other slot.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_verify_launch.h"
#include "tests/kernels/device_problem.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

TEST(KvSlotWrite, WritesRowsIntoTheirSlotsOnly) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> bits(0, 0xFFFF);
  const int64_t num_slots = 5000;
  const int num_rows = 777;
  std::vector<bf16_bits> pool(num_slots * kKvDim), rows(size_t{num_rows} * kKvDim);
  for (auto& x : pool) x = static_cast<bf16_bits>(bits(rng));
  for (auto& x : rows) x = static_cast<bf16_bits>(bits(rng));
  std::vector<int32_t> perm(num_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> slots(perm.begin(), perm.begin() + num_rows);

  DeviceBuffer d_pool, d_rows, d_slots;
  ASSERT_TRUE(d_pool.Allocate(pool.size() * 2).ok() &&
              d_pool.Upload(pool.data(), pool.size() * 2).ok());
  ASSERT_TRUE(d_rows.Allocate(rows.size() * 2).ok() &&
              d_rows.Upload(rows.data(), rows.size() * 2).ok());
  ASSERT_TRUE(d_slots.Allocate(slots.size() * 4).ok() &&
              d_slots.Upload(slots.data(), slots.size() * 4).ok());
  ASSERT_TRUE(LaunchKvSlotWrite(static_cast<bf16_bits*>(d_pool.get()), num_slots,
                                static_cast<const bf16_bits*>(d_rows.get()),
                                static_cast<const int32_t*>(d_slots.get()), num_rows, nullptr)
                  .ok());
  std::vector<bf16_bits> result(pool.size());
  ASSERT_EQ(cudaMemcpy(result.data(), d_pool.get(), result.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);

  std::vector<bf16_bits> expected = pool;
  for (int i = 0; i < num_rows; ++i) {
    std::copy_n(rows.begin() + static_cast<size_t>(i) * kKvDim, kKvDim,
                expected.begin() + size_t(slots[i]) * kKvDim);
  }
  EXPECT_TRUE(result == expected);
}

TEST(KvSlotWrite, RejectsMissingPointers) {
  EXPECT_FALSE(LaunchKvSlotWrite(nullptr, 10, nullptr, nullptr, 3, nullptr).ok());
  EXPECT_FALSE(LaunchKvSlotWrite(nullptr, 10, nullptr, nullptr, -1, nullptr).ok());
}

}  // namespace
}  // namespace verifyd::test
