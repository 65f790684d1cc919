// CudaWriteBatch: KV rows written since the last flush, gathered in pinned memory, so that a whole
// Verify batch's tree KV (one WriteRows per sequence) or an Append's layers reach the device in one
// pair of copies and one slot-write kernel instead of one of each per call.
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
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backend/cuda/cuda_device_memory.h"
#include "verify/bf16.h"

namespace verifyd {

class CudaWriteBatch {
 public:
  static absl::StatusOr<std::unique_ptr<CudaWriteBatch>> Create();
  ~CudaWriteBatch();
  CudaWriteBatch(const CudaWriteBatch&) = delete;
  CudaWriteBatch& operator=(const CudaWriteBatch&) = delete;

  // Queues rows[k] for pool row pool_rows_base + slots[k] (slots already checked by the caller).
  absl::Status Add(int64_t pool_rows_base, absl::Span<const int32_t> slots, const bf16_bits* rows);
  int64_t pending_rows() const { return halves_[current_].count; }

  // Enqueues the queued rows on `stream`: H2D of indices and rows into `scratch`, then the
  // slot-write kernel into `pool` ([pool_rows][576]). Returns without waiting.
  absl::Status Flush(bf16_bits* pool, int64_t pool_rows, DeviceBuffer& scratch,
                     const CudaStream& stream);

 private:
  struct Half {
    PinnedBuffer indices;  // int32 [count]
    PinnedBuffer rows;     // bf16 [count][576]
    int64_t count = 0;
    absl::flat_hash_map<int32_t, int64_t> position;  // pool row -> its index in the batch
    cudaEvent_t copied = nullptr;                    // recorded after the half's copies
    bool in_flight = false;
  };
  CudaWriteBatch() = default;

  Half halves_[2];
  int current_ = 0;
};

}  // namespace verifyd
