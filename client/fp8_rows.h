// KV rows in DeepSeek's FP8 MLA layout (656 bytes per token and layer: 512 e4m3 latent values in
// four groups of 128, the groups' float32 scales, 64 bf16 rope values), made on the client's side
// exactly as the daemon makes them from bf16 rows (the daemon's own code, verify/kv_fp8_layout.h),
// for Append with DTYPE_FP8_MLA on a daemon started with --kv_dtype=fp8 (plans/0030-fp8-store.md).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace verifyd {

inline constexpr int kFp8KvRowBytes = 656;

// bf16 rows [n][576] (bit patterns, row-major; any leading shape) -> [n][656] bytes: per group of
// 128 latent values scale = float32(amax / 448) (1 for a zero group), each value rounded to the
// nearest e4m3 (ties to even, saturating at 448), the rope values copied. INVALID_ARGUMENT when
// the length is not a multiple of 576. Values beyond SPEC §1's bound (2^16, NaN, Inf) are the
// daemon's to refuse: send bf16 rows for its check, or keep within the bound.
absl::StatusOr<std::vector<uint8_t>> QuantizeKvRowsFp8(absl::Span<const uint16_t> bf16_rows);

}  // namespace verifyd
