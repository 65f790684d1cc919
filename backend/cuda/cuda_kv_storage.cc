#include "backend/cuda/cuda_kv_storage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/kv_copy_kernels.h"
#include "kernels/kv_fp8_row_check.h"
#include "kernels/kv_fp8_write.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/value_bound_check.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

// The pinned ring stages the slot lists of reads and compaction's run tables; it starts here and
// doubles when one request needs more. A wrap waits for the stream, which would stall the copy
// pipeline (a 64 MiB chunk of single-slot runs at 2 layers is a 466 KB table): 8 MB wraps
// rarely.
constexpr size_t kInitialRingBytes = size_t{8} << 20;
// Queued writes are flushed once they hold this much, bounding the pinned batch.
constexpr int64_t kFlushBytes = int64_t{32} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<CudaKvStorage>> CudaKvStorage::Create(
    int num_layers, int64_t capacity_slots, std::shared_ptr<CudaStream> stream, KvDtype dtype) {
  if (stream == nullptr) return absl::InvalidArgumentError("stream must be set");
  if (num_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers = ", num_layers, " must be >= 1"));
  }
  if (capacity_slots < 1 || capacity_slots > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity_slots = ", capacity_slots, " must be in [1, ", INT32_MAX, "]"));
  }
  // The write batch addresses rows of the whole pool with int32 (a pool that large would not fit
  // any device: 2^31 rows are 2.4 TB).
  if (static_cast<int64_t>(num_layers) * capacity_slots > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_layers * capacity_slots = ", num_layers * capacity_slots, " must be <= ", INT32_MAX));
  }
  VERIFYD_RETURN_IF_ERROR(stream->MakeDeviceCurrent());
  std::unique_ptr<CudaKvStorage> storage(
      new CudaKvStorage(num_layers, capacity_slots, std::move(stream), dtype));
  const int row_bytes = KvRowBytes(dtype);
  const size_t pool_bytes = static_cast<size_t>(num_layers) * capacity_slots * row_bytes;
  VERIFYD_RETURN_IF_ERROR(storage->pool_.AllocateExact(
      pool_bytes, absl::StrCat("the KV pool (", num_layers, " layers x ", capacity_slots,
                               " slots x ", row_bytes, " bytes, ", KvDtypeName(dtype), ")")
                      .c_str()));
  VERIFYD_RETURN_IF_ERROR(storage->ring_.Reserve(kInitialRingBytes, *storage->stream_).status());
  VERIFYD_ASSIGN_OR_RETURN(storage->writes_, CudaWriteBatch::Create(kKvRowBytes));
  if (dtype == KvDtype::kFp8) {
    VERIFYD_ASSIGN_OR_RETURN(storage->encoded_writes_, CudaWriteBatch::Create(kFp8RowBytes));
  }
  for (cudaEvent_t& event : storage->copy_done_) {
    VERIFYD_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  return storage;
}

CudaKvStorage::~CudaKvStorage() {
  if (stream_->MakeDeviceCurrent().ok()) stream_->Synchronize().IgnoreError();
  for (cudaEvent_t event : copy_done_) {
    if (event != nullptr) cudaEventDestroy(event);
  }
}

const bf16_bits* CudaKvStorage::layer_device_data(int layer) const {
  if (dtype_ != KvDtype::kBf16) return nullptr;
  return reinterpret_cast<const bf16_bits*>(layer_device_bytes(layer));
}

const uint8_t* CudaKvStorage::layer_device_bytes(int layer) const {
  return pool_.as<uint8_t>(static_cast<size_t>(layer) * capacity_ * row_bytes());
}

absl::Status CudaKvStorage::CheckLayer(int layer) const {
  if (layer < 0 || layer >= num_layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer = ", layer, " must be in [0, ", num_layers_, ")"));
  }
  return absl::OkStatus();
}

absl::Status CudaKvStorage::CheckSlots(absl::Span<const int32_t> slots, const char* field) const {
  // The kernels would read or write out of bounds: every index is checked on the host first.
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] < 0 || slots[k] >= capacity_) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", k, "] = ", slots[k], " must be in [0, ", capacity_, ")"));
    }
  }
  if (slots.size() > static_cast<size_t>(INT32_MAX / kKvDim)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", slots.size(), " entries, must be <= ", INT32_MAX / kKvDim));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> CudaKvStorage::TakeFromRing(size_t bytes) const {
  const size_t aligned = AlignTo256(bytes);
  if (ring_used_ + aligned > ring_.capacity()) {
    VERIFYD_RETURN_IF_ERROR(stream_->Synchronize());
    ring_used_ = 0;
    VERIFYD_RETURN_IF_ERROR(ring_.Reserve(aligned, *stream_).status());
  }
  uint8_t* taken = ring_.as<uint8_t>(ring_used_);
  ring_used_ += aligned;
  return taken;
}

absl::Status CudaKvStorage::UploadScratch(const void* a, size_t a_bytes, const void* b,
                                          size_t b_bytes, void** a_dev, void** b_dev) const {
  const size_t b_offset = AlignTo256(a_bytes);
  const size_t total = b_offset + b_bytes;
  VERIFYD_RETURN_IF_ERROR(scratch_.Reserve(total, *stream_).status());
  // a and b are staged back to back so that one DMA moves both.
  VERIFYD_ASSIGN_OR_RETURN(uint8_t * staged, TakeFromRing(total));
  if (a_bytes > 0) std::memcpy(staged, a, a_bytes);
  if (b_bytes > 0) std::memcpy(staged + b_offset, b, b_bytes);
  VERIFYD_CUDA_CHECK(
      cudaMemcpyAsync(scratch_.get(), staged, total, cudaMemcpyHostToDevice, stream_->get()));
  *a_dev = scratch_.as<void>(0);
  *b_dev = scratch_.as<void>(b_offset);
  return absl::OkStatus();
}

absl::Status CudaKvStorage::Enqueue(CudaWriteBatch& batch, CudaWriteBatch* other, int layer,
                                    absl::Span<const int32_t> slots, const void* rows) {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (slots.empty()) return absl::OkStatus();
  if (rows == nullptr) return absl::InvalidArgumentError("rows must not be null");
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  // The other batch's rows were written earlier: they land first, so a later write of the same
  // slot wins as it does on the host.
  if (other != nullptr && other->pending_rows() > 0) VERIFYD_RETURN_IF_ERROR(FlushBatch(*other));
  VERIFYD_RETURN_IF_ERROR(batch.Add(int64_t{layer} * capacity_, slots, rows));
  if (batch.pending_bytes() >= kFlushBytes) return FlushBatch(batch);
  return absl::OkStatus();
}

absl::Status CudaKvStorage::WriteRows(int layer, absl::Span<const int32_t> slots,
                                      const bf16_bits* rows) {
  return Enqueue(*writes_, encoded_writes_.get(), layer, slots, rows);
}

absl::Status CudaKvStorage::WriteEncodedRows(int layer, absl::Span<const int32_t> slots,
                                             const uint8_t* rows) {
  // A bf16 pool's encoded rows are bf16 rows.
  if (dtype_ == KvDtype::kBf16) return Enqueue(*writes_, nullptr, layer, slots, rows);
  return Enqueue(*encoded_writes_, writes_.get(), layer, slots, rows);
}

absl::Status CudaKvStorage::FlushBatch(CudaWriteBatch& batch) const {
  if (batch.pending_rows() == 0) return absl::OkStatus();
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  // The whole pool as one layer of num_layers * capacity rows (the batch addresses it so).
  const int64_t pool_rows = int64_t{num_layers_} * capacity_;
  uint8_t* pool = pool_.as<uint8_t>();
  cudaStream_t stream = stream_->get();
  const bool quantize = batch.row_bytes() != row_bytes();
  return batch.Flush(
      scratch_, *stream_, [&](const int32_t* indices, const void* rows, int count) -> absl::Status {
        const auto* bf16_rows = static_cast<const bf16_bits*>(rows);
        if (quantize) {
          return LaunchKvSlotWriteFp8(pool, pool_rows, bf16_rows, indices, count, stream);
        }
        if (dtype_ == KvDtype::kFp8) {
          return LaunchFp8RowSlotWrite(pool, pool_rows, static_cast<const uint8_t*>(rows), indices,
                                       count, stream);
        }
        return LaunchKvSlotWrite(reinterpret_cast<bf16_bits*>(pool), pool_rows, bf16_rows, indices,
                                 count, stream);
      });
}

absl::Status CudaKvStorage::FlushWrites() const {
  // At most one batch holds rows (a write to one flushes the other), so the order is moot.
  VERIFYD_RETURN_IF_ERROR(FlushBatch(*writes_));
  if (encoded_writes_ != nullptr) VERIFYD_RETURN_IF_ERROR(FlushBatch(*encoded_writes_));
  return absl::OkStatus();
}

absl::StatusOr<CudaKvStorage::DeviceRowsScratch> CudaKvStorage::StageDeviceRows(
    absl::Span<const int32_t> slots, const void* rows) {
  if (rows == nullptr) return absl::InvalidArgumentError("rows must not be null");
  if (reinterpret_cast<uintptr_t>(rows) % 16 != 0) {
    return absl::InvalidArgumentError("rows must be 16-byte aligned");
  }
  VERIFYD_RETURN_IF_ERROR(FlushWrites());
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  // Sized before the upload so that growing it cannot discard the slots.
  const size_t first_offset = AlignTo256(slots.size() * sizeof(int32_t));
  VERIFYD_RETURN_IF_ERROR(scratch_.Reserve(first_offset + sizeof(uint64_t), *stream_).status());
  void* slots_dev = nullptr;
  void* unused = nullptr;
  VERIFYD_RETURN_IF_ERROR(
      UploadScratch(slots.data(), slots.size() * sizeof(int32_t), nullptr, 0, &slots_dev, &unused));
  DeviceRowsScratch staged;
  staged.slots = static_cast<const int32_t*>(slots_dev);
  staged.first_bad = scratch_.as<unsigned long long>(first_offset);
  VERIFYD_CUDA_CHECK(cudaMemsetAsync(staged.first_bad, 0xff, sizeof(uint64_t), stream_->get()));
  return staged;
}

absl::StatusOr<unsigned long long> CudaKvStorage::ReadFirstBad(
    const unsigned long long* first_bad) {
  VERIFYD_RETURN_IF_ERROR(read_back_.Reserve(sizeof(uint64_t), *stream_).status());
  auto* found = static_cast<unsigned long long*>(read_back_.get());
  VERIFYD_CUDA_CHECK(
      cudaMemcpyAsync(found, first_bad, sizeof(uint64_t), cudaMemcpyDeviceToHost, stream_->get()));
  VERIFYD_RETURN_IF_ERROR(stream_->Synchronize());
  ring_used_ = 0;  // the stream is idle: every copy out of the ring has happened
  return *found;
}

absl::Status CudaKvStorage::WriteDeviceRows(int layer, absl::Span<const int32_t> slots,
                                            const bf16_bits* rows, BadValueNamer name_bad_value) {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (slots.empty()) return absl::OkStatus();
  VERIFYD_ASSIGN_OR_RETURN(const DeviceRowsScratch staged, StageDeviceRows(slots, rows));
  const int64_t elements = static_cast<int64_t>(slots.size()) * kKvDim;
  VERIFYD_RETURN_IF_ERROR(LaunchFirstOutOfBound(rows, elements, staged.first_bad, stream_->get()));
  VERIFYD_ASSIGN_OR_RETURN(const unsigned long long found, ReadFirstBad(staged.first_bad));
  if (found != kNoneOutOfBound) {
    return name_bad_value(OutOfBoundIndex(found), OutOfBoundBits(found));
  }
  uint8_t* layer_bytes = const_cast<uint8_t*>(layer_device_bytes(layer));
  const int count = static_cast<int>(slots.size());
  if (dtype_ == KvDtype::kFp8) {
    // Checked above as bf16 (SPEC §1), quantized on the way in as WriteRows' rows are.
    VERIFYD_RETURN_IF_ERROR(
        LaunchKvSlotWriteFp8(layer_bytes, capacity_, rows, staged.slots, count, stream_->get()));
  } else {
    VERIFYD_RETURN_IF_ERROR(LaunchKvSlotWrite(reinterpret_cast<bf16_bits*>(layer_bytes), capacity_,
                                              rows, staged.slots, count, stream_->get()));
  }
  return stream_->Synchronize();
}

absl::Status CudaKvStorage::WriteEncodedDeviceRows(int layer, absl::Span<const int32_t> slots,
                                                   const uint8_t* rows, BadRowNamer name_bad_row) {
  // A bf16 pool's encoded rows are bf16 rows.
  if (dtype_ == KvDtype::kBf16) {
    return WriteDeviceRows(layer, slots, reinterpret_cast<const bf16_bits*>(rows),
                           [](int64_t index, bf16_bits bits) {
                             const int64_t shape[] = {index / kKvDim + 1, kKvDim};
                             return OutOfBoundError(shape, index, bits, "rows");
                           });
  }
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (slots.empty()) return absl::OkStatus();
  VERIFYD_ASSIGN_OR_RETURN(const DeviceRowsScratch staged, StageDeviceRows(slots, rows));
  const int64_t count = static_cast<int64_t>(slots.size());
  VERIFYD_RETURN_IF_ERROR(LaunchFirstBadFp8Row(rows, count, staged.first_bad, stream_->get()));
  VERIFYD_ASSIGN_OR_RETURN(const unsigned long long found, ReadFirstBad(staged.first_bad));
  if (found != ~0ull) {
    // That one row back to the host, named by the caller's check of it.
    const int64_t bad = static_cast<int64_t>(found);
    VERIFYD_RETURN_IF_ERROR(read_back_.Reserve(kFp8RowBytes, *stream_).status());
    uint8_t* row = read_back_.as<uint8_t>();
    VERIFYD_CUDA_CHECK(cudaMemcpyAsync(row, rows + bad * kFp8RowBytes, kFp8RowBytes,
                                       cudaMemcpyDeviceToHost, stream_->get()));
    VERIFYD_RETURN_IF_ERROR(stream_->Synchronize());
    const absl::Status named = name_bad_row(row, bad);
    if (named.ok()) {
      return absl::InternalError(absl::StrCat("the device found row ", bad,
                                              " of the fp8 rows bad and the host's check did not; "
                                              "nothing was kept"));
    }
    return named;
  }
  VERIFYD_RETURN_IF_ERROR(LaunchFp8RowSlotWrite(const_cast<uint8_t*>(layer_device_bytes(layer)),
                                                capacity_, rows, staged.slots,
                                                static_cast<int>(count), stream_->get()));
  return stream_->Synchronize();
}

absl::Status CudaKvStorage::ReadRows(int layer, absl::Span<const int32_t> slots,
                                     bf16_bits* out) const {
  if (dtype_ != KvDtype::kBf16) {
    return absl::FailedPreconditionError(
        "the pool holds fp8 rows, whose dequantized values are not bf16; read them with "
        "ReadEncodedRows");
  }
  return GatherToHost(layer, slots, out);
}

absl::Status CudaKvStorage::ReadEncodedRows(int layer, absl::Span<const int32_t> slots,
                                            uint8_t* out) const {
  return GatherToHost(layer, slots, out);
}

absl::Status CudaKvStorage::GatherToHost(int layer, absl::Span<const int32_t> slots,
                                         void* out) const {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (slots.empty()) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("out must not be null");
  VERIFYD_RETURN_IF_ERROR(FlushWrites());
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  const size_t row_bytes = slots.size() * static_cast<size_t>(this->row_bytes());
  // The gathered rows go to the scratch after the indices: one buffer, sized before the upload so
  // that growing it cannot discard the indices.
  const size_t rows_offset = AlignTo256(slots.size() * sizeof(int32_t));
  VERIFYD_RETURN_IF_ERROR(scratch_.Reserve(rows_offset + row_bytes, *stream_).status());
  void* slots_dev = nullptr;
  void* unused = nullptr;
  VERIFYD_RETURN_IF_ERROR(
      UploadScratch(slots.data(), slots.size() * sizeof(int32_t), nullptr, 0, &slots_dev, &unused));
  void* gathered = scratch_.as<void>(rows_offset);
  VERIFYD_RETURN_IF_ERROR(LaunchGatherRows(
      layer_device_bytes(layer), this->row_bytes(), static_cast<const int32_t*>(slots_dev),
      static_cast<int>(slots.size()), gathered, stream_->get()));
  VERIFYD_RETURN_IF_ERROR(read_back_.Reserve(row_bytes, *stream_).status());
  VERIFYD_CUDA_CHECK(cudaMemcpyAsync(read_back_.get(), gathered, row_bytes, cudaMemcpyDeviceToHost,
                                     stream_->get()));
  VERIFYD_RETURN_IF_ERROR(stream_->Synchronize());
  // The stream is idle: every copy out of the ring has happened.
  ring_used_ = 0;
  std::memcpy(out, read_back_.get(), row_bytes);
  return absl::OkStatus();
}

absl::Status CudaKvStorage::CopySlots(absl::Span<const int32_t> src,
                                      absl::Span<const int32_t> dst) {
  VERIFYD_RETURN_IF_ERROR(copy_check_.Check(src, dst));
  if (src.empty()) return absl::OkStatus();
  VERIFYD_RETURN_IF_ERROR(FlushWrites());
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  void* src_dev = nullptr;
  void* dst_dev = nullptr;
  VERIFYD_RETURN_IF_ERROR(UploadScratch(src.data(), src.size() * sizeof(int32_t), dst.data(),
                                        dst.size() * sizeof(int32_t), &src_dev, &dst_dev));
  VERIFYD_RETURN_IF_ERROR(LaunchCopySlotsAllLayers(
      pool_.get(), row_bytes(), num_layers_, capacity_, static_cast<const int32_t*>(src_dev),
      static_cast<const int32_t*>(dst_dev), static_cast<int>(src.size()), stream_->get()));
  // Not needed for correctness (stream order already puts the copy before any later write of a
  // freed source slot): the wait makes a compaction chunk's measured time its real copy time, so
  // the reported bytes/s are the GPU's, and keeps at most one chunk queued behind Verify traffic.
  VERIFYD_RETURN_IF_ERROR(stream_->Synchronize());
  ring_used_ = 0;
  return absl::OkStatus();
}

absl::Status CudaKvStorage::CopyRuns(absl::Span<const SlotRunCopy> runs) {
  VERIFYD_RETURN_IF_ERROR(copy_check_.CheckRuns(runs));
  if (runs.empty()) return absl::OkStatus();
  // Bounded by the kernel's int32 run index and the table's int32 segment entries.
  if (runs.size() > static_cast<size_t>(INT32_MAX / 4)) {
    return absl::InvalidArgumentError(
        absl::StrCat("runs has ", runs.size(), " entries, must be <= ", INT32_MAX / 4));
  }
  VERIFYD_RETURN_IF_ERROR(FlushWrites());
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  // At most two copies queued: the one two calls back must be done before this one is enqueued.
  if (copies_enqueued_ >= 2) {
    VERIFYD_CUDA_CHECK(cudaEventSynchronize(copy_done_[copies_enqueued_ % 2]));
  }
  const size_t table_bytes = runs.size() * 4 * sizeof(int32_t);
  // Sized before staging: growing the scratch waits for the stream, which a staged ring region
  // does not survive (a wrap reuses it).
  VERIFYD_RETURN_IF_ERROR(scratch_.Reserve(table_bytes, *stream_).status());
  VERIFYD_ASSIGN_OR_RETURN(uint8_t * staged, TakeFromRing(table_bytes));
  const int64_t segments = PackCopyRunTable(runs, row_bytes(), reinterpret_cast<int32_t*>(staged));
  if (segments > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("runs cover ", segments, " copy segments of ", kCopySegmentWords * 16,
                     " bytes per layer, must be <= ", INT32_MAX, " (split the plan into chunks)"));
  }
  VERIFYD_CUDA_CHECK(
      cudaMemcpyAsync(scratch_.get(), staged, table_bytes, cudaMemcpyHostToDevice, stream_->get()));
  VERIFYD_RETURN_IF_ERROR(LaunchCopyRunsAllLayers(
      pool_.get(), row_bytes(), num_layers_, capacity_, scratch_.as<int32_t>(),
      static_cast<int>(runs.size()), segments, stream_->get()));
  VERIFYD_CUDA_CHECK(cudaEventRecord(copy_done_[copies_enqueued_ % 2], stream_->get()));
  ++copies_enqueued_;
  return absl::OkStatus();
}

absl::Status CudaKvStorage::WaitForCopies() {
  if (copies_enqueued_ == 0) return absl::OkStatus();
  VERIFYD_RETURN_IF_ERROR(stream_->MakeDeviceCurrent());
  VERIFYD_CUDA_CHECK(cudaEventSynchronize(copy_done_[(copies_enqueued_ - 1) % 2]));
  return absl::OkStatus();
}

}  // namespace verifyd
