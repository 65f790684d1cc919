#include "kvstore/kv_storage.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {

absl::Status KvStorage::WriteEncodedRows(int layer, absl::Span<const int32_t> slots,
                                         const uint8_t* rows) {
  if (dtype() != KvDtype::kBf16) {
    return absl::UnimplementedError(
        absl::StrCat("this KV storage cannot take rows in its ", KvDtypeName(dtype()), " layout"));
  }
  // A private, aligned copy: `rows` may be a protobuf's bytes, with no bf16 alignment.
  std::vector<bf16_bits> aligned(slots.size() * kKvDim);
  if (!slots.empty()) std::memcpy(aligned.data(), rows, aligned.size() * sizeof(bf16_bits));
  return WriteRows(layer, slots, aligned.data());
}

absl::Status KvStorage::ReadEncodedRows(int layer, absl::Span<const int32_t> slots,
                                        uint8_t* out) const {
  if (dtype() != KvDtype::kBf16) {
    return absl::UnimplementedError(
        absl::StrCat("this KV storage cannot read rows in its ", KvDtypeName(dtype()), " layout"));
  }
  std::vector<bf16_bits> aligned(slots.size() * kKvDim);
  VERIFYD_RETURN_IF_ERROR(ReadRows(layer, slots, aligned.data()));
  if (!slots.empty()) std::memcpy(out, aligned.data(), aligned.size() * sizeof(bf16_bits));
  return absl::OkStatus();
}

HostKvStorage::HostKvStorage(int num_layers, int64_t capacity_slots, KvDtype dtype)
    : num_layers_(std::max(num_layers, 0)),
      capacity_(std::max<int64_t>(capacity_slots, 0)),
      dtype_(dtype),
      row_bytes_(KvRowBytes(dtype)),
      data_(std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(num_layers_) * capacity_ *
                                                      row_bytes_)),
      copy_check_(capacity_) {}

uint8_t* HostKvStorage::row(int layer, int32_t slot) const {
  return data_.get() + (static_cast<size_t>(layer) * capacity_ + slot) * row_bytes_;
}

const bf16_bits* HostKvStorage::layer_data(int layer) const {
  if (dtype_ != KvDtype::kBf16) return nullptr;
  return reinterpret_cast<const bf16_bits*>(row(layer, 0));
}

const uint8_t* HostKvStorage::layer_bytes(int layer) const { return row(layer, 0); }

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
    if (dtype_ == KvDtype::kFp8) {
      QuantizeFp8Row(rows + k * kKvDim, row(layer, slots[k]));
    } else {
      std::memcpy(row(layer, slots[k]), rows + k * kKvDim, kKvRowBytes);
    }
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::ReadRows(int layer, absl::Span<const int32_t> slots,
                                     bf16_bits* out) const {
  if (dtype_ != KvDtype::kBf16) {
    return absl::FailedPreconditionError(
        "the pool holds fp8 rows, whose dequantized values are not bf16; read them with "
        "ReadEncodedRows");
  }
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (!slots.empty() && out == nullptr) return absl::InvalidArgumentError("out must not be null");
  for (size_t k = 0; k < slots.size(); ++k) {
    std::memcpy(out + k * kKvDim, row(layer, slots[k]), kKvRowBytes);
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::WriteEncodedRows(int layer, absl::Span<const int32_t> slots,
                                             const uint8_t* rows) {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (!slots.empty() && rows == nullptr) return absl::InvalidArgumentError("rows must not be null");
  for (size_t k = 0; k < slots.size(); ++k) {
    std::memcpy(row(layer, slots[k]), rows + k * row_bytes_, row_bytes_);
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::ReadEncodedRows(int layer, absl::Span<const int32_t> slots,
                                            uint8_t* out) const {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer));
  VERIFYD_RETURN_IF_ERROR(CheckSlots(slots, "slots"));
  if (!slots.empty() && out == nullptr) return absl::InvalidArgumentError("out must not be null");
  for (size_t k = 0; k < slots.size(); ++k) {
    std::memcpy(out + k * row_bytes_, row(layer, slots[k]), row_bytes_);
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::CopySlots(absl::Span<const int32_t> src,
                                      absl::Span<const int32_t> dst) {
  VERIFYD_RETURN_IF_ERROR(copy_check_.Check(src, dst));
  for (int layer = 0; layer < num_layers_; ++layer) {
    for (size_t k = 0; k < src.size(); ++k) {
      std::memcpy(row(layer, dst[k]), row(layer, src[k]), row_bytes_);
    }
  }
  return absl::OkStatus();
}

absl::Status HostKvStorage::CopyRuns(absl::Span<const SlotRunCopy> runs) {
  VERIFYD_RETURN_IF_ERROR(copy_check_.CheckRuns(runs));
  for (int layer = 0; layer < num_layers_; ++layer) {
    for (const SlotRunCopy& run : runs) {
      std::memcpy(row(layer, run.dst_begin), row(layer, run.src_begin),
                  static_cast<size_t>(run.length) * row_bytes_);
    }
  }
  return absl::OkStatus();
}

}  // namespace verifyd
