// The randomized model check of the KV store (issue 2): >= 100,000 random operations, valid and
// deliberately invalid, against a trivially correct model (sequence -> per-layer list of token
// rows, pending tree contents). The model predicts every status code; after EVERY operation every
// sequence read back through its slot table equals the model byte for byte, free + used =
// capacity, and a rejected call changed nothing. Forks (issue 18) share slots: the model names
// every allocated token with a cell id that a fork copies, and two positions must hold the same
// slot exactly when they hold the same cell (no copy, no slot freed while referenced, a pending
// slot held once); every slot's reference count is checked, and releasing everything at the end,
// in random order with compactions between, must free the whole pool. VERIFYD_TEST_SEED
// reproduces a run. It runs on a bf16 store and on an fp8 one (plans/0030-fp8-store.md): there rows
// come as bf16 (the store quantizes; the model quantizes the same way) or already in the 656-byte
// layout (sometimes with a NaN code: refused, nothing kept), and every row is compared as the
// pool's bytes through compaction and forks.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_test_util.h"
#include "verify/kv_dtype.h"
#include "verify/kv_fp8_layout.h"

namespace verifyd {
namespace {

using testing_kv::HashedBoundedRows;
using testing_kv::HashedFp8Rows;
using testing_kv::HashedRows;
using Code = absl::StatusCode;

constexpr int kLayers = 2;
constexpr int kCapacity = 1024;
constexpr int kMaxTreeNodes = 32;
constexpr int kSequenceIds = 12;  // ids 1..kSequenceIds; id 0 is never created
constexpr int kOperations = 100000;
constexpr int kPressurePhase = 5000;
const absl::Duration kLease = absl::Seconds(100);

// Bytes of one pool row in the running check (1152 bf16, 656 fp8): set by KvStoreModelCheck.
int g_row_bytes = kKvRowBytes;

using Bytes = std::vector<uint8_t>;

struct ModelTree {
  std::vector<int32_t> parents;
  std::vector<Bytes> rows;  // per layer: [Q][row bytes] as the pool holds them, empty until written
  int num_nodes() const { return static_cast<int>(parents.size()); }
  bool all_written() const {
    return std::all_of(rows.begin(), rows.end(), [](const auto& r) { return !r.empty(); });
  }
};

struct ModelSequence {
  std::vector<Bytes> layers = std::vector<Bytes>(kLayers);  // per layer: the pool's row bytes
  std::vector<uint64_t> cells;  // position -> token identity: equal cells must share one slot
  std::optional<ModelTree> tree;
  absl::Time deadline;
  int64_t fill(int l) const { return static_cast<int64_t>(layers[l].size()) / g_row_bytes; }
  int64_t length() const { return std::max(fill(0), fill(1)); }
  bool even() const { return fill(0) == fill(1); }
};

// Everything the store exposes about its bookkeeping; a rejected call must leave it identical.
struct Snapshot {
  std::map<SequenceId, std::vector<int32_t>> slots;  // committed then pending
  std::map<SequenceId, std::vector<int64_t>> fills;
  std::vector<SlotRun> free_runs;
  bool operator==(const Snapshot& o) const {
    if (slots != o.slots || fills != o.fills || free_runs.size() != o.free_runs.size()) {
      return false;
    }
    for (size_t k = 0; k < free_runs.size(); ++k) {
      if (free_runs[k].begin != o.free_runs[k].begin ||
          free_runs[k].length != o.free_runs[k].length) {
        return false;
      }
    }
    return true;
  }
};

class KvStoreModelCheck {
 public:
  KvStoreModelCheck(uint64_t seed, KvDtype dtype) : rng_(seed), dtype_(dtype) {
    g_row_bytes = KvRowBytes(dtype);
    KvStoreOptions options;
    options.num_layers = kLayers;
    options.max_tree_nodes = kMaxTreeNodes;
    options.lease = kLease;
    options.now = [this] { return now_; };
    auto storage = std::make_unique<HostKvStorage>(kLayers, kCapacity, dtype);
    storage_ = storage.get();
    store_ = std::make_unique<KvStore>(options, std::move(storage));
  }

  void Step() {
    const Snapshot before = TakeSnapshot();
    // One phase in four frees nothing (no Release, no lease lapse): the store fills, so the
    // RESOURCE_EXHAUSTED outcomes happen on every seed, not only on the seeds that wander there.
    const bool pressure = (steps_++ / kPressurePhase) % 4 == 3;
    int dice = Uniform(100);
    if (pressure && dice >= 70 && dice < 76) dice = Uniform(23);  // a Release becomes an Append
    if (pressure && dice >= 93 && dice < 96) dice = 23 + Uniform(18);  // leases become Verify
    std::optional<Code> result;  // set when the call was rejected (must change nothing)
    if (dice < 23) {
      result = Append();
    } else if (dice < 41) {
      result = PrepareVerify();
    } else if (dice < 58) {
      result = WriteTreeLayer();
    } else if (dice < 70) {
      result = Commit();
    } else if (dice < 76) {
      result = Release();
    } else if (dice < 83) {
      result = Fork();
    } else if (dice < 89) {
      result = Compact();
    } else if (dice < 93) {
      result = StaleCompaction();
    } else if (dice < 96) {
      Leases();
    } else {
      result = ReadOnlyCalls();
    }
    if (::testing::Test::HasFatalFailure()) return;
    if (result && *result != Code::kOk) {
      ASSERT_TRUE(TakeSnapshot() == before) << "a rejected call (" << *result << ") changed state";
    }
    CheckEverything();
  }

  int64_t used_slots_seen() const { return used_slots_seen_; }
  int64_t shared_slots_seen() const { return shared_slots_seen_; }
  std::map<std::string, int> codes_seen;

  // Releases every sequence in random order, compacting between some releases; afterwards every
  // slot must be free (none leaked by sharing).
  void ReleaseAll() {
    std::vector<SequenceId> ids = store_->Sequences();
    std::shuffle(ids.begin(), ids.end(), rng_);
    for (SequenceId id : ids) {
      ASSERT_TRUE(store_->Release(id).ok()) << "sequence " << id;
      model_.erase(id);
      if (Chance(50)) Compact();
      CheckEverything();
      if (::testing::Test::HasFatalFailure()) return;
    }
    const StoreStats stats = store_->Stats();
    EXPECT_EQ(stats.free_slots, kCapacity);
    EXPECT_EQ(stats.shared_slots, 0);
    EXPECT_EQ(stats.shared_references, 0);
    EXPECT_EQ(store_->allocator().largest_free_run(), kCapacity);
  }

 private:
  int Uniform(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  bool Chance(int percent) { return Uniform(100) < percent; }
  SequenceId AnyId() { return 1 + Uniform(kSequenceIds); }
  // Distinct committed tokens (cells) plus pending nodes.
  int64_t ModelUsed() const {
    std::set<uint64_t> cells;
    int64_t used = 0;
    for (const auto& [id, s] : model_) {
      cells.insert(s.cells.begin(), s.cells.end());
      used += s.tree ? s.tree->num_nodes() : 0;
    }
    return used + static_cast<int64_t>(cells.size());
  }
  int64_t ModelFree() const { return kCapacity - ModelUsed(); }
  void Renew(ModelSequence& s) { s.deadline = now_ + kLease; }
  void Seen(const char* op, const absl::Status& status) {
    ++codes_seen[std::string(op) + " " + absl::StatusCodeToString(status.code())];
  }
  // Returns an id with a pending tree, or any id.
  SequenceId IdWithTree() {
    std::vector<SequenceId> ids;
    for (const auto& [id, s] : model_) {
      if (s.tree) ids.push_back(id);
    }
    return ids.empty() ? AnyId() : ids[Uniform(static_cast<int>(ids.size()))];
  }

  std::vector<int32_t> RandomParents(int q) {
    std::vector<int32_t> parents(q);
    for (int i = 0; i < q; ++i) parents[i] = i == 0 ? -1 : Uniform(i + 1) - 1;
    return parents;
  }
  // Mostly valid trees; sometimes one broken in one of the ways TreeMask must reject.
  std::vector<int32_t> MaybeInvalidParents() {
    if (Chance(90)) return RandomParents(1 + Uniform(24));
    switch (Uniform(4)) {
      case 0:
        return {};
      case 1:
        return RandomParents(kMaxTreeNodes + 1);
      case 2: {
        std::vector<int32_t> p = RandomParents(2 + Uniform(10));
        const int i = Uniform(static_cast<int>(p.size()));
        p[i] = i + Uniform(3);
        return p;
      }
      default: {
        std::vector<int32_t> p = RandomParents(1 + Uniform(10));
        p[Uniform(static_cast<int>(p.size()))] = -2 - Uniform(5);
        return p;
      }
    }
  }
  static bool ParentsValid(const std::vector<int32_t>& p) {
    if (p.empty() || p.size() > kMaxTreeNodes) return false;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] < -1 || p[i] >= static_cast<int32_t>(i)) return false;
    }
    return true;
  }
  // A root, then random children; sometimes corrupted.
  std::vector<int32_t> RandomPath(const ModelTree* tree) {
    std::vector<int32_t> path;
    const int q = tree ? tree->num_nodes() : 1 + Uniform(8);
    if (tree && !Chance(15)) {
      std::vector<int32_t> roots;
      for (int i = 0; i < q; ++i) {
        if (tree->parents[i] == -1) roots.push_back(i);
      }
      path.push_back(roots[Uniform(static_cast<int>(roots.size()))]);
      while (Chance(75)) {
        std::vector<int32_t> children;
        for (int i = path.back() + 1; i < q; ++i) {
          if (tree->parents[i] == path.back()) children.push_back(i);
        }
        if (children.empty()) break;
        path.push_back(children[Uniform(static_cast<int>(children.size()))]);
      }
    }
    if (Chance(20)) {
      if (path.empty() || Chance(30)) {
        path.push_back(Uniform(q + 2));
      } else {
        path[Uniform(static_cast<int>(path.size()))] = Uniform(q + 2) - 1;
      }
    }
    if (Chance(3)) path.resize(q + 1, 0);
    return path;
  }
  // The status Commit must return for `path` on model sequence s.
  static Code ExpectedCommit(const ModelSequence& s, const std::vector<int32_t>& a) {
    if (!s.tree) return Code::kFailedPrecondition;
    const ModelTree& t = *s.tree;
    if (a.size() > static_cast<size_t>(t.num_nodes())) return Code::kInvalidArgument;
    for (size_t j = 0; j < a.size(); ++j) {
      if (a[j] < 0 || a[j] >= t.num_nodes()) return Code::kInvalidArgument;
      if (t.parents[a[j]] != (j == 0 ? -1 : a[j - 1])) return Code::kInvalidArgument;
    }
    if (!a.empty() && !t.all_written()) return Code::kFailedPrecondition;
    return Code::kOk;
  }
  void ApplyCommit(ModelSequence& s, const std::vector<int32_t>& a) {
    for (size_t j = 0; j < a.size(); ++j) s.cells.push_back(next_cell_++);
    for (int l = 0; l < kLayers; ++l) {
      for (int32_t node : a) {
        const auto row = s.tree->rows[l].begin() + static_cast<int64_t>(node) * g_row_bytes;
        s.layers[l].insert(s.layers[l].end(), row, row + g_row_bytes);
      }
    }
    s.tree.reset();
  }

  std::optional<Code> Append() {
    const SequenceId id = Chance(97) ? AnyId() : 0;
    auto it = model_.find(id);
    int layer_begin = 0;
    int layer_count = kLayers;
    int tokens = 1 + Uniform(8);
    if (Chance(3)) tokens = 50 + Uniform(400);  // pushes against capacity
    if (it != model_.end() && !it->second.even() && Chance(60)) {
      // Bring the short layer level (what a chunked multi-layer prefill does).
      layer_begin = it->second.fill(0) < it->second.fill(1) ? 0 : 1;
      layer_count = 1;
      tokens = static_cast<int>(std::abs(it->second.fill(0) - it->second.fill(1)));
    } else if (Chance(20)) {
      layer_begin = Uniform(kLayers);
      layer_count = 1;
    }
    bool null_kv = false;
    if (Chance(3)) {
      switch (Uniform(4)) {
        case 0:
          layer_begin = Chance(50) ? -1 : kLayers;
          break;
        case 1:
          layer_count = Chance(50) ? 0 : kLayers - layer_begin + 1;
          break;
        case 2:
          tokens = -Uniform(2);
          break;
        default:
          null_kv = true;
      }
    }
    Code expected = Code::kOk;
    const bool args_ok = layer_begin >= 0 && layer_begin < kLayers && layer_count >= 1 &&
                         layer_count <= kLayers - layer_begin && tokens >= 1 && !null_kv;
    // SPEC §2's expected position: none (older clients) half the time, else mostly the right one
    // (create for a new sequence, the range's fill for a live one), sometimes a wrong one.
    AppendExpectation expect;
    const bool exists = it != model_.end();
    const int kind = Uniform(10);
    if (kind >= 5) {
      const bool wrong = kind == 9;
      if (exists == wrong) {
        expect = AppendExpectation::Create();
      } else {
        const int64_t fill = exists && args_ok ? it->second.fill(layer_begin) : Uniform(5);
        expect = AppendExpectation::Fill(wrong && exists ? fill + 1 + Uniform(3) : fill);
      }
    }
    bool expect_holds = true;
    if (expect.kind == AppendExpectation::Kind::kCreate) {
      expect_holds = !exists;
    } else if (expect.kind == AppendExpectation::Kind::kFill) {
      expect_holds = exists;
      for (int l = layer_begin; args_ok && expect_holds && l < layer_begin + layer_count; ++l) {
        expect_holds = it->second.fill(l) == expect.fill;
      }
    }
    int64_t need = 0;
    if (!args_ok) {
      expected = Code::kInvalidArgument;
    } else if (!expect_holds) {
      expected = Code::kFailedPrecondition;
    } else if (it != model_.end() && it->second.tree) {
      expected = Code::kFailedPrecondition;
    } else {
      const int64_t length = it == model_.end() ? 0 : it->second.length();
      int64_t new_length = length;
      for (int l = layer_begin; l < layer_begin + layer_count; ++l) {
        new_length = std::max(new_length, (it == model_.end() ? 0 : it->second.fill(l)) + tokens);
      }
      need = new_length - length;
      if (need > ModelFree()) expected = Code::kResourceExhausted;
    }
    const uint64_t tag = next_tag_++;
    const int64_t rows = args_ok ? static_cast<int64_t>(layer_count) * tokens : 1;
    // What is sent (bf16, or the fp8 layout on an fp8 store) and what the pool then holds.
    const bool send_fp8 = dtype_ == KvDtype::kFp8 ? Chance(50) : Chance(1);
    Bytes sent, held;
    if (send_fp8) {
      sent = HashedFp8Rows(tag, rows);
      if (Chance(3))
        sent[Uniform(static_cast<int>(sent.size() / kFp8RowBytes)) * kFp8RowBytes +
             Uniform(kVDim)] = Chance(50) ? 0x7F : 0xFF;  // a NaN code: refused
      held = sent;
    } else {
      const std::vector<bf16_bits> kv =
          dtype_ == KvDtype::kFp8 ? HashedBoundedRows(tag, rows) : HashedRows(tag, rows);
      sent.resize(kv.size() * sizeof(bf16_bits));
      std::memcpy(sent.data(), kv.data(), sent.size());
      held = Encode(kv);
    }
    // The store checks the call's arguments, then fp8 rows, before anything else.
    if (args_ok && send_fp8 && (dtype_ != KvDtype::kFp8 || !testing_kv::Fp8RowsValid(sent))) {
      expected = Code::kInvalidArgument;
    }
    const absl::Status status =
        store_->Append(id, layer_begin, layer_count, tokens, null_kv ? nullptr : sent.data(),
                       expect, RowMemory::kHost, send_fp8 ? KvDtype::kFp8 : KvDtype::kBf16);
    Seen("Append", status);
    EXPECT_EQ(status.code(), expected) << status;
    if (status.code() != expected || !status.ok()) return status.code();
    ModelSequence& s = model_[id];
    for (int64_t p = s.length(); p < s.length() + need; ++p) s.cells.push_back(next_cell_++);
    for (int l = layer_begin; l < layer_begin + layer_count; ++l) {
      const auto src = held.begin() + static_cast<int64_t>(l - layer_begin) * tokens * g_row_bytes;
      s.layers[l].insert(s.layers[l].end(), src, src + static_cast<int64_t>(tokens) * g_row_bytes);
    }
    Renew(s);
    return std::nullopt;
  }

  std::optional<Code> PrepareVerify() {
    int layer = Uniform(kLayers);
    if (Chance(2)) layer = Chance(50) ? -1 : kLayers;
    std::vector<VerifyItem> items(Chance(2) ? 0 : 1 + Uniform(3));
    for (VerifyItem& item : items) {
      item.sequence = Chance(60) ? IdWithTree() : AnyId();
      auto it = model_.find(item.sequence);
      const ModelTree* tree = it != model_.end() && it->second.tree ? &*it->second.tree : nullptr;
      if (tree && Chance(50)) {
        item.commit = CommitPath{RandomPath(tree)};
        item.parents = MaybeInvalidParents();
      } else if (tree && Chance(90)) {
        item.parents = tree->parents;  // the next layer of the same step
      } else {
        item.parents = MaybeInvalidParents();
        if (Chance(5)) item.commit = CommitPath{RandomPath(tree)};
      }
    }
    // The expected outcome, in the documented order of checks.
    Code expected = Code::kOk;
    if (layer < 0 || layer >= kLayers || items.empty()) expected = Code::kInvalidArgument;
    int64_t need = 0;
    int64_t freed = 0;
    std::vector<SequenceId> seen;
    for (size_t b = 0; b < items.size() && expected == Code::kOk; ++b) {
      const VerifyItem& item = items[b];
      if (std::find(seen.begin(), seen.end(), item.sequence) != seen.end()) {
        expected = Code::kInvalidArgument;
        break;
      }
      seen.push_back(item.sequence);
      auto it = model_.find(item.sequence);
      if (it == model_.end()) {
        expected = Code::kNotFound;
        break;
      }
      const ModelSequence& s = it->second;
      bool pending_after = s.tree.has_value();
      if (item.commit) {
        expected = ExpectedCommit(s, item.commit->accepted_path);
        if (expected != Code::kOk) break;
        freed += s.tree->num_nodes() - static_cast<int64_t>(item.commit->accepted_path.size());
        pending_after = false;
      }
      if (pending_after) {
        if (item.parents != s.tree->parents) expected = Code::kFailedPrecondition;
      } else if (!ParentsValid(item.parents)) {
        expected = Code::kInvalidArgument;
      } else if (!s.even()) {
        expected = Code::kFailedPrecondition;
      } else {
        need += static_cast<int64_t>(item.parents.size());
      }
    }
    if (expected == Code::kOk && need > ModelFree() + freed) expected = Code::kResourceExhausted;

    const absl::Status status = store_->PrepareVerify(layer, items);
    Seen("PrepareVerify", status);
    EXPECT_EQ(status.code(), expected) << status;
    if (status.code() != expected || !status.ok()) return status.code();
    for (const VerifyItem& item : items) {
      ModelSequence& s = model_[item.sequence];
      if (item.commit) ApplyCommit(s, item.commit->accepted_path);
      if (!s.tree) {
        s.tree = ModelTree{item.parents, std::vector<Bytes>(kLayers)};
      }
      Renew(s);
    }
    return std::nullopt;
  }

  std::optional<Code> WriteTreeLayer() {
    const SequenceId id = Chance(90) ? IdWithTree() : AnyId();
    auto it = model_.find(id);
    int layer = Uniform(kLayers);
    if (it != model_.end() && it->second.tree && Chance(80)) {
      for (int l = 0; l < kLayers; ++l) {
        if (it->second.tree->rows[l].empty()) layer = l;
      }
    }
    bool null_rows = Chance(2);
    if (Chance(2)) layer = Chance(50) ? -1 : kLayers;
    Code expected = Code::kOk;
    if (layer < 0 || layer >= kLayers || null_rows) {
      expected = Code::kInvalidArgument;
    } else if (it == model_.end()) {
      expected = Code::kNotFound;
    } else if (!it->second.tree) {
      expected = Code::kFailedPrecondition;
    }
    const int q = expected == Code::kOk ? it->second.tree->num_nodes() : 1;
    const std::vector<bf16_bits> rows =
        dtype_ == KvDtype::kFp8 ? HashedBoundedRows(next_tag_++, q) : HashedRows(next_tag_++, q);
    const absl::Status status =
        store_->WriteTreeLayer(id, layer, null_rows ? nullptr : rows.data());
    Seen("WriteTreeLayer", status);
    EXPECT_EQ(status.code(), expected) << status;
    if (status.code() != expected || !status.ok()) return status.code();
    it->second.tree->rows[layer] = Encode(rows);
    Renew(it->second);
    return std::nullopt;
  }

  std::optional<Code> Commit() {
    const SequenceId id = Chance(90) ? IdWithTree() : AnyId();
    auto it = model_.find(id);
    const ModelTree* tree = it != model_.end() && it->second.tree ? &*it->second.tree : nullptr;
    const CommitPath path{RandomPath(tree)};
    const Code expected =
        it == model_.end() ? Code::kNotFound : ExpectedCommit(it->second, path.accepted_path);
    const absl::Status status = store_->Commit(id, path);
    Seen("Commit", status);
    EXPECT_EQ(status.code(), expected) << status;
    if (status.code() != expected || !status.ok()) return status.code();
    ApplyCommit(it->second, path.accepted_path);
    Renew(it->second);
    return std::nullopt;
  }

  std::optional<Code> Release() {
    const SequenceId id = Chance(95) ? AnyId() : 0;
    const Code expected = model_.contains(id) ? Code::kOk : Code::kNotFound;
    const absl::Status status = store_->Release(id);
    Seen("Release", status);
    EXPECT_EQ(status.code(), expected) << status;
    if (status.ok()) model_.erase(id);
    return status.ok() ? std::nullopt : std::optional<Code>(status.code());
  }

  std::optional<Code> Fork() {
    SequenceId source = Chance(95) ? AnyId() : 0;
    if (Chance(70) && !model_.empty()) {  // mostly a live source, often one without a tree
      auto it = std::next(model_.begin(), Uniform(static_cast<int>(model_.size())));
      source = it->first;
    }
    SequenceId fork = AnyId();
    for (int tries = 0; tries < 4 && model_.contains(fork) && Chance(85); ++tries) fork = AnyId();
    auto src = model_.find(source);
    const int64_t committed =
        src == model_.end() ? 0 : std::min(src->second.fill(0), src->second.fill(1));
    int64_t length = 1 + Uniform(static_cast<int>(std::max<int64_t>(committed, 1)));
    if (Chance(5)) length = Chance(50) ? 0 : -Uniform(3);
    if (Chance(5)) length = committed + 1 + Uniform(3);
    Code expected = Code::kOk;
    if (length < 1) {
      expected = Code::kInvalidArgument;
    } else if (src == model_.end()) {
      expected = Code::kNotFound;
    } else if (model_.contains(fork)) {
      expected = Code::kAlreadyExists;
    } else if (src->second.tree) {
      expected = Code::kFailedPrecondition;
    } else if (length > committed) {
      expected = Code::kOutOfRange;
    }
    const absl::Status status = store_->Fork(source, fork, length);
    Seen("Fork", status);
    EXPECT_EQ(status.code(), expected) << status;
    if (status.code() != expected || !status.ok()) return status.code();
    ModelSequence child;
    for (int l = 0; l < kLayers; ++l) {
      child.layers[l].assign(src->second.layers[l].begin(),
                             src->second.layers[l].begin() + length * g_row_bytes);
    }
    child.cells.assign(src->second.cells.begin(), src->second.cells.begin() + length);
    Renew(child);
    Renew(src->second);
    model_[fork] = std::move(child);
    return std::nullopt;
  }

  std::optional<Code> Compact() {
    const int64_t move_bytes = int64_t{kLayers} * g_row_bytes;
    const int64_t budget = Uniform(200) * move_bytes + Uniform(static_cast<int>(move_bytes)) - 1;
    const CompactionPlan plan = store_->PlanCompaction(budget);
    EXPECT_LE(plan.bytes(), std::max<int64_t>(budget, 0));
    const StoreStats before = store_->Stats();
    const absl::Status status = store_->ExecuteCompaction(plan);
    Seen("Compact", status);
    EXPECT_TRUE(status.ok()) << status;
    const StoreStats after = store_->Stats();
    EXPECT_EQ(after.free_slots, before.free_slots);
    EXPECT_EQ(after.fragmentation.tokens, before.fragmentation.tokens);
    return std::nullopt;  // the model does not change; the byte check proves nothing moved wrong
  }

  // A plan executed after another mutating call: valid plans still apply, stale ones are refused
  // without any change. Sometimes the plan is malformed on purpose.
  std::optional<Code> StaleCompaction() {
    CompactionPlan plan = store_->PlanCompaction(Uniform(100) * int64_t{kLayers} * g_row_bytes);
    bool malformed = false;
    if (!plan.runs.empty() && Chance(30)) {
      if (plan.runs.size() >= 2 && Chance(50)) {
        plan.runs[1].dst_begin = plan.runs[0].dst_begin;  // two runs share destinations
      } else {
        plan.runs.push_back(plan.runs[0]);  // the same positions moved twice
      }
      malformed = true;
    }
    if (Chance(40)) {
      Append();
    } else if (Chance(50)) {
      Release();
    } else {
      Fork();
    }
    if (::testing::Test::HasFailure()) return std::nullopt;
    const Snapshot before = TakeSnapshot();
    const absl::Status status = store_->ExecuteCompaction(plan);
    Seen("StaleCompact", status);
    if (malformed) {  // refused for the repeated dst, or earlier for a stale move
      EXPECT_TRUE(status.code() == Code::kInvalidArgument ||
                  status.code() == Code::kFailedPrecondition)
          << status;
    } else {
      EXPECT_TRUE(status.ok() || status.code() == Code::kFailedPrecondition) << status;
    }
    if (!status.ok()) {
      EXPECT_TRUE(TakeSnapshot() == before) << "a refused plan changed state";
    }
    return std::nullopt;
  }

  void Leases() {
    now_ += absl::Seconds(Uniform(40));
    std::vector<SequenceId> expected;
    for (const auto& [id, s] : model_) {
      if (s.deadline <= now_) expected.push_back(id);
    }
    EXPECT_EQ(store_->ExpireLeases(), expected);
    for (SequenceId id : expected) model_.erase(id);
  }

  std::optional<Code> ReadOnlyCalls() {
    const SequenceId id = Chance(90) ? AnyId() : 0;
    auto it = model_.find(id);
    const auto view = store_->GetVerifyView(id);
    const Code expected = it == model_.end() ? Code::kNotFound
                          : it->second.tree  ? Code::kOk
                                             : Code::kFailedPrecondition;
    Seen("GetVerifyView", view.status());
    EXPECT_EQ(view.status().code(), expected) << view.status();
    const auto length = store_->CommittedLength(id);
    EXPECT_EQ(length.ok(), it != model_.end());
    if (length.ok()) {
      EXPECT_EQ(*length, std::min(it->second.fill(0), it->second.fill(1)));
    }
    Bytes out(int64_t{kCapacity} * g_row_bytes);
    const int layer = Uniform(kLayers + 1);
    const absl::Status read = store_->ReadCommittedEncoded(id, layer, out.data());
    EXPECT_EQ(read.ok(), it != model_.end() && layer < kLayers) << read;
    // An empty layer's data() may be null, and memcmp with a null pointer is UB even for 0 bytes.
    if (read.ok() && !it->second.layers[layer].empty()) {
      EXPECT_EQ(0, std::memcmp(out.data(), it->second.layers[layer].data(),
                               it->second.layers[layer].size()));
    }
    return Code::kInvalidArgument;  // read-only: state must be unchanged either way
  }

  Snapshot TakeSnapshot() const {
    Snapshot snap;
    for (SequenceId id : store_->Sequences()) {
      std::vector<int32_t> slots = *store_->CommittedSlots(id);
      if (auto view = store_->GetVerifyView(id); view.ok()) slots = view->AllSlots();
      snap.slots[id] = std::move(slots);
      snap.fills[id] = *store_->LayerFill(id);
    }
    snap.free_runs = store_->allocator().FreeRuns();
    return snap;
  }

  void CheckEverything() {
    const std::vector<SequenceId> ids = store_->Sequences();
    ASSERT_EQ(ids.size(), model_.size());
    // Committed slots: held by every list with the same cell there, and by no other cell.
    std::vector<int64_t> holders(kCapacity, 0);
    std::vector<uint64_t> cell_of_slot(kCapacity, 0);
    std::map<uint64_t, int32_t> slot_of_cell;
    std::vector<uint8_t> owned(kCapacity, 0);  // committed (any number of holders) or pending
    int64_t owned_count = 0;
    int64_t pending = 0;
    auto hold = [&](int32_t slot, uint64_t cell) {
      ASSERT_TRUE(slot >= 0 && slot < kCapacity) << "slot " << slot;
      auto [it, fresh] = slot_of_cell.emplace(cell, slot);
      ASSERT_EQ(it->second, slot) << "token " << cell << " is in two slots (a fork copied)";
      if (holders[slot]++ == 0) {
        ASSERT_EQ(owned[slot]++, 0) << "slot " << slot << " is pending and committed";
        cell_of_slot[slot] = cell;
        ++owned_count;
      }
      ASSERT_EQ(cell_of_slot[slot], cell) << "slot " << slot << " holds two different tokens";
    };
    auto own = [&](int32_t slot) {
      ASSERT_TRUE(slot >= 0 && slot < kCapacity) << "slot " << slot;
      ASSERT_EQ(owned[slot]++, 0) << "slot " << slot << " is owned twice";
      ++owned_count;
    };
    for (SequenceId id : ids) {
      auto it = model_.find(id);
      ASSERT_NE(it, model_.end()) << "store has sequence " << id << " the model does not";
      const ModelSequence& s = it->second;
      const std::vector<int32_t> slots = *store_->CommittedSlots(id);
      ASSERT_EQ(static_cast<int64_t>(slots.size()), s.length()) << "sequence " << id;
      ASSERT_EQ(*store_->LayerFill(id), (std::vector<int64_t>{s.fill(0), s.fill(1)}));
      ASSERT_EQ(s.cells.size(), slots.size());
      for (size_t p = 0; p < slots.size(); ++p) {
        hold(slots[p], s.cells[p]);
        if (::testing::Test::HasFatalFailure()) return;
      }
      for (int l = 0; l < kLayers; ++l) {
        const uint8_t* layer = storage_->layer_bytes(l);
        for (int64_t p = 0; p < s.fill(l); ++p) {
          ASSERT_EQ(0, std::memcmp(layer + static_cast<int64_t>(slots[p]) * g_row_bytes,
                                   s.layers[l].data() + p * g_row_bytes, g_row_bytes))
              << "sequence " << id << " layer " << l << " position " << p << " slot " << slots[p];
        }
      }
      const auto view = store_->GetVerifyView(id);
      ASSERT_EQ(view.ok(), s.tree.has_value()) << view.status();
      if (!s.tree) continue;
      const int q = s.tree->num_nodes();
      pending += q;
      const std::vector<int32_t> view_slots = view->AllSlots();
      ASSERT_EQ(view->prefix_len, s.length());
      ASSERT_EQ(view_slots.size(), slots.size() + q);
      ASSERT_TRUE(std::equal(slots.begin(), slots.end(), view_slots.begin()));
      // A device mirror trusts the generation: the same generation must mean the same slot at
      // every committed position both lists hold.
      if (auto seen = generations_.find(id);
          seen != generations_.end() && seen->second.first == view->slot_generation) {
        const std::vector<int32_t>& before = seen->second.second;
        const size_t common = std::min(before.size(), slots.size());
        ASSERT_TRUE(std::equal(before.begin(), before.begin() + common, slots.begin()))
            << "sequence " << id << " kept generation " << view->slot_generation
            << " but a committed position changed slot";
      }
      generations_[id] = {view->slot_generation, slots};
      ASSERT_EQ(view->mask->num_nodes(), q);
      for (int i = 0; i < q; ++i) {
        ASSERT_TRUE(view->mask->Visible(i, i));
        if (s.tree->parents[i] >= 0) {
          ASSERT_TRUE(view->mask->Visible(i, s.tree->parents[i]));
        }
        own(view_slots[slots.size() + i]);
        if (::testing::Test::HasFatalFailure()) return;
      }
      for (int l = 0; l < kLayers; ++l) {
        if (s.tree->rows[l].empty()) continue;
        const uint8_t* layer = storage_->layer_bytes(l);
        for (int i = 0; i < q; ++i) {
          ASSERT_EQ(
              0, std::memcmp(
                     layer + static_cast<int64_t>(view_slots[slots.size() + i]) * g_row_bytes,
                     s.tree->rows[l].data() + static_cast<int64_t>(i) * g_row_bytes, g_row_bytes))
              << "sequence " << id << " layer " << l << " tree node " << i;
        }
      }
    }
    int64_t free_count = 0;
    for (const SlotRun& run : store_->allocator().FreeRuns()) {
      for (int32_t slot = run.begin; slot < run.end(); ++slot) {
        ASSERT_EQ(owned[slot], 0) << "slot " << slot << " is both free and owned";
      }
      free_count += run.length;
    }
    int64_t shared_slots = 0;
    int64_t shared_references = 0;
    for (int32_t slot = 0; slot < kCapacity; ++slot) {
      ASSERT_EQ(store_->Holders(slot), holders[slot]) << "slot " << slot << "'s reference count";
      if (holders[slot] >= 2) {
        ++shared_slots;
        shared_references += holders[slot];
      }
    }
    const StoreStats stats = store_->Stats();
    ASSERT_EQ(stats.shared_slots, shared_slots);
    ASSERT_EQ(stats.shared_references, shared_references);
    shared_slots_seen_ += shared_slots;
    // The store keeps its fragmentation figures incrementally; a walk of every list recomputes
    // them.
    ASSERT_EQ(stats.fragmentation, testing_kv::WalkFragmentation(*store_));
    ASSERT_EQ(free_count, stats.free_slots);
    ASSERT_EQ(owned_count, stats.used_slots);
    ASSERT_EQ(stats.free_slots + stats.used_slots, kCapacity);
    ASSERT_EQ(stats.pending_slots, pending);
    ASSERT_EQ(owned_count, ModelUsed());
    used_slots_seen_ += owned_count;
  }

  // bf16 rows as the pool holds them: their bytes, or quantized (verify/kv_fp8_layout.h).
  Bytes Encode(const std::vector<bf16_bits>& rows) const {
    const int64_t count = static_cast<int64_t>(rows.size()) / kKvDim;
    Bytes out(count * g_row_bytes);
    for (int64_t r = 0; r < count; ++r) {
      if (dtype_ == KvDtype::kFp8) {
        QuantizeFp8Row(rows.data() + r * kKvDim, out.data() + r * kFp8RowBytes);
      } else {
        std::memcpy(out.data() + r * kKvRowBytes, rows.data() + r * kKvDim, kKvRowBytes);
      }
    }
    return out;
  }

  std::mt19937_64 rng_;
  KvDtype dtype_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  HostKvStorage* storage_ = nullptr;  // owned by store_
  std::unique_ptr<KvStore> store_;
  std::map<SequenceId, ModelSequence> model_;
  // Last generation and committed slot list seen per sequence (CheckEverything).
  std::map<SequenceId, std::pair<uint64_t, std::vector<int32_t>>> generations_;
  uint64_t next_tag_ = 1;
  uint64_t next_cell_ = 1;
  int64_t used_slots_seen_ = 0;
  int64_t shared_slots_seen_ = 0;
  int64_t steps_ = 0;
};

class KvStoreModelTest : public ::testing::TestWithParam<KvDtype> {};

TEST_P(KvStoreModelTest, HundredThousandRandomOperationsMatchTheModel) {
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(::testing::Message() << "reproduce with VERIFYD_TEST_SEED=" << seed);
  KvStoreModelCheck check(seed, GetParam());
  for (int step = 0; step < kOperations; ++step) {
    check.Step();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "operation " << step;
  }
  // The run must have exercised every outcome, or it proves less than it claims.
  for (const char* outcome : {"Append OK",
                              "Append INVALID_ARGUMENT",
                              "Append FAILED_PRECONDITION",
                              "Append RESOURCE_EXHAUSTED",
                              "PrepareVerify OK",
                              "PrepareVerify INVALID_ARGUMENT",
                              "PrepareVerify NOT_FOUND",
                              "PrepareVerify FAILED_PRECONDITION",
                              "PrepareVerify RESOURCE_EXHAUSTED",
                              "WriteTreeLayer OK",
                              "WriteTreeLayer NOT_FOUND",
                              "WriteTreeLayer FAILED_PRECONDITION",
                              "WriteTreeLayer INVALID_ARGUMENT",
                              "Commit OK",
                              "Commit INVALID_ARGUMENT",
                              "Commit FAILED_PRECONDITION",
                              "Commit NOT_FOUND",
                              "Release OK",
                              "Release NOT_FOUND",
                              "Compact OK",
                              "StaleCompact OK",
                              "StaleCompact FAILED_PRECONDITION",
                              "StaleCompact INVALID_ARGUMENT",
                              "GetVerifyView OK",
                              "Fork OK",
                              "Fork INVALID_ARGUMENT",
                              "Fork NOT_FOUND",
                              "Fork ALREADY_EXISTS",
                              "Fork FAILED_PRECONDITION",
                              "Fork OUT_OF_RANGE"}) {
    EXPECT_GT(check.codes_seen[outcome], 0) << outcome << " never happened";
  }
  std::cout << "mean used slots " << check.used_slots_seen() / kOperations << " of " << kCapacity
            << ", mean shared slots " << check.shared_slots_seen() / kOperations << "\n";
  EXPECT_GT(check.shared_slots_seen(), 0) << "no fork ever shared a slot";
  check.ReleaseAll();
  for (const auto& [outcome, count] : check.codes_seen)
    std::cout << outcome << ": " << count << "\n";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KvStoreModelTest, ::testing::Values(KvDtype::kBf16, KvDtype::kFp8),
                         [](const auto& info) { return std::string(KvDtypeName(info.param)); });

}  // namespace
}  // namespace verifyd
