// KvStore: sequence life cycle (Append, trees, Commit, Release, leases) and queries. Compaction and
// statistics live in kv_store_compaction.cc.
#include "kvstore/kv_store.h"

#include <algorithm>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kvstore/sequence.h"
#include "verify/kv_fp8_check.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

std::vector<int32_t> SlotsOf(absl::Span<const SlotRun> runs) {
  std::vector<int32_t> slots;
  for (const SlotRun& run : runs) {
    for (int32_t s = run.begin; s < run.end(); ++s) slots.push_back(s);
  }
  return slots;
}

}  // namespace

KvStore::KvStore(KvStoreOptions options, std::unique_ptr<KvStorage> storage)
    : options_(std::move(options)),
      storage_(std::move(storage)),
      allocator_(storage_->capacity_slots()),
      holders_(static_cast<size_t>(allocator_.capacity()), 0) {
  options_.num_layers = storage_->num_layers();
  // The kernels' mask rows and launch bounds stop at kMaxTreeNodes (SPEC §1).
  options_.max_tree_nodes = std::clamp(options_.max_tree_nodes, 1, kMaxTreeNodes);
}

KvStore::~KvStore() = default;

absl::StatusOr<KvStore::Sequence*> KvStore::Find(SequenceId seq, absl::string_view field) {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) {
    return NotLive(seq, field);
  }
  return it->second.get();
}

absl::StatusOr<const KvStore::Sequence*> KvStore::Find(SequenceId seq,
                                                       absl::string_view field) const {
  auto it = sequences_.find(seq);
  if (it == sequences_.end()) {
    return NotLive(seq, field);
  }
  return it->second.get();
}

absl::Status KvStore::NotLive(SequenceId seq, absl::string_view field) const {
  if (const std::optional<absl::Time> when = expired_.When(seq)) {
    return absl::NotFoundError(absl::StrCat(
        field, " = ", seq, " is not a live sequence: its lease expired at ",
        absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", *when, absl::UTCTimeZone()),
        " (no call named it for ", absl::FormatDuration(options_.lease), "); Append it again"));
  }
  return absl::NotFoundError(absl::StrCat(field, " = ", seq, " is not a live sequence"));
}

absl::Status KvStore::CheckLayer(int layer, const char* field) const {
  if (layer < 0 || layer >= options_.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", layer, " must be in [0, ", options_.num_layers, ")"));
  }
  return absl::OkStatus();
}

void KvStore::Renew(Sequence& sequence) const {
  sequence.deadline = options_.now() + options_.lease;
}

absl::Status KvStore::CheckHostBounds(SequenceId seq, const std::string& field, bool new_sequence,
                                      int64_t entries) const {
  const int64_t live = static_cast<int64_t>(sequences_.size());
  if (new_sequence && options_.max_sequences > 0 && live >= options_.max_sequences) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, " = ", seq, " would be live sequence ", live + 1, ", past ", names().max_sequences,
        " = ", options_.max_sequences, "; release sequences first; nothing was kept"));
  }
  if (options_.max_slot_table_entries > 0 &&
      table_entries_ + entries > options_.max_slot_table_entries) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, " = ", seq, ": ", entries, " more slot-table entries would make ",
        table_entries_ + entries, ", past ", names().max_slot_table_entries, " = ",
        options_.max_slot_table_entries,
        " (every committed position of every sequence, a fork's shared prefix included); release "
        "sequences or forks first; nothing was kept"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckExpectation(SequenceId seq, const Sequence* existing, int layer_begin,
                                       int layer_count, AppendExpectation expect) const {
  switch (expect.kind) {
    case AppendExpectation::Kind::kAny:
      return absl::OkStatus();
    case AppendExpectation::Kind::kCreate:
      if (existing == nullptr) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat(
          "expected_position: create expects sequence ", seq, " not to exist (0 tokens), but it ",
          "exists with ", existing->committed_length(), " committed tokens; send expected_fill"));
    case AppendExpectation::Kind::kFill:
      if (existing == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "expected_fill = ", expect.fill, " but sequence ", seq,
            " does not exist (0 tokens): it was released, its lease expired or the daemon "
            "restarted; nothing was written"));
      }
      for (int l = layer_begin; l < layer_begin + layer_count; ++l) {
        if (existing->fill[l] != expect.fill) {
          return absl::FailedPreconditionError(
              absl::StrCat("expected_fill = ", expect.fill, " but layer ", l, " of sequence ", seq,
                           " holds ", existing->fill[l], " tokens; nothing was written"));
        }
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("expected_position: unknown kind");
}

absl::Status KvStore::Append(SequenceId seq, int layer_begin, int layer_count, int num_tokens,
                             const void* kv, AppendExpectation expect, RowMemory memory,
                             KvDtype kv_dtype) {
  const int layers = options_.num_layers;
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer_begin, "layer_begin"));
  if (layer_count < 1 || layer_count > layers - layer_begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_count = ", layer_count,
                     " must be in [1, layers - layer_begin = ", layers - layer_begin, "]"));
  }
  if (num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(names().num_tokens, " = ", num_tokens, " must be >= 1"));
  }
  if (kv == nullptr) return absl::InvalidArgumentError("kv must not be null");
  const bool encoded = kv_dtype == KvDtype::kFp8;
  if (encoded && storage_->dtype() != KvDtype::kFp8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv.dtype = fp8 (the 656-byte layout) but the store holds ", KvDtypeName(storage_->dtype()),
        " rows (--kv_dtype); send bf16 rows: fp8 values x their scales are not bf16 values, so "
        "they would not be stored exactly; nothing was kept"));
  }
  const int64_t row_bytes = encoded ? kFp8RowBytes : kKvRowBytes;
  const int64_t layer_bytes = int64_t{num_tokens} * row_bytes;
  const int64_t check_shape[] = {layer_count, num_tokens};
  if (encoded && memory == RowMemory::kHost) {
    // Every layer before any state changes: the call keeps nothing of a bad row.
    VERIFYD_RETURN_IF_ERROR(CheckFp8Rows(static_cast<const uint8_t*>(kv),
                                         int64_t{layer_count} * num_tokens, 0, check_shape, "kv"));
  }

  auto it = sequences_.find(seq);
  Sequence* existing = it == sequences_.end() ? nullptr : it->second.get();
  VERIFYD_RETURN_IF_ERROR(CheckExpectation(seq, existing, layer_begin, layer_count, expect));
  if (existing != nullptr && existing->pending) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " has a pending tree of ",
                                                      existing->pending->num_nodes(),
                                                      " nodes; commit it before appending"));
  }
  const int64_t length = existing ? static_cast<int64_t>(existing->slots.size()) : 0;
  int64_t new_length = length;
  for (int l = layer_begin; l < layer_begin + layer_count; ++l) {
    const int64_t fill = existing ? existing->fill[l] : 0;
    new_length = std::max(new_length, fill + num_tokens);
  }
  const int64_t need = new_length - length;
  VERIFYD_RETURN_IF_ERROR(CheckHostBounds(seq, names().sequence, existing == nullptr, need));
  std::vector<SlotRun> runs;
  if (need > 0) {
    // Extending the last run in place keeps the sequence contiguous with no copy.
    VERIFYD_ASSIGN_OR_RETURN(runs, existing != nullptr
                                       ? AllocateGrowth(*existing, need, names().num_tokens.c_str())
                                       : allocator_.Allocate(need, names().num_tokens.c_str()));
  }

  Sequence* sequence = existing;
  if (sequence == nullptr) {
    auto created = std::make_unique<Sequence>();
    created->id = seq;
    created->slot_generation = next_slot_generation_++;
    created->fill.assign(layers, 0);
    sequence = created.get();
    sequences_.emplace(seq, std::move(created));
    expired_.Forget(seq);
  }
  for (const SlotRun& run : runs) {
    for (int32_t s = run.begin; s < run.end(); ++s) sequence->slots.push_back(s);
  }
  const int64_t layer_values = int64_t{num_tokens} * kKvDim;
  for (int l = layer_begin; l < layer_begin + layer_count; ++l) {
    const absl::Span<const int32_t> target(sequence->slots.data() + sequence->fill[l], num_tokens);
    const uint8_t* layer_rows =
        static_cast<const uint8_t*>(kv) + static_cast<size_t>(l - layer_begin) * layer_bytes;
    const bf16_bits* rows = reinterpret_cast<const bf16_bits*>(layer_rows);
    absl::Status written;
    if (encoded && memory == RowMemory::kDevice) {
      // The storage finds the first bad row on the device; the host's check of that one row
      // names it, as for rows in host memory.
      const int64_t first_row = int64_t{l - layer_begin} * num_tokens;
      written = storage_->WriteEncodedDeviceRows(
          l, target, layer_rows, [&](const uint8_t* row, int64_t index) {
            return CheckFp8Rows(row, 1, first_row + index, check_shape, "kv");
          });
    } else if (encoded) {
      if (memory == RowMemory::kShared) {
        // As for bf16 below: the bytes judged are the bytes written.
        shared_bytes_.assign(layer_rows, layer_rows + layer_bytes);
        layer_rows = shared_bytes_.data();
        written = CheckFp8Rows(layer_rows, num_tokens, int64_t{l - layer_begin} * num_tokens,
                               check_shape, "kv");
      }
      if (written.ok()) written = storage_->WriteEncodedRows(l, target, layer_rows);
    } else if (memory == RowMemory::kShared) {
      // The values judged are the values written: the copy, not the region, which its client may
      // rewrite meanwhile.
      shared_rows_.resize(static_cast<size_t>(layer_values));
      const int64_t bad = CopyFirstOutOfBound(shared_rows_.data(), rows, layer_values);
      if (bad >= 0) {
        const int64_t shape[] = {layer_count, num_tokens, kKvDim};
        written =
            OutOfBoundError(shape, (l - layer_begin) * layer_values + bad, shared_rows_[bad], "kv");
      }
      rows = shared_rows_.data();
    }
    bool value_named = false;  // a device value out of bound, named by kv's own shape
    if (!encoded && written.ok() && memory == RowMemory::kDevice) {
      written = storage_->WriteDeviceRows(l, target, rows, [&](int64_t index, bf16_bits bits) {
        value_named = true;
        const int64_t shape[] = {layer_count, num_tokens, kKvDim};
        return OutOfBoundError(shape, (l - layer_begin) * layer_values + index, bits, "kv");
      });
    } else if (!encoded && written.ok()) {
      written = storage_->WriteRows(l, target, rows);
    }
    if (written.code() == absl::StatusCode::kInvalidArgument && memory == RowMemory::kDevice &&
        !encoded && !value_named) {
      written =
          absl::InvalidArgumentError(absl::StrCat("kv[", l - layer_begin, "] ", written.message()));
    }
    if (!written.ok()) {
      // A device row out of SPEC §1's bound, or a broken storage (slots are in range); undo so
      // the call keeps nothing. Rows already written went to slots that return to the free list.
      sequence->slots.resize(length);
      (void)allocator_.Free(SlotsOf(runs));
      if (existing == nullptr) sequences_.erase(seq);
      return written;
    }
  }
  for (int l = layer_begin; l < layer_begin + layer_count; ++l) sequence->fill[l] += num_tokens;
  for (int64_t p = length; p < new_length; ++p) Hold(sequence->slots[p]);
  table_entries_ += need;
  if (existing == nullptr) fragmentation_.Add(seq);
  if (need > 0) {
    fragmentation_.Extend(seq, sequence->accounted(), length - sequence->accounted_begin());
  }
  Renew(*sequence);
  return absl::OkStatus();
}

absl::Status KvStore::ValidateCommit(const Sequence& sequence, const CommitPath& path,
                                     const std::string& field) const {
  if (!sequence.pending) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": sequence ", sequence.id, " has no pending tree to commit"));
  }
  const PendingTree& tree = *sequence.pending;
  const std::vector<int32_t>& a = path.accepted_path;
  if (a.size() > static_cast<size_t>(tree.num_nodes())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".accepted_path has ", a.size(),
                                                   " nodes; must be <= the tree's ",
                                                   tree.num_nodes()));
  }
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j] < 0 || a[j] >= tree.num_nodes()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".accepted_path[", j, "] = ", a[j],
                                                     " must be in [0, ", tree.num_nodes(), ")"));
    }
    const int32_t parent = tree.parents[a[j]];
    if (j == 0 && parent != -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".accepted_path[0] = ", a[0], " must be a root (its parent is ", parent, ")"));
    }
    if (j > 0 && parent != a[j - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".accepted_path[", j, "] = ", a[j], " must be a child of accepted_path[", j - 1,
          "] = ", a[j - 1], " (its parent is ", parent, ")"));
    }
  }
  if (!a.empty() && tree.layers_written < options_.num_layers) {
    const int missing =
        static_cast<int>(std::find(tree.layer_written.begin(), tree.layer_written.end(), false) -
                         tree.layer_written.begin());
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": layer ", missing, " of sequence ", sequence.id,
                     "'s pending tree was never verified; all ", options_.num_layers,
                     " layers must be written before a commit"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::ApplyCommit(Sequence& sequence, const CommitPath& path) {
  PendingTree& tree = *sequence.pending;
  const int64_t old_length = static_cast<int64_t>(sequence.slots.size());
  std::vector<bool> accepted(tree.num_nodes(), false);
  for (int32_t node : path.accepted_path) {
    sequence.slots.push_back(tree.slots[node]);
    Hold(tree.slots[node]);
    accepted[node] = true;
  }
  fragmentation_.Extend(sequence.id, sequence.accounted(), old_length - sequence.accounted_begin());
  table_entries_ += static_cast<int64_t>(path.accepted_path.size());
  pending_slots_ -= tree.num_nodes();
  std::vector<int32_t> rejected;
  for (int32_t i = 0; i < tree.num_nodes(); ++i) {
    if (!accepted[i]) rejected.push_back(tree.slots[i]);
  }
  for (int64_t& fill : sequence.fill) fill += static_cast<int64_t>(path.accepted_path.size());
  sequence.pending.reset();
  return allocator_.Free(rejected);
}

absl::Status KvStore::PrepareVerify(int layer, absl::Span<const VerifyItem> items) {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer, "layer"));
  if (items.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(names().items, " must not be empty"));
  }

  struct Planned {
    Sequence* sequence = nullptr;
    std::optional<TreeMask> new_tree;  // set when this item begins a tree
  };
  std::vector<Planned> planned(items.size());
  absl::flat_hash_map<SequenceId, size_t> first_index;
  int64_t need = 0;
  int64_t freed_by_commits = 0;
  for (size_t b = 0; b < items.size(); ++b) {
    const VerifyItem& item = items[b];
    const std::string field = absl::StrCat(names().items, "[", b, "]");
    const std::string sequence_field = absl::StrCat(field, ".", names().item_sequence);
    auto [dup, inserted] = first_index.emplace(item.sequence, b);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          sequence_field, " = ", item.sequence, " repeats ", names().items, "[", dup->second, "]"));
    }
    VERIFYD_ASSIGN_OR_RETURN(Sequence * sequence, Find(item.sequence, sequence_field));
    planned[b].sequence = sequence;
    bool pending_after = sequence->pending.has_value();
    if (item.commit) {
      VERIFYD_RETURN_IF_ERROR(
          ValidateCommit(*sequence, *item.commit, absl::StrCat(field, ".", names().item_commit)));
      freed_by_commits +=
          sequence->pending->num_nodes() - static_cast<int64_t>(item.commit->accepted_path.size());
      pending_after = false;
    }
    if (pending_after) {
      if (item.parents != sequence->pending->parents) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ".parents differ from sequence ", item.sequence, "'s pending tree (",
            sequence->pending->num_nodes(), " nodes); commit it before sending a new tree"));
      }
      continue;
    }
    const std::string parents_field = field + ".parents";
    VERIFYD_ASSIGN_OR_RETURN(
        planned[b].new_tree,
        TreeMask::FromParents(item.parents, options_.max_tree_nodes, parents_field.c_str()));
    const auto [lo, hi] = std::minmax_element(sequence->fill.begin(), sequence->fill.end());
    if (*lo != *hi) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": sequence ", item.sequence,
                       " has layers at different fill levels (layer ", lo - sequence->fill.begin(),
                       " holds ", *lo, " tokens, layer ", hi - sequence->fill.begin(), " holds ",
                       *hi, "); append every layer to the same length before a tree"));
    }
    need += static_cast<int64_t>(item.parents.size());
  }
  const int64_t available = allocator_.free_slots() + freed_by_commits;
  if (need > available) {
    return absl::ResourceExhaustedError(absl::StrCat(
        names().items, ": the new trees need ", need, " free KV slots, only ", available, " of ",
        allocator_.capacity(), " are free (counting ", freed_by_commits, " freed by the commits)"));
  }

  // Validated: nothing below can fail for a reason the caller controls.
  for (size_t b = 0; b < items.size(); ++b) {
    if (items[b].commit)
      VERIFYD_RETURN_IF_ERROR(ApplyCommit(*planned[b].sequence, *items[b].commit));
  }
  for (size_t b = 0; b < items.size(); ++b) {
    Sequence& sequence = *planned[b].sequence;
    if (planned[b].new_tree) {
      const int64_t q = static_cast<int64_t>(items[b].parents.size());
      // The run right after the prefix keeps an accepted chain contiguous with it.
      VERIFYD_ASSIGN_OR_RETURN(std::vector<SlotRun> runs,
                               AllocateGrowth(sequence, q, names().items.c_str()));
      PendingTree tree;
      tree.parents = items[b].parents;
      tree.mask = *std::move(planned[b].new_tree);
      tree.slots = SlotsOf(runs);
      tree.layer_written.assign(options_.num_layers, false);
      pending_slots_ += tree.num_nodes();
      sequence.pending = std::move(tree);
    }
    Renew(sequence);
  }
  return absl::OkStatus();
}

absl::Status KvStore::WriteTreeLayer(SequenceId seq, int layer, const bf16_bits* tree_kv) {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer, "layer"));
  if (tree_kv == nullptr) return absl::InvalidArgumentError("tree_kv must not be null");
  VERIFYD_ASSIGN_OR_RETURN(Sequence * sequence, Find(seq, names().sequence));
  if (!sequence->pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " has no pending tree; PrepareVerify begins one"));
  }
  PendingTree& tree = *sequence->pending;
  VERIFYD_RETURN_IF_ERROR(storage_->WriteRows(layer, tree.slots, tree_kv));
  if (!tree.layer_written[layer]) {
    tree.layer_written[layer] = true;
    ++tree.layers_written;
  }
  Renew(*sequence);
  return absl::OkStatus();
}

absl::Status KvStore::MarkTreeLayerWritten(SequenceId seq, int layer) {
  return SetTreeLayerWritten(seq, layer, true);
}

absl::Status KvStore::MarkTreeLayerUnwritten(SequenceId seq, int layer) {
  return SetTreeLayerWritten(seq, layer, false);
}

absl::Status KvStore::SetTreeLayerWritten(SequenceId seq, int layer, bool written) {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer, "layer"));
  VERIFYD_ASSIGN_OR_RETURN(Sequence * sequence, Find(seq, names().sequence));
  if (!sequence->pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " has no pending tree; PrepareVerify begins one"));
  }
  PendingTree& tree = *sequence->pending;
  if (tree.layer_written[layer] != written) {
    tree.layer_written[layer] = written;
    tree.layers_written += written ? 1 : -1;
  }
  // Writing renews the lease as any call does; the undoing is the daemon's, not the client's.
  if (written) Renew(*sequence);
  return absl::OkStatus();
}

absl::StatusOr<VerifyView> KvStore::GetVerifyView(SequenceId seq) const {
  VERIFYD_ASSIGN_OR_RETURN(const Sequence* sequence, Find(seq, names().sequence));
  if (!sequence->pending) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, " has no pending tree; PrepareVerify begins one"));
  }
  VerifyView view;
  view.prefix_len = static_cast<int32_t>(sequence->slots.size());
  view.prefix_slots = sequence->slots;
  view.tree_slots = sequence->pending->slots;
  view.mask = &sequence->pending->mask;
  view.slot_generation = sequence->slot_generation;
  return view;
}

absl::Status KvStore::Commit(SequenceId seq, const CommitPath& path) {
  VERIFYD_ASSIGN_OR_RETURN(Sequence * sequence, Find(seq, names().sequence));
  VERIFYD_RETURN_IF_ERROR(ValidateCommit(*sequence, path, "commit"));
  VERIFYD_RETURN_IF_ERROR(ApplyCommit(*sequence, path));
  Renew(*sequence);
  return absl::OkStatus();
}

absl::Status KvStore::Release(SequenceId seq) {
  VERIFYD_ASSIGN_OR_RETURN(Sequence * sequence, Find(seq, names().sequence));
  // Only the slots no other list holds are freed (a shared prefix stays with its other holders).
  std::vector<int32_t> slots;
  slots.reserve(sequence->slots.size());
  for (int32_t slot : sequence->slots) {
    if (Drop(slot)) slots.push_back(slot);
  }
  if (sequence->pending) {
    slots.insert(slots.end(), sequence->pending->slots.begin(), sequence->pending->slots.end());
    pending_slots_ -= sequence->pending->num_nodes();
  }
  table_entries_ -= static_cast<int64_t>(sequence->slots.size());
  Detach(*sequence);
  sequences_.erase(seq);
  fragmentation_.Remove(seq);
  return allocator_.Free(slots);
}

std::vector<SequenceId> KvStore::ExpireLeases() {
  const absl::Time now = options_.now();
  std::vector<SequenceId> expired;
  for (const auto& [id, sequence] : sequences_) {
    if (sequence->deadline <= now) expired.push_back(id);
  }
  std::sort(expired.begin(), expired.end());
  for (SequenceId id : expired) {
    (void)Release(id);
    expired_.Add(id, now);
  }
  return expired;
}

absl::StatusOr<int64_t> KvStore::CommittedLength(SequenceId seq) const {
  VERIFYD_ASSIGN_OR_RETURN(const Sequence* sequence, Find(seq, names().sequence));
  return sequence->committed_length();
}

absl::StatusOr<std::vector<int64_t>> KvStore::LayerFill(SequenceId seq) const {
  VERIFYD_ASSIGN_OR_RETURN(const Sequence* sequence, Find(seq, names().sequence));
  return sequence->fill;
}

absl::StatusOr<std::vector<int32_t>> KvStore::CommittedSlots(SequenceId seq) const {
  VERIFYD_ASSIGN_OR_RETURN(const Sequence* sequence, Find(seq, names().sequence));
  return sequence->slots;
}

absl::Status KvStore::ReadCommitted(SequenceId seq, int layer, bf16_bits* out) const {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer, "layer"));
  VERIFYD_ASSIGN_OR_RETURN(const Sequence* sequence, Find(seq, names().sequence));
  return storage_->ReadRows(
      layer, absl::MakeConstSpan(sequence->slots.data(), sequence->fill[layer]), out);
}

absl::Status KvStore::ReadCommittedEncoded(SequenceId seq, int layer, uint8_t* out) const {
  VERIFYD_RETURN_IF_ERROR(CheckLayer(layer, "layer"));
  VERIFYD_ASSIGN_OR_RETURN(const Sequence* sequence, Find(seq, names().sequence));
  return storage_->ReadEncodedRows(
      layer, absl::MakeConstSpan(sequence->slots.data(), sequence->fill[layer]), out);
}

std::vector<SequenceId> KvStore::Sequences() const {
  std::vector<SequenceId> ids;
  ids.reserve(sequences_.size());
  for (const auto& [id, sequence] : sequences_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool KvStore::Contains(SequenceId seq) const { return sequences_.contains(seq); }

}  // namespace verifyd
