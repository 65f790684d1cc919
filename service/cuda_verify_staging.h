// Where one batched Verify's inputs and outputs sit in the CUDA backend's buffers.
//
// Inputs are packed so that ONE host-to-device copy moves all of them plus the split plan:
//   pinned staging: [q | qo_indptr | prefix_len | slot_indptr | slot upload | mask_indptr |
//                    mask_bits | plan]
//   device inputs:  [the same ...                                               | workspace]
// The slot upload is what the slot mirror places into the device arena this call
// (cuda_slot_scatter.h: header | runs | values); slot_indptr holds each sequence's arena offset.
// The workspace begins with the plan bytes (kernels/split_planner.h: PackPlan) and continues with
// the partials, so the upload ends exactly where the partials begin. Outputs are [out | lse], one
// device-to-host copy. Every region starts 256-byte aligned.
//
// Nothing in the layout may change from one decode step to the next of a shape bucket, or the
// bucket's CUDA graph would be re-captured every step: regions whose use varies per call (the
// slot values uploaded, the mask words) are sized by a band (CopyBytesFor), the run table by the
// batch; the rest depends on total_q, batch, heads and the plan's item counts only. The two copies
// also move a little more than the bytes in use (CopyBytesFor); the excess lands in the partials
// region (written by the kernels later in stream order) and in unused output bytes, never read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/verify_problem.h"
#include "service/host_copy_pool.h"

namespace verifyd {

struct VerifyStagingLayout {
  size_t q = 0, qo_indptr = 0, prefix_len = 0, slot_indptr = 0;
  size_t slot_header = 0, slot_runs = 0, slot_values = 0;  // the slot upload
  size_t mask_indptr = 0, mask_bits = 0;
  size_t slot_value_capacity = 0;  // int32 values the upload region holds (a band)
  size_t workspace = 0;            // offset of the workspace (and of the plan bytes) in the inputs
  size_t upload_bytes = 0;         // inputs + plan bytes: the one H2D copy
  size_t input_bytes = 0;   // the device buffer's size: inputs + workspace, >= upload_copy_bytes
  size_t out = 0, lse = 0;  // offsets in the outputs
  size_t out_bytes = 0, lse_bytes = 0;
  size_t output_bytes = 0;       // out (+ lse when asked)
  size_t upload_copy_bytes = 0;  // CopyBytesFor(upload_bytes): what the H2D copy moves
  size_t output_copy_bytes = 0;  // CopyBytesFor(output_bytes): what the D2H copy moves

  bool operator==(const VerifyStagingLayout&) const = default;
};

// `bytes` rounded up to a multiple of 1/8 of its power of two (at least 4 KiB): at most 12.5%
// more, and the same for every size in a band.
size_t CopyBytesFor(size_t bytes);

// `problem` carries host arrays (validated; slot_indptr and slots are not read). slot_values: the
// int32 values the slot mirror uploads this call; plan_bytes = PackPlan()'s size (the workspace
// layout's partial_o_offset), workspace_bytes = its total_bytes.
VerifyStagingLayout LayoutVerifyStaging(const VerifyProblem& problem, size_t slot_values,
                                        size_t plan_bytes, size_t workspace_bytes);

// Copies the problem's host arrays (q, qo_indptr, prefix_len, masks), the arena offsets of the
// lists (list_offset[batch], as slot_indptr) and the packed plan into `staging`. The slot upload
// region is the slot mirror's to fill (WriteSlotUploads at SlotHeader/SlotRuns/SlotValues).
// q, the one large array, goes through `copier` when given (several threads).
void FillVerifyStaging(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                       absl::Span<const int32_t> list_offset,
                       const std::vector<uint8_t>& packed_plan, void* staging,
                       HostCopyPool* copier = nullptr);

// The problem with every pointer moved into the device buffers: slots = the arena base, and
// slot_indptr[b] = sequence b's offset in it (kv and num_slots are kept).
VerifyProblem PlaceVerifyProblem(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                                 void* device_inputs, void* device_outputs,
                                 const int32_t* slot_arena);

}  // namespace verifyd
