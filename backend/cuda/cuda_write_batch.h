// CudaWriteBatch: KV rows written since the last flush, gathered in pinned memory, so that a whole
// Verify batch's tree KV (one WriteRows per sequence) or an Append's layers reach the device in one
// pair of copies and one slot-write kernel instead of one of each per call.
//
// A batch holds rows of one byte size (1152 for bf16 rows, 656 for rows already in the fp8 layout)
// and moves bytes only: which kernel writes the flushed rows into the pool (a plain slot write, or
// one that quantizes bf16 rows into an fp8 pool) is the caller's, given to Flush.
//
// Rows are addressed in the whole pool, row = layer * capacity + slot, so one launch of the
// slot-write kernel (over the pool seen as a single layer) covers every layer.
//
// A row written twice before a flush is kept once, with the later bytes: the kernel writes all
// rows in parallel, so duplicates would race (a slot freed and reused between two flushes).
//
// Two halves alternate: one fills while the other's copies may still be in flight; an event per
// half says when its pinned bytes may be overwritten.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backend/cuda/cuda_device_memory.h"

namespace verifyd {

class CudaWriteBatch {
 public:
  // row_bytes: the size of every queued row, a multiple of 16 (the kernels move 16-byte words).
  static absl::StatusOr<std::unique_ptr<CudaWriteBatch>> Create(int row_bytes);
  ~CudaWriteBatch();
  CudaWriteBatch(const CudaWriteBatch&) = delete;
  CudaWriteBatch& operator=(const CudaWriteBatch&) = delete;

  // Queues rows + k * row_bytes for pool row pool_rows_base + slots[k] (slots already checked by
  // the caller). `rows` needs no alignment and may be reused on return.
  absl::Status Add(int64_t pool_rows_base, absl::Span<const int32_t> slots, const void* rows);
  int64_t pending_rows() const { return halves_[current_].count; }
  int64_t pending_bytes() const { return pending_rows() * row_bytes_; }
  int row_bytes() const { return row_bytes_; }

  // Writes `count` flushed rows into the pool: device pool row indices and the rows
  // ([count][row_bytes], 16-byte aligned), enqueued on the stream Flush was given.
  using WriteKernel =
      absl::FunctionRef<absl::Status(const int32_t* pool_rows, const void* rows, int count)>;
  // Enqueues the queued rows on `stream`: H2D of indices and rows into `scratch`, then `write`.
  // Returns without waiting.
  absl::Status Flush(DeviceBuffer& scratch, const CudaStream& stream, WriteKernel write);

 private:
  struct Half {
    PinnedBuffer indices;  // int32 [count]
    PinnedBuffer rows;     // [count][row_bytes]
    int64_t count = 0;
    absl::flat_hash_map<int32_t, int64_t> position;  // pool row -> its index in the batch
    cudaEvent_t copied = nullptr;                    // recorded after the half's copies
    bool in_flight = false;
  };
  explicit CudaWriteBatch(int row_bytes) : row_bytes_(row_bytes) {}

  int row_bytes_;
  Half halves_[2];
  int current_ = 0;
};

}  // namespace verifyd
