#include "backend/cuda/cuda_write_batch.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/align.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"

namespace verifyd {

absl::StatusOr<std::unique_ptr<CudaWriteBatch>> CudaWriteBatch::Create(int row_bytes) {
  if (row_bytes < 16 || row_bytes % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_bytes = ", row_bytes, " must be a positive multiple of 16"));
  }
  std::unique_ptr<CudaWriteBatch> batch(new CudaWriteBatch(row_bytes));
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
                                 const void* rows) {
  if (slots.empty()) return absl::OkStatus();
  Half& half = halves_[current_];
  if (half.in_flight) {
    // Filled and flushed two flushes ago; its copies almost always finished long since.
    VERIFYD_CUDA_CHECK(cudaEventSynchronize(half.copied));
    half.in_flight = false;
  }
  const size_t count = static_cast<size_t>(half.count);
  const size_t n = slots.size();
  const size_t row_bytes = static_cast<size_t>(row_bytes_);
  // cudaMallocHost costs milliseconds: start at a size that holds a few large trees.
  constexpr size_t kMinRows = 2048;
  const size_t want = std::max(count + n, kMinRows);
  VERIFYD_RETURN_IF_ERROR(
      half.indices.ReserveKeeping(want * sizeof(int32_t), count * sizeof(int32_t)));
  VERIFYD_RETURN_IF_ERROR(half.rows.ReserveKeeping(want * row_bytes, count * row_bytes));
  int32_t* indices = half.indices.as<int32_t>();
  const auto* source = static_cast<const uint8_t*>(rows);
  int64_t next = half.count;
  for (size_t k = 0; k < n; ++k) {
    const int32_t row = static_cast<int32_t>(pool_rows_base + slots[k]);
    const auto [it, fresh] = half.position.try_emplace(row, next);
    if (fresh) indices[next++] = row;
    std::memcpy(half.rows.as<uint8_t>(static_cast<size_t>(it->second) * row_bytes),
                source + k * row_bytes, row_bytes);
  }
  half.count = next;
  return absl::OkStatus();
}

absl::Status CudaWriteBatch::Flush(DeviceBuffer& scratch, const CudaStream& stream,
                                   WriteKernel write) {
  Half& half = halves_[current_];
  if (half.count == 0) return absl::OkStatus();
  const size_t count = static_cast<size_t>(half.count);
  const size_t rows_bytes = count * static_cast<size_t>(row_bytes_);
  const size_t rows_offset = AlignTo256(count * sizeof(int32_t));
  VERIFYD_RETURN_IF_ERROR(scratch.Reserve(rows_offset + rows_bytes, stream).status());
  VERIFYD_CUDA_CHECK(cudaMemcpyAsync(scratch.get(), half.indices.get(), count * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, stream.get()));
  VERIFYD_CUDA_CHECK(cudaMemcpyAsync(scratch.as<void>(rows_offset), half.rows.get(), rows_bytes,
                                     cudaMemcpyHostToDevice, stream.get()));
  VERIFYD_CUDA_CHECK(cudaEventRecord(half.copied, stream.get()));
  half.in_flight = true;
  half.count = 0;
  half.position.clear();
  current_ ^= 1;
  return write(scratch.as<int32_t>(), scratch.as<void>(rows_offset), static_cast<int>(count));
}

}  // namespace verifyd
