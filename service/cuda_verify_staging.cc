#include "service/cuda_verify_staging.h"

#include <algorithm>
#include <cstring>

#include "kernels/mla_dims.h"
#include "service/cuda_slot_scatter.h"

namespace verifyd {
namespace {

size_t Align(size_t bytes) { return (bytes + 255) & ~size_t{255}; }

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
    at = Align(at + bytes);
    return offset;
  };
  l.q = take(rows * kKvDim * sizeof(bf16_bits));
  l.qo_indptr = take(index_bytes);
  l.prefix_len = take(static_cast<size_t>(p.batch) * sizeof(int32_t));
  l.slot_indptr = take(index_bytes);
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
  l.lse = Align(l.out_bytes);
  l.output_bytes = p.lse != nullptr ? l.lse + l.lse_bytes : l.out_bytes;
  l.output_copy_bytes = CopyBytesFor(l.output_bytes);
  return l;
}

void FillVerifyStaging(const VerifyStagingLayout& l, const VerifyProblem& p,
                       absl::Span<const int32_t> list_offset,
                       const std::vector<uint8_t>& packed_plan, void* staging,
                       HostCopyPool* copier) {
  const size_t rows = static_cast<size_t>(p.total_q) * p.num_heads;
  const size_t index_bytes = static_cast<size_t>(p.batch + 1) * sizeof(int32_t);
  const size_t q_bytes = rows * kKvDim * sizeof(bf16_bits);
  if (copier != nullptr) {
    copier->Copy(At(staging, l.q), p.q, q_bytes);
  } else {
    std::memcpy(At(staging, l.q), p.q, q_bytes);
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

}  // namespace verifyd
