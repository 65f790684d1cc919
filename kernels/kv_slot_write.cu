// Writes new KV rows (an Append's tokens, a Verify's tree KV) into their slots of one layer of the
// pool. One 16-byte chunk per thread, so a row is written by 72 consecutive threads with coalesced
// stores.
#include <cstdint>

#include "kernels/mla_verify_kernels.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kChunksPerRow = kKvDim / 8;
constexpr int kSlotWriteThreads = 256;

__global__ void __launch_bounds__(kSlotWriteThreads)
    KvSlotWriteKernel(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows, const int32_t* slots,
                      int num_rows) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kSlotWriteThreads + threadIdx.x;
  if (chunk >= static_cast<int64_t>(num_rows) * kChunksPerRow) return;
  const int64_t r = chunk / kChunksPerRow;
  const int cc = static_cast<int>(chunk % kChunksPerRow);
  const int32_t slot = slots[r];
  if (slot < 0 || slot >= num_slots) return;
  reinterpret_cast<uint4*>(kv + static_cast<int64_t>(slot) * kKvDim)[cc] =
      reinterpret_cast<const uint4*>(rows + r * kKvDim)[cc];
}

}  // namespace

void LaunchKvSlotWriteKernel(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows,
                             const int32_t* slots, int num_rows, cudaStream_t stream) {
  if (num_rows <= 0) return;
  const int64_t chunks = static_cast<int64_t>(num_rows) * kChunksPerRow;
  const unsigned blocks =
      static_cast<unsigned>((chunks + kSlotWriteThreads - 1) / kSlotWriteThreads);
  KvSlotWriteKernel<<<blocks, kSlotWriteThreads, 0, stream>>>(kv, num_slots, rows, slots, num_rows);
}

}  // namespace verifyd
