#include "tests/testing/fp8_f64.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace verifyd::test {
namespace {

constexpr int kLatent = 512, kGroup = 128, kRope = 64, kScales = 512, kRopeAt = 528, kRow = 656;

double Bf16Value(bf16_bits b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

double E4m3ValueF64(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

uint8_t NearestE4m3F64(double x) {
  const double a = std::fabs(x);
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= 0x7E; ++code) {
    const double distance = std::fabs(E4m3ValueF64(static_cast<uint8_t>(code)) - a);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | best);
}

std::vector<uint8_t> QuantizeFp8RowF64(const bf16_bits* row) {
  std::vector<uint8_t> out(kRow);
  for (int g = 0; g < 4; ++g) {
    double amax = 0;
    for (int i = 0; i < kGroup; ++i)
      amax = std::max(amax, std::fabs(Bf16Value(row[g * kGroup + i])));
    // A float64 quotient of two float32 values, rounded once to float32, is the float32 quotient.
    float scale = static_cast<float>(amax / 448.0);
    if (scale == 0.f) scale = 1.f;
    for (int i = 0; i < kGroup; ++i) {
      const float x = static_cast<float>(Bf16Value(row[g * kGroup + i]) / double{scale});
      out[g * kGroup + i] = NearestE4m3F64(x);
    }
    std::memcpy(out.data() + kScales + 4 * g, &scale, 4);
  }
  std::memcpy(out.data() + kRopeAt, row + kLatent, kRope * 2);
  return out;
}

std::vector<double> DequantizeFp8RowF64(const uint8_t* row) {
  std::vector<double> out(kLatent + kRope);
  DequantizeFp8RowF64(row, out.data());
  return out;
}

void DequantizeFp8RowF64(const uint8_t* row, double* out) {
  for (int i = 0; i < kLatent; ++i) {
    float scale;
    std::memcpy(&scale, row + kScales + 4 * (i / kGroup), 4);
    out[i] = E4m3ValueF64(row[i]) * double{scale};
  }
  for (int i = 0; i < kRope; ++i) {
    bf16_bits v;
    std::memcpy(&v, row + kRopeAt + 2 * i, 2);
    out[kLatent + i] = Bf16Value(v);
  }
}

}  // namespace verifyd::test
