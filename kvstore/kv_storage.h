// KvStorage: where the bytes of the KV pool live ([layer][slot][576] bf16). The bookkeeping
// (KvStore) is shared; a storage only moves rows. Host memory now, device memory later.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "verify/bf16.h"
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

  // rows: host [slots.size()][576]; row k goes to slot slots[k] of `layer`.
  virtual absl::Status WriteRows(int layer, absl::Span<const int32_t> slots,
                                 const bf16_bits* rows) = 0;
  // rows: [slots.size()][576] in device memory the storage's device can read (a scheduler's
  // registered region, plans/0017): checked against SPEC §1's bound first (INVALID_ARGUMENT naming
  // the first bad row and element, nothing written), then written; `rows` may be reused once it
  // returns. Storage without device memory: UNIMPLEMENTED.
  virtual absl::Status WriteDeviceRows(int layer, absl::Span<const int32_t> slots,
                                       const bf16_bits* rows) {
    (void)layer;
    (void)slots;
    (void)rows;
    return absl::UnimplementedError("this KV storage has no device memory to read rows from");
  }
  // out: host [slots.size()][576].
  virtual absl::Status ReadRows(int layer, absl::Span<const int32_t> slots,
                                bf16_bits* out) const = 0;
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
  HostKvStorage(int num_layers, int64_t capacity_slots);
  int num_layers() const override { return num_layers_; }
  int64_t capacity_slots() const override { return capacity_; }
  absl::Status WriteRows(int layer, absl::Span<const int32_t> slots,
                         const bf16_bits* rows) override;
  absl::Status ReadRows(int layer, absl::Span<const int32_t> slots, bf16_bits* out) const override;
  absl::Status CopySlots(absl::Span<const int32_t> src, absl::Span<const int32_t> dst) override;
  // One memcpy per run and layer (a run's rows are contiguous in each layer).
  absl::Status CopyRuns(absl::Span<const SlotRunCopy> runs) override;

  // [capacity][576] rows of one layer.
  const bf16_bits* layer_data(int layer) const;

 private:
  bf16_bits* row(int layer, int32_t slot) const;
  absl::Status CheckLayer(int layer) const;
  absl::Status CheckSlots(absl::Span<const int32_t> slots, const char* field) const;

  int num_layers_;
  int64_t capacity_;
  std::unique_ptr<bf16_bits[]> data_;
  SlotCopyCheck copy_check_;
};

}  // namespace verifyd
