// The quantizing write is one warp per row (kernels/kv_fp8_quantize_warp.cuh); the plain write
// moves one 16-byte word per thread, 41 consecutive threads per row, as kv_slot_write.cu does for
// bf16 rows.
#include "kernels/kv_fp8_write.h"

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/kv_fp8_quantize_warp.cuh"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kWordsPerFp8Row = kFp8RowBytes / 16;

__global__ void __launch_bounds__(kThreads)
    KvSlotWriteFp8Kernel(uint8_t* kv, int64_t num_slots, const bf16_bits* rows,
                         const int32_t* slots, int num_rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= num_rows) return;  // warp-uniform: the shuffles below see a full warp
  const int32_t slot = slots[r];
  if (slot < 0 || slot >= num_slots) return;
  QuantizeFp8RowWarp(rows + r * kKvDim, kv + static_cast<int64_t>(slot) * kFp8RowBytes,
                     static_cast<int>(threadIdx.x % 32));
}

__global__ void __launch_bounds__(kThreads)
    Fp8RowSlotWriteKernel(uint4* kv, int64_t num_slots, const uint4* rows, const int32_t* slots,
                          int num_rows) {
  const int64_t word = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (word >= static_cast<int64_t>(num_rows) * kWordsPerFp8Row) return;
  const int64_t r = word / kWordsPerFp8Row;
  const int w = static_cast<int>(word - r * kWordsPerFp8Row);
  const int32_t slot = slots[r];
  if (slot < 0 || slot >= num_slots) return;
  kv[static_cast<int64_t>(slot) * kWordsPerFp8Row + w] = rows[word];
}

absl::Status CheckWrite(const void* kv, const void* rows, const int32_t* slots, int num_rows) {
  if (num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_rows = ", num_rows, " must be >= 0"));
  }
  if (num_rows > 0 && (kv == nullptr || rows == nullptr || slots == nullptr)) {
    return absl::InvalidArgumentError("kv, rows and slots must be set when num_rows > 0");
  }
  if (reinterpret_cast<uintptr_t>(kv) % 16 != 0 || reinterpret_cast<uintptr_t>(rows) % 16 != 0) {
    return absl::InvalidArgumentError("kv and rows must be 16-byte aligned");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchKvSlotWriteFp8(uint8_t* kv, int64_t num_slots, const bf16_bits* rows,
                                  const int32_t* slots, int num_rows, cudaStream_t stream) {
  if (absl::Status s = CheckWrite(kv, rows, slots, num_rows); !s.ok()) return s;
  if (num_rows == 0) return absl::OkStatus();
  const unsigned blocks = static_cast<unsigned>((num_rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  KvSlotWriteFp8Kernel<<<blocks, kThreads, 0, stream>>>(kv, num_slots, rows, slots, num_rows);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status LaunchFp8RowSlotWrite(uint8_t* kv, int64_t num_slots, const uint8_t* rows,
                                   const int32_t* slots, int num_rows, cudaStream_t stream) {
  if (absl::Status s = CheckWrite(kv, rows, slots, num_rows); !s.ok()) return s;
  if (num_rows == 0) return absl::OkStatus();
  const int64_t words = static_cast<int64_t>(num_rows) * kWordsPerFp8Row;
  const unsigned blocks = static_cast<unsigned>((words + kThreads - 1) / kThreads);
  Fp8RowSlotWriteKernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<uint4*>(kv), num_slots,
                                                         reinterpret_cast<const uint4*>(rows),
                                                         slots, num_rows);
  VERIFYD_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd
