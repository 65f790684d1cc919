// The split-KV planner: turns the host-side shapes of a batch into flash work items and combine
// items that keep every SM busy, and lays out the workspace those items and their partials use.
//
// Why on the host: the daemon knows L_b and Q_b before it launches, and a plan that is plain data
// in device memory keeps the launch free of host syncs (CUDA-graph capturable). The caller uploads
// PackPlan()'s bytes to the start of the workspace, then launches (mla_verify_launch.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/mla_verify_params.h"

namespace verifyd {

struct SplitPlan {
  std::vector<FlashWorkItem> work;
  std::vector<CombineItem> combine;
  int num_partials = 0;
  int tiles_per_split =
      0;  // the chunk the planner chose, in kFlashBlockCols-column tiles (for reports)
};

// Byte offsets inside the caller's workspace; every region is 256-byte aligned.
struct WorkspaceLayout {
  size_t work_offset = 0;
  size_t combine_offset = 0;
  size_t partial_o_offset = 0;
  size_t partial_lse_offset = 0;
  size_t total_bytes = 0;
};

// prefix_len[b] = L_b >= 0, q_len[b] = Q_b in [1, kMaxTreeNodes]; num_sms = the CTAs that run at
// once. Chooses one chunk length (in tiles) for the whole batch by minimising waves x (chunk +
// overhead), then cuts each sequence's L_b + Q_b columns into near-equal splits.
//
// The split counts are chosen for PlanningTiles(tiles), not for the exact tile count: while a
// decode loop grows L a few tokens per step, every step of a band gets the same number of work
// items, combine items and partials (only their column ranges move), so a captured CUDA graph of
// the launch replays with new data instead of being re-captured. The price: up to 1/8 more splits
// (each a little shorter) than the exact tile count would get.
absl::StatusOr<SplitPlan> PlanSplits(absl::Span<const int32_t> prefix_len,
                                     absl::Span<const int32_t> q_len, int num_heads, int num_sms);

// A tile count rounded up to its band: exact up to 16, then to a multiple of 1/8 of its power of
// two (so a band at L = 64K columns spans 8K columns).
int64_t PlanningTiles(int64_t tiles);

WorkspaceLayout LayoutWorkspace(const SplitPlan& plan);

// The first layout.partial_o_offset bytes of the workspace: work items, then combine items.
std::vector<uint8_t> PackPlan(const SplitPlan& plan, const WorkspaceLayout& layout);

}  // namespace verifyd
