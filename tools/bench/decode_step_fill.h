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

}  // namespace verifyd
