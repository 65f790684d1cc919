// HostCopyPool: every byte lands for random sizes and offsets (small copies on the caller, large
// ones split over threads), back to back, so that a worker waking late for one copy cannot
// disturb the next.
#include "backend/cuda/host_copy_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/problem_builder.h"

namespace verifyd {
namespace {

TEST(HostCopyPool, RandomCopiesLandExactly) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr size_t kMax = size_t{3} << 20;
  std::vector<uint8_t> src(kMax + 64);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (int threads : {1, 2, 4, 7}) {
    HostCopyPool pool(threads);
    EXPECT_EQ(pool.threads(), std::max(threads, 1));
    std::vector<uint8_t> dst(kMax + 128);
    for (int i = 0; i < 200; ++i) {
      const size_t bytes = i % 3 == 0 ? rng() % HostCopyPool::kParallelBytes : rng() % kMax;
      const size_t from = rng() % 64, to = rng() % 64;
      const uint8_t fill = static_cast<uint8_t>(rng());
      std::memset(dst.data(), fill, dst.size());
      pool.Copy(dst.data() + to, src.data() + from, bytes);
      ASSERT_EQ(0, std::memcmp(dst.data() + to, src.data() + from, bytes))
          << "threads " << threads << " copy " << i << " of " << bytes << " bytes";
      const std::vector<uint8_t> untouched(dst.size(), fill);
      ASSERT_EQ(0, std::memcmp(dst.data(), untouched.data(), to)) << "wrote before dst";
      ASSERT_EQ(0, std::memcmp(dst.data() + to + bytes, untouched.data(), dst.size() - to - bytes))
          << "wrote past dst";
    }
  }
}

}  // namespace
}  // namespace verifyd
