#include "backend/cuda/cuda_write_batch.h"

#include <algorithm>
#include <cstring>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/mla_verify_launch.h"
#include "verify/mla_dims.h"

namespace verifyd {

absl::StatusOr<std::unique_ptr<CudaWriteBatch>> CudaWriteBatch::Create() {
  std::unique_ptr<CudaWriteBatch> batch(new CudaWriteBatch());
  for (Half& half : batch->halves_) {
    VERIFYD_CUDA_CHECK(cudaEventCreateWithFlags(&half.copied, cudaEventDisableTiming));
  }
  return batch;
}

CudaWriteBatch::~CudaWriteBatch() {
  for (Half& half : halves_) {
    if (half.copied == nullptr) continue;
    // The pinned buffers are freed next: their copies must be done.
    if (half.in_flight) cudaEventSynchronize(half.copied);
    cudaEventDestroy(half.copied);
  }
}

absl::Status CudaWriteBatch::Add(int64_t pool_rows_base, absl::Span<const int32_t> slots,
                                 const bf16_bits* rows) {
  if (slots.empty()) return absl::OkStatus();
  Half& half = halves_[current_];
  if (half.in_flight) {
    // Filled and flushed two flushes ago; its copies almost always finished long since.
    VERIFYD_CUDA_CHECK(cudaEventSynchronize(half.copied));
    half.in_flight = false;
  }
  const size_t count = static_cast<size_t>(half.count);
  const size_t n = slots.size();
  // cudaMallocHost costs milliseconds: start at a size that holds a few large trees.
  constexpr size_t kMinRows = 2048;
  const size_t want = std::max(count + n, kMinRows);
  VERIFYD_RETURN_IF_ERROR(
      half.indices.ReserveKeeping(want * sizeof(int32_t), count * sizeof(int32_t)));
  VERIFYD_RETURN_IF_ERROR(half.rows.ReserveKeeping(want * kKvRowBytes, count * kKvRowBytes));
  int32_t* indices = half.indices.as<int32_t>();
  int64_t next = half.count;
  for (size_t k = 0; k < n; ++k) {
    const int32_t row = static_cast<int32_t>(pool_rows_base + slots[k]);
    const auto [it, fresh] = half.position.try_emplace(row, next);
    if (fresh) indices[next++] = row;
    std::memcpy(half.rows.as<uint8_t>(static_cast<size_t>(it->second) * kKvRowBytes),
                rows + k * kKvDim, kKvRowBytes);
  }
  half.count = next;
  return absl::OkStatus();
}

absl::Status CudaWriteBatch::Flush(bf16_bits* pool, int64_t pool_rows, DeviceBuffer& scratch,
                                   const CudaStream& stream) {
  Half& half = halves_[current_];
  if (half.count == 0) return absl::OkStatus();
  const size_t count = static_cast<size_t>(half.count);
  const size_t rows_offset = AlignTo256(count * sizeof(int32_t));
  VERIFYD_RETURN_IF_ERROR(scratch.Reserve(rows_offset + count * kKvRowBytes, stream).status());
  VERIFYD_CUDA_CHECK(cudaMemcpyAsync(scratch.get(), half.indices.get(), count * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream.get()));
  VERIFYD_CUDA_CHECK(cudaMemcpyAsync(scratch.as<void>(rows_offset), half.rows.get(),
                                     count * kKvRowBytes, cudaMemcpyHostToDevice, stream.get()));
  VERIFYD_CUDA_CHECK(cudaEventRecord(half.copied, stream.get()));
  half.in_flight = true;
  half.count = 0;
  half.position.clear();
  current_ ^= 1;
  return LaunchKvSlotWrite(pool, pool_rows, scratch.as<bf16_bits>(rows_offset),
                           scratch.as<int32_t>(), static_cast<int>(count), stream.get());
}

}  // namespace verifyd
