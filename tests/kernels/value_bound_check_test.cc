// SPEC §1 on the device (kernels/value_bound_check.h): the first out-of-bound element of a tensor
// with its value, exactly as the host's FirstOutOfBound finds it, and the NaN fill of a refused
// call's outputs, which leaves a clean call's outputs untouched.
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/value_bound_check.h"
#include "tests/kernels/device_problem.h"
#include "verify/value_bound.h"

namespace verifyd::test {
namespace {

// Random finite values inside [-2^16, 2^16] (every exponent up to 2^15, both signs).
std::vector<bf16_bits> InsideBound(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<int> exponent(0, 127 + 15), mantissa(0, 127), sign(0, 1);
  std::vector<bf16_bits> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = static_cast<bf16_bits>((sign(rng) << 15) | (exponent(rng) << 7) | mantissa(rng));
  }
  return v;
}

unsigned long long RunFirst(const std::vector<bf16_bits>& data) {
  DeviceBuffer d_data, d_first;
  EXPECT_TRUE(d_data.Allocate(data.size() * 2 + 16).ok());
  EXPECT_TRUE(d_data.Upload(data.data(), data.size() * 2).ok());
  EXPECT_TRUE(d_first.Allocate(8).ok());
  EXPECT_EQ(cudaMemset(d_first.get(), 0xff, 8), cudaSuccess);
  auto* first = static_cast<unsigned long long*>(d_first.get());
  EXPECT_TRUE(LaunchFirstOutOfBound(static_cast<const bf16_bits*>(d_data.get()),
                                    static_cast<int64_t>(data.size()), first, nullptr)
                  .ok());
  unsigned long long found = 0;
  EXPECT_EQ(cudaMemcpy(&found, first, 8, cudaMemcpyDeviceToHost), cudaSuccess);
  return found;
}

TEST(ValueBoundCheck, FindsTheFirstBadElementAndItsValueAsTheHostDoes) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Sizes around the 8-value words and the tail, and one past a full grid's stride.
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{577}, int64_t{16 * 8 * 576},
                    int64_t{1024 * 256 * 8 + 13}}) {
    std::vector<bf16_bits> data = InsideBound(rng, n);
    EXPECT_EQ(RunFirst(data), kNoneOutOfBound) << "n = " << n << ": a clean tensor";
    // Several bad values (+Inf, -Inf, NaN, just past 2^16, far past): the first one wins.
    const bf16_bits bad[] = {0x7F80, 0xFF80, 0x7FC1, 0x4781, 0xC900};
    std::uniform_int_distribution<int64_t> at(0, n - 1);
    for (int k = 0; k < 3; ++k) data[static_cast<size_t>(at(rng))] = bad[rng() % 5];
    const int64_t want = FirstOutOfBound(data.data(), n);
    ASSERT_GE(want, 0);
    const unsigned long long found = RunFirst(data);
    ASSERT_NE(found, kNoneOutOfBound) << "n = " << n;
    EXPECT_EQ(OutOfBoundIndex(found), want) << "n = " << n;
    EXPECT_EQ(OutOfBoundBits(found), data[static_cast<size_t>(want)]) << "n = " << n;
  }
  // 2^16 itself is inside; the next value up is not.
  EXPECT_EQ(RunFirst({kMaxInputMagnitudeBits, 0xC780}), kNoneOutOfBound);
  EXPECT_EQ(OutOfBoundIndex(RunFirst({kMaxInputMagnitudeBits, 0x4781})), 1);
}

// Two tensors in one launch (a verify call's q and tree_kv) answer exactly as two launches would:
// each its own first bad element and value, a clean one none, whichever is longer.
TEST(ValueBoundCheck, TwoTensorsInOneLaunchAnswerEachAsAlone) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const bf16_bits bad[] = {0x7F80, 0xFF80, 0x7FC1, 0x4781, 0xC900};
  for (auto [na, nb] : {std::pair<int64_t, int64_t>{16 * 8 * 576, 16 * 576},
                        {16 * 576 + 3, 33 * 64 * 576},
                        {577, 0}}) {
    for (int dirty = 0; dirty < 4; ++dirty) {  // bit 0: a has bad values, bit 1: b has
      std::vector<bf16_bits> a = InsideBound(rng, na), b = InsideBound(rng, nb);
      std::uniform_int_distribution<int64_t> at_a(0, na - 1), at_b(0, nb > 0 ? nb - 1 : 0);
      for (int k = 0; k < 3 && (dirty & 1); ++k) a[static_cast<size_t>(at_a(rng))] = bad[rng() % 5];
      for (int k = 0; k < 3 && (dirty & 2) && nb > 0; ++k)
        b[static_cast<size_t>(at_b(rng))] = bad[rng() % 5];
      DeviceBuffer d_a, d_b, d_firsts;
      ASSERT_TRUE(d_a.Allocate(a.size() * 2 + 16).ok() && d_a.Upload(a.data(), a.size() * 2).ok());
      ASSERT_TRUE(d_b.Allocate(b.size() * 2 + 16).ok());
      if (nb > 0) ASSERT_TRUE(d_b.Upload(b.data(), b.size() * 2).ok());
      ASSERT_TRUE(d_firsts.Allocate(16).ok());
      ASSERT_EQ(cudaMemset(d_firsts.get(), 0xff, 16), cudaSuccess);
      auto* firsts = static_cast<unsigned long long*>(d_firsts.get());
      ASSERT_TRUE(LaunchFirstOutOfBoundOfTwo(static_cast<const bf16_bits*>(d_a.get()), na,
                                             static_cast<const bf16_bits*>(d_b.get()), nb, firsts,
                                             nullptr)
                      .ok());
      unsigned long long found[2] = {0, 0};
      ASSERT_EQ(cudaMemcpy(found, firsts, 16, cudaMemcpyDeviceToHost), cudaSuccess);
      const std::vector<bf16_bits>* tensors[2] = {&a, &b};
      for (int t = 0; t < 2; ++t) {
        const std::vector<bf16_bits>& v = *tensors[t];
        const int64_t want =
            v.empty() ? -1 : FirstOutOfBound(v.data(), static_cast<int64_t>(v.size()));
        if (want < 0) {
          EXPECT_EQ(found[t], kNoneOutOfBound) << "tensor " << t << " is clean";
        } else {
          EXPECT_EQ(OutOfBoundIndex(found[t]), want) << "tensor " << t;
          EXPECT_EQ(OutOfBoundBits(found[t]), v[static_cast<size_t>(want)]) << "tensor " << t;
        }
      }
    }
  }
}

TEST(ValueBoundCheck, NanFillOnlyWhenACheckFoundSomething) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(TestSeed());
  const int64_t out_n = 33 * 8 * 512, lse_n = 33 * 8;
  const std::vector<bf16_bits> out = InsideBound(rng, out_n);
  std::vector<float> lse(static_cast<size_t>(lse_n));
  for (auto& x : lse) x = std::uniform_real_distribution<float>(-50, 50)(rng);
  for (bool bad : {false, true}) {
    DeviceBuffer d_out, d_lse, d_firsts;
    ASSERT_TRUE(d_out.Allocate(out.size() * 2).ok() &&
                d_out.Upload(out.data(), out.size() * 2).ok());
    ASSERT_TRUE(d_lse.Allocate(lse.size() * 4).ok() &&
                d_lse.Upload(lse.data(), lse.size() * 4).ok());
    const unsigned long long firsts[2] = {kNoneOutOfBound,
                                          bad ? (uint64_t{12345} << 16) | 0x7F80 : kNoneOutOfBound};
    ASSERT_TRUE(d_firsts.Allocate(16).ok() && d_firsts.Upload(firsts, 16).ok());
    ASSERT_TRUE(LaunchNanIfOutOfBound(static_cast<const unsigned long long*>(d_firsts.get()), 2,
                                      static_cast<bf16_bits*>(d_out.get()), out_n,
                                      static_cast<float*>(d_lse.get()), lse_n, nullptr)
                    .ok());
    std::vector<bf16_bits> got_out(out.size());
    std::vector<float> got_lse(lse.size());
    ASSERT_EQ(cudaMemcpy(got_out.data(), d_out.get(), out.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got_lse.data(), d_lse.get(), lse.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    int64_t wrong = 0;
    for (int64_t i = 0; i < out_n; ++i) {
      const bool nan = (got_out[i] & 0x7F80) == 0x7F80 && (got_out[i] & 0x7F) != 0;
      wrong += bad ? !nan : got_out[i] != out[i];
    }
    for (int64_t i = 0; i < lse_n; ++i) {
      wrong += bad ? !std::isnan(got_lse[i]) : std::memcmp(&got_lse[i], &lse[i], 4) != 0;
    }
    EXPECT_EQ(wrong, 0) << (bad ? "a refused call's outputs must all be NaN"
                                : "a clean call's outputs must stay as they were");
  }
}

}  // namespace
}  // namespace verifyd::test
