// A KvStorage double that fails on command (fault injection): it forwards to a HostKvStorage and
// returns INTERNAL ("injected device error") from the N-th WriteRows / CopyRuns / CopySlots call
// on, so the rollback paths of the store and the executor can be tested without a broken device.
#pragma once

#include <atomic>
#include <memory>

#include "absl/status/status.h"
#include "kvstore/kv_storage.h"

namespace verifyd::testing_kv {

class FailingStorage : public KvStorage {
 public:
  FailingStorage(int num_layers, int64_t capacity_slots)
      : host_(std::make_unique<HostKvStorage>(num_layers, capacity_slots)) {}

  // The `n`-th write from now (0: the next one) and every later one fail, until Heal().
  void FailWritesAfter(int64_t n) { writes_left_ = n; }
  void Heal() { writes_left_ = -1; }
  int64_t injected() const { return injected_; }

  int num_layers() const override { return host_->num_layers(); }
  int64_t capacity_slots() const override { return host_->capacity_slots(); }
  absl::Status WriteRows(int layer, absl::Span<const int32_t> slots,
                         const bf16_bits* rows) override {
    if (Fail()) return absl::InternalError("injected device error in WriteRows");
    return host_->WriteRows(layer, slots, rows);
  }
  absl::Status ReadRows(int layer, absl::Span<const int32_t> slots, bf16_bits* out) const override {
    return host_->ReadRows(layer, slots, out);
  }
  absl::Status CopySlots(absl::Span<const int32_t> src, absl::Span<const int32_t> dst) override {
    if (Fail()) return absl::InternalError("injected device error in CopySlots");
    return host_->CopySlots(src, dst);
  }
  absl::Status CopyRuns(absl::Span<const SlotRunCopy> runs) override {
    if (Fail()) return absl::InternalError("injected device error in CopyRuns");
    return host_->CopyRuns(runs);
  }
  const HostKvStorage& host() const { return *host_; }

 private:
  bool Fail() {
    if (writes_left_ < 0) return false;
    if (writes_left_ > 0) {
      --writes_left_;
      return false;
    }
    ++injected_;
    return true;
  }

  std::unique_ptr<HostKvStorage> host_;
  int64_t writes_left_ = -1;
  int64_t injected_ = 0;
};

}  // namespace verifyd::testing_kv
