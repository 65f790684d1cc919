#include "kvstore/kv_storage.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/mla_dims.h"

namespace verifyd {

HostKvStorage::HostKvStorage(int num_layers, int64_t capacity_slots)
    : num_layers_(std::max(num_layers, 0)),
      capacity_(std::max<int64_t>(capacity_slots, 0)),
      data_(std::make_unique_for_overwrite<bf16_bits[]>(static_cast<size_t>(num_layers_) *
                                                        capacity_ * kKvDim)),
      copy_check_(capacity_) {}

bf16_bits* HostKvStorage::row(int layer, int32_t slot) const {
  return data_.get() + (static_cast<size_t>(layer) * capacity_ + slot) * kKvDim;
}

const bf16_bits* HostKvStorage::layer_data(int layer) const { return row(layer, 0); }

absl::Status HostKvStorage::CheckLayer(int layer) const {
  if (layer < 0 || layer >= num_layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer = ", layer, " must be in [0, ", num_layers_, ")"));
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::CheckSlots(absl::Span<const int32_t> slots, const char* field) const {
  for (size_t k = 0; k < slots.size(); ++k) {
    if (slots[k] < 0 || slots[k] >= capacity_) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", k, "] = ", slots[k], " must be in [0, ", capacity_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::WriteRows(int layer, absl::Span<const int32_t> slots,
                                      const bf16_bits* rows) {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (!slots.empty() && rows == nullptr) return absl::InvalidArgumentError("rows must not be null");
  for (size_t k = 0; k < slots.size(); ++k) {
    std::memcpy(row(layer, slots[k]), rows + k * kKvDim, kKvRowBytes);
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::ReadRows(int layer, absl::Span<const int32_t> slots,
                                     bf16_bits* out) const {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (!slots.empty() && out == nullptr) return absl::InvalidArgumentError("out must not be null");
  for (size_t k = 0; k < slots.size(); ++k) {
    std::memcpy(out + k * kKvDim, row(layer, slots[k]), kKvRowBytes);
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::CopySlots(absl::Span<const int32_t> src,
                                      absl::Span<const int32_t> dst) {
  VERIFYD_RETURN_IF_ERROR(copy_check_.Check(src, dst));
  for (int layer = 0; layer < num_layers_; ++layer) {
    for (size_t k = 0; k < src.size(); ++k) {
      std::memcpy(row(layer, dst[k]), row(layer, src[k]), kKvRowBytes);
    }
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::CopyRuns(absl::Span<const SlotRunCopy> runs) {
  VERIFYD_RETURN_IF_ERROR(copy_check_.CheckRuns(runs));
  for (int layer = 0; layer < num_layers_; ++layer) {
    for (const SlotRunCopy& run : runs) {
      std::memcpy(row(layer, run.dst_begin), row(layer, run.src_begin),
                  static_cast<size_t>(run.length) * kKvRowBytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace verifyd
