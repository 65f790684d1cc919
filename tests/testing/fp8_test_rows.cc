#include "tests/testing/fp8_test_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "verify/kv_fp8_check.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd::test {

std::vector<bf16_bits> RandomFp8EdgeRow(std::mt19937_64& rng) {
  std::vector<bf16_bits> row(kKvDim);
  std::uniform_real_distribution<float> unit(-1.f, 1.f);
  for (int g = 0; g < kFp8Groups; ++g) {
    bf16_bits* v = row.data() + g * kFp8GroupSize;
    const int kind = std::uniform_int_distribution<int>(0, 6)(rng);
    const float magnitude = std::ldexp(1.f, std::uniform_int_distribution<int>(-20, 16)(rng));
    for (int i = 0; i < kFp8GroupSize; ++i) {
      switch (kind) {
        case 0:  // a zero group (signed zeros too): scale 1
          v[i] = (rng() & 1) ? 0x8000 : 0x0000;
          break;
        case 1: {  // scale a power of two: every value lands on the e4m3 grid or a tie
          const int code = std::uniform_int_distribution<int>(0, 0x7E)(rng);
          const float mid = (E4m3ToFloat(static_cast<uint8_t>(code)) +
                             E4m3ToFloat(static_cast<uint8_t>(std::min(code + 1, 0x7E)))) /
                            2;
          v[i] = FloatToBf16(((rng() & 1) ? -1.f : 1.f) * std::ldexp(mid, -8));
          break;
        }
        case 2:  // bf16 subnormals and tiny values: amax / 448 near or below float32's reach
          v[i] = static_cast<bf16_bits>((rng() & 0x8000) | (rng() % 0x0100));
          break;
        case 3:  // one large value, the rest tiny: e4m3 subnormals and zeros
          v[i] = FloatToBf16(unit(rng) * magnitude * (i == 5 ? 1.f : 0x1p-16f));
          break;
        default:
          v[i] = FloatToBf16(unit(rng) * magnitude);
      }
    }
    if (kind == 1) v[3] = FloatToBf16(448.f * 0x1p-8f);  // amax: scale = 2^-8 exactly
  }
  for (int i = kVDim; i < kKvDim; ++i) row[i] = FloatToBf16(unit(rng) * 100.f);
  return row;
}

std::vector<bf16_bits> RandomFp8EdgeRows(std::mt19937_64& rng, int64_t count) {
  std::vector<bf16_bits> rows;
  rows.reserve(static_cast<size_t>(count) * kKvDim);
  for (int64_t r = 0; r < count; ++r) {
    const std::vector<bf16_bits> row = RandomFp8EdgeRow(rng);
    rows.insert(rows.end(), row.begin(), row.end());
  }
  return rows;
}

void PlantFp8Violation(std::mt19937_64& rng, uint8_t* row, int kind) {
  const int g = static_cast<int>(rng() % kFp8Groups);
  auto set_scale = [&](float scale) { std::memcpy(row + kFp8ScalesOffset + 4 * g, &scale, 4); };
  const int i = static_cast<int>(rng() % kRopeDim);
  auto set_rope = [&](bf16_bits v) { std::memcpy(row + kFp8RopeOffset + 2 * i, &v, 2); };
  switch (kind % 9) {
    case 0:
      set_scale(std::numeric_limits<float>::quiet_NaN());
      break;
    case 1:
      set_scale(std::numeric_limits<float>::infinity());
      break;
    case 2:
      set_scale(0.f);
      break;
    case 3:
      set_scale(-1.f);
      break;
    case 4:
      set_scale(std::nextafter(kMaxFp8Scale, 1e30f));
      break;
    case 5:
      row[kFp8LatentOffset + rng() % kVDim] = 0x7F;
      break;
    case 6:
      row[kFp8LatentOffset + rng() % kVDim] = 0xFF;
      break;
    case 7:
      set_rope(rng() % 2 ? 0x7F80 /*inf*/ : 0xFFC1 /*nan*/);
      break;
    default:
      set_rope(rng() % 2 ? 0x4781 : 0xC781);  // +-65792, just past 2^16
      break;
  }
}

}  // namespace verifyd::test
