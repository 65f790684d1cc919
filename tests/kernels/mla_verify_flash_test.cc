// The flash kernel (and the naive on-GPU oracle) against the float64 CPU oracle, on fresh random
// inputs: the issue's H, Q and L values, every tree shape, mixed batches, forced split plans; plus
// bit-exactness across slot layouts and repeated runs.
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/split_planner.h"
#include "tests/kernels/device_problem.h"
#include "tests/testing/flash_cases.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

constexpr double kTolerance = 1e-2;
// H200: 132 SMs; the real count is what the daemon passes, tests also force other plans.
constexpr int kSms = 132;

class FlashVsOracle : public ::testing::TestWithParam<Case> {};

TEST_P(FlashVsOracle, MatchesFloat64) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(Describe(c) + " seed=" + std::to_string(seed));
  HostProblem host =
      MakeRandomProblem(c.seqs, c.heads, seed, /*scattered=*/true, /*extra_slots=*/97);
  std::vector<double> ref_out, ref_lse;
  ComputeVerifyF64(host.problem(), &ref_out, &ref_lse);
  auto dev = DeviceProblem::Upload(host);
  ASSERT_TRUE(dev.ok()) << dev.status();
  for (FlashPath path : AvailableFlashPaths()) {
    SCOPED_TRACE(FlashKernelName(path));
    auto flash = dev->RunFlash(kSms, path);
    ASSERT_TRUE(flash.ok()) << flash.status();
    EXPECT_LE(RelativeError(flash->out, ref_out), kTolerance);
    EXPECT_LE(RelativeError(flash->lse, ref_lse), kTolerance);
    std::printf("%-28s %-18s out err %.2e, lse err %.2e\n", c.name.c_str(), FlashKernelName(path),
                RelativeError(flash->out, ref_out), RelativeError(flash->lse, ref_lse));
  }
  auto naive = dev->RunNaive();
  ASSERT_TRUE(naive.ok()) << naive.status();
  EXPECT_LE(RelativeError(naive->out, ref_out), kTolerance);
  EXPECT_LE(RelativeError(naive->lse, ref_lse), 1e-4);
  std::printf("%-28s naive out err %.2e\n", c.name.c_str(), RelativeError(naive->out, ref_out));
}

INSTANTIATE_TEST_SUITE_P(IssueMatrix, FlashVsOracle, ::testing::ValuesIn(OracleCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// `host` on each flash path, under the split plan made for each SM count, against the float64
// results of the same logical problem.
void ExpectEveryPathAndPlanMatches(HostProblem& host, const std::vector<double>& ref_out,
                                   const std::vector<double>& ref_lse,
                                   const std::vector<int>& sm_counts) {
  auto dev = DeviceProblem::Upload(host);
  ASSERT_TRUE(dev.ok()) << dev.status();
  for (FlashPath path : AvailableFlashPaths()) {
    SCOPED_TRACE(FlashKernelName(path));
    for (int sms : sm_counts) {
      SCOPED_TRACE("num_sms=" + std::to_string(sms));
      auto flash = dev->RunFlash(sms, path);
      ASSERT_TRUE(flash.ok()) << flash.status();
      EXPECT_LE(RelativeError(flash->out, ref_out), kTolerance);
      EXPECT_LE(RelativeError(flash->lse, ref_lse), kTolerance);
    }
  }
}

// One random problem (4 heads) against the float64 oracle, on each flash path, under the split
// plan made for each SM count.
void ExpectEveryPlanMatchesFloat64(const std::vector<SequenceSpec>& seqs,
                                   const std::vector<int>& sm_counts) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  HostProblem host = MakeRandomProblem(seqs, 4, seed, /*scattered=*/true, 11);
  std::vector<double> ref_out, ref_lse;
  ComputeVerifyF64(host.problem(), &ref_out, &ref_lse);
  ExpectEveryPathAndPlanMatches(host, ref_out, ref_lse, sm_counts);
}

// The split planner's choice must not matter: no split, a few, and far more splits than columns per
// row block (tree-only splits where most rows see nothing) all agree with the oracle. The largest
// split counts of these plans (20-27, and 320 at 100000 SMs) send the combine through its
// multi-batch paths: two batches of one group, four batches of four groups.
TEST(FlashPlans, AnySplitCountMatchesFloat64) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  using enum TreeShape;
  ExpectEveryPlanMatchesFloat64(
      {{3000, 65, kRandom}, {17, 130, kForest}, {0, 40, kStar}, {20000, 5, kChain}},
      {1, 3, 5, 24, 132, 100000});
}

// Each combine shape (picked by the plan's largest split count: <= 4, <= 8, < 32 splits with one
// group, >= 32 with four) on a small batch: 4, 8, 16 and 132 SMs give 3, 6, 11 and 32 splits.
TEST(FlashPlans, EveryCombineShapeMatchesFloat64) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  using enum TreeShape;
  ExpectEveryPlanMatchesFloat64({{1000, 16, kRandom}, {300, 9, kChain}}, {4, 8, 16, 132});
}

// The Hopper kernel brings a 32-column half tile that is one run of consecutive slots by one bulk
// tensor copy and every other half by the gather: one consecutive run per sequence (every whole
// half by copy, the last row of the run the pool's last row) and runs of random lengths (halves of
// both kinds in one item, runs that start and end inside a half, a half one row short of a run),
// each against float64 on every path under plans that cut the columns at different places.
TEST(FlashSlotRuns, ContiguousAndRandomRunsMatchFloat64) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  using enum TreeShape;
  const std::vector<SequenceSpec> seqs = {
      {20000, 16, kRandom}, {4095, 9, kChain}, {63, 33, kForest}, {1000, 257, kStar}};
  const HostProblem scattered = MakeRandomProblem(seqs, 8, seed, /*scattered=*/true, 0);
  std::vector<double> ref_out, ref_lse;
  HostProblem for_oracle = scattered;
  ComputeVerifyF64(for_oracle.problem(), &ref_out, &ref_lse);
  for (const bool contiguous : {true, false}) {
    SCOPED_TRACE(contiguous ? "one run per sequence" : "runs of random lengths");
    HostProblem host = contiguous ? WithContiguousSlots(scattered) : WithSlotRuns(scattered, seed);
    ExpectEveryPathAndPlanMatches(host, ref_out, ref_lse, {5, 132});
  }
}

// Scores that jump past the running maximum deep inside a split's columns: the Hopper kernel moves
// a row's reference maximum only when a score passes it by a margin, in one warpgroup's half at a
// time, and the other adopts that reference (rescaling its own O) when it reads the P made on it.
// Every ~100th prefix column is scaled up,
// more the later it comes (so the maximum keeps moving), on both layouts the kernel loads
// differently (gathered, and one run per sequence by bulk copies), under plans that cut the columns
// differently.
TEST(FlashSoftmax, ScoresThatJumpLateInTheRowMatchFloat64) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  using enum TreeShape;
  const std::vector<SequenceSpec> seqs = {
      {30000, 16, kRandom}, {3000, 9, kChain}, {500, 33, kStar}};
  HostProblem host = MakeRandomProblem(seqs, 8, seed, /*scattered=*/true, 0);
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::uniform_int_distribution<int> gap(1, 200);
  for (int b = 0; b < host.batch(); ++b) {
    const int len = host.prefix_len[b];
    for (int t = gap(rng); t < len; t += gap(rng)) {
      // Scores scale with the row: x2 at the start of the prefix up to x12 at its end (|s| up to
      // ~70 in log2 units, far past the kernel's margin of 8).
      const float factor = 2.f + 10.f * static_cast<float>(t) / static_cast<float>(len);
      bf16_bits* row = &host.kv[static_cast<size_t>(host.slots[host.slot_indptr[b] + t]) * kKvDim];
      for (int d = 0; d < kKvDim; ++d) row[d] = FloatToBf16(Bf16ToFloat(row[d]) * factor);
    }
  }
  std::vector<double> ref_out, ref_lse;
  ComputeVerifyF64(host.problem(), &ref_out, &ref_lse);
  ExpectEveryPathAndPlanMatches(host, ref_out, ref_lse, {5, 132});
  HostProblem contiguous = WithContiguousSlots(host);
  ExpectEveryPathAndPlanMatches(contiguous, ref_out, ref_lse, {5, 132});
}

// Page size 1 with random slots, one consecutive run per sequence and runs of random lengths hold
// the same KV: the kernel must give the same bytes (the bulk copies of one-run halves change how a
// half arrives, never the arithmetic). Also two runs give identical bytes (no atomics, fixed
// reduction order).
TEST(FlashBitExact, ScatteredEqualsContiguousAndRunsRepeat) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  using enum TreeShape;
  const std::vector<SequenceSpec> seqs = {
      {4096, 16, kRandom}, {1000, 9, kChain}, {0, 33, kForest}, {77, 257, kStar}};
  HostProblem scattered = MakeRandomProblem(seqs, 16, seed, /*scattered=*/true, 301);
  HostProblem contiguous = WithContiguousSlots(scattered);
  HostProblem runs = WithSlotRuns(scattered, seed);
  auto dev_s = DeviceProblem::Upload(scattered);
  auto dev_c = DeviceProblem::Upload(contiguous);
  auto dev_r = DeviceProblem::Upload(runs);
  ASSERT_TRUE(dev_s.ok() && dev_c.ok() && dev_r.ok());
  for (FlashPath path : AvailableFlashPaths()) {
    SCOPED_TRACE(FlashKernelName(path));
    auto a = dev_s->RunFlash(kSms, path);
    auto b = dev_c->RunFlash(kSms, path);
    auto r = dev_r->RunFlash(kSms, path);
    auto again = dev_s->RunFlash(kSms, path);
    ASSERT_TRUE(a.ok() && b.ok() && r.ok() && again.ok());
    EXPECT_TRUE(a->out == b->out) << "scattered and contiguous slot tables differ";
    EXPECT_TRUE(a->lse == b->lse);
    EXPECT_TRUE(a->out == r->out) << "scattered and random-run slot tables differ";
    EXPECT_TRUE(a->lse == r->lse);
    EXPECT_TRUE(a->out == again->out) << "two runs differ";
    EXPECT_TRUE(a->lse == again->lse);
  }
  auto na = dev_s->RunNaive();
  auto nb = dev_c->RunNaive();
  ASSERT_TRUE(na.ok() && nb.ok());
  EXPECT_TRUE(na->out == nb->out) << "naive: scattered and contiguous differ";
}

// What the product runs (kAuto) is the first path the tests check: the Hopper kernel where it can
// run, else the portable one (same bytes).
TEST(FlashPaths, AutoRunsTheFirstAvailablePath) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  using enum TreeShape;
  HostProblem host = MakeRandomProblem({{3000, 33, kRandom}, {64, 9, kChain}}, 16, seed,
                                       /*scattered=*/true, 5);
  auto dev = DeviceProblem::Upload(host);
  ASSERT_TRUE(dev.ok()) << dev.status();
  const FlashPath first = AvailableFlashPaths().front();
  EXPECT_STREQ(FlashKernelName(FlashPath::kAuto), FlashKernelName(first));
  auto a = dev->RunFlash(kSms, FlashPath::kAuto);
  auto b = dev->RunFlash(kSms, first);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->out == b->out);
  EXPECT_TRUE(a->lse == b->lse);
}

// Calls on one stream share one workspace: the combine of call i reads the partials that the flash
// kernel of call i + 1 overwrites, and the combine may be scheduled before the flash kernel ahead
// of it has finished (programmatic dependent launch). Alternating two problems with no sync in
// between, every call must still give the bytes of that problem run alone (which match float64).
TEST(FlashStreamOrder, BackToBackCallsOnOneWorkspaceKeepEachResult) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  using enum TreeShape;
  // One long sequence cut into ~114 splits of ~17 tiles, and 16 one-node sequences whose CTAs end
  // after one tile: their SMs free up while the long splits still run, the window in which a
  // combine that did not wait for the whole flash grid would merge partials still being written.
  // (A build without the waits still passed on the H200: no combine CTA was seen to start under
  // the flash grid's tail there. The waits are the launch contract all the same; plans/0004, v30.)
  std::vector<SequenceSpec> seqs = {{60000, 16, kRandom}};
  for (int i = 0; i < 16; ++i) seqs.push_back({0, 1, kChain});
  constexpr int kHeads = 8;
  std::vector<int32_t> prefix_len, q_len;
  int total_q = 0;
  for (const SequenceSpec& q : seqs) {
    prefix_len.push_back(q.prefix_len);
    q_len.push_back(q.num_nodes);
    total_q += q.num_nodes;
  }
  HostProblem host_a = MakeRandomProblem(seqs, kHeads, seed, /*scattered=*/true, 13);
  HostProblem host_b = MakeRandomProblem(seqs, kHeads, seed + 1, /*scattered=*/true, 13);
  std::vector<double> ref_out, ref_lse;
  ComputeVerifyF64(host_a.problem(), &ref_out, &ref_lse);
  auto dev_a = DeviceProblem::Upload(host_a);
  auto dev_b = DeviceProblem::Upload(host_b);
  ASSERT_TRUE(dev_a.ok() && dev_b.ok());
  auto plan = PlanSplits(prefix_len, q_len, kHeads, kSms);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GE(plan->num_partials, 64);
  const WorkspaceLayout layout = LayoutWorkspace(*plan);
  const int rows = total_q * kHeads;
  constexpr int kCalls = 16;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (FlashPath path : AvailableFlashPaths()) {
    SCOPED_TRACE(FlashKernelName(path));
    auto alone_a = dev_a->RunFlash(kSms, path);
    auto alone_b = dev_b->RunFlash(kSms, path);
    ASSERT_TRUE(alone_a.ok() && alone_b.ok());
    EXPECT_LE(RelativeError(alone_a->out, ref_out), kTolerance);
    EXPECT_LE(RelativeError(alone_a->lse, ref_lse), kTolerance);
    EXPECT_FALSE(alone_a->out == alone_b->out) << "the two problems must differ";

    DeviceBuffer workspace;
    ASSERT_TRUE(workspace.Allocate(layout.total_bytes).ok());
    ASSERT_TRUE(UploadPlan(*plan, layout, workspace.get(), stream).ok());
    std::vector<DeviceBuffer> outs(kCalls), lses(kCalls);
    for (int i = 0; i < kCalls; ++i) {
      ASSERT_TRUE(outs[i].Allocate(size_t(rows) * kVDim * sizeof(bf16_bits)).ok());
      ASSERT_TRUE(lses[i].Allocate(size_t(rows) * sizeof(float)).ok());
      ASSERT_EQ(cudaMemset(outs[i].get(), 0xFF, outs[i].bytes()), cudaSuccess);
      ASSERT_EQ(cudaMemset(lses[i].get(), 0xFF, lses[i].bytes()), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int i = 0; i < kCalls; ++i) {
      VerifyProblem p = (i % 2 == 0 ? dev_a : dev_b)->problem();
      p.out = static_cast<bf16_bits*>(outs[i].get());
      p.lse = static_cast<float*>(lses[i].get());
      ASSERT_TRUE(LaunchMlaVerify(p, *plan, layout, workspace.get(), stream,
                                  VerifyStages::kFlashAndCombine, path)
                      .ok());
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int i = 0; i < kCalls; ++i) {
      SCOPED_TRACE("call " + std::to_string(i));
      KernelOutput got;
      got.out.resize(size_t(rows) * kVDim);
      got.lse.resize(rows);
      ASSERT_EQ(cudaMemcpy(got.out.data(), outs[i].get(), outs[i].bytes(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got.lse.data(), lses[i].get(), lses[i].bytes(), cudaMemcpyDeviceToHost),
                cudaSuccess);
      const KernelOutput& alone = i % 2 == 0 ? *alone_a : *alone_b;
      EXPECT_TRUE(got.out == alone.out);
      EXPECT_TRUE(got.lse == alone.lse);
    }
  }
  cudaStreamDestroy(stream);
}

// The largest shapes are too slow for the float64 oracle: there flash is checked against the naive
// kernel, which the tests above check against float64.
TEST(FlashVsNaive, LargeShapes) {
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = TestSeed();
  using enum TreeShape;
  const std::vector<Case> cases = {
      {"S6_like", 128, {{65536, 64, kRandom}}},
      {"S5_like", 8, std::vector<SequenceSpec>(32, {4096, 8, kRandom})},
      {"S3_like", 64, {{65536, 33, kForest}}},
      // SPEC §5's S8 and SH as they are (issue 16): 1024 rows x 131K columns, and an L that is no
      // multiple of the tile (185000 = 2890 tiles of 64 + 40).
      {"S8", 8, {{131072, 128, kRandom}}},
      {"SH", 8, {{185000, 16, kRandom}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c) + " seed=" + std::to_string(seed));
    HostProblem host = MakeRandomProblem(c.seqs, c.heads, seed, /*scattered=*/true, 0);
    auto dev = DeviceProblem::Upload(host);
    ASSERT_TRUE(dev.ok()) << dev.status();
    auto naive = dev->RunNaive();
    ASSERT_TRUE(naive.ok());
    const Reference ref = AsReference(*naive);
    const std::vector<double>& naive_out = ref.out;
    const std::vector<double>& naive_lse = ref.lse;
    for (FlashPath path : AvailableFlashPaths()) {
      SCOPED_TRACE(FlashKernelName(path));
      auto flash = dev->RunFlash(kSms, path);
      ASSERT_TRUE(flash.ok());
      EXPECT_LE(RelativeError(flash->out, naive_out), kTolerance);
      EXPECT_LE(RelativeError(flash->lse, naive_lse), kTolerance);
      std::printf("%-10s %-18s flash vs naive out err %.2e\n", c.name.c_str(),
                  FlashKernelName(path), RelativeError(flash->out, naive_out));
    }
  }
}

}  // namespace
}  // namespace verifyd::test
