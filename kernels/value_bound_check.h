// SPEC §1's input rule (verify/value_bound.h) for tensors that are already in device memory: the
// co-located data plane's registered regions, which the host cannot read. Same rule, same answer
// as FirstOutOfBound on the host: the index of the first value whose magnitude exceeds 2^16 (NaN
// and Inf included) with its value, or none; and the NaN outputs of a call so refused.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/slot_table_scatter.h"
#include "kernels/tree_kv_write.h"
#include "verify/bf16.h"

namespace verifyd {

// The first out-of-bound element of data[0, n), packed so that one atomicMin finds it and its
// value together: (index << 16) | bits, or kNoneOutOfBound when every value is inside.
inline constexpr unsigned long long kNoneOutOfBound = ~0ull;
inline int64_t OutOfBoundIndex(unsigned long long packed) {
  return static_cast<int64_t>(packed >> 16);
}
inline bf16_bits OutOfBoundBits(unsigned long long packed) {
  return static_cast<bf16_bits>(packed & 0xffffu);
}

// Sets *first (device, uint64) to the min of itself and the packed (index << 16) | bits of every
// out-of-bound element of data[0, n) (n < 2^48); the caller initialises *first to
// kNoneOutOfBound (bytes 0xff) before the launch. data: device, 16-byte aligned. Allocates nothing,
// never synchronizes.
absl::Status LaunchFirstOutOfBound(const bf16_bits* data, int64_t n, unsigned long long* first,
                                   cudaStream_t stream);
// The same for two tensors in one launch (a verify call's q and tree_kv: one graph node, not two):
// firsts[0] for a[0, na), firsts[1] for b[0, nb). Either n may be 0.
absl::Status LaunchFirstOutOfBoundOfTwo(const bf16_bits* a, int64_t na, const bf16_bits* b,
                                        int64_t nb, unsigned long long* firsts,
                                        cudaStream_t stream);

// What LaunchFirstOutOfBoundOfTwo checks, as one argument. All empty: no check.
struct FirstOutOfBoundArgs {
  const bf16_bits* a = nullptr;
  int64_t na = 0;
  const bf16_bits* b = nullptr;
  int64_t nb = 0;
  unsigned long long* firsts = nullptr;
};
// The slot-table scatter (kernels/slot_table_scatter.h) and the check of up to two tensors in one
// launch: both read only what a verify call's one upload brought, so its graph needs one node
// after the upload, not two. Either part may be empty; the launch completes both (a later kernel
// in stream order sees the arena placed and the words final).
// `tree`, when given (an external call on a bf16 pool), writes the call's tree KV into the pool in
// the same launch (kernels/tree_kv_write.h): it reads its slots from the upload and its rows from
// the tensor the check reads, so it needs neither part's result. A refused call's rows are
// written as they were when the write had its own launch after the check: the store keeps that
// layer unwritten until the check's answer (executor/device_operations.cc), so no Commit takes
// them.
absl::Status LaunchSlotScatterAndFirstOutOfBound(const SlotScatterArgs& scatter,
                                                 const FirstOutOfBoundArgs& check,
                                                 cudaStream_t stream,
                                                 const TreeRowWriteArgs& tree = {});

// A refused call's outputs, and the hand-off of the check's answer. When any of firsts[0, count)
// (device, count <= 2, set by a check above) found a bad value, out[0, out_n) (bf16) and
// lse[0, lse_n) (fp32, may be null) become NaN and the words go to host_firsts[0, count) (a device
// pointer to mapped pinned host memory: visible to the host once an event recorded after the
// launch has completed); otherwise nothing is written. For calls whose inputs the host cannot see
// before they run. Nothing is re-armed: the caller arms firsts before the check (an external
// call's upload carries them) and host_firsts before the launch (kNoneOutOfBound), so a replay of
// the same launches needs no memset and no copy. The launch runs even with nothing to fill.
// The check's and the fill's launchers use programmatic dependent launch where the device has it
// (programmatic_launch.cuh): each kernel waits for the grid before it, so its launch, not its
// reads, overlaps that grid's tail.
absl::Status LaunchNanIfOutOfBound(const unsigned long long* firsts, int count,
                                   unsigned long long* host_firsts, bf16_bits* out, int64_t out_n,
                                   float* lse, int64_t lse_n, cudaStream_t stream);

}  // namespace verifyd
