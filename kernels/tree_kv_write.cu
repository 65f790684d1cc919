// One 16-byte chunk per thread, as kv_slot_write.cu; each thread finds its node's sequence by a
// linear scan of qo_indptr (batch is small and the array sits in L1 after the first warp).
#include "kernels/tree_kv_write.h"

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/programmatic_launch.cuh"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kChunksPerRow = kKvDim / 8;
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    TreeKvWriteKernel(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows, int total_q,
                      int batch, const int32_t* qo_indptr, const int32_t* prefix_len,
                      const int32_t* slot_indptr, const int32_t* slots) {
  pdl::WaitForPriorGrid();
  pdl::AllowDependentLaunch();
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (chunk >= static_cast<int64_t>(total_q) * kChunksPerRow) return;
  const int r = static_cast<int>(chunk / kChunksPerRow);
  const int cc = static_cast<int>(chunk % kChunksPerRow);
  int b = 0;
  while (b + 1 < batch && qo_indptr[b + 1] <= r) ++b;
  const int32_t slot = slots[slot_indptr[b] + prefix_len[b] + (r - qo_indptr[b])];
  if (slot < 0 || slot >= num_slots) return;
  reinterpret_cast<uint4*>(kv + static_cast<int64_t>(slot) * kKvDim)[cc] =
      reinterpret_cast<const uint4*>(rows + static_cast<int64_t>(r) * kKvDim)[cc];
}

}  // namespace

absl::Status LaunchTreeKvWrite(bf16_bits* kv, int64_t num_slots, const bf16_bits* rows, int total_q,
                               int batch, const int32_t* qo_indptr, const int32_t* prefix_len,
                               const int32_t* slot_indptr, const int32_t* slots,
                               cudaStream_t stream) {
  if (total_q < 0 || batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_q = ", total_q, " must be >= 0 and batch = ", batch, " >= 1"));
  }
  if (total_q == 0) return absl::OkStatus();
  if (kv == nullptr || rows == nullptr || qo_indptr == nullptr || prefix_len == nullptr ||
      slot_indptr == nullptr || slots == nullptr) {
    return absl::InvalidArgumentError("kv, rows and the index arrays must be set");
  }
  if (reinterpret_cast<uintptr_t>(rows) % 16 != 0) {
    return absl::InvalidArgumentError("rows (the tree KV) must be 16-byte aligned");
  }
  const int64_t chunks = static_cast<int64_t>(total_q) * kChunksPerRow;
  const unsigned blocks = static_cast<unsigned>((chunks + kThreads - 1) / kThreads);
  // Programmatic where the device has it: its launch overlaps the value check's tail
  // (programmatic_launch.cuh; the kernel waits for that grid before it reads).
  VERIFYD_CUDA_CHECK(pdl::LaunchMaybeProgrammatic(
      TreeKvWriteKernel, dim3(blocks), dim3(kThreads), 0, stream, ProgrammaticLaunchRunsHere(), kv,
      num_slots, rows, total_q, batch, qo_indptr, prefix_len, slot_indptr, slots));
  return absl::OkStatus();
}

}  // namespace verifyd
