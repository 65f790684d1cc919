// KvStorage: where the bytes of the KV pool live ([layer][slot][row], a row 576 bf16 or the fp8
// layout's 656 bytes: verify/kv_dtype.h). The bookkeeping (KvStore) is shared; a storage only
// moves rows, of its own byte size, whatever the dtype.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "verify/bf16.h"
#include "verify/kv_dtype.h"
#include "verify/slot_copy_check.h"

namespace verifyd {

// Where rows handed to the store live: the daemon's host memory (already checked against SPEC §1's
// bound), host memory another process may rewrite while the call runs (a shared-memory region:
// the store copies each layer privately and checks the copy, issue 33 N8), or device memory a
// scheduler registered (the co-located data plane, plans/0017).
enum class RowMemory { kHost, kShared, kDevice };

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  virtual int num_layers() const = 0;
  virtual int64_t capacity_slots() const = 0;
  // What a row of the pool is (a storage that does not say stores bf16).
  virtual KvDtype dtype() const { return KvDtype::kBf16; }
  int row_bytes() const { return KvRowBytes(dtype()); }

  // rows: host [slots.size()][576] bf16; row k goes to slot slots[k] of `layer`. An fp8 storage
  // quantizes each row (verify/kv_fp8_layout.h).
  virtual absl::Status WriteRows(int layer, absl::Span<const int32_t> slots,
                                 const bf16_bits* rows) = 0;
  // rows: [slots.size()][576] in device memory the storage's device can read (a scheduler's
  // registered region, plans/0017): checked against SPEC §1's bound first, nothing written when a
  // value breaks it, and the answer is then name_bad_value(its flat index in rows, its bits), so
  // that the caller names it by its own shape, as for rows in host memory; then written. `rows`
  // may be reused once it returns. Storage without device memory: UNIMPLEMENTED.
  using BadValueNamer = absl::FunctionRef<absl::Status(int64_t index, bf16_bits bits)>;
  virtual absl::Status WriteDeviceRows(int layer, absl::Span<const int32_t> slots,
                                       const bf16_bits* rows, BadValueNamer name_bad_value) {
    (void)layer;
    (void)slots;
    (void)rows;
    (void)name_bad_value;
    return absl::UnimplementedError("this KV storage has no device memory to read rows from");
  }
  // rows: [slots.size()][row_bytes()] already in the pool's encoding (for fp8, DeepSeek's 656-byte
  // layout), in device memory the storage's device can read (a scheduler's registered region):
  // checked against SPEC §1's rules for that encoding first (verify/kv_fp8_check.h), and when a
  // row breaks one nothing is written and the answer is name_bad_row(a host copy of the first such
  // row, its index in rows), which names the element and the rule. Storage without device memory:
  // UNIMPLEMENTED.
  using BadRowNamer = absl::FunctionRef<absl::Status(const uint8_t* row, int64_t index)>;
  virtual absl::Status WriteEncodedDeviceRows(int layer, absl::Span<const int32_t> slots,
                                              const uint8_t* rows, BadRowNamer name_bad_row) {
    (void)layer;
    (void)slots;
    (void)rows;
    (void)name_bad_row;
    return absl::UnimplementedError("this KV storage has no device memory to read rows from");
  }
  // out: host [slots.size()][576]. An fp8 storage cannot (its dequantized values are not bf16):
  // FAILED_PRECONDITION; ReadEncodedRows reads any storage.
  virtual absl::Status ReadRows(int layer, absl::Span<const int32_t> slots,
                                bf16_bits* out) const = 0;
  // Rows as the pool holds them: host [slots.size()][row_bytes()], already checked (for fp8,
  // verify/kv_fp8_check.h). The defaults serve a bf16 storage through WriteRows / ReadRows.
  virtual absl::Status WriteEncodedRows(int layer, absl::Span<const int32_t> slots,
                                        const uint8_t* rows);
  virtual absl::Status ReadEncodedRows(int layer, absl::Span<const int32_t> slots,
                                       uint8_t* out) const;
  // For every layer: row of slot src[k] is copied to slot dst[k]. src and dst are disjoint.
  virtual absl::Status CopySlots(absl::Span<const int32_t> src, absl::Span<const int32_t> dst) = 0;
  // Compaction's copy: for every layer and run, rows [src_begin, +length) go to
  // [dst_begin, +length). Contract: SlotCopyCheck::CheckRuns (refused with no change otherwise).
  // The copy may still be running on return (device storage); every later use of the pool is
  // ordered after it, so only a host that wants to know the copy's duration waits (below).
  virtual absl::Status CopyRuns(absl::Span<const SlotRunCopy> runs) = 0;
  // Returns once every copy enqueued by CopyRuns has finished (a no-op where copies are
  // synchronous). For timing; never needed for correctness.
  virtual absl::Status WaitForCopies() { return absl::OkStatus(); }
};

// The pool in host memory; the CPU backend computes on layer_data() directly. The pool is not
// zeroed (a slot's row is defined once written), so a large pool costs no page touching up front.
class HostKvStorage : public KvStorage {
 public:
  HostKvStorage(int num_layers, int64_t capacity_slots, KvDtype dtype = KvDtype::kBf16);
  int num_layers() const override { return num_layers_; }
  int64_t capacity_slots() const override { return capacity_; }
  KvDtype dtype() const override { return dtype_; }
  absl::Status WriteRows(int layer, absl::Span<const int32_t> slots,
                         const bf16_bits* rows) override;
  absl::Status ReadRows(int layer, absl::Span<const int32_t> slots, bf16_bits* out) const override;
  absl::Status WriteEncodedRows(int layer, absl::Span<const int32_t> slots,
                                const uint8_t* rows) override;
  absl::Status ReadEncodedRows(int layer, absl::Span<const int32_t> slots,
                               uint8_t* out) const override;
  absl::Status CopySlots(absl::Span<const int32_t> src, absl::Span<const int32_t> dst) override;
  // One memcpy per run and layer (a run's rows are contiguous in each layer).
  absl::Status CopyRuns(absl::Span<const SlotRunCopy> runs) override;

  // [capacity][576] rows of one layer of a bf16 pool (null for fp8).
  const bf16_bits* layer_data(int layer) const;
  // [capacity][row_bytes()] bytes of one layer, either dtype.
  const uint8_t* layer_bytes(int layer) const;

 private:
  uint8_t* row(int layer, int32_t slot) const;
  absl::Status CheckLayer(int layer) const;
  absl::Status CheckSlots(absl::Span<const int32_t> slots, const char* field) const;

  int num_layers_;
  int64_t capacity_;
  KvDtype dtype_;
  int64_t row_bytes_;
  std::unique_ptr<uint8_t[]> data_;
  SlotCopyCheck copy_check_;
};

}  // namespace verifyd
