// The CUDA backend's mirror of slot lists in device memory: host bookkeeping only (no CUDA call
// here), so that every decision is testable without a GPU.
//
// One device arena of int32 holds a region per sequence; region b holds the sequence's slot list
// as the kernels read it: arena[offset + t] = slot of column t, t < L_b + Q_b (the committed
// prefix, then the tree nodes). Per sequence the mirror remembers {slot generation, how many
// prefix positions are mirrored, the tree slots last placed}. A Verify call then uploads, per
// sequence:
//   - same generation, region large enough: prefix positions [mirrored, n) and the Q tree slots
//     at [n, n+Q), as one run [mirrored, n+Q); nothing at all when n == mirrored and the tree is
//     the one already there (every layer after the first of a decode step);
//   - otherwise (new, compacted, regrown or never seen): the whole list, in a region with headroom.
// KvStore guarantees that two views with one generation agree on every position both hold
// (appends only extend), which is what makes the tail enough.
//
// When the arena has no room, every mirror is dropped (a reset, counted) and the call's lists are
// uploaded whole into the emptied arena, grown when they do not fit even then. A dropped mirror is
// only slower, never wrong. Device side: the kernels get slots = arena base and
// slot_indptr[b] = the region offset of sequence b; they only ever read slots + slot_indptr[b]
// (kernels/mla_verify_flash*.cu, mla_verify_naive.cu), so regions need not be adjacent or ordered.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "backend/compute_backend.h"
#include "kernels/slot_table_scatter.h"

namespace verifyd {

// First-fit allocator of arena entries with coalescing free runs. Lowest offset first, so live
// regions pack at the start and large free runs stay at the end.
class SlotArena {
 public:
  explicit SlotArena(int64_t entries) { Reset(entries); }
  // The offset of `entries` free entries, or nullopt when no free run is long enough.
  std::optional<int64_t> Allocate(int64_t entries);
  void Free(int64_t offset, int64_t entries);
  // Everything free again, `entries` long.
  void Reset(int64_t entries);
  int64_t size() const { return size_; }
  int64_t free_entries() const { return free_entries_; }

 private:
  int64_t size_ = 0;
  int64_t free_entries_ = 0;
  std::map<int64_t, int64_t> free_;  // offset -> length, disjoint and never adjacent
};

// What one Verify call must upload, and where each sequence's list lives in the arena.
struct SlotMirrorPlan {
  std::vector<int32_t> list_offset;  // [batch]: slot_indptr[b] of the device problem
  std::vector<SlotScatterRun> runs;  // at most one per sequence, by value_begin
  std::vector<int32_t> run_list;     // [runs]: the batch index whose list the run copies
  std::vector<int32_t> run_first;    // [runs]: its first position (the run ends at L_b + Q_b)
  int64_t num_values = 0;            // entries uploaded by this call
  bool reset = false;                // every mirror was dropped to make room
};

struct SlotMirrorCounters {
  int64_t full_uploads = 0;      // lists uploaded whole (unknown, new generation, relocated)
  int64_t delta_uploads = 0;     // lists uploaded from a mirrored prefix position on
  int64_t unchanged = 0;         // lists that needed nothing
  int64_t uploaded_entries = 0;  // Σ values over all calls
  int64_t resets = 0;            // arena full: every mirror dropped
  int64_t grows = 0;             // the arena had to grow (the device buffer is reallocated)
};

// Headroom for growth: a decode sequence grows by Q per step, so a region with 25% (at least 64
// entries) spare is rewritten rarely. Rounded to 64 entries (256 bytes).
int64_t SlotRegionEntriesFor(int64_t list_entries);

class SlotMirror {
 public:
  // arena_entries: the device arena's size in int32 entries (the backend sizes it from the pool's
  // capacity: every live list together holds at most `capacity` slots).
  explicit SlotMirror(int64_t arena_entries) : arena_(arena_entries) {}

  // Decides what this call uploads and records the lists as mirrored. Checks first, changing
  // nothing on error: lists with one non-zero-generation id twice (INVALID_ARGUMENT), lists too
  // long for int32 offsets, and every value to upload in [0, num_slots) (INVALID_ARGUMENT naming
  // slot_lists[b].prefix_slots[i] / tree_slots[i]). Values already mirrored were checked when
  // uploaded. The caller must then place the plan's values (WriteSlotUploads + the scatter) before
  // anything reads the arena, and call Clear() when it cannot. RESOURCE_EXHAUSTED when the lists
  // would need an arena past 2^31 entries. The plan stays valid until the next call.
  absl::StatusOr<const SlotMirrorPlan*> Plan(absl::Span<const VerifySlotList> lists,
                                             int64_t num_slots);

  // The sequence is gone: its region is freed.
  void Forget(SequenceId sequence);
  // Drops every mirror (the device arena was lost, or a call failed after Plan).
  void Clear();

  // The arena size the device buffer must have now (grows only inside Plan, with plan.reset).
  int64_t arena_entries() const { return arena_.size(); }
  const SlotArena& arena() const { return arena_; }
  const SlotMirrorCounters& counters() const { return counters_; }
  size_t mirrored_sequences() const { return entries_.size(); }
  // Region of a mirrored sequence {offset, capacity}, for tests.
  struct Region {
    int64_t offset = 0, capacity = 0;
  };
  std::optional<Region> RegionOf(SequenceId sequence) const;

 private:
  struct Entry {
    uint64_t generation = 0;
    Region region;
    int32_t mirrored = 0;       // prefix positions [0, mirrored) hold the store's slots
    std::vector<int32_t> tree;  // what [mirrored, mirrored + tree.size()) holds
  };
  struct Decision {
    int64_t first = 0;      // first position to upload; == L + Q: nothing
    bool relocate = false;  // needs a new region
  };
  absl::Status Decide(absl::Span<const VerifySlotList> lists, int64_t num_slots);
  // Allocates the regions the decisions need; false when the arena has no room.
  bool AllocateRegions(absl::Span<const VerifySlotList> lists);
  // Drops every mirror and sizes the arena for `lists` uploaded whole.
  absl::Status ResetFor(absl::Span<const VerifySlotList> lists);
  void Record(absl::Span<const VerifySlotList> lists);

  SlotArena arena_;
  absl::flat_hash_map<SequenceId, Entry> entries_;
  std::vector<Region> transient_;  // regions of generation-0 lists: freed by the next Plan
  std::vector<Decision> decisions_;
  std::vector<Region> regions_;  // [batch] this call
  absl::flat_hash_set<SequenceId> seen_;
  SlotMirrorPlan plan_;
  SlotMirrorCounters counters_;
};

// Checks a problem whose slot lists come as `lists` (problem.slots / slot_indptr unused): one list
// per sequence, prefix_slots of prefix_len[b] entries, tree_slots of Q_b entries, and everything
// ValidateVerifyProblem checks except the prefix slots (the mirror checks those it uploads).
// Cost O(Σ Q_b · mask words), independent of the prefix lengths. INVALID_ARGUMENT naming the field.
absl::Status ValidateProblemWithSlotLists(const VerifyProblem& problem,
                                          absl::Span<const VerifySlotList> lists);

// Packs the plan's upload into the staging region that cuda_slot_scatter.h describes: header,
// runs (plan.runs.size() of them), then plan.num_values values.
void WriteSlotUploads(absl::Span<const VerifySlotList> lists, const SlotMirrorPlan& plan,
                      SlotScatterHeader* header, SlotScatterRun* runs, int32_t* values);

}  // namespace verifyd
