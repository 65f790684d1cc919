// SPEC §1's input bound: FirstOutOfBound against a float comparison over every bf16 bit pattern and
// random arrays, and the reference arithmetic's outputs finite for inputs at the bound (and not
// beyond it, which is why the daemon refuses what lies beyond).
#include "verify/value_bound.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/problem_builder.h"
#include "verify/verify_reference.h"

namespace verifyd {
namespace {

bool OutsideByFloat(bf16_bits v) { return !(std::fabs(Bf16ToFloat(v)) <= 65536.0f); }

TEST(ValueBoundTest, EveryBitPatternAgreesWithTheFloatComparison) {
  int outside = 0;
  for (uint32_t v = 0; v <= 0xffff; ++v) {
    const auto b = static_cast<bf16_bits>(v);
    ASSERT_EQ(OutOfBound(b), OutsideByFloat(b)) << "bits 0x" << std::hex << v;
    ASSERT_EQ(FirstOutOfBound(&b, 1), OutsideByFloat(b) ? 0 : -1) << "bits 0x" << std::hex << v;
    outside += OutsideByFloat(b);
  }
  // +-65536 are inside; everything from the next bf16 up, Inf and NaN are outside.
  EXPECT_EQ(outside, 2 * (0x8000 - 0x4781));
}

// A random in-bound value: any sign, magnitudes from subnormal to exactly 2^16.
bf16_bits RandomInside(std::mt19937_64& rng) {
  for (;;) {
    const auto v = static_cast<bf16_bits>(rng());
    if (!OutOfBound(v)) return v;
  }
}

bf16_bits RandomOutside(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:  // NaN, any payload and sign
      return static_cast<bf16_bits>(0x7f81 + rng() % 0x7f | (rng() & 1) << 15);
    case 1:  // +-Inf
      return static_cast<bf16_bits>(0x7f80 | (rng() & 1) << 15);
    case 2:  // the smallest finite value beyond the bound
      return static_cast<bf16_bits>(0x4781 | (rng() & 1) << 15);
    default:  // any finite value beyond it, up to 3.39e38
      return static_cast<bf16_bits>(0x4781 + rng() % (0x7f80 - 0x4781) | (rng() & 1) << 15);
  }
}

TEST(ValueBoundTest, FindsTheFirstBadValueAtEveryPositionOfRandomArrays) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 400; ++round) {
    const int64_t n = static_cast<int64_t>(rng() % 3000);
    std::vector<bf16_bits> data(n);
    for (bf16_bits& v : data) v = RandomInside(rng);
    ASSERT_EQ(FirstOutOfBound(data.data(), n), -1);
    if (n == 0) continue;
    const int64_t first = static_cast<int64_t>(rng() % n);
    data[first] = RandomOutside(rng);
    // Later bad values must not be reported instead of the first.
    for (int k = 0; k < 3; ++k) {
      const int64_t later = first + static_cast<int64_t>(rng() % (n - first));
      data[later] = RandomOutside(rng);
    }
    ASSERT_EQ(FirstOutOfBound(data.data(), n), first) << "n=" << n;
  }
}

// q and kv replaced by values of magnitude in [2^15, 2^16] with random signs, or all +2^16 (the
// largest scores: 576 * 2^32 * scale).
void FillAtBound(std::vector<bf16_bits>& values, std::mt19937_64& rng, bool all_max) {
  std::uniform_real_distribution<float> magnitude(32768.f, 65536.f);
  for (bf16_bits& v : values) {
    if (all_max) {
      v = 0x4780;
      continue;
    }
    const float x = magnitude(rng) * ((rng() & 1) ? 1.f : -1.f);
    v = FloatToBf16(x);
    if (OutOfBound(v)) v = static_cast<bf16_bits>(0x4780 | (v & 0x8000));  // rounded past 2^16
  }
}

bool AllFinite(const test::HostProblem& hp) {
  for (bf16_bits o : hp.out)
    if (!std::isfinite(Bf16ToFloat(o))) return false;
  for (float l : hp.lse)
    if (!std::isfinite(l)) return false;
  return true;
}

TEST(ValueBoundTest, ReferenceOutputsAreFiniteForInputsAtTheBound) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(testing::Message() << "seed=" << seed);
  std::mt19937_64 rng(seed);
  const std::vector<test::SequenceSpec> seqs = {{300, 9, test::TreeShape::kRandom},
                                                {0, 17, test::TreeShape::kForest},
                                                {1000, 4, test::TreeShape::kChain}};
  for (bool all_max : {false, true}) {
    for (float scale : {1.f / std::sqrt(192.f), 1.f}) {
      test::HostProblem hp = test::MakeRandomProblem(seqs, 4, rng(), /*scattered=*/true, 5);
      hp.scale = scale;
      FillAtBound(hp.q, rng, all_max);
      FillAtBound(hp.kv, rng, all_max);
      ASSERT_TRUE(ComputeVerifyReference(hp.problem(), 2).ok());
      EXPECT_TRUE(AllFinite(hp)) << "all_max=" << all_max << " scale=" << scale;
    }
  }
}

// Why the bound exists: finite inputs far beyond it overflow scale * <q, k> to +-Inf, and the
// softmax's max subtraction (Inf - Inf) makes the row NaN. The daemon refuses such inputs.
TEST(ValueBoundTest, BeyondTheBoundScoresOverflowAndOutputsAreNotFinite) {
  const std::vector<test::SequenceSpec> seqs = {{20, 3, test::TreeShape::kChain}};
  test::HostProblem hp = test::MakeRandomProblem(seqs, 2, test::TestSeed(), false);
  const bf16_bits huge = FloatToBf16(3.3e38f);
  for (bf16_bits& v : hp.q) v = huge;
  for (bf16_bits& v : hp.kv) v = huge;
  ASSERT_TRUE(ComputeVerifyReference(hp.problem(), 1).ok());
  EXPECT_FALSE(AllFinite(hp));
}

}  // namespace
}  // namespace verifyd
