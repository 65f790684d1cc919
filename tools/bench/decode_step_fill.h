// Device-side random fill for the decode-step bench (the prefill KV, q and tree KV come from device
// memory, never the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace verifyd {

// count bf16 values uniform in [-amplitude, amplitude), a hash of (index, seed): never zeros.
absl::Status FillRandom(void* data, int64_t count, uint64_t seed, float amplitude,
                        cudaStream_t stream);

// rows fp8 KV rows (656 bytes each, verify/kv_fp8_layout.h) that pass SPEC §1's checks: random
// e4m3 codes (never a NaN code), every group's scale 1/448 (values within +-1, as
// FillRandom's bf16 rows), rope values as FillRandom's.
absl::Status FillRandomFp8Rows(void* data, int64_t rows, uint64_t seed, cudaStream_t stream);

}  // namespace verifyd
