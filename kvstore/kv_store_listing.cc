// KvStore::ListSequences: what an operator needs to find sequences a client forgot (ids,
// lengths, idle time, sharing) without touching them.
#include <algorithm>
#include <queue>

#include "kvstore/kv_store.h"
#include "kvstore/sequence.h"

namespace verifyd {

SequencePage KvStore::ListSequences(std::optional<SequenceId> after, int64_t limit) const {
  SequencePage page;
  page.total = static_cast<int64_t>(sequences_.size());
  const size_t keep = static_cast<size_t>(std::max<int64_t>(limit, 0));
  // The `keep` smallest ids past `after`: a max-heap of that size, so that a page costs
  // O(sequences log page) and not a sort of every id (the map is unordered).
  std::priority_queue<SequenceId> smallest;
  size_t candidates = 0;
  for (const auto& [id, sequence] : sequences_) {
    if (after.has_value() && id <= *after) continue;
    ++candidates;
    if (keep == 0) continue;
    if (smallest.size() < keep) {
      smallest.push(id);
    } else if (id < smallest.top()) {
      smallest.pop();
      smallest.push(id);
    }
  }
  page.truncated = candidates > smallest.size();
  std::vector<SequenceId> ids;
  ids.reserve(smallest.size());
  for (; !smallest.empty(); smallest.pop()) ids.push_back(smallest.top());
  std::reverse(ids.begin(), ids.end());

  const absl::Time now = options_.now();
  page.sequences.reserve(ids.size());
  for (SequenceId id : ids) {
    const Sequence& sequence = *sequences_.at(id);
    SequenceSummary summary;
    summary.id = id;
    summary.committed_length = sequence.committed_length();
    summary.pending_nodes = sequence.pending ? sequence.pending->num_nodes() : 0;
    // Every renewal sets deadline = now + lease (Renew), so the last one was at deadline - lease.
    summary.lease_left = sequence.deadline - now;
    summary.idle = options_.lease - summary.lease_left;
    for (int32_t slot : sequence.slots) {
      if (Holders(slot) >= 2) ++summary.shared_slots;
    }
    page.sequences.push_back(summary);
  }
  return page;
}

}  // namespace verifyd
