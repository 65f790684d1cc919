#include "kvstore/slot_copy_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace verifyd {

absl::Status SlotCopyCheck::Check(absl::Span<const int32_t> src, absl::Span<const int32_t> dst) {
  if (src.size() != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dst has ", dst.size(), " slots, must equal src's ", src.size()));
  }
  for (const auto& [field, slots] : {std::pair{"src", src}, std::pair{"dst", dst}}) {
    for (size_t k = 0; k < slots.size(); ++k) {
      if (slots[k] < 0 || slots[k] >= capacity_) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, "[", k, "] = ", slots[k], " must be in [0, ", capacity_, ")"));
      }
    }
  }
  if (dst.empty()) return absl::OkStatus();
  if (stamp_.empty()) stamp_.assign(static_cast<size_t>(capacity_), 0);
  if (++generation_ == 0) {  // wrapped: old stamps could collide with the new generation
    std::fill(stamp_.begin(), stamp_.end(), 0);
    generation_ = 1;
  }
  for (size_t k = 0; k < dst.size(); ++k) {
    uint32_t& s = stamp_[static_cast<size_t>(dst[k])];
    if (s == generation_) {
      return absl::InvalidArgumentError(absl::StrCat("dst lists slot ", dst[k], " twice"));
    }
    s = generation_;
  }
  for (size_t k = 0; k < src.size(); ++k) {
    if (stamp_[static_cast<size_t>(src[k])] == generation_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "src[", k, "] = ", src[k], " is also a destination; src and dst must be disjoint"));
    }
  }
  return absl::OkStatus();
}

}  // namespace verifyd
