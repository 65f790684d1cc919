#include "verify/kv_fp8_check.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "verify/kv_fp8_layout.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

constexpr char kKept[] = "; nothing was kept";

std::string RowName(const std::string& field, absl::Span<const int64_t> shape, int64_t flat) {
  std::vector<int64_t> index(shape.size());
  for (int64_t k = flat, d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = k % shape[d];
    k /= shape[d];
  }
  std::string at;
  for (size_t d = 0; d < index.size(); ++d) absl::StrAppend(&at, d ? ", " : "", index[d]);
  return absl::StrCat(field, "[", at, "]");
}

// A branch-free pass the compiler vectorizes; the exact byte is searched only after a hit.
bool HasNanCode(const uint8_t* codes) {
  uint8_t bad = 0;
  for (int i = 0; i < kVDim; ++i) bad |= static_cast<uint8_t>((codes[i] & 0x7F) == 0x7F);
  return bad != 0;
}

absl::Status CheckRow(const uint8_t* row, const std::string& name) {
  for (int g = 0; g < kFp8Groups; ++g) {
    const float scale = Fp8RowScale(row, g);
    if (!(std::isfinite(scale) && scale > 0.f && scale <= kMaxFp8Scale)) {
      const int byte = kFp8ScalesOffset + 4 * g;
      return absl::InvalidArgumentError(absl::StrCat(
          name, " group ", g, " scale (float32 at bytes ", byte, "-", byte + 3, ") = ", scale,
          " must be finite and in (0, ", kMaxFp8Scale,
          "] (SPEC §1: 448 x scale, the group's largest value, must be within 2^16; the bound is "
          "float32(65536 / 448))",
          kKept));
    }
  }
  if (HasNanCode(row + kFp8LatentOffset)) {
    for (int i = 0; i < kVDim; ++i) {
      const uint8_t code = row[kFp8LatentOffset + i];
      if (!IsE4m3Nan(code)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          name, " byte ", kFp8LatentOffset + i, " (group ", i / kFp8GroupSize, " element ",
          i % kFp8GroupSize, ") = 0x", absl::Hex(code, absl::kZeroPad2),
          " is an e4m3 NaN encoding (0x7F, 0xFF); fp8 rows carry finite values only (SPEC §1)",
          kKept));
    }
  }
  for (int i = 0; i < kRopeDim; ++i) {
    bf16_bits v;
    std::memcpy(&v, row + kFp8RopeOffset + 2 * i, sizeof(v));
    if (!OutOfBound(v)) continue;
    const float value = Bf16ToFloat(v);
    const int byte = kFp8RopeOffset + 2 * i;
    return absl::InvalidArgumentError(absl::StrCat(
        name, " rope element ", i, " (bf16 at bytes ", byte, "-", byte + 1, ") = ", value,
        std::isfinite(value) ? " is outside" : " is not finite; values must lie in",
        " [-65536, 65536] (SPEC §1: NaN and Inf are rejected, and finite values beyond 2^16 "
        "could overflow the scores)",
        kKept));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckFp8Rows(const uint8_t* rows, int64_t count, int64_t first_row,
                          absl::Span<const int64_t> row_shape, const std::string& field) {
  for (int64_t k = 0; k < count; ++k) {
    const uint8_t* row = rows + k * kFp8RowBytes;
    // The name is built only for a bad row: the check itself allocates nothing.
    absl::Status status = CheckRow(row, std::string());
    if (status.ok()) continue;
    return CheckRow(row, RowName(field, row_shape, first_row + k));
  }
  return absl::OkStatus();
}

}  // namespace verifyd
