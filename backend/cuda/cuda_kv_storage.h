// CudaKvStorage: the KV pool [layer][slot][row] in one device allocation, moved by kernels on the
// device's one stream. A row is 576 bf16 values (1152 bytes) or, with KvDtype::kFp8, DeepSeek's
// 656-byte fp8 layout (verify/kv_fp8_layout.h; 656 = 41 x 16, so rows stay 16-byte aligned). The
// pool's bytes are whatever its dtype says; copies and compaction move row_bytes() per row.
//
// bf16 rows given to an fp8 pool (WriteRows, WriteDeviceRows, the CUDA backend's tree-KV write)
// are quantized on the device by kernels that compute QuantizeFp8Row's bytes exactly
// (kernels/kv_fp8_write.h): the write batch keeps them bf16 and the flush quantizes, so the host
// never runs the quantizer on the Verify path. Rows already in the layout (WriteEncodedRows,
// checked by the store) go through a second batch and are copied as they are; the two batches are
// flushed in call order (a write to one flushes the other first), so a later write of a slot
// always wins.
//
// Writes are gathered (cuda_write_batch.h) and reach the device at the next FlushWrites, which
// every reader of the pool calls first (ReadRows, CopySlots, CopyRuns, the backend's
// ComputeVerify), or once many are queued. Device work is enqueued and not waited for; ReadRows
// waits (the host must see the rows), and so does CopySlots (the old slot-list path, kept for its
// benchmark). CopyRuns, compaction's path, does not: it only keeps at most two copies queued
// (plans/0011-run-compaction.md). Not waiting is safe because every user of the pool (this
// storage, the CUDA backend's verify) enqueues on the same stream in the executor's order, so a
// later operation always sees an earlier one's bytes (plans/0008-cuda-backend.md).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backend/cuda/cuda_device_memory.h"
#include "backend/cuda/cuda_write_batch.h"
#include "kvstore/kv_storage.h"
#include "verify/bf16.h"
#include "verify/kv_dtype.h"
#include "verify/slot_copy_check.h"

namespace verifyd {

class CudaKvStorage : public KvStorage {
 public:
  // Allocates num_layers * capacity_slots * KvRowBytes(dtype) bytes on stream->device();
  // RESOURCE_EXHAUSTED when the device cannot hold it.
  static absl::StatusOr<std::unique_ptr<CudaKvStorage>> Create(int num_layers,
                                                               int64_t capacity_slots,
                                                               std::shared_ptr<CudaStream> stream,
                                                               KvDtype dtype = KvDtype::kBf16);

  // Waits for the stream: queued copies may still use the buffers freed here.
  ~CudaKvStorage() override;
  CudaKvStorage(const CudaKvStorage&) = delete;
  CudaKvStorage& operator=(const CudaKvStorage&) = delete;

  int num_layers() const override { return num_layers_; }
  int64_t capacity_slots() const override { return capacity_; }
  KvDtype dtype() const override { return dtype_; }
  // Copies the rows into the pinned write batch; `rows` may be reused at once. The device sees
  // them after the next FlushWrites (an fp8 pool quantizes them there).
  absl::Status WriteRows(int layer, absl::Span<const int32_t> slots,
                         const bf16_bits* rows) override;
  // bf16 rows in device memory. Flushes the write batches, checks the rows' values on the device
  // (one read of their bytes, then a wait), writes them with one kernel (quantizing into an fp8
  // pool) and waits again: the caller's buffer is free on return. WriteEncodedDeviceRows does the
  // same for rows already in the pool's layout (an fp8 pool: its rules checked on the device,
  // kernels/kv_fp8_row_check.h; the rows copied as they are).
  absl::Status WriteDeviceRows(int layer, absl::Span<const int32_t> slots, const bf16_bits* rows,
                               BadValueNamer name_bad_value) override;
  absl::Status WriteEncodedDeviceRows(int layer, absl::Span<const int32_t> slots,
                                      const uint8_t* rows, BadRowNamer name_bad_row) override;
  // Gather kernel → D2H → waits for the stream. An fp8 pool: FAILED_PRECONDITION, as on the host
  // (its dequantized values are not bf16); ReadEncodedRows reads it.
  absl::Status ReadRows(int layer, absl::Span<const int32_t> slots, bf16_bits* out) const override;
  // Rows as the pool holds them (row_bytes() each), through a write batch like WriteRows; the
  // caller has checked them (verify/kv_fp8_check.h for fp8).
  absl::Status WriteEncodedRows(int layer, absl::Span<const int32_t> slots,
                                const uint8_t* rows) override;
  // Gather kernel → D2H → waits for the stream; either dtype.
  absl::Status ReadEncodedRows(int layer, absl::Span<const int32_t> slots,
                               uint8_t* out) const override;
  // One kernel copies every layer's rows, then waits for the stream.
  absl::Status CopySlots(absl::Span<const int32_t> src, absl::Span<const int32_t> dst) override;
  // Run table H2D (one copy from the pinned ring) → one kernel over every layer's runs → an
  // event; no wait for this copy. Before enqueueing, waits for the copy two calls back, so at
  // most two copies sit ahead of later work (a Verify behind them) while the host prepares the
  // next chunk during the current one's copy.
  absl::Status CopyRuns(absl::Span<const SlotRunCopy> runs) override;
  // Waits for the last CopyRuns' event.
  absl::Status WaitForCopies() override;

  // Enqueues every queued write (one H2D pair + one kernel). Whoever reads the pool on the device
  // calls it first; stream order does the rest.
  absl::Status FlushWrites() const;

  // Device pointer of one layer's [capacity][576] rows of a bf16 pool (null for fp8).
  const bf16_bits* layer_device_data(int layer) const;
  // Device pointer of one layer's [capacity][row_bytes()] bytes, either dtype.
  const uint8_t* layer_device_bytes(int layer) const;
  const CudaStream& stream() const { return *stream_; }

 private:
  CudaKvStorage(int num_layers, int64_t capacity, std::shared_ptr<CudaStream> stream, KvDtype dtype)
      : num_layers_(num_layers),
        capacity_(capacity),
        dtype_(dtype),
        stream_(std::move(stream)),
        copy_check_(capacity) {}

  absl::Status CheckLayer(int layer) const;
  absl::Status CheckSlots(absl::Span<const int32_t> slots, const char* field) const;
  // `bytes` of the pinned ring for the host to fill. When the ring is full it waits for the stream
  // (every earlier copy out of the ring is then done) and starts over; a request larger than the
  // ring grows it.
  absl::StatusOr<uint8_t*> TakeFromRing(size_t bytes) const;
  // Stages [a | b] (each 256-aligned) and enqueues one H2D into the device scratch buffer.
  // Returns the device addresses of a and b.
  absl::Status UploadScratch(const void* a, size_t a_bytes, const void* b, size_t b_bytes,
                             void** a_dev, void** b_dev) const;
  // Queues rows into `batch` after flushing `other` if it holds any (call order across batches).
  absl::Status Enqueue(CudaWriteBatch& batch, CudaWriteBatch* other, int layer,
                       absl::Span<const int32_t> slots, const void* rows);
  // Enqueues `batch`'s rows with the kernel that fits them: a plain copy when their size is the
  // pool's row size, else (bf16 rows into an fp8 pool) the quantizing write.
  absl::Status FlushBatch(CudaWriteBatch& batch) const;
  // The start shared by the writes from device rows: the rows' pointer checked, earlier host rows
  // flushed (a later device row for the same slot wins: call order), the slots uploaded and a
  // first-bad word armed to ~0 in the scratch ([slots | word]), for the caller's check kernel.
  struct DeviceRowsScratch {
    const int32_t* slots = nullptr;
    unsigned long long* first_bad = nullptr;
  };
  absl::StatusOr<DeviceRowsScratch> StageDeviceRows(absl::Span<const int32_t> slots,
                                                    const void* rows);
  // The first-bad word once the check enqueued on the stream has run (the stream is then idle).
  absl::StatusOr<unsigned long long> ReadFirstBad(const unsigned long long* first_bad);
  // The gather shared by ReadRows and ReadEncodedRows: row_bytes() per row into `out`.
  absl::Status GatherToHost(int layer, absl::Span<const int32_t> slots, void* out) const;

  int num_layers_;
  int64_t capacity_;
  KvDtype dtype_;
  std::shared_ptr<CudaStream> stream_;
  DeviceBuffer pool_;
  // Mutable: ReadRows is const in the KvStorage interface but stages through these. The device
  // scratch is reused by every call without waiting: the stream runs one call's upload only after
  // the previous call's kernel finished reading it.
  mutable PinnedBuffer ring_;
  mutable size_t ring_used_ = 0;
  mutable DeviceBuffer scratch_;
  mutable PinnedBuffer read_back_;
  // bf16 rows (WriteRows; on a bf16 pool WriteEncodedRows too): copied, or quantized into fp8.
  std::unique_ptr<CudaWriteBatch> writes_;
  // An fp8 pool's rows already in the layout (WriteEncodedRows); null for bf16.
  std::unique_ptr<CudaWriteBatch> encoded_writes_;
  SlotCopyCheck copy_check_;
  // Recorded after each CopyRuns kernel, alternately: copy_done_[n % 2] is copy n's (timing off).
  cudaEvent_t copy_done_[2] = {nullptr, nullptr};
  int64_t copies_enqueued_ = 0;
};

}  // namespace verifyd
