// KvStore: sequences, their slot tables, pending trees and leases over one KvStorage (SPEC §2).
//
// Not thread-safe: the service's executor (one per device) owns it and serializes every call.
// Every mutating call validates all of its input first and changes nothing when it fails.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvstore/expired_sequences.h"
#include "kvstore/fragmentation_tracker.h"
#include "kvstore/kv_storage.h"
#include "kvstore/slot_allocator.h"
#include "verify/bf16.h"
#include "verify/kv_dtype.h"
#include "verify/tree_mask.h"

namespace verifyd {

using SequenceId = uint64_t;

// What the store's error messages call its parameters. The defaults are the store's own names; a
// caller serving a request passes the request's, so that a message names the field the client sent
// ("sequences[2].sequence_id = 7 is not a live sequence") without the caller rewriting it.
struct KvFieldNames {
  std::string sequence = "sequence";       // the id of Append, Commit, Release and the queries
  std::string num_tokens = "num_tokens";   // Append's token count T
  std::string items = "items";             // PrepareVerify's batch: "items[2]", "items: ..."
  std::string item_sequence = "sequence";  // an item's id, after "items[b]."
  std::string item_commit = "commit";      // an item's commit, after "items[b]."
  std::string fork_source = "source";      // Fork's source sequence
  std::string fork_sequence = "fork";      // Fork's new sequence
  std::string fork_length = "length";      // Fork's shared prefix length
  // The bounds, as the daemon's flags name them.
  std::string max_sequences = "max_sequences";
  std::string max_slot_table_entries = "max_slot_table_entries";
};

struct KvStoreOptions {
  int num_layers = 1;
  int max_tree_nodes = 1024;
  absl::Duration lease = absl::Seconds(60);
  // Injectable clock for lease tests.
  std::function<absl::Time()> now = [] { return absl::Now(); };
  KvFieldNames field_names;
  // Host memory a client can make the store hold without holding KV slots (issue 33 N2): live
  // sequences, and the entries of their slot tables (each committed position of each sequence,
  // 4 bytes; a fork copies its prefix's). Past either a new sequence or a Fork is
  // RESOURCE_EXHAUSTED. Without forks the tables hold at most the pool's slots. 0: no bound.
  int64_t max_sequences = 0;
  int64_t max_slot_table_entries = 0;
};

// A commit of the pending tree: accepted_path[0] a root, each next a child of the previous.
// An empty path rejects the whole tree.
struct CommitPath {
  std::vector<int32_t> accepted_path;
};

// Where an Append expects to write (SPEC §2), so that a chunk of a prefill never silently
// re-creates a sequence that was released, expired or lost in a restart.
struct AppendExpectation {
  enum class Kind {
    kAny,     // no check (clients that predate the rule)
    kCreate,  // the sequence must not exist
    kFill,    // the sequence must exist and every layer of the range must hold `fill` tokens
  };
  Kind kind = Kind::kAny;
  int64_t fill = 0;

  static AppendExpectation Any() { return {}; }
  static AppendExpectation Create() { return {Kind::kCreate, 0}; }
  static AppendExpectation Fill(int64_t fill) { return {Kind::kFill, fill}; }
};

// One sequence's part of a Verify for one layer.
struct VerifyItem {
  SequenceId sequence = 0;
  std::vector<int32_t> parents;      // [Q]
  std::optional<CommitPath> commit;  // applied to the pending tree before this verify
};

// What the compute needs for one sequence after PrepareVerify: read-only, valid until the next
// mutating call on the store.
struct VerifyView {
  int32_t prefix_len = 0;                  // committed length n
  absl::Span<const int32_t> prefix_slots;  // [n]: the slot of each committed position
  absl::Span<const int32_t> tree_slots;    // [Q]: the slot of each tree node
  const TreeMask* mask = nullptr;          // the pending tree's mask
  // Names the sequence's slot list up to appends: two views with the same generation agree on
  // every position both hold, so a device mirror of the list only needs the new tail. A new
  // sequence, and a compaction that moves any of its positions, take a fresh value (store-wide).
  uint64_t slot_generation = 0;

  // prefix_slots then tree_slots, as one list (a copy).
  std::vector<int32_t> AllSlots() const {
    std::vector<int32_t> all(prefix_slots.begin(), prefix_slots.end());
    all.insert(all.end(), tree_slots.begin(), tree_slots.end());
    return all;
  }
};

// FragmentationStats: kvstore/fragmentation_tracker.h.

struct StoreStats {
  // The pool: its rows' dtype, bytes per token and layer (1152 bf16, 656 fp8), and its bytes
  // (capacity_slots x layers x row_bytes).
  KvDtype kv_dtype = KvDtype::kBf16;
  int64_t row_bytes = 0;
  int64_t pool_bytes = 0;
  int64_t capacity_slots = 0;
  int64_t used_slots = 0;  // committed + pending
  int64_t free_slots = 0;
  int64_t pending_slots = 0;
  int64_t largest_free_run = 0;
  // fragmentation counts every committed slot once, in the sequence that accounts it (a shared
  // slot: its oldest surviving holder's line, plans/0019-shared-prefixes.md).
  FragmentationStats fragmentation;
  // Sharing (Fork): committed slots held by two or more sequences, and the references to them
  // (the sum of their holder counts). Without sharing the committed tokens would take
  // fragmentation.tokens + shared_references - shared_slots slots.
  int64_t shared_slots = 0;
  int64_t shared_references = 0;
  // Live sequences and their slot tables' entries (committed positions over every sequence):
  // what KvStoreOptions::max_sequences and max_slot_table_entries bound.
  int64_t sequences = 0;
  int64_t slot_table_entries = 0;
};

// One sequence as ListSequences reports it (the "release what leaked" runbook): read-only.
struct SequenceSummary {
  SequenceId id = 0;
  int64_t committed_length = 0;  // the minimum fill over layers
  int64_t pending_nodes = 0;     // nodes of the pending tree; 0 when none
  // Since the last successful call that renewed the lease, and until the lease passes (<= 0:
  // the next sweep releases it), on the store's clock.
  absl::Duration idle;
  absl::Duration lease_left;
  // Committed slots of this sequence that another sequence holds too (a fork's shared prefix).
  int64_t shared_slots = 0;
};

// A page of ListSequences: ids ascending.
struct SequencePage {
  std::vector<SequenceSummary> sequences;
  bool truncated = false;  // live sequences with larger ids were left out
  int64_t total = 0;       // live sequences in the store
};

// Positions [position, position + length) of `sequence` move from the consecutive slots
// [src_begin, src_begin + length) to [dst_begin, dst_begin + length). The owner is named so that
// executing a stale plan is detected instead of moving somebody else's rows.
struct CompactionRun {
  SequenceId sequence = 0;
  int32_t position = 0;
  int32_t src_begin = 0;
  int32_t dst_begin = 0;
  int32_t length = 0;
  bool operator==(const CompactionRun&) const = default;
};

// A compaction step: maximal runs (a run ends where its source or destination stops being
// consecutive), each sequence's runs in position order. Executing it copies rows for every layer,
// rewrites slot tables and frees the sources; its cost is per run, apart from the slot tables.
struct CompactionPlan {
  std::vector<CompactionRun> runs;
  int64_t bytes_per_slot = 0;  // layers * the row's bytes (1152 bf16, 656 fp8), set by the planner
  // Slots (tokens) moved: the sum of the run lengths.
  int64_t slots() const {
    int64_t n = 0;
    for (const CompactionRun& run : runs) n += run.length;
    return n;
  }
  // Bytes moved.
  int64_t bytes() const { return slots() * bytes_per_slot; }
};

class KvStore {
 public:
  // options.num_layers is taken from the storage; capacity is the storage's; max_tree_nodes is
  // clamped to [1, kMaxTreeNodes].
  KvStore(KvStoreOptions options, std::unique_ptr<KvStorage> storage);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Appends num_tokens (T) committed tokens to layers [layer_begin, layer_begin+layer_count) at
  // each layer's fill level; creates the sequence on first use. kv: host
  // [layer_count][num_tokens][576]. New slots are allocated only past the slot list's end,
  // extending the last run in place when possible, else one run, else the lowest free slots.
  // INVALID_ARGUMENT (layer range, T >= 1, kv), FAILED_PRECONDITION while a tree is pending or
  // when `expect` does not hold (naming the expected and the actual fill), RESOURCE_EXHAUSTED;
  // every failure keeps nothing (not even a new sequence). kv in device memory (`memory`
  // kDevice): the storage checks its values (INVALID_ARGUMENT "kv[layer] row r element c = ...")
  // and reads it there (KvStorage::WriteDeviceRows). kv in memory a client may rewrite (kShared):
  // each layer is copied and the copy checked and written (INVALID_ARGUMENT "kv[l, t, c] = ...",
  // the gRPC validation's message).
  // kv_dtype says what kv holds: bf16 rows [layer_count][num_tokens][576] (an fp8 store quantizes
  // them), or rows already in the fp8 layout [layer_count][num_tokens][656 bytes]
  // (verify/kv_fp8_layout.h), taken by an fp8 store only and checked here in any memory
  // (verify/kv_fp8_check.h: INVALID_ARGUMENT "kv[l, t] ...", nothing kept). A bf16 store refuses
  // fp8 rows (INVALID_ARGUMENT): their values are not bf16 values (plans/0030-fp8-store.md).
  absl::Status Append(SequenceId seq, int layer_begin, int layer_count, int num_tokens,
                      const void* kv, AppendExpectation expect = AppendExpectation::Any(),
                      RowMemory memory = RowMemory::kHost, KvDtype kv_dtype = KvDtype::kBf16);

  // For a batch of sequences on one layer, atomically: applies each item's commit, begins a pending
  // tree where none is pending (allocating Q slots, preferably right after the prefix), or checks
  // that parents equal the pending tree's. Checks, in order: layer, non-empty batch; per item:
  // duplicate id (INVALID_ARGUMENT), unknown id (NOT_FOUND), the commit (as Commit), then a new
  // tree's parents (INVALID_ARGUMENT) and equal layer fills (FAILED_PRECONDITION), or a pending
  // tree's parents (FAILED_PRECONDITION); last, capacity for the batch (RESOURCE_EXHAUSTED).
  absl::Status PrepareVerify(int layer, absl::Span<const VerifyItem> items);
  // Writes the tree's own KV for `layer` into the pending slots (tree_kv: host [Q][576]).
  absl::Status WriteTreeLayer(SequenceId seq, int layer, const bf16_bits* tree_kv);
  // The same bookkeeping as WriteTreeLayer when the backend itself writes the rows (the data
  // plane: tree KV in the scheduler's memory, written inside the call's stream order).
  absl::Status MarkTreeLayerWritten(SequenceId seq, int layer);
  // Its undoing: the layer's rows are being rewritten by a call whose inputs are not checked yet
  // (the data plane's device check answers later), so a Commit must not take them meanwhile.
  absl::Status MarkTreeLayerUnwritten(SequenceId seq, int layer);
  absl::StatusOr<VerifyView> GetVerifyView(SequenceId seq) const;

  // Commits the pending tree (see CommitPath). FAILED_PRECONDITION when no tree is pending or a
  // layer of it was never written (unless the path is empty).
  absl::Status Commit(SequenceId seq, const CommitPath& path);
  // Frees the slots no other sequence holds (a fork's shared prefix stays while any holder lives).
  absl::Status Release(SequenceId seq);
  // A new sequence `fork` whose positions [0, length) are the first `length` committed positions
  // of `source`, sharing their slots (no copy); afterwards both grow on their own. O(length).
  // Checks, in order: length >= 1 (INVALID_ARGUMENT), source live (NOT_FOUND), fork not live
  // (ALREADY_EXISTS), no pending tree on source (FAILED_PRECONDITION), length <= source's
  // committed length (OUT_OF_RANGE), max_sequences and max_slot_table_entries
  // (RESOURCE_EXHAUSTED). Renews both leases. Nothing changes on an error.
  absl::Status Fork(SequenceId source, SequenceId fork, int64_t length);
  // Releases every sequence whose deadline (now + lease, renewed by every successful call that
  // names it; not by read-only calls or compaction) is <= now; returns them in id order.
  std::vector<SequenceId> ExpireLeases();

  // Committed length and per-layer fill levels.
  absl::StatusOr<int64_t> CommittedLength(SequenceId seq) const;
  absl::StatusOr<std::vector<int64_t>> LayerFill(SequenceId seq) const;
  // The slot list in position order (a copy): max fill entries, so every position some layer holds.
  absl::StatusOr<std::vector<int32_t>> CommittedSlots(SequenceId seq) const;
  // Reads the committed KV of one layer back: out host [LayerFill(seq)[layer]][576].
  // A bf16 store only (KvStorage::ReadRows).
  absl::Status ReadCommitted(SequenceId seq, int layer, bf16_bits* out) const;
  // The rows as the store holds them: out host [LayerFill(seq)[layer]][storage().row_bytes()].
  absl::Status ReadCommittedEncoded(SequenceId seq, int layer, uint8_t* out) const;
  std::vector<SequenceId> Sequences() const;
  // The live sequences with id > `after` (every one when unset), ascending, at most `limit` (>= 0)
  // of them. Renews nothing. O(sequences log limit + the listed sequences' committed lengths).
  SequencePage ListSequences(std::optional<SequenceId> after, int64_t limit) const;
  bool Contains(SequenceId seq) const;
  // Sharing, for tests and diagnostics: how many committed slot lists hold `slot` (0 when free or
  // pending), and the first position `seq` accounts (plans/0019; 0 unless it shares a prefix with
  // an older holder).
  int64_t Holders(int32_t slot) const;
  absl::StatusOr<int64_t> AccountedBegin(SequenceId seq) const;

  // O(1): the fragmentation figures are kept up to date by every call that changes a slot list.
  StoreStats Stats() const;

  // Plans moves of at most budget_bytes that make sequences contiguous in position order
  // (strategy in plans/0001-core.md, run form in plans/0011-run-compaction.md). With sharing each
  // sequence's accounted positions are made contiguous: its own suffix, and the shared runs it is
  // the oldest holder of; a run is planned once, in its accounting sequence's name, and executing
  // it rewrites every list holding it (plans/0019-shared-prefixes.md). Cost
  // O(sequences + fragmented log fragmented + positions past their first runs that it walks) +
  // O(runs log runs).
  CompactionPlan PlanCompaction(int64_t budget_bytes) const;
  // Copies, rewrites slot tables, frees sources. A plan is valid only until the next mutating call;
  // a stale or malformed plan is rejected (FAILED_PRECONDITION / INVALID_ARGUMENT naming runs[k])
  // with no change. Checks cost O(runs log runs) plus one compare per moved slot.
  absl::Status ExecuteCompaction(const CompactionPlan& plan);

  const KvStoreOptions& options() const { return options_; }
  const SlotAllocator& allocator() const { return allocator_; }
  KvStorage& storage() { return *storage_; }
  const KvStorage& storage() const { return *storage_; }

 private:
  absl::Status SetTreeLayerWritten(SequenceId seq, int layer, bool written);
  // Defined in kvstore/sequence.h.
  struct PendingTree;
  struct Sequence;

  absl::StatusOr<Sequence*> Find(SequenceId seq, absl::string_view field);
  absl::StatusOr<const Sequence*> Find(SequenceId seq, absl::string_view field) const;
  // Find's NOT_FOUND: says when the lease dropped the sequence, where it did.
  absl::Status NotLive(SequenceId seq, absl::string_view field) const;
  absl::Status ValidateCommit(const Sequence& sequence, const CommitPath& path,
                              const std::string& field) const;
  // Slot-table rewrite of a validated commit; frees the rejected nodes' slots.
  absl::Status ApplyCommit(Sequence& sequence, const CommitPath& path);
  absl::Status CheckLayer(int layer, const char* field) const;
  absl::Status CheckExpectation(SequenceId seq, const Sequence* existing, int layer_begin,
                                int layer_count, AppendExpectation expect) const;
  void Renew(Sequence& sequence) const;
  // RESOURCE_EXHAUSTED when a new sequence `seq` (named `field`) or `entries` more slot-table
  // entries would pass the options' bounds.
  absl::Status CheckHostBounds(SequenceId seq, const std::string& field, bool new_sequence,
                               int64_t entries) const;
  // Growth of a slot list by n slots (Append, a new tree): right after its last slot when free;
  // for a fork that has not grown yet, the first free run after its shared prefix; else the
  // allocator's lowest-first choice.
  absl::StatusOr<std::vector<SlotRun>> AllocateGrowth(const Sequence& sequence, int64_t n,
                                                      const char* field);
  // Reference counts of committed slots (holders_), keeping the shared figures.
  void Hold(int32_t slot);
  // True when no list holds the slot any more.
  bool Drop(int32_t slot);
  // Unlinks a released sequence from the sharing tree: its parent forgets it, and its children
  // pass to the child with the longest shared prefix (the heir), which takes over the positions
  // the released sequence accounted and still shares.
  void Detach(Sequence& sequence);
  // Rebuilds a sequence's fragmentation entry after its accounted range changed.
  void Retrack(const Sequence& sequence);
  // Compaction moved positions [position, position + length) of `owner` to slots dst...: the
  // same rewrite for every descendant holding them (limit: the shared prefix along the path).
  // Iterative: O(holders) time and heap, whatever the depth of the sharing tree.
  void RewriteDescendants(Sequence& owner, int64_t position, int32_t dst, int64_t length,
                          int64_t limit);
  const KvFieldNames& names() const { return options_.field_names; }
  KvStoreOptions options_;
  std::unique_ptr<KvStorage> storage_;
  SlotAllocator allocator_;
  absl::flat_hash_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  // Updated by every change of a slot list (Append, commits, Release, compaction).
  FragmentationTracker fragmentation_;
  int64_t pending_slots_ = 0;  // slots of pending trees, summed over sequences
  // Per slot: how many committed slot lists hold it (pending slots: 0, they are never shared).
  std::vector<uint32_t> holders_;
  int64_t shared_slots_ = 0;       // slots with holders_ >= 2
  int64_t shared_references_ = 0;  // sum of holders_ over those
  int64_t table_entries_ = 0;      // sum of Sequence::slots.size() over sequences
  uint64_t next_slot_generation_ = 1;
  // What ExpireLeases dropped, for the NOT_FOUND of a later call naming one.
  ExpiredSequences expired_;
  std::vector<bf16_bits> shared_rows_;  // Append's private copy of one layer of kShared rows
  std::vector<uint8_t> shared_bytes_;   // the same for rows in the fp8 layout
};

}  // namespace verifyd
