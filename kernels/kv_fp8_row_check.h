// SPEC §1's value rules for rows already in DeepSeek's fp8 layout (verify/kv_fp8_layout.h) that lie
// in device memory (an Append from a scheduler's registered buffer): the device finds the first
// row that breaks a rule; the host then names the element and the rule by checking that one row
// with verify/kv_fp8_check.h, so the message is the host path's, word for word.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace verifyd {

// *first_bad_row = min(*first_bad_row, k) for every row k of rows[0, count) (656 bytes each,
// 16-byte aligned, device memory) that CheckFp8Rows would refuse: a scale not finite, <= 0 or
// above kMaxFp8Scale; a latent byte that is an e4m3 NaN code; a rope bf16 beyond 2^16 (or NaN,
// Inf). The caller arms *first_bad_row (device) to ~0 before the launch. Asynchronous on `stream`.
absl::Status LaunchFirstBadFp8Row(const uint8_t* rows, int64_t count,
                                  unsigned long long* first_bad_row, cudaStream_t stream);

}  // namespace verifyd
