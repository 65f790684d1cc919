// KvStore: shared prefixes (Fork). Slots carry reference counts; sequences form a sharing tree
// (parent, fork_length, children) that says which holder accounts each shared slot and which
// lists a compaction must rewrite with it. Design and the SPEC §2 rule:
// plans/0019-shared-prefixes.md.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvstore/kv_store.h"
#include "kvstore/sequence.h"

namespace verifyd {

absl::Status KvStore::Fork(SequenceId source, SequenceId fork, int64_t length) {
  if (length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(names().fork_length, " = ", length,
                     " must be >= 1 (a new sequence without a prefix is an Append)"));
  }
  VERIFYD_ASSIGN_OR_RETURN(Sequence * parent, Find(source, names().fork_source));
  if (sequences_.contains(fork)) {
    return absl::AlreadyExistsError(absl::StrCat(
        names().fork_sequence, " = ", fork, " is already a live sequence; a fork needs a new id"));
  }
  if (parent->pending) {
    return absl::FailedPreconditionError(
        absl::StrCat(names().fork_source, " = ", source, " has a pending tree of ",
                     parent->pending->num_nodes(), " nodes; commit it before forking"));
  }
  const int64_t committed = parent->committed_length();
  if (length > committed) {
    return absl::OutOfRangeError(absl::StrCat(names().fork_length, " = ", length,
                                              " must be <= the committed length ", committed,
                                              " of ", names().fork_source, " = ", source));
  }
  VERIFYD_RETURN_IF_ERROR(CheckHostBounds(fork, names().fork_sequence, true, length));

  auto created = std::make_unique<Sequence>();
  created->id = fork;
  created->slot_generation = next_slot_generation_++;
  created->fill.assign(options_.num_layers, length);
  created->slots.assign(parent->slots.begin(), parent->slots.begin() + length);
  for (int32_t slot : created->slots) Hold(slot);
  table_entries_ += length;
  created->parent = parent;
  created->fork_length = length;
  parent->children.push_back(created.get());
  Renew(*created);
  Renew(*parent);
  // Every position of the fork is accounted by an ancestor until it grows.
  fragmentation_.Add(fork);
  sequences_.emplace(fork, std::move(created));
  expired_.Forget(fork);
  return absl::OkStatus();
}

void KvStore::Hold(int32_t slot) {
  uint32_t& holders = holders_[static_cast<size_t>(slot)];
  if (holders == 1) {
    ++shared_slots_;
    shared_references_ += 2;
  } else if (holders >= 2) {
    ++shared_references_;
  }
  ++holders;
}

bool KvStore::Drop(int32_t slot) {
  uint32_t& holders = holders_[static_cast<size_t>(slot)];
  --holders;
  if (holders == 1) {
    --shared_slots_;
    shared_references_ -= 2;
  } else if (holders >= 2) {
    --shared_references_;
  }
  return holders == 0;
}

void KvStore::Detach(Sequence& sequence) {
  Sequence* parent = sequence.parent;
  if (parent != nullptr) {
    std::erase(parent->children, &sequence);
  }
  if (sequence.children.empty()) return;
  // The child sharing the longest prefix holds every position any other child shares (each
  // shares a prefix of the same list), so it can account them and parent the others.
  Sequence* heir = *std::max_element(
      sequence.children.begin(), sequence.children.end(),
      [](const Sequence* a, const Sequence* b) { return a->fork_length < b->fork_length; });
  const int64_t old_begin = heir->accounted_begin();
  heir->parent = parent;
  // It shares with the grandparent what both it and the released sequence shared with it.
  heir->fork_length = parent != nullptr ? std::min(heir->fork_length, sequence.fork_length) : 0;
  if (parent != nullptr) parent->children.push_back(heir);
  for (Sequence* child : sequence.children) {
    if (child == heir) continue;
    child->parent = heir;  // its shared prefix (<= the heir's) is the heir's too
    heir->children.push_back(child);
  }
  sequence.children.clear();
  if (heir->accounted_begin() != old_begin) Retrack(*heir);
}

void KvStore::Retrack(const Sequence& sequence) {
  fragmentation_.Remove(sequence.id);
  fragmentation_.Add(sequence.id);
  fragmentation_.Extend(sequence.id, sequence.accounted(), 0);
}

void KvStore::RewriteDescendants(Sequence& owner, int64_t position, int32_t dst, int64_t length,
                                 int64_t limit) {
  // An explicit stack, not recursion: a chain of forks is as deep as the client makes it (150,000
  // links overflowed the thread's stack, issue 33 N1). Each entry is a holder whose children may
  // share the moved positions below `limit`, the prefix shared along the path to it.
  struct Holder {
    Sequence* sequence;
    int64_t limit;
  };
  std::vector<Holder> stack{{&owner, limit}};
  const int64_t end = position + length;
  while (!stack.empty()) {
    const Holder holder = stack.back();
    stack.pop_back();
    for (Sequence* child : holder.sequence->children) {
      const int64_t shared = std::min(holder.limit, child->fork_length);
      if (shared <= position) continue;
      const int64_t count = std::min(end, shared) - position;
      int32_t* slots = child->slots.data() + position;
      for (int64_t i = 0; i < count; ++i) slots[i] = dst + static_cast<int32_t>(i);
      // The device mirror keys slot lists by generation: a list whose old entries changed needs a
      // fresh one, whoever accounts the moved slots.
      child->slot_generation = next_slot_generation_++;
      stack.push_back({child, shared});
    }
  }
}

absl::StatusOr<std::vector<SlotRun>> KvStore::AllocateGrowth(const Sequence& sequence, int64_t n,
                                                             const char* field) {
  if (sequence.slots.empty()) return allocator_.Allocate(n, field);
  const int32_t hint = sequence.slots.back() + 1;
  const bool fork_not_grown =
      sequence.parent != nullptr &&
      sequence.accounted_begin() == static_cast<int64_t>(sequence.slots.size());
  if (fork_not_grown && n > 0 && n <= allocator_.free_slots()) {
    // The slot after the shared prefix is usually the source's next token: the nearest free run
    // at or after it keeps the fork's suffix close to (and in address order after) its prefix.
    if (std::optional<SlotRun> run = allocator_.FindRunFrom(n, hint)) {
      const SlotRun taken{run->begin, static_cast<int32_t>(n)};
      VERIFYD_RETURN_IF_ERROR(allocator_.Reserve(taken));
      return std::vector<SlotRun>{taken};
    }
  }
  return allocator_.AllocateAfter(hint, n, field);
}

int64_t KvStore::Holders(int32_t slot) const {
  if (slot < 0 || static_cast<size_t>(slot) >= holders_.size()) return 0;
  return holders_[static_cast<size_t>(slot)];
}

absl::StatusOr<int64_t> KvStore::AccountedBegin(SequenceId seq) const {
  VERIFYD_ASSIGN_OR_RETURN(const Sequence* sequence, Find(seq, names().sequence));
  return sequence->accounted_begin();
}

}  // namespace verifyd
