// The sequences their lease dropped most recently, so that a call naming one hears why it is gone
// (NOT_FOUND "... its lease expired ...") rather than a bare "not a live sequence". Bounded: past
// `capacity` ids the oldest are forgotten; an id that is created again is forgotten at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace verifyd {

using SequenceId = uint64_t;

class ExpiredSequences {
 public:
  explicit ExpiredSequences(size_t capacity = 4096) : capacity_(capacity) {}

  void Add(SequenceId id, absl::Time when) {
    when_.insert_or_assign(id, when);
    order_.push_back({id, when});
    while (order_.size() > capacity_) {
      // Only the entry this record made: the id may have expired again since.
      auto it = when_.find(order_.front().first);
      if (it != when_.end() && it->second == order_.front().second) when_.erase(it);
      order_.pop_front();
    }
  }
  // The id names a live sequence again (an Append or a Fork made it).
  void Forget(SequenceId id) { when_.erase(id); }
  std::optional<absl::Time> When(SequenceId id) const {
    auto it = when_.find(id);
    if (it == when_.end()) return std::nullopt;
    return it->second;
  }

 private:
  size_t capacity_;
  std::deque<std::pair<SequenceId, absl::Time>> order_;
  absl::flat_hash_map<SequenceId, absl::Time> when_;
};

}  // namespace verifyd
