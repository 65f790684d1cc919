#include "backend/cuda/cuda_verify_staging.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"

#include "base/align.h"
#include "kernels/slot_table_scatter.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

uint8_t* At(void* base, size_t offset) { return static_cast<uint8_t*>(base) + offset; }

}  // namespace

size_t CopyBytesFor(size_t bytes) {
  constexpr size_t kMinimum = 4096;
  if (bytes <= kMinimum) return kMinimum;
  size_t power = kMinimum;
  while (power * 2 <= bytes) power *= 2;
  const size_t step = power / 8;
  return (bytes + step - 1) / step * step;
}

VerifyStagingLayout LayoutVerifyStaging(const VerifyProblem& p, size_t slot_values,
                                        size_t plan_bytes, size_t workspace_bytes) {
  const size_t rows = static_cast<size_t>(p.total_q) * p.num_heads;
  const size_t index_bytes = static_cast<size_t>(p.batch + 1) * sizeof(int32_t);
  VerifyStagingLayout l;
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t offset = at;
    at = AlignTo256(at + bytes);
    return offset;
  };
  l.q_bytes = rows * kKvDim * sizeof(bf16_bits);
  l.q = take(l.q_bytes);
  l.qo_indptr = take(index_bytes);
  l.prefix_len = take(static_cast<size_t>(p.batch) * sizeof(int32_t));
  l.slot_indptr = take(index_bytes);
  l.tree_slots = take(static_cast<size_t>(p.total_q) * sizeof(int32_t));
  l.value_words = take(2 * sizeof(uint64_t));
  l.slot_header = take(sizeof(SlotScatterHeader));
  l.slot_runs = take(static_cast<size_t>(p.batch) * sizeof(SlotScatterRun));
  l.slot_value_capacity = CopyBytesFor(slot_values * sizeof(int32_t)) / sizeof(int32_t);
  l.slot_values = take(l.slot_value_capacity * sizeof(int32_t));
  l.mask_indptr = take(index_bytes);
  l.mask_bits = take(CopyBytesFor(static_cast<size_t>(p.mask_indptr[p.batch]) * sizeof(uint64_t)));
  l.workspace = at;
  l.upload_bytes = l.workspace + plan_bytes;
  l.upload_copy_bytes = CopyBytesFor(l.upload_bytes);
  l.input_bytes = std::max(l.workspace + workspace_bytes, l.upload_copy_bytes);

  l.out_bytes = rows * kVDim * sizeof(bf16_bits);
  l.lse_bytes = p.lse != nullptr ? rows * sizeof(float) : 0;
  l.out = 0;
  l.lse = AlignTo256(l.out_bytes);
  l.output_bytes = p.lse != nullptr ? l.lse + l.lse_bytes : l.out_bytes;
  l.output_copy_bytes = CopyBytesFor(l.output_bytes);
  return l;
}

void FillVerifyStaging(const VerifyStagingLayout& l, const VerifyProblem& p,
                       absl::Span<const int32_t> list_offset,
                       const std::vector<uint8_t>& packed_plan, void* staging, HostCopyPool* copier,
                       bool stage_q) {
  const size_t index_bytes = static_cast<size_t>(p.batch + 1) * sizeof(int32_t);
  if (stage_q && copier != nullptr) {
    copier->Copy(At(staging, l.q), p.q, l.q_bytes);
  } else if (stage_q) {
    std::memcpy(At(staging, l.q), p.q, l.q_bytes);
  }
  std::memcpy(At(staging, l.qo_indptr), p.qo_indptr, index_bytes);
  std::memcpy(At(staging, l.prefix_len), p.prefix_len, static_cast<size_t>(p.batch) * 4);
  // slot_indptr[batch] is never read on the device; it is set to the last offset so that the
  // array is fully defined.
  int32_t* slot_indptr = reinterpret_cast<int32_t*>(At(staging, l.slot_indptr));
  std::memcpy(slot_indptr, list_offset.data(), static_cast<size_t>(p.batch) * 4);
  slot_indptr[p.batch] = p.batch > 0 ? list_offset[p.batch - 1] : 0;
  std::memcpy(At(staging, l.mask_indptr), p.mask_indptr, index_bytes);
  std::memcpy(At(staging, l.mask_bits), p.mask_bits,
              static_cast<size_t>(p.mask_indptr[p.batch]) * sizeof(uint64_t));
  if (!packed_plan.empty()) {
    std::memcpy(At(staging, l.workspace), packed_plan.data(), packed_plan.size());
  }
}

VerifyProblem PlaceVerifyProblem(const VerifyStagingLayout& l, const VerifyProblem& p,
                                 void* device_inputs, void* device_outputs,
                                 const int32_t* slot_arena) {
  VerifyProblem d = p;
  d.q = reinterpret_cast<const bf16_bits*>(At(device_inputs, l.q));
  d.qo_indptr = reinterpret_cast<const int32_t*>(At(device_inputs, l.qo_indptr));
  d.prefix_len = reinterpret_cast<const int32_t*>(At(device_inputs, l.prefix_len));
  d.slot_indptr = reinterpret_cast<const int32_t*>(At(device_inputs, l.slot_indptr));
  d.slots = slot_arena;
  d.mask_indptr = reinterpret_cast<const int32_t*>(At(device_inputs, l.mask_indptr));
  d.mask_bits = reinterpret_cast<const uint64_t*>(At(device_inputs, l.mask_bits));
  d.out = reinterpret_cast<bf16_bits*>(At(device_outputs, l.out));
  d.lse = p.lse != nullptr ? reinterpret_cast<float*>(At(device_outputs, l.lse)) : nullptr;
  return d;
}

absl::Status RegisteredHostRanges::Add(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host range [", absl::Hex(reinterpret_cast<uintptr_t>(data)), ", +", bytes,
                     ") must be non-null and non-empty"));
  }
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mu_);
  auto next = ranges_.lower_bound(begin);
  const bool overlaps_next = next != ranges_.end() && next->first < begin + bytes;
  const bool overlaps_previous =
      next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second > begin;
  if (overlaps_next || overlaps_previous) {
    return absl::AlreadyExistsError(absl::StrCat("host range [", absl::Hex(begin), ", +", bytes,
                                                 ") overlaps a registered range"));
  }
  ranges_.emplace(begin, bytes);
  return absl::OkStatus();
}

bool RegisteredHostRanges::Remove(const void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  return ranges_.erase(reinterpret_cast<uintptr_t>(data)) > 0;
}

bool RegisteredHostRanges::Contains(const void* data, size_t bytes) const {
  if (data == nullptr || bytes == 0) return false;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mu_);
  auto after = ranges_.upper_bound(begin);
  if (after == ranges_.begin()) return false;
  const auto& [first, size] = *std::prev(after);
  // begin >= first here; written so that no sum can overflow.
  return begin - first < size && bytes <= size - (begin - first);
}

size_t RegisteredHostRanges::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranges_.size();
}

DirectCopies ChooseDirectCopies(const VerifyStagingLayout& l, const VerifyProblem& p,
                                const RegisteredHostRanges& ranges) {
  DirectCopies d;
  if (ranges.size() == 0) return d;
  d.q = ranges.Contains(p.q, l.q_bytes);
  d.out = ranges.Contains(p.out, l.out_bytes);
  d.lse = p.lse != nullptr && ranges.Contains(p.lse, l.lse_bytes);
  return d;
}

StagedCopy StagedUpload(const VerifyStagingLayout& l, const DirectCopies& d) {
  // The copy keeps its banded end; only its start moves past q.
  if (!d.q) return {0, l.upload_copy_bytes};
  return {l.qo_indptr, l.upload_copy_bytes - l.qo_indptr};
}

StagedCopy StagedOutputs(const VerifyStagingLayout& l, const DirectCopies& d) {
  const bool lse_staged = l.lse_bytes > 0 && !d.lse;
  if (!d.out)
    return lse_staged || l.lse_bytes == 0 ? StagedCopy{0, l.output_copy_bytes}
                                          : StagedCopy{l.out, l.out_bytes};
  return lse_staged ? StagedCopy{l.lse, l.lse_bytes} : StagedCopy{0, 0};
}

}  // namespace verifyd
