// SPEC §1's value rules for rows handed over already in the fp8 layout (verify/kv_fp8_layout.h):
// what the daemon refuses so that every dequantized value is finite and within 2^16, the bound bf16
// input has (verify/value_bound.h), and every output stays finite.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace verifyd {

// The largest scale taken: the one the daemon's quantizer gives a group whose largest value is
// 2^16, fl32(65536 / 448) (a hair above the real quotient, far inside what keeps scores finite).
inline constexpr float kMaxFp8Scale = 65536.f / 448.f;

// OK, or INVALID_ARGUMENT naming the first bad element of rows[0, count) (656 bytes each) and the
// rule it breaks: a scale that is not finite, <= 0 or above kMaxFp8Scale; a latent byte that is an
// e4m3 NaN encoding (0x7F, 0xFF); a rope value (bf16) that is not finite or beyond 2^16. Row k is
// named by its index in `row_shape` (product >= first_row + count) at flat index first_row + k:
// "kv[1, 7] group 2 scale (bytes 520-523) = nan ...".
absl::Status CheckFp8Rows(const uint8_t* rows, int64_t count, int64_t first_row,
                          absl::Span<const int64_t> row_shape, const std::string& field);

}  // namespace verifyd
