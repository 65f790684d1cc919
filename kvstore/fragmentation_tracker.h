// FragmentationTracker: the store's fragmentation statistics kept up to date as slot lists change,
// so that KvStore::Stats() costs O(1) instead of a walk of every held slot (the compaction manager
// reads it before and after every operation, the gauges every tick: plans/0011), and the planner
// finds the fragmented sequences and their first runs without walking them.
//
// Per sequence it keeps the slot list's length, its breaks (positions p >= 1 whose slot is not the
// slot of p - 1 plus one; the list's runs are its breaks + 1) and the length of its first run (the
// first break, or the length when there is none). The owner reports every change of a list:
// growth at the end (Extend), positions rewritten in place (Rewrite) and removal.
// Header-only: small, and used by the store's two .cc files.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace verifyd {

// Also declared by kvstore/kv_store.h (the same type).
using SequenceId = uint64_t;

struct FragmentationStats {
  int64_t sequences = 0;
  int64_t tokens = 0;  // slots held by committed positions
  int64_t runs = 0;    // maximal runs of consecutive slots, summed over sequences
  int64_t tokens_outside_first_run = 0;
  double fragmented_ratio() const {
    return tokens == 0 ? 0.0 : static_cast<double>(tokens_outside_first_run) / tokens;
  }
  bool operator==(const FragmentationStats&) const = default;
};

class FragmentationTracker {
 public:
  // Boundary `position` of a list lies between positions position - 1 and position.
  struct BoundaryChange {
    int64_t position = 0;
    bool was_break = false;
    bool is_break = false;
  };

  // True when position p (1 <= p < slots.size()) starts a new run.
  static bool IsBreak(absl::Span<const int32_t> slots, int64_t p) {
    return p >= 1 && p < static_cast<int64_t>(slots.size()) && slots[p] != slots[p - 1] + 1;
  }

  // A sequence whose slot list is empty. The id must not be tracked yet.
  void Add(SequenceId id);
  // Forgets a tracked sequence (nothing when unknown).
  void Remove(SequenceId id);
  // `slots` (the whole list) grew at the end from old_length entries: reads the new entries only.
  void Extend(SequenceId id, absl::Span<const int32_t> slots, int64_t old_length);
  // Positions of `slots` were rewritten in place (the length is unchanged); `changes` names, once
  // each, every boundary whose state may differ. O(changes), plus, when the rewrite removes the
  // first break and adds none before it, a scan of `slots` up to the next break.
  void Rewrite(SequenceId id, absl::Span<const int32_t> slots,
               absl::Span<const BoundaryChange> changes);

  // For a rewrite of many lists at once (a compaction chunk): each sequence's state is looked up
  // once, as a handle (valid until the next Add or Remove), and marked with the batch, which tells
  // whether the batch named it before. Rewrite(handle, ...) is Rewrite(id, ...) without the lookup.
  struct PerSequence;
  using Handle = PerSequence*;
  uint64_t BeginBatch() { return ++batch_; }
  // nullptr for an unknown id.
  Handle Find(SequenceId id) {
    auto it = sequences_.find(id);
    return it == sequences_.end() ? nullptr : &it->second;
  }
  // True the first time a batch marks `handle`.
  static bool MarkInBatch(Handle handle, uint64_t batch);
  void Rewrite(Handle handle, absl::Span<const int32_t> slots,
               absl::Span<const BoundaryChange> changes);

  const FragmentationStats& totals() const { return totals_; }
  // 0 for an unknown id.
  int64_t FirstRunLength(SequenceId id) const;
  // f(id, first run length) for every sequence whose slots are more than one run.
  template <typename F>
  void ForEachFragmented(F f) const {
    for (const auto& [id, s] : sequences_) {
      if (s.first_run < s.length) f(id, s.first_run);
    }
  }

  struct PerSequence {
    int64_t length = 0;
    int64_t breaks = 0;
    int64_t first_run = 0;
    uint64_t batch = 0;  // the last batch that marked it
  };

 private:
  // Adds (sign +1) or takes out (-1) one sequence's share of the totals.
  void Account(const PerSequence& s, int sign);

  absl::flat_hash_map<SequenceId, PerSequence> sequences_;
  FragmentationStats totals_;
  uint64_t batch_ = 0;
};

inline void FragmentationTracker::Account(const PerSequence& s, int sign) {
  totals_.tokens += sign * s.length;
  totals_.runs += sign * (s.length > 0 ? s.breaks + 1 : 0);
  totals_.tokens_outside_first_run += sign * (s.length - s.first_run);
}

inline void FragmentationTracker::Add(SequenceId id) {
  sequences_.emplace(id, PerSequence{});
  totals_.sequences = static_cast<int64_t>(sequences_.size());
}

inline void FragmentationTracker::Remove(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  Account(it->second, -1);
  sequences_.erase(it);
  totals_.sequences = static_cast<int64_t>(sequences_.size());
}

inline void FragmentationTracker::Extend(SequenceId id, absl::Span<const int32_t> slots,
                                         int64_t old_length) {
  PerSequence& s = sequences_[id];
  Account(s, -1);
  const int64_t length = static_cast<int64_t>(slots.size());
  // The first run reaches the old end only when the old list was one run; then it continues up to
  // the first break among the new entries.
  bool first_run_open = s.first_run == old_length;
  for (int64_t p = old_length; p < length; ++p) {
    if (!IsBreak(slots, p)) continue;
    ++s.breaks;
    if (first_run_open) {
      s.first_run = p;
      first_run_open = false;
    }
  }
  if (first_run_open) s.first_run = length;
  s.length = length;
  Account(s, +1);
}

inline void FragmentationTracker::Rewrite(SequenceId id, absl::Span<const int32_t> slots,
                                          absl::Span<const BoundaryChange> changes) {
  if (Handle handle = Find(id)) Rewrite(handle, slots, changes);
}

inline bool FragmentationTracker::MarkInBatch(Handle handle, uint64_t batch) {
  if (handle->batch == batch) return false;
  handle->batch = batch;
  return true;
}

inline void FragmentationTracker::Rewrite(Handle handle, absl::Span<const int32_t> slots,
                                          absl::Span<const BoundaryChange> changes) {
  PerSequence& s = *handle;
  Account(s, -1);
  int64_t earliest_new_break = s.length;
  bool first_break_removed = false;
  for (const BoundaryChange& c : changes) {
    s.breaks += int64_t{c.is_break} - int64_t{c.was_break};
    if (c.is_break) earliest_new_break = std::min(earliest_new_break, c.position);
    if (c.position == s.first_run && c.was_break && !c.is_break) first_break_removed = true;
  }
  if (earliest_new_break < s.first_run) {
    // Every boundary before the old first break was no break; the rewrite made this one the first.
    s.first_run = earliest_new_break;
  } else if (first_break_removed) {
    // The scan reads the list as it is now, so a new break after the old first one is found too.
    // Blocks of 16 are compared without an early exit (the compiler vectorizes them); the break
    // is then located one by one.
    const int32_t* d = slots.data();
    int64_t p = s.first_run + 1;
    for (; p + 16 <= s.length; p += 16) {
      int32_t differ = 0;
      for (int i = 0; i < 16; ++i) differ |= d[p + i] - d[p + i - 1] - 1;
      if (differ != 0) break;
    }
    while (p < s.length && d[p] == d[p - 1] + 1) ++p;
    s.first_run = p;
  }
  Account(s, +1);
}

inline int64_t FragmentationTracker::FirstRunLength(SequenceId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second.first_run;
}

}  // namespace verifyd
