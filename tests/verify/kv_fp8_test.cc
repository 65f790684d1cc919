// The fp8 row (verify/kv_fp8_layout.h) against the independent float64 statement of its rule
// (tests/testing/fp8_f64.h), bit for bit: every e4m3 code, rounding at and around every tie,
// subnormals, saturation, and random rows with zero groups, boundary groups and tiny values; then
// SPEC §1's checks of rows handed over in the layout (verify/kv_fp8_check.h).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fp8_f64.h"
#include "tests/testing/fp8_test_rows.h"
#include "tests/testing/test_seed.h"
#include "verify/bf16.h"
#include "verify/kv_dtype.h"
#include "verify/kv_fp8_check.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

class KvFp8Test : public ::testing::Test {
 protected:
  const uint64_t seed_ = test::TestSeed();
  const ::testing::ScopedTrace trace_{__FILE__, __LINE__,
                                      testing::Message() << "VERIFYD_TEST_SEED=" << seed_};
};

TEST(KvFp8Layout, SizesAreDeepSeeksLayout) {
  EXPECT_EQ(kFp8RowBytes, 656);
  EXPECT_EQ(kFp8ScalesOffset, 512);
  EXPECT_EQ(kFp8RopeOffset, 528);
  EXPECT_EQ(KvRowBytes(KvDtype::kFp8), 656);
  EXPECT_EQ(KvRowBytes(KvDtype::kBf16), 1152);
}

TEST(KvFp8Layout, EveryCodeDecodesToItsFloat64Value) {
  for (int code = 0; code < 256; ++code) {
    const double want = test::E4m3ValueF64(static_cast<uint8_t>(code));
    const float got = E4m3ToFloat(static_cast<uint8_t>(code));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << code;
      EXPECT_TRUE(IsE4m3Nan(static_cast<uint8_t>(code))) << code;
    } else {
      EXPECT_EQ(double{got}, want) << code;
      EXPECT_EQ(std::signbit(got), code >= 0x80) << code;
      EXPECT_FALSE(IsE4m3Nan(static_cast<uint8_t>(code))) << code;
    }
  }
  EXPECT_EQ(E4m3ToFloat(kE4m3MaxCode), 448.f);
  EXPECT_EQ(E4m3ToFloat(0x01), 0x1p-9f);  // least subnormal
}

// Every finite value, every midpoint between neighbours (ties), one float ulp either side of each,
// the subnormal range, and values past 448.
TEST(KvFp8Layout, RoundingMatchesTheNearestSearch) {
  std::vector<float> probes;
  for (int code = 0; code < 0x7E; ++code) {
    const float lo = E4m3ToFloat(static_cast<uint8_t>(code));
    const float hi = E4m3ToFloat(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;  // exact: both have 4 significant bits
    probes.insert(probes.end(), {lo, mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f),
                                 std::nextafter(lo, 1e9f)});
  }
  probes.insert(probes.end(), {448.f, std::nextafter(448.f, 1e9f), 455.f, 456.f, 464.f, 1e6f,
                               1e-30f, 0x1p-10f, 0x1p-10f * 3, 0x1p-9f * 7.5f});
  int checked = 0;
  for (const float p : probes) {
    for (const float x : {p, -p}) {
      ASSERT_EQ(FloatToE4m3(x), test::NearestE4m3F64(x)) << "x = " << x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000);
  // Ties go to the even code: 8.5 between 8 (0x50) and 9 (0x51), 9.5 between 9 and 10 (0x52).
  EXPECT_EQ(FloatToE4m3(8.5f), 0x50);
  EXPECT_EQ(FloatToE4m3(9.5f), 0x52);
  EXPECT_EQ(FloatToE4m3(-0.f), 0x80);
  EXPECT_EQ(FloatToE4m3(1000.f), kE4m3MaxCode);
  EXPECT_EQ(FloatToE4m3(-1000.f), 0x80 | kE4m3MaxCode);
}

TEST_F(KvFp8Test, RandomFloatsRoundLikeTheNearestSearch) {
  std::mt19937_64 rng(seed_);
  std::uniform_real_distribution<float> mantissa(-1.f, 1.f);
  std::uniform_int_distribution<int> exponent(-14, 10);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(mantissa(rng), exponent(rng));
    ASSERT_EQ(FloatToE4m3(x), test::NearestE4m3F64(x)) << "x = " << x;
  }
}

TEST_F(KvFp8Test, RandomRowsQuantizeAndDequantizeBitExactly) {
  std::mt19937_64 rng(seed_);
  std::vector<uint8_t> got(kFp8RowBytes);
  std::vector<float> dequantized(kKvDim);
  int zero_groups = 0, subnormal_codes = 0, max_codes = 0;
  for (int r = 0; r < 4000; ++r) {
    const std::vector<bf16_bits> row = test::RandomFp8EdgeRow(rng);
    QuantizeFp8Row(row.data(), got.data());
    const std::vector<uint8_t> want = test::QuantizeFp8RowF64(row.data());
    for (int b = 0; b < kFp8RowBytes; ++b) {
      ASSERT_EQ(got[b], want[b]) << "row " << r << " byte " << b;
    }
    DequantizeFp8Row(got.data(), dequantized.data());
    const std::vector<double> exact = test::DequantizeFp8RowF64(want.data());
    for (int i = 0; i < kKvDim; ++i) {
      // float32 of the exact product: the one rounding DequantizeFp8Row may do.
      ASSERT_EQ(dequantized[i], static_cast<float>(exact[i])) << "row " << r << " value " << i;
      if (i >= kVDim) ASSERT_EQ(dequantized[i], Bf16ToFloat(row[i]));
    }
    for (int g = 0; g < kFp8Groups; ++g) {
      const float scale = Fp8RowScale(got.data(), g);
      ASSERT_TRUE(std::isfinite(scale) && scale > 0) << scale;
      ASSERT_EQ(CheckFp8Rows(got.data(), 1, 0, {1}, "kv"), absl::OkStatus());
      // Each value within half an e4m3 step of the group's scale (saturation aside).
      for (int i = g * kFp8GroupSize; i < (g + 1) * kFp8GroupSize; ++i) {
        const double v = Bf16ToFloat(row[i]);
        ASSERT_LE(std::fabs(exact[i] - v), std::fabs(v) / 16 + double{scale} * 0x1p-10 + 1e-45)
            << "row " << r << " value " << i;
      }
      zero_groups += scale == 1.f;
    }
    for (int i = 0; i < kVDim; ++i) {
      subnormal_codes += (got[i] & 0x78) == 0 && (got[i] & 7) != 0;
      max_codes += (got[i] & 0x7F) == kE4m3MaxCode;
    }
  }
  // The kinds above must have happened, or the test checks less than it says.
  EXPECT_GT(zero_groups, 100);
  EXPECT_GT(subnormal_codes, 100);
  EXPECT_GT(max_codes, 1000);
}

TEST(KvFp8Layout, AZeroGroupGetsScaleOne) {
  std::vector<bf16_bits> row(kKvDim, 0);
  for (int i = kFp8GroupSize; i < kKvDim; ++i) row[i] = FloatToBf16(1.5f);
  std::vector<uint8_t> out(kFp8RowBytes);
  QuantizeFp8Row(row.data(), out.data());
  EXPECT_EQ(Fp8RowScale(out.data(), 0), 1.f);
  EXPECT_EQ(Fp8RowScale(out.data(), 1), 1.5f / 448.f);
  for (int i = 0; i < kFp8GroupSize; ++i) EXPECT_EQ(out[i], 0);
  for (int i = kFp8GroupSize; i < kVDim; ++i) EXPECT_EQ(out[i], kE4m3MaxCode);
}

// A valid row with one thing broken at a time: each is refused, naming the row and the element.
TEST_F(KvFp8Test, CheckNamesTheFirstBadElement) {
  std::mt19937_64 rng(seed_);
  std::vector<uint8_t> rows(6 * kFp8RowBytes);
  for (int r = 0; r < 6; ++r) {
    QuantizeFp8Row(test::RandomFp8EdgeRow(rng).data(), rows.data() + r * kFp8RowBytes);
  }
  const int64_t shape[] = {2, 3};
  ASSERT_EQ(CheckFp8Rows(rows.data(), 6, 0, shape, "kv"), absl::OkStatus());
  auto with = [&](int row, int byte, const void* bytes, int n) {
    std::vector<uint8_t> bad = rows;
    std::memcpy(bad.data() + row * kFp8RowBytes + byte, bytes, n);
    return CheckFp8Rows(bad.data(), 6, 0, shape, "kv");
  };
  for (const float scale : {std::nanf(""), INFINITY, 0.f, -1.f, 147.f}) {
    const absl::Status s = with(4, kFp8ScalesOffset + 8, &scale, 4);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << scale;
    EXPECT_THAT(s.message(), HasSubstr("kv[1, 1] group 2 scale (float32 at bytes 520-523)"));
    EXPECT_THAT(s.message(), HasSubstr("nothing was kept"));
  }
  const float largest = 65536.f / 448.f;
  EXPECT_EQ(with(4, kFp8ScalesOffset + 8, &largest, 4), absl::OkStatus());
  for (const uint8_t code : {uint8_t{0x7F}, uint8_t{0xFF}}) {
    const absl::Status s = with(5, 300, &code, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("kv[1, 2] byte 300 (group 2 element 44) = 0x"));
    EXPECT_THAT(s.message(), HasSubstr("e4m3 NaN encoding"));
  }
  for (const float value : {INFINITY, std::nanf(""), 70000.f, -66000.f}) {
    const bf16_bits bits = FloatToBf16(value);
    const absl::Status s = with(2, kFp8RopeOffset + 2 * 7, &bits, 2);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(s.message(), HasSubstr("kv[0, 2] rope element 7 (bf16 at bytes 542-543)"));
  }
  const bf16_bits edge = FloatToBf16(65536.f);
  EXPECT_EQ(with(2, kFp8RopeOffset, &edge, 2), absl::OkStatus());
  // first_row offsets the names (a store checking one layer of a call at a time).
  std::vector<uint8_t> bad = rows;
  bad[kFp8RowBytes + 9] = 0x7F;
  EXPECT_THAT(CheckFp8Rows(bad.data() + kFp8RowBytes, 1, 4, shape, "kv").message(),
              HasSubstr("kv[1, 1] byte 9"));
}

}  // namespace
}  // namespace verifyd
