// The device's quantizer steps (verify/kv_fp8_quantize_bits.h, compiled here for the host) against
// the host's quantizer (verify/kv_fp8_layout.h), which tests/verify/kv_fp8_test.cc holds to the
// float64 statement of the rule: the e4m3 rounding on 6 million floats (every sign, exponent and
// top-8 significand bit pattern, with the low bits that decide ties and sticky rounding), every
// bf16 value under many scales, and whole rows composed as the warp kernel composes them
// (kernels/kv_fp8_quantize_warp.cuh), byte for byte. The device's own division (__fdiv_rn) and
// the kernels are tested on a GPU: tests/kernels/kv_fp8_write_test.cc.
#include "verify/kv_fp8_quantize_bits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/fp8_test_rows.h"
#include "tests/testing/test_seed.h"
#include "verify/bf16.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

float FromBits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

TEST(KvFp8QuantizeBits, E4m3CodeIsFloatToE4m3OnEveryRoundingCase) {
  // Bits [31:12] all 2^20 patterns; e4m3 keeps 3 of the 23 significand bits, so bit 19 is the
  // rounding bit and the rest only break ties: these low endings cover exact, just above and
  // just below a tie, and both parities of a sticky bit.
  const uint32_t endings[] = {0x000, 0x001, 0x7ff, 0x800, 0x801, 0xfff};
  int64_t checked = 0;
  for (uint32_t top = 0; top < (1u << 20); ++top) {
    for (const uint32_t ending : endings) {
      const uint32_t u = (top << 12) | ending;
      const float x = FromBits(u);
      if (std::isnan(x)) continue;  // FloatToE4m3's contract: never NaN
      ASSERT_EQ(fp8_bits::E4m3Code(x), FloatToE4m3(x))
          << "x = " << x << " (bits 0x" << std::hex << u << ")";
      ++checked;
    }
  }
  EXPECT_GT(checked, 6'000'000);
  // The cases named by the rule: saturation just past 448, -0, ties either side of 448.
  EXPECT_EQ(fp8_bits::E4m3Code(448.f), kE4m3MaxCode);
  EXPECT_EQ(fp8_bits::E4m3Code(std::nextafter(448.f, 1000.f)), kE4m3MaxCode);
  EXPECT_EQ(fp8_bits::E4m3Code(-464.f), 0x80 | kE4m3MaxCode);
  EXPECT_EQ(fp8_bits::E4m3Code(-0.f), 0x80);
  EXPECT_EQ(fp8_bits::E4m3Code(0.f), 0x00);
  EXPECT_EQ(fp8_bits::E4m3Code(0x1p-10f), 0x00);   // half the least subnormal: tie to even 0
  EXPECT_EQ(fp8_bits::E4m3Code(0x3p-10f), 0x02);   // 1.5 x 2^-9: tie to even 2
  EXPECT_EQ(fp8_bits::E4m3Code(-0x1p-12f), 0x80);  // rounds to -0
  // amax from bits: the magnitude order of bf16 values is the order of their sign-cleared bits.
  EXPECT_EQ(fp8_bits::Bf16MagnitudeBits(0x8000), 0u);
  EXPECT_EQ(fp8_bits::Bf16MagnitudeBits(FloatToBf16(-3.f)), FloatToBf16(3.f));
}

TEST(KvFp8QuantizeBits, EveryBf16ValueUnderManyScalesQuantizesAsTheHost) {
  std::mt19937_64 rng(test::TestSeed());
  std::vector<float> scales = {1.f, 0x1p-8f, 65536.f / 448.f, 1.5f / 448.f};
  // Scales as GroupScale makes them, from random finite amax (normal, subnormal and tiny bf16).
  for (int i = 0; i < 60; ++i) {
    const uint32_t amax = static_cast<uint32_t>(rng() % 0x7f80);
    scales.push_back(fp8_bits::GroupScale(amax));
  }
  for (const float scale : scales) {
    for (uint32_t v = 0; v < 0x10000; ++v) {
      const float value = Bf16ToFloat(static_cast<bf16_bits>(v));
      if (std::isnan(value)) continue;
      ASSERT_EQ(fp8_bits::QuantizeValue(static_cast<bf16_bits>(v), scale),
                FloatToE4m3(value / scale))
          << "v = " << value << " scale = " << scale;
    }
  }
}

// The warp kernel's composition on the host: amax as the max of magnitude bits per group, the
// group's scale, each value's code, the scales little-endian at byte 512, the rope bits copied.
std::vector<uint8_t> QuantizeLikeTheKernel(const bf16_bits* in) {
  std::vector<uint8_t> out(kFp8RowBytes);
  for (int g = 0; g < kFp8Groups; ++g) {
    uint32_t amax = 0;
    for (int i = 0; i < kFp8GroupSize; ++i) {
      amax = std::max(amax, fp8_bits::Bf16MagnitudeBits(in[g * kFp8GroupSize + i]));
    }
    const float scale = fp8_bits::GroupScale(amax);
    for (int i = 0; i < kFp8GroupSize; ++i) {
      out[kFp8LatentOffset + g * kFp8GroupSize + i] =
          fp8_bits::QuantizeValue(in[g * kFp8GroupSize + i], scale);
    }
    std::memcpy(out.data() + kFp8ScalesOffset + 4 * g, &scale, sizeof(scale));
  }
  std::memcpy(out.data() + kFp8RopeOffset, in + kVDim, kRopeDim * sizeof(bf16_bits));
  return out;
}

TEST(KvFp8QuantizeBits, RandomEdgeRowsQuantizeByteForByteAsQuantizeFp8Row) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE(testing::Message() << "VERIFYD_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> want(kFp8RowBytes);
  for (int r = 0; r < 20000; ++r) {
    const std::vector<bf16_bits> row = test::RandomFp8EdgeRow(rng);
    QuantizeFp8Row(row.data(), want.data());
    const std::vector<uint8_t> got = QuantizeLikeTheKernel(row.data());
    for (int b = 0; b < kFp8RowBytes; ++b) {
      ASSERT_EQ(got[b], want[b]) << "row " << r << " byte " << b;
    }
  }
}

}  // namespace
}  // namespace verifyd
