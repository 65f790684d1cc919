#include "client/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace verifyd::tensor {
namespace {

// Round to nearest even done in double from the two bf16 neighbours of x: independent of the
// bit trick under test.
uint16_t ReferenceBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t down = static_cast<uint16_t>(u >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double dx = x, dd = Bf16ToFloat(down), du = Bf16ToFloat(up);
  const double err_down = std::fabs(dx - dd), err_up = std::fabs(du - dx);
  if (err_down < err_up) return down;
  if (err_up < err_down) return up;
  return (down & 1) ? up : down;
}

TEST(TensorTest, FloatToBf16RoundsToNearestEven) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float x;
    std::memcpy(&x, &u, 4);
    if (!std::isfinite(x) || std::fabs(x) > 3.0e38f) continue;  // neighbours must be finite
    ASSERT_EQ(FloatToBf16(x), ReferenceBf16(x)) << "x = " << x << " bits " << u;
    ++checked;
  }
  EXPECT_GT(checked, 100000);
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7; even is 1.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-std::numeric_limits<float>::infinity())),
            -std::numeric_limits<float>::infinity());
}

TEST(TensorTest, MakeAndParseRoundTripEveryElement) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> value(-4.f, 4.f);
  const int64_t shape[] = {3, 5, 576};
  std::vector<float> data(3 * 5 * 576);
  for (float& v : data) v = value(rng);
  auto t = MakeBf16FromFloat(shape, data);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(t->inline_data().size(), data.size() * 2);
  auto back = ParseBf16AsFloat(*t, "kv", shape);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    // bf16 keeps 8 significant bits: rounding error <= half an ulp <= 2^-8 relative.
    ASSERT_LE(std::fabs((*back)[i] - data[i]), std::fabs(data[i]) * (1.0f / 256)) << i;
    ASSERT_EQ((*back)[i], Bf16ToFloat(FloatToBf16(data[i]))) << i;
  }
}

TEST(TensorTest, ParseNamesTheFieldAndTheBound) {
  const int64_t shape[] = {2, 4};
  std::vector<uint16_t> data(8, 0x3f80);
  auto t = MakeBf16(shape, data);
  ASSERT_TRUE(t.ok());

  const int64_t other[] = {4, 2};
  auto wrong_shape = ParseBf16(*t, "out", other);
  EXPECT_EQ(wrong_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_shape.status().message().find("out.shape = [2, 4] must equal [4, 2]"),
            std::string::npos)
      << wrong_shape.status();

  v1::Tensor short_bytes = *t;
  short_bytes.mutable_inline_data()->pop_back();
  auto bad_len = ParseBf16(short_bytes, "out");
  EXPECT_NE(bad_len.status().message().find("out.inline_data has 15 bytes, must be 16"),
            std::string::npos)
      << bad_len.status();

  auto wrong_dtype = ParseFp32(*t, "lse");
  EXPECT_NE(wrong_dtype.status().message().find("lse.dtype = DTYPE_BF16 must be DTYPE_FP32"),
            std::string::npos)
      << wrong_dtype.status();

  EXPECT_FALSE(MakeBf16(shape, absl::MakeSpan(data).subspan(1)).ok());
  const int64_t negative[] = {2, -1};
  EXPECT_FALSE(MakeBf16(negative, {}).ok());
}

TEST(TensorTest, ParseFp32CopiesEveryValue) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> value;
  std::vector<float> data(7 * 3);
  for (float& v : data) v = value(rng);
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FP32);
  t.add_shape(7);
  t.add_shape(3);
  t.set_inline_data(reinterpret_cast<const char*>(data.data()), data.size() * 4);
  auto back = ParseFp32(t, "lse");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, data);
}

}  // namespace
}  // namespace verifyd::tensor
