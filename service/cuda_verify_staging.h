// Where one batched Verify's inputs and outputs sit in the CUDA backend's buffers.
//
// Inputs are packed so that ONE host-to-device copy moves all of them plus the split plan:
//   pinned staging: [q | qo_indptr | prefix_len | slot_indptr | slots | mask_indptr | mask_bits |
//   plan] device inputs:  [the same ...                                                 | workspace
//   ]
// The workspace begins with the plan bytes (kernels/split_planner.h: PackPlan) and continues with
// the partials, so the upload ends exactly where the partials begin. Outputs are [out | lse], one
// device-to-host copy. Every region starts 256-byte aligned.
//
// The two copies move a little more than the bytes in use (CopyBytesFor): sizes that change with
// every prefix length would change the captured memcpy nodes each step, and a graph update may
// refuse size changes. The excess lands in the partials region (written by the kernels later in
// stream order) and in unused output bytes, so it is never read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/verify_problem.h"

namespace verifyd {

struct VerifyStagingLayout {
  size_t q = 0, qo_indptr = 0, prefix_len = 0, slot_indptr = 0, slots = 0, mask_indptr = 0,
         mask_bits = 0;
  size_t workspace = 0;     // offset of the workspace (and of the plan bytes) in the inputs
  size_t upload_bytes = 0;  // inputs + plan bytes: the one H2D copy
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

// `problem` carries host index arrays (validated); plan_bytes = PackPlan()'s size (the workspace
// layout's partial_o_offset), workspace_bytes = its total_bytes.
VerifyStagingLayout LayoutVerifyStaging(const VerifyProblem& problem, size_t plan_bytes,
                                        size_t workspace_bytes);

// Copies the problem's host arrays and the packed plan into `staging` (upload_bytes of its
// upload_copy_bytes).
void FillVerifyStaging(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                       const std::vector<uint8_t>& packed_plan, void* staging);

// The problem with every pointer moved into the device buffers (kv and num_slots are kept).
VerifyProblem PlaceVerifyProblem(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                                 void* device_inputs, void* device_outputs);

}  // namespace verifyd
