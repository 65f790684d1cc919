#include "verify/slot_copy_check.h"

#include <algorithm>
#include <vector>

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

absl::Status SlotCopyCheck::CheckRuns(absl::Span<const SlotRunCopy> runs) const {
  for (size_t k = 0; k < runs.size(); ++k) {
    const SlotRunCopy& run = runs[k];
    if (run.length < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("runs[", k, "].length = ", run.length, " must be >= 1"));
    }
    for (const auto& [field, begin] :
         {std::pair{"src_begin", run.src_begin}, std::pair{"dst_begin", run.dst_begin}}) {
      if (begin < 0 || int64_t{begin} + run.length > capacity_) {
        return absl::InvalidArgumentError(absl::StrCat("runs[", k, "].", field, " = ", begin,
                                                       " with length ", run.length,
                                                       " must lie in [0, ", capacity_, ")"));
      }
    }
  }
  // Destination ranges by start: a range overlaps another iff it overlaps its sorted neighbour.
  // Sorted as packed (dst_begin, index) integers (begins are >= 0 here).
  std::vector<uint64_t> keys(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) {
    keys[k] = uint64_t{static_cast<uint32_t>(runs[k].dst_begin)} << 32 | k;
  }
  std::sort(keys.begin(), keys.end());
  std::vector<uint32_t> by_dst(runs.size());
  for (size_t i = 0; i < keys.size(); ++i) by_dst[i] = static_cast<uint32_t>(keys[i]);
  for (size_t i = 1; i < by_dst.size(); ++i) {
    const SlotRunCopy& prev = runs[by_dst[i - 1]];
    if (int64_t{prev.dst_begin} + prev.length > runs[by_dst[i]].dst_begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "runs[", std::max(by_dst[i - 1], by_dst[i]),
          "].dst_begin: the destination ranges of runs[", std::min(by_dst[i - 1], by_dst[i]),
          "] and runs[", std::max(by_dst[i - 1], by_dst[i]), "] overlap"));
    }
  }
  // Each source range against the destination range that starts last before its end.
  for (size_t k = 0; k < runs.size(); ++k) {
    const int64_t src_end = int64_t{runs[k].src_begin} + runs[k].length;
    auto it = std::lower_bound(by_dst.begin(), by_dst.end(), src_end,
                               [&](uint32_t d, int64_t end) { return runs[d].dst_begin < end; });
    if (it == by_dst.begin()) continue;
    const SlotRunCopy& dst = runs[*std::prev(it)];
    if (int64_t{dst.dst_begin} + dst.length > runs[k].src_begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("runs[", k, "].src_begin = ", runs[k].src_begin,
                       ": the source range meets the destination range of runs[", *std::prev(it),
                       "]; sources and destinations must be disjoint"));
    }
  }
  return absl::OkStatus();
}

}  // namespace verifyd
