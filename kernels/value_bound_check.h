// SPEC §1's input rule (verify/value_bound.h) for tensors that are already in device memory: the
// co-located data plane's registered regions, which the host cannot read. Same rule, same answer
// as FirstOutOfBound on the host: the index of the first value whose magnitude exceeds 2^16 (NaN
// and Inf included), or none.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "verify/bf16.h"

namespace verifyd {

// Sets *first (device, uint64) to min(*first, index of every out-of-bound element of
// data[0, n)); the caller initialises *first to UINT64_MAX before the launch. data: device,
// 16-byte aligned. Allocates nothing, never synchronizes.
absl::Status LaunchFirstOutOfBound(const bf16_bits* data, int64_t n, unsigned long long* first,
                                   cudaStream_t stream);

}  // namespace verifyd
