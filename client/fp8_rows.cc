#include "client/fp8_rows.h"

#include "absl/strings/str_cat.h"
#include "verify/kv_fp8_layout.h"

namespace verifyd {

static_assert(kFp8KvRowBytes == kFp8RowBytes);

absl::StatusOr<std::vector<uint8_t>> QuantizeKvRowsFp8(absl::Span<const uint16_t> bf16_rows) {
  if (bf16_rows.size() % kKvDim != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bf16_rows has ", bf16_rows.size(),
                                                   " values, must be a multiple of ", kKvDim));
  }
  const size_t rows = bf16_rows.size() / kKvDim;
  std::vector<uint8_t> out(rows * kFp8RowBytes);
  for (size_t r = 0; r < rows; ++r) {
    QuantizeFp8Row(bf16_rows.data() + r * kKvDim, out.data() + r * kFp8RowBytes);
  }
  return out;
}

}  // namespace verifyd
