// The flash kernel over an fp8 pool (DeepSeek's 656-byte rows, verify/kv_fp8_layout.h) against the
// float64 oracle computed on the dequantized KV (SPEC §1: attention over an fp8 store is attention
// over its dequantized rows), on fresh random inputs quantized the daemon's way: the whole flash
// test matrix, forced split plans, page-size-1 / one-run / random-run layouts (bit-exact), the
// naive kernel's fp8 reading and the largest shapes against the naive kernel, on every flash path
// the device has (both on a Hopper one). Also reports (does not bound) how far the fp8 store's
// output is from the bf16 store's.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_verify_launch.h"
#include "tests/kernels/device_problem.h"
#include "tests/testing/flash_cases.h"
#include "tests/testing/problem_builder.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

constexpr double kTolerance = 1e-2;
constexpr int kSms = 132;

// The pool's every row (used or not) quantized as the daemon quantizes bf16 rows.
std::vector<uint8_t> QuantizePool(const HostProblem& host) {
  std::vector<uint8_t> pool(static_cast<size_t>(host.num_slots) * kFp8RowBytes);
  for (int64_t s = 0; s < host.num_slots; ++s)
    QuantizeFp8Row(&host.kv[static_cast<size_t>(s) * kKvDim], &pool[s * kFp8RowBytes]);
  return pool;
}

// The float64 oracle on the dequantized rows.
void OracleOnFp8(HostProblem& host, const std::vector<uint8_t>& pool, std::vector<double>* out,
                 std::vector<double>* lse) {
  VerifyProblem p = host.problem();
  p.kv_fp8 = pool.data();
  ComputeVerifyF64(p, out, lse);
}

class FlashFp8VsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(FlashFp8VsOracle, MatchesFloat64OnTheDequantizedKv) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(Describe(c) + " seed=" + std::to_string(seed));
  HostProblem host =
      MakeRandomProblem(c.seqs, c.heads, seed, /*scattered=*/true, /*extra_slots=*/97);
  const std::vector<uint8_t> pool = QuantizePool(host);
  std::vector<double> ref_out, ref_lse, bf16_out, bf16_lse;
  OracleOnFp8(host, pool, &ref_out, &ref_lse);
  ComputeVerifyF64(host.problem(), &bf16_out, &bf16_lse);
  auto dev = DeviceProblem::Upload(host, &pool);
  ASSERT_TRUE(dev.ok()) << dev.status();
  for (FlashPath path : AvailableFlashPaths()) {
    SCOPED_TRACE(FlashKernelName(path));
    auto flash = dev->RunFlash(kSms, path);
    ASSERT_TRUE(flash.ok()) << flash.status();
    EXPECT_LE(RelativeError(flash->out, ref_out), kTolerance);
    EXPECT_LE(RelativeError(flash->lse, ref_lse), kTolerance);
    std::printf("fp8 %-26s %-18s out err %.2e, lse err %.2e; vs a bf16 store %.2e\n",
                c.name.c_str(), FlashKernelName(path), RelativeError(flash->out, ref_out),
                RelativeError(flash->lse, ref_lse), RelativeError(flash->out, bf16_out));
  }
  auto naive = dev->RunNaive();
  ASSERT_TRUE(naive.ok()) << naive.status();
  EXPECT_LE(RelativeError(naive->out, ref_out), kTolerance);
  EXPECT_LE(RelativeError(naive->lse, ref_lse), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(IssueMatrix, FlashFp8VsOracle, ::testing::ValuesIn(OracleCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Splits anywhere (none, a few, far more than tiles), one run per sequence and runs of random
// lengths: each against float64 on the dequantized KV, and the bytes of every layout identical (the
// load stage widens the same rows whichever way their slots lie).
TEST(FlashFp8, EveryPlanAndLayoutMatchesFloat64AndLayoutsAreBitExact) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  using enum TreeShape;
  const std::vector<SequenceSpec> seqs = {
      {3000, 65, kRandom}, {17, 130, kForest}, {0, 40, kStar}, {20000, 5, kChain}};
  HostProblem scattered = MakeRandomProblem(seqs, 4, seed, /*scattered=*/true, 11);
  const std::vector<uint8_t> pool = QuantizePool(scattered);
  std::vector<double> ref_out, ref_lse;
  OracleOnFp8(scattered, pool, &ref_out, &ref_lse);
  HostProblem contiguous = WithContiguousSlots(scattered);
  HostProblem runs = WithSlotRuns(scattered, seed);
  const std::vector<uint8_t> pool_c = QuantizePool(contiguous);
  const std::vector<uint8_t> pool_r = QuantizePool(runs);
  auto dev_s = DeviceProblem::Upload(scattered, &pool);
  auto dev_c = DeviceProblem::Upload(contiguous, &pool_c);
  auto dev_r = DeviceProblem::Upload(runs, &pool_r);
  ASSERT_TRUE(dev_s.ok() && dev_c.ok() && dev_r.ok());
  for (FlashPath path : AvailableFlashPaths()) {
    for (int sms : {1, 3, 5, 24, 132, 100000}) {
      SCOPED_TRACE("num_sms=" + std::to_string(sms));
      auto a = dev_s->RunFlash(sms, path);
      auto b = dev_c->RunFlash(sms, path);
      auto r = dev_r->RunFlash(sms, path);
      ASSERT_TRUE(a.ok() && b.ok() && r.ok());
      EXPECT_LE(RelativeError(a->out, ref_out), kTolerance);
      EXPECT_LE(RelativeError(a->lse, ref_lse), kTolerance);
      EXPECT_TRUE(a->out == b->out) << "scattered and contiguous slot tables differ";
      EXPECT_TRUE(a->lse == b->lse);
      EXPECT_TRUE(a->out == r->out) << "scattered and random-run slot tables differ";
      EXPECT_TRUE(a->lse == r->lse);
    }
  }
}

// Values that use the whole e4m3 range and scales far from 1: groups scaled from 2^-20 to 2^15
// (subnormal codes where a group's small values sit), so a widening that drops a code's exponent,
// a scale, or the subnormals shows.
TEST(FlashFp8, ScalesFarFromOneAndSubnormalCodesMatchFloat64) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  using enum TreeShape;
  HostProblem host =
      MakeRandomProblem({{1000, 33, kForest}, {64, 9, kChain}}, 16, seed, /*scattered=*/true, 7);
  for (int64_t s = 0; s < host.num_slots; ++s) {
    bf16_bits* row = &host.kv[static_cast<size_t>(s) * kKvDim];
    for (int d = 0; d < kVDim; ++d) {
      const int group = d / kFp8GroupSize;
      // Group scales 2^-20, 2^-4, 2^6, 2^15 rotating with the slot; a few values in each group
      // 2^-12 of the others, so they quantize to subnormal codes.
      const int power = (group + static_cast<int>(s)) % 4 == 0   ? -20
                        : (group + static_cast<int>(s)) % 4 == 1 ? -4
                        : (group + static_cast<int>(s)) % 4 == 2 ? 6
                                                                 : 15;
      float v = std::ldexp(Bf16ToFloat(row[d]), power);
      if (d % 17 == 3) v = std::ldexp(v, -12);
      row[d] = FloatToBf16(v);
    }
  }
  // Scores stay moderate: q shrinks by the largest scale (the scores' scale is the oracle's own).
  for (bf16_bits& x : host.q) x = FloatToBf16(std::ldexp(Bf16ToFloat(x), -15));
  const std::vector<uint8_t> pool = QuantizePool(host);
  std::vector<double> ref_out, ref_lse;
  OracleOnFp8(host, pool, &ref_out, &ref_lse);
  auto dev = DeviceProblem::Upload(host, &pool);
  ASSERT_TRUE(dev.ok()) << dev.status();
  for (FlashPath path : AvailableFlashPaths()) {
    for (int sms : {5, 132}) {
      auto flash = dev->RunFlash(sms, path);
      ASSERT_TRUE(flash.ok()) << flash.status();
      EXPECT_LE(RelativeError(flash->out, ref_out), kTolerance);
      EXPECT_LE(RelativeError(flash->lse, ref_lse), kTolerance);
    }
  }
  auto naive = dev->RunNaive();
  ASSERT_TRUE(naive.ok()) << naive.status();
  EXPECT_LE(RelativeError(naive->out, ref_out), kTolerance);
}

// The largest shapes against the naive kernel reading the same fp8 pool (checked against float64
// above).
TEST(FlashFp8, LargeShapesMatchTheNaiveKernel) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  using enum TreeShape;
  const std::vector<Case> cases = {
      {"S5_like", 8, std::vector<SequenceSpec>(32, {4096, 8, kRandom})},
      {"S3_like", 64, {{65536, 33, kForest}}},
      {"SH", 8, {{185000, 16, kRandom}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c) + " seed=" + std::to_string(seed));
    HostProblem host = MakeRandomProblem(c.seqs, c.heads, seed, /*scattered=*/true, 0);
    const std::vector<uint8_t> pool = QuantizePool(host);
    auto dev = DeviceProblem::Upload(host, &pool);
    ASSERT_TRUE(dev.ok()) << dev.status();
    auto naive = dev->RunNaive();
    ASSERT_TRUE(naive.ok());
    const Reference ref = AsReference(*naive);
    const std::vector<double>& naive_out = ref.out;
    const std::vector<double>& naive_lse = ref.lse;
    for (FlashPath path : AvailableFlashPaths()) {
      auto flash = dev->RunFlash(kSms, path);
      ASSERT_TRUE(flash.ok());
      EXPECT_LE(RelativeError(flash->out, naive_out), kTolerance);
      EXPECT_LE(RelativeError(flash->lse, naive_lse), kTolerance);
      std::printf("fp8 %-10s flash vs naive out err %.2e\n", c.name.c_str(),
                  RelativeError(flash->out, naive_out));
    }
  }
}

}  // namespace
}  // namespace verifyd::test
