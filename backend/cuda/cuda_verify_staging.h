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
//
// q, out and lse that lie in host memory registered with the device (a client's shared-memory
// region: RegisteredHostRanges) skip the staging: q is copied straight from the caller's memory
// into its place in the device inputs, out and lse straight from the device outputs into the
// caller's memory (DirectCopies); the staged copies then cover only the rest (StagedUpload,
// StagedOutputs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "backend/cuda/host_copy_pool.h"
#include "verify/verify_problem.h"

namespace verifyd {

struct VerifyStagingLayout {
  size_t q = 0, qo_indptr = 0, prefix_len = 0, slot_indptr = 0;
  // The tree rows' pool slots (int32, total_q, batch order): an external call's tree-KV write
  // reads them from here, so it can ride in the scatter's launch (it must not wait for the arena
  // that launch fills; plans/0031, change 4). Filled by the caller that uses them.
  size_t tree_slots = 0;
  // SPEC §1's check of an external call, two packed first-bad words (q's, tree_kv's: uint64,
  // kernels/value_bound_check.h): the caller stages them as kNoneOutOfBound, so the call's one
  // upload arms them and no kernel has to re-arm them for the next call (plans/0031, change 7).
  size_t value_words = 0;
  size_t q_bytes = 0;  // the q region starts at 0 and ends before qo_indptr
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
// stage_q = false leaves the q region alone (q is copied to the device straight from the caller).
void FillVerifyStaging(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                       absl::Span<const int32_t> list_offset,
                       const std::vector<uint8_t>& packed_plan, void* staging,
                       HostCopyPool* copier = nullptr, bool stage_q = true);

// The problem with every pointer moved into the device buffers: slots = the arena base, and
// slot_indptr[b] = sequence b's offset in it (kv and num_slots are kept).
VerifyProblem PlaceVerifyProblem(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                                 void* device_inputs, void* device_outputs,
                                 const int32_t* slot_arena);

// Host memory ranges registered with the device (cudaHostRegister): the device can DMA from and to
// any byte inside one. Thread-safe: ranges come and go on gRPC threads (a region is mapped or
// unmapped) while the executor asks about a call's tensors.
class RegisteredHostRanges {
 public:
  // INVALID_ARGUMENT for a null or empty range; ALREADY_EXISTS when it overlaps a registered one.
  absl::Status Add(const void* data, size_t bytes);
  // Whether a range began at `data`.
  bool Remove(const void* data);
  // Whether [data, data + bytes) lies wholly inside one registered range (bytes > 0).
  bool Contains(const void* data, size_t bytes) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> ranges_;  // first byte -> bytes
};

// Which of a call's tensors move between the caller's memory and the device without staging.
struct DirectCopies {
  bool q = false;
  bool out = false;
  bool lse = false;  // only when lse is asked

  bool any() const { return q || out || lse; }
  bool operator==(const DirectCopies&) const = default;
};
DirectCopies ChooseDirectCopies(const VerifyStagingLayout& layout, const VerifyProblem& problem,
                                const RegisteredHostRanges& ranges);

// A byte range of the staging / device inputs (H2D) or of the device / host outputs (D2H).
struct StagedCopy {
  size_t offset = 0;
  size_t bytes = 0;
  bool operator==(const StagedCopy&) const = default;
};
// The H2D copy through the staging: the whole upload, or all after q when q goes directly.
StagedCopy StagedUpload(const VerifyStagingLayout& layout, const DirectCopies& direct);
// The D2H copy into the pinned host outputs: the banded [out | lse] when both are staged, exactly
// the one staged output when the other goes directly, nothing (bytes 0) when none is staged.
StagedCopy StagedOutputs(const VerifyStagingLayout& layout, const DirectCopies& direct);

}  // namespace verifyd
