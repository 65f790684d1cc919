// fp8 pool: one warp per node (kernels/kv_fp8_quantize_warp.cuh). (A bf16 pool's write rides in
// the scatter and check's launch: tree_row_write.cuh.) Each thread finds its node's sequence by a
// linear scan of qo_indptr (batch is small and the array sits in L1 after the first warp).
#include "kernels/tree_kv_write.h"

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/kv_fp8_quantize_warp.cuh"
#include "kernels/mla_verify_launch.h"
#include "kernels/programmatic_launch.cuh"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

// The pool slot of tree row r (node r - qo_indptr[b] of its sequence b).
__device__ __forceinline__ int32_t TreeRowSlot(int r, int batch, const int32_t* qo_indptr,
                                               const int32_t* prefix_len,
                                               const int32_t* slot_indptr, const int32_t* slots) {
  int b = 0;
  while (b + 1 < batch && qo_indptr[b + 1] <= r) ++b;
  return slots[slot_indptr[b] + prefix_len[b] + (r - qo_indptr[b])];
}

__global__ void __launch_bounds__(kThreads)
    TreeKvWriteFp8Kernel(uint8_t* kv, int64_t num_slots, const bf16_bits* rows, int total_q,
                         int batch, const int32_t* qo_indptr, const int32_t* prefix_len,
                         const int32_t* slot_indptr, const int32_t* slots) {
  pdl::WaitForPriorGrid();
  pdl::AllowDependentLaunch();
  const int r = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
  if (r >= total_q) return;  // warp-uniform: the quantizer's shuffles see a full warp
  const int32_t slot = TreeRowSlot(r, batch, qo_indptr, prefix_len, slot_indptr, slots);
  if (slot < 0 || slot >= num_slots) return;
  QuantizeFp8RowWarp(rows + static_cast<int64_t>(r) * kKvDim,
                     kv + static_cast<int64_t>(slot) * kFp8RowBytes,
                     static_cast<int>(threadIdx.x % 32));
}

absl::Status CheckTreeWrite(const void* kv, const bf16_bits* rows, int total_q, int batch,
                            const int32_t* qo_indptr, const int32_t* prefix_len,
                            const int32_t* slot_indptr, const int32_t* slots) {
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
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchTreeKvWriteFp8(uint8_t* kv, int64_t num_slots, const bf16_bits* rows,
                                  int total_q, int batch, const int32_t* qo_indptr,
                                  const int32_t* prefix_len, const int32_t* slot_indptr,
                                  const int32_t* slots, cudaStream_t stream) {
  if (absl::Status s =
          CheckTreeWrite(kv, rows, total_q, batch, qo_indptr, prefix_len, slot_indptr, slots);
      !s.ok() || total_q == 0) {
    return s;
  }
  if (reinterpret_cast<uintptr_t>(kv) % 16 != 0) {
    return absl::InvalidArgumentError("kv (the fp8 pool's layer) must be 16-byte aligned");
  }
  const unsigned blocks = static_cast<unsigned>((total_q + kWarpsPerBlock - 1) / kWarpsPerBlock);
  VERIFYD_CUDA_CHECK(pdl::LaunchMaybeProgrammatic(
      TreeKvWriteFp8Kernel, dim3(blocks), dim3(kThreads), 0, stream, ProgrammaticLaunchRunsHere(),
      kv, num_slots, rows, total_q, batch, qo_indptr, prefix_len, slot_indptr, slots));
  return absl::OkStatus();
}

}  // namespace verifyd
