// The per-sequence bookkeeping of KvStore (private to kvstore/; shared by its .cc files).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvstore/kv_store.h"
#include "verify/tree_mask.h"

namespace verifyd {

// The draft tree between its first Verify and its Commit. Node i lives in slots[i].
struct KvStore::PendingTree {
  std::vector<int32_t> parents;
  TreeMask mask;
  std::vector<int32_t> slots;
  std::vector<bool> layer_written;
  int layers_written = 0;

  int32_t num_nodes() const { return static_cast<int32_t>(slots.size()); }
};

// Invariants: slots.size() == max(fill); fill[l] <= slots.size(); while a tree is pending every
// fill equals slots.size() (PrepareVerify demands it and Append is refused until the commit).
struct KvStore::Sequence {
  SequenceId id = 0;
  std::vector<int32_t> slots;  // position -> slot
  // VerifyView::slot_generation: changes whenever an existing entry of `slots` does.
  uint64_t slot_generation = 0;
  std::vector<int64_t> fill;  // per layer
  std::optional<PendingTree> pending;
  absl::Time deadline;
  // Sharing (Fork, plans/0019-shared-prefixes.md). Positions [0, fork_length) hold the same slots
  // as the same positions of `parent`; every slot is accounted (fragmentation figures, compaction
  // planning) by exactly one holder: this sequence accounts positions [accounted_begin(), size),
  // the ones before belong to its ancestors. A compaction that moves an accounted position moves
  // it for every descendant that holds it (children with fork_length > position, recursively).
  Sequence* parent = nullptr;  // null: a root, which accounts all its positions
  int64_t fork_length = 0;     // meaningful with a parent; <= slots.size()
  std::vector<Sequence*> children;

  int64_t accounted_begin() const { return parent != nullptr ? fork_length : 0; }
  absl::Span<const int32_t> accounted() const {
    return absl::MakeConstSpan(slots).subspan(static_cast<size_t>(accounted_begin()));
  }

  int64_t committed_length() const {
    int64_t n = static_cast<int64_t>(slots.size());
    for (int64_t f : fill) n = std::min(n, f);
    return n;
  }
};

}  // namespace verifyd
