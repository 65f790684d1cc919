// ComputeVerifyReference against the float64 oracle, on random problems (fresh seed each run).
//
// Tolerances (plans/0002-cpu-reference.md): the fp32 output before rounding and the fp32 LSE must
// be within 1e-5 of float64; the bf16 output may differ from float64 only by the bf16 rounding of
// that fp32 value, at most half an ulp = 2^-8 of |ref| per element, plus the fp32 error.
#include "verify/verify_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::HostProblem;
using test::SequenceSpec;
using test::TreeShape;
using ::testing::HasSubstr;

constexpr double kFp32Tolerance = 1e-5;
constexpr double kBf16HalfUlp = 1.0 / 256;  // 2^-8: bf16 keeps 8 significant bits

struct Case {
  std::vector<SequenceSpec> seqs;
  int num_heads;
  bool scattered = true;
};

std::string Describe(const Case& c) {
  std::string s = "H=" + std::to_string(c.num_heads) + (c.scattered ? " scattered" : " contiguous");
  for (const SequenceSpec& q : c.seqs) {
    s += " {L=" + std::to_string(q.prefix_len) + " Q=" + std::to_string(q.num_nodes) +
         " shape=" + std::to_string(static_cast<int>(q.shape)) + "}";
  }
  return s;
}

// Runs both output paths and checks every element of both against float64.
void CheckAgainstF64(const Case& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seed=" << seed << " " << Describe(c));
  HostProblem hp =
      test::MakeRandomProblem(c.seqs, c.num_heads, seed, c.scattered, /*extra_slots=*/7);
  std::vector<double> ref_out, ref_lse;
  test::ComputeVerifyF64(hp.problem(), &ref_out, &ref_lse);

  // fp32 path first: its output and LSE before any rounding.
  std::vector<float> out_f32(hp.out.size(), std::nanf(""));
  ASSERT_TRUE(ComputeVerifyReferenceF32(hp.problem(), out_f32.data()).ok());
  const std::vector<float> lse_f32 = hp.lse;
  EXPECT_LE(test::RelativeError(out_f32, ref_out), kFp32Tolerance);
  // The LSE vector's error relative to its norm, absolute where the norm is below one per entry: a
  // plain norm-relative bound failed a one-row problem whose LSE fell near 0 (1.2e-5 against 1e-5,
  // seed 2568613124511622726) with an error of fp32's size.
  double lse_diff2 = 0.0, lse_ref2 = 0.0;
  for (size_t r = 0; r < ref_lse.size(); ++r) {
    lse_diff2 += (lse_f32[r] - ref_lse[r]) * (lse_f32[r] - ref_lse[r]);
    lse_ref2 += ref_lse[r] * ref_lse[r];
  }
  ASSERT_EQ(lse_f32.size(), ref_lse.size());
  EXPECT_LE(std::sqrt(lse_diff2 / std::max(lse_ref2, static_cast<double>(ref_lse.size()))),
            kFp32Tolerance);
  ASSERT_TRUE(std::all_of(hp.out.begin(), hp.out.end(), [](bf16_bits b) { return b == 0xFFFF; }))
      << "the fp32 path wrote the bf16 output";

  // Per (row, head): relative error of the fp32 row, and the LSE error. A log's absolute error is
  // the relative error of sum(exp), so LSE is held to 1e-5 absolute below |lse| = 1.
  const size_t row_heads = ref_lse.size();
  int bad_rows = 0;
  for (size_t r = 0; r < row_heads; ++r) {
    const absl::Span<const float> o(out_f32.data() + r * kVDim, kVDim);
    const absl::Span<const double> ref(ref_out.data() + r * kVDim, kVDim);
    const double row_err = test::RelativeError(o, ref);
    const double lse_err = std::abs(lse_f32[r] - ref_lse[r]);
    if (row_err > kFp32Tolerance ||
        lse_err > kFp32Tolerance * std::max(1.0, std::abs(ref_lse[r]))) {
      if (++bad_rows <= 5) {
        ADD_FAILURE() << "row-head " << r << ": fp32 rel err " << row_err << ", lse " << lse_f32[r]
                      << " vs " << ref_lse[r];
      }
    }
  }
  EXPECT_EQ(bad_rows, 0);

  // bf16 path: must be the fp32 result rounded to nearest even, and the same LSE.
  hp.Poison();
  ASSERT_TRUE(ComputeVerifyReference(hp.problem()).ok());
  EXPECT_LE(test::RelativeError(hp.out, ref_out), kBf16HalfUlp);
  int bad_elements = 0;
  for (size_t r = 0; r < row_heads; ++r) {
    double row_max = 0;
    for (int d = 0; d < kVDim; ++d) row_max = std::max(row_max, std::abs(ref_out[r * kVDim + d]));
    for (int d = 0; d < kVDim; ++d) {
      const size_t i = r * kVDim + d;
      const double got = Bf16ToFloat(hp.out[i]);
      const double bound =
          kBf16HalfUlp * std::abs(ref_out[i]) * (1 + kFp32Tolerance) + kFp32Tolerance * row_max;
      if (!(std::abs(got - ref_out[i]) <= bound) && ++bad_elements <= 5) {
        ADD_FAILURE() << "out[" << i << "] = " << got << " vs " << ref_out[i] << " bound " << bound;
      }
      if (hp.out[i] != FloatToBf16(out_f32[i]) && ++bad_elements <= 5) {
        ADD_FAILURE() << "out[" << i << "] is not the fp32 path's value rounded to bf16";
      }
    }
  }
  EXPECT_EQ(bad_elements, 0);
  EXPECT_EQ(hp.lse, lse_f32) << "the two output paths disagree on LSE";
}

class VerifyReferenceTest : public ::testing::Test {
 protected:
  const uint64_t seed_ = test::TestSeed();
  // Every failure message carries the base seed, so VERIFYD_TEST_SEED=<seed> replays the test.
  const ::testing::ScopedTrace trace_{__FILE__, __LINE__,
                                      testing::Message() << "VERIFYD_TEST_SEED=" << seed_};
};

TEST_F(VerifyReferenceTest, SingleNodeWithoutPrefixReturnsItsOwnValue) {
  HostProblem hp = test::MakeRandomProblem({{0, 1, TreeShape::kChain}}, 4, seed_, true, 5);
  ASSERT_TRUE(ComputeVerifyReference(hp.problem()).ok());
  // softmax over one column is exactly 1, so out is that column's bf16 value, bit for bit.
  const bf16_bits* v = hp.kv.data() + static_cast<size_t>(hp.slots[0]) * kKvDim;
  for (int h = 0; h < 4; ++h) {
    for (int d = 0; d < kVDim; ++d) ASSERT_EQ(hp.out[h * kVDim + d], v[d]) << h << "," << d;
  }
  CheckAgainstF64({{{0, 1, TreeShape::kChain}}, 4}, seed_);
}

TEST_F(VerifyReferenceTest, EdgeShapes) {
  const std::vector<Case> cases = {
      {{{0, 1, TreeShape::kChain}}, 1},          {{{1, 1, TreeShape::kStar}}, 1},
      {{{0, 64, TreeShape::kChain}}, 2},         {{{0, 65, TreeShape::kStar}}, 3},
      {{{0, 130, TreeShape::kForest}}, 2},       {{{63, 1, TreeShape::kRandom}}, 8},
      {{{64, 2, TreeShape::kRandom}}, 8, false}, {{{65, 129, TreeShape::kRandom}}, 1},
  };
  for (const Case& c : cases) CheckAgainstF64(c, seed_ ^ std::hash<std::string>{}(Describe(c)));
}

TEST_F(VerifyReferenceTest, ManyHeads) {
  CheckAgainstF64({{{200, 9, TreeShape::kRandom}}, 128}, seed_);
  CheckAgainstF64({{{77, 17, TreeShape::kForest}}, 64, false}, seed_ + 1);
  CheckAgainstF64({{{300, 16, TreeShape::kChain}}, 16}, seed_ + 2);
  CheckAgainstF64({{{64, 64, TreeShape::kRandom}}, 128}, seed_ + 3);
}

TEST_F(VerifyReferenceTest, TypicalDraftTree) {
  // A DDTree-sized tree (256 nodes plus its root) over a few thousand committed tokens.
  CheckAgainstF64({{{4096, 257, TreeShape::kRandom}}, 2}, seed_);
}

TEST_F(VerifyReferenceTest, LargestTrees) {
  CheckAgainstF64({{{16, 1024, TreeShape::kRandom}}, 1}, seed_);
  CheckAgainstF64({{{0, 1024, TreeShape::kChain}}, 1}, seed_ + 1);
  CheckAgainstF64({{{3, 1024, TreeShape::kStar}}, 2}, seed_ + 2);
  CheckAgainstF64({{{1, 1024, TreeShape::kForest}}, 1}, seed_ + 3);
}

TEST_F(VerifyReferenceTest, LongPrefix) {
  CheckAgainstF64({{{20000, 4, TreeShape::kRandom}}, 8}, seed_);
}

TEST_F(VerifyReferenceTest, MixedBatch) {
  CheckAgainstF64({{{0, 1, TreeShape::kChain},
                    {1000, 17, TreeShape::kRandom},
                    {5, 64, TreeShape::kForest},
                    {333, 8, TreeShape::kStar},
                    {0, 33, TreeShape::kChain},
                    {2048, 1, TreeShape::kStar}},
                   8},
                  seed_);
}

TEST_F(VerifyReferenceTest, RandomShapes) {
  std::mt19937_64 rng(seed_);
  for (int iter = 0; iter < 12; ++iter) {
    Case c;
    c.num_heads = 1 << std::uniform_int_distribution<int>(0, 4)(rng);
    c.scattered = iter % 3 != 0;
    const int batch = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int b = 0; b < batch; ++b) {
      c.seqs.push_back({std::uniform_int_distribution<int>(0, 1000)(rng),
                        std::uniform_int_distribution<int>(1, 64)(rng),
                        static_cast<TreeShape>(std::uniform_int_distribution<int>(0, 3)(rng))});
    }
    CheckAgainstF64(c, rng());
  }
}

TEST_F(VerifyReferenceTest, ResultDoesNotDependOnThreadsOrSlotLayout) {
  const std::vector<SequenceSpec> seqs = {{700, 40, TreeShape::kRandom},
                                          {90, 3, TreeShape::kChain}};
  HostProblem scattered = test::MakeRandomProblem(seqs, 4, seed_, true, 100);
  ASSERT_TRUE(ComputeVerifyReference(scattered.problem(), 1).ok());
  const std::vector<bf16_bits> out1 = scattered.out;
  const std::vector<float> lse1 = scattered.lse;
  scattered.Poison();
  ASSERT_TRUE(ComputeVerifyReference(scattered.problem(), 5).ok());
  EXPECT_EQ(scattered.out, out1);
  EXPECT_EQ(scattered.lse, lse1);

  HostProblem contiguous = test::WithContiguousSlots(scattered);
  ASSERT_NE(contiguous.slots, scattered.slots);
  ASSERT_TRUE(ComputeVerifyReference(contiguous.problem(), 3).ok());
  EXPECT_EQ(contiguous.out, out1);
  EXPECT_EQ(contiguous.lse, lse1);
}

TEST_F(VerifyReferenceTest, WithoutLseOnlyWritesOut) {
  HostProblem hp = test::MakeRandomProblem({{10, 5, TreeShape::kRandom}}, 2, seed_, true);
  VerifyProblem p = hp.problem();
  p.lse = nullptr;
  ASSERT_TRUE(ComputeVerifyReference(p).ok());
  EXPECT_TRUE(std::all_of(hp.lse.begin(), hp.lse.end(), [](float x) { return std::isnan(x); }));
  std::vector<double> ref;
  test::ComputeVerifyF64(p, &ref, nullptr);
  EXPECT_LE(test::RelativeError(hp.out, ref), kBf16HalfUlp);
}

// Validation: every rejection is INVALID_ARGUMENT naming the field and bound, and writes nothing.
class VerifyReferenceValidationTest : public ::testing::Test {
 protected:
  void ExpectRejected(const VerifyProblem& p, const std::string& message) {
    const absl::Status status = ComputeVerifyReference(p);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message));
    EXPECT_TRUE(
        std::all_of(hp_.out.begin(), hp_.out.end(), [](bf16_bits b) { return b == 0xFFFF; }));
    EXPECT_TRUE(std::all_of(hp_.lse.begin(), hp_.lse.end(), [](float x) { return std::isnan(x); }));
  }

  const uint64_t seed_ = test::TestSeed();
  const ::testing::ScopedTrace trace_{__FILE__, __LINE__,
                                      testing::Message() << "VERIFYD_TEST_SEED=" << seed_};
  HostProblem hp_ = test::MakeRandomProblem(
      {{5, 3, TreeShape::kChain}, {4, 70, TreeShape::kRandom}}, 2, seed_, true, 3);
};

TEST_F(VerifyReferenceValidationTest, AcceptsTheUnmodifiedProblem) {
  EXPECT_TRUE(ValidateVerifyProblem(hp_.problem()).ok());
}

TEST_F(VerifyReferenceValidationTest, RejectsOutOfRangeSlots) {
  const int32_t saved = hp_.slots[9];
  hp_.slots[9] = static_cast<int32_t>(hp_.num_slots);
  ExpectRejected(hp_.problem(), "slots[9] = " + std::to_string(hp_.num_slots) +
                                    " must be in [0, num_slots = " + std::to_string(hp_.num_slots) +
                                    ")");
  hp_.slots[9] = -1;
  ExpectRejected(hp_.problem(), "slots[9] = -1 must be in [0, num_slots");
  hp_.slots[9] = saved;
  // Shrinking the pool to the largest slot used puts exactly that slot out of range.
  const auto largest = std::max_element(hp_.slots.begin(), hp_.slots.end());
  VerifyProblem p = hp_.problem();
  p.num_slots = *largest;
  ExpectRejected(p, "slots[" + std::to_string(largest - hp_.slots.begin()) +
                        "] = " + std::to_string(*largest) +
                        " must be in [0, num_slots = " + std::to_string(*largest) + ")");
}

TEST_F(VerifyReferenceValidationTest, RejectsInconsistentSizes) {
  VerifyProblem p = hp_.problem();
  p.num_heads = 0;
  ExpectRejected(p, "num_heads = 0 must be in [1, 1024]");
  p = hp_.problem();
  p.total_q = 72;
  ExpectRejected(p, "qo_indptr[2] = 73 must equal total_q = 72");
  p = hp_.problem();
  p.scale = std::nanf("");
  ExpectRejected(p, "scale = nan must be finite");

  hp_.prefix_len[1] = -1;
  ExpectRejected(hp_.problem(), "prefix_len[1] = -1 must be >= 0");
  hp_.prefix_len[1] = 5;
  ExpectRejected(hp_.problem(),
                 "slot_indptr[2] - slot_indptr[1] = 74 must equal prefix_len[1] + tree nodes = 75");
  hp_.prefix_len[1] = 4;

  hp_.mask_indptr[2] -= 1;
  ExpectRejected(
      hp_.problem(),
      "mask_indptr[2] - mask_indptr[1] = 139 must equal tree nodes * words per row = 140");
  hp_.mask_indptr[2] += 1;

  hp_.qo_indptr[1] = 0;
  ExpectRejected(hp_.problem(), "qo_indptr[1] - qo_indptr[0] = 0 tree nodes; must be in [1, 1024]");
}

TEST_F(VerifyReferenceValidationTest, RejectsTooManyTreeNodes) {
  HostProblem big = test::MakeRandomProblem({{0, 1024, TreeShape::kStar}}, 1, 1, false);
  big.qo_indptr[1] = 1025;
  VerifyProblem p = big.problem();
  p.total_q = 1025;
  const absl::Status status = ValidateVerifyProblem(p);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("1025 tree nodes; must be in [1, 1024]"));
}

TEST_F(VerifyReferenceValidationTest, RejectsMasksThatAreNotAncestorSets) {
  // Sequence 1 has 70 nodes: two words per row, starting at mask word 3.
  uint64_t* row5 = &hp_.mask_bits[3 + 5 * 2];
  row5[0] &= ~(uint64_t{1} << 5);
  ExpectRejected(hp_.problem(),
                 "mask_bits of sequence 1 row 5: bit 5 (the node itself) must be set");
  row5[0] |= uint64_t{1} << 5;
  row5[1] |= uint64_t{1} << 2;
  ExpectRejected(hp_.problem(), "mask_bits of sequence 1 row 5: bit 66 is set; must be <= 5");
  row5[1] = 0;
  row5[0] |= uint64_t{1} << 6;
  ExpectRejected(hp_.problem(), "mask_bits of sequence 1 row 5: bit 6 is set; must be <= 5");
}

}  // namespace
}  // namespace verifyd
