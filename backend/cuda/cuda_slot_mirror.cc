#include "backend/cuda/cuda_slot_mirror.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/verify_reference.h"

namespace verifyd {
namespace {

constexpr int64_t kMaxArenaEntries = std::numeric_limits<int32_t>::max();

int64_t ListEntries(const VerifySlotList& list) {
  return static_cast<int64_t>(list.prefix_slots.size()) +
         static_cast<int64_t>(list.tree_slots.size());
}

absl::Status CheckValues(absl::Span<const int32_t> values, size_t first, int64_t num_slots, int b,
                         const char* field) {
  for (size_t i = first; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] >= num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot_lists[", b, "].", field, "[", i, "] = ", values[i],
                       " must be in [0, num_slots = ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SlotRegionEntriesFor(int64_t list_entries) {
  const int64_t with_headroom = list_entries + std::max<int64_t>(list_entries / 4, 64);
  return (with_headroom + 63) / 64 * 64;
}

std::optional<int64_t> SlotArena::Allocate(int64_t entries) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < entries) continue;
    const int64_t offset = it->first;
    const int64_t rest = it->second - entries;
    free_.erase(it);
    if (rest > 0) free_.emplace(offset + entries, rest);
    free_entries_ -= entries;
    return offset;
  }
  return std::nullopt;
}

void SlotArena::Free(int64_t offset, int64_t entries) {
  if (entries <= 0) return;
  free_entries_ += entries;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + entries) {
    entries += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += entries;
      return;
    }
  }
  free_.emplace(offset, entries);
}

void SlotArena::Reset(int64_t entries) {
  size_ = entries;
  free_entries_ = entries;
  free_.clear();
  if (entries > 0) free_.emplace(0, entries);
}

std::optional<SlotMirror::Region> SlotMirror::RegionOf(SequenceId sequence) const {
  auto it = entries_.find(sequence);
  if (it == entries_.end()) return std::nullopt;
  return it->second.region;
}

void SlotMirror::Forget(SequenceId sequence) {
  auto it = entries_.find(sequence);
  if (it == entries_.end()) return;
  arena_.Free(it->second.region.offset, it->second.region.capacity);
  entries_.erase(it);
}

void SlotMirror::Clear() {
  entries_.clear();
  transient_.clear();
  arena_.Reset(arena_.size());
}

absl::Status SlotMirror::Decide(absl::Span<const VerifySlotList> lists, int64_t num_slots) {
  decisions_.assign(lists.size(), Decision{});
  seen_.clear();
  for (size_t b = 0; b < lists.size(); ++b) {
    const VerifySlotList& list = lists[b];
    const int64_t n = static_cast<int64_t>(list.prefix_slots.size());
    const int64_t total = ListEntries(list);
    if (SlotRegionEntriesFor(total) > kMaxArenaEntries) {
      return absl::InvalidArgumentError(absl::StrCat("slot_lists[", b, "] has ", total,
                                                     " entries; must be < 2^31 with headroom"));
    }
    Decision& d = decisions_[b];
    d.relocate = true;
    if (list.generation != 0) {
      if (!seen_.insert(list.sequence).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("slot_lists[", b, "].sequence = ", list.sequence, " appears twice"));
      }
      auto it = entries_.find(list.sequence);
      if (it != entries_.end() && it->second.region.capacity >= total) {
        const Entry& e = it->second;
        d.relocate = false;
        if (e.generation == list.generation) {
          d.first = std::min<int64_t>(e.mirrored, n);
          if (d.first == n && absl::MakeConstSpan(e.tree) == list.tree_slots) d.first = total;
        }
      }
    }
    // Only what is uploaded is checked: the rest was checked when it was uploaded.
    VERIFYD_RETURN_IF_ERROR(CheckValues(list.prefix_slots,
                                        static_cast<size_t>(std::min(d.first, n)), num_slots,
                                        static_cast<int>(b), "prefix_slots"));
    if (d.first < total) {
      VERIFYD_RETURN_IF_ERROR(CheckValues(list.tree_slots,
                                          static_cast<size_t>(std::max<int64_t>(d.first - n, 0)),
                                          num_slots, static_cast<int>(b), "tree_slots"));
    }
  }
  return absl::OkStatus();
}

bool SlotMirror::AllocateRegions(absl::Span<const VerifySlotList> lists) {
  regions_.assign(lists.size(), Region{});
  // Old regions of relocating sequences go first, so that a grown list may reuse its own space.
  for (size_t b = 0; b < lists.size(); ++b) {
    if (decisions_[b].relocate && lists[b].generation != 0) Forget(lists[b].sequence);
  }
  for (size_t b = 0; b < lists.size(); ++b) {
    if (!decisions_[b].relocate) {
      regions_[b] = entries_.at(lists[b].sequence).region;
      continue;
    }
    const int64_t capacity = SlotRegionEntriesFor(ListEntries(lists[b]));
    const std::optional<int64_t> offset = arena_.Allocate(capacity);
    if (!offset.has_value()) return false;
    regions_[b] = Region{*offset, capacity};
    // Recorded at once so that a failure further on frees it with the rest (ResetFor).
    if (lists[b].generation == 0) transient_.push_back(regions_[b]);
  }
  return true;
}

absl::Status SlotMirror::ResetFor(absl::Span<const VerifySlotList> lists) {
  int64_t needed = 0;
  for (const VerifySlotList& list : lists) needed += SlotRegionEntriesFor(ListEntries(list));
  if (needed > kMaxArenaEntries) {
    return absl::ResourceExhaustedError(absl::StrCat("slot arena: the batch's lists need ", needed,
                                                     " entries; the arena holds at most 2^31"));
  }
  int64_t size = std::max<int64_t>(arena_.size(), 1);
  while (size < needed) size = std::min(size * 2, kMaxArenaEntries);
  if (size != arena_.size()) ++counters_.grows;
  ++counters_.resets;
  entries_.clear();
  transient_.clear();
  arena_.Reset(size);
  return absl::OkStatus();
}

void SlotMirror::Record(absl::Span<const VerifySlotList> lists) {
  plan_.list_offset.resize(lists.size());
  plan_.runs.clear();
  plan_.run_list.clear();
  plan_.run_first.clear();
  plan_.num_values = 0;
  for (size_t b = 0; b < lists.size(); ++b) {
    const VerifySlotList& list = lists[b];
    const int64_t total = ListEntries(list);
    const Decision& d = decisions_[b];
    plan_.list_offset[b] = static_cast<int32_t>(regions_[b].offset);
    if (d.first < total) {
      plan_.runs.push_back(SlotScatterRun{static_cast<int32_t>(regions_[b].offset + d.first),
                                          static_cast<int32_t>(plan_.num_values)});
      plan_.run_list.push_back(static_cast<int32_t>(b));
      plan_.run_first.push_back(static_cast<int32_t>(d.first));
      plan_.num_values += total - d.first;
    }
    if (d.first == total) {
      ++counters_.unchanged;
    } else if (d.first == 0) {
      ++counters_.full_uploads;
    } else {
      ++counters_.delta_uploads;
    }
    if (list.generation == 0) continue;
    Entry& e = entries_[list.sequence];
    e.generation = list.generation;
    e.region = regions_[b];
    e.mirrored = static_cast<int32_t>(list.prefix_slots.size());
    e.tree.assign(list.tree_slots.begin(), list.tree_slots.end());
  }
  counters_.uploaded_entries += plan_.num_values;
}

absl::StatusOr<const SlotMirrorPlan*> SlotMirror::Plan(absl::Span<const VerifySlotList> lists,
                                                       int64_t num_slots) {
  VERIFYD_RETURN_IF_ERROR(Decide(lists, num_slots));
  // The previous call's one-shot regions: that call has completed (the backend waits for it).
  for (const Region& r : transient_) arena_.Free(r.offset, r.capacity);
  transient_.clear();
  plan_.reset = false;
  if (!AllocateRegions(lists)) {
    VERIFYD_RETURN_IF_ERROR(ResetFor(lists));
    plan_.reset = true;
    // Everything is uploaded whole now, so everything is checked (values a mirror had skipped
    // are equal to checked ones by the generation contract; this holds even if it was broken).
    VERIFYD_RETURN_IF_ERROR(Decide(lists, num_slots));
    // An emptied arena of at least Σ capacities: first fit places them one after another.
    AllocateRegions(lists);
  }
  Record(lists);
  return &plan_;
}

absl::Status ValidateProblemWithSlotLists(const VerifyProblem& p,
                                          absl::Span<const VerifySlotList> lists) {
  if (p.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch = ", p.batch, " must be >= 1"));
  }
  if (p.qo_indptr == nullptr || p.prefix_len == nullptr) {
    return absl::InvalidArgumentError("qo_indptr and prefix_len must be set");
  }
  if (lists.size() != static_cast<size_t>(p.batch)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_lists has ", lists.size(), " entries; must equal batch = ", p.batch));
  }
  // The tree-only problem (L_b = 0, the tree slots as the lists) goes through the reference
  // validation: masks, node counts, indptr starts, heads, scale and the tree slots' range.
  std::vector<int32_t> zeros(static_cast<size_t>(p.batch), 0);
  std::vector<int32_t> tree_indptr(1, 0);
  std::vector<int32_t> tree_slots;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t nodes = int64_t{p.qo_indptr[b + 1]} - p.qo_indptr[b];
    if (static_cast<int64_t>(lists[b].tree_slots.size()) != nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot_lists[", b, "].tree_slots has ", lists[b].tree_slots.size(),
          " entries; must equal qo_indptr[", b + 1, "] - qo_indptr[", b, "] = ", nodes));
    }
    if (p.prefix_len[b] < 0 ||
        static_cast<int64_t>(lists[b].prefix_slots.size()) != p.prefix_len[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot_lists[", b, "].prefix_slots has ", lists[b].prefix_slots.size(),
                       " entries; must equal prefix_len[", b, "] = ", p.prefix_len[b]));
    }
    tree_slots.insert(tree_slots.end(), lists[b].tree_slots.begin(), lists[b].tree_slots.end());
    tree_indptr.push_back(static_cast<int32_t>(tree_slots.size()));
  }
  VerifyProblem tree_only = p;
  tree_only.prefix_len = zeros.data();
  tree_only.slot_indptr = tree_indptr.data();
  tree_only.slots = tree_slots.data();
  return ValidateVerifyProblem(tree_only);
}

void WriteSlotUploads(absl::Span<const VerifySlotList> lists, const SlotMirrorPlan& plan,
                      SlotScatterHeader* header, SlotScatterRun* runs, int32_t* values) {
  header->num_runs = static_cast<int32_t>(plan.runs.size());
  header->num_values = static_cast<int32_t>(plan.num_values);
  if (!plan.runs.empty()) std::memcpy(runs, plan.runs.data(), plan.runs.size() * sizeof(*runs));
  for (size_t r = 0; r < plan.runs.size(); ++r) {
    const VerifySlotList& list = lists[plan.run_list[r]];
    const size_t first = static_cast<size_t>(plan.run_first[r]);  // <= L: a run always has the tree
    int32_t* at = values + plan.runs[r].value_begin;
    const size_t prefix = list.prefix_slots.size() - first;
    if (prefix > 0) std::memcpy(at, list.prefix_slots.data() + first, prefix * sizeof(int32_t));
    if (!list.tree_slots.empty()) {
      std::memcpy(at + prefix, list.tree_slots.data(), list.tree_slots.size() * sizeof(int32_t));
    }
  }
}

}  // namespace verifyd
