// Fuzz target: the store's operations. The bytes are a program of Append (with any expected
// position), PrepareVerify (with riding commits, valid or not), WriteTreeLayer, Commit, Release,
// compaction (fresh and stale plans) and lease expiry on a small store. After every operation:
// used + free = capacity, the incremental fragmentation figures equal a walk of the slot lists, no
// slot is owned twice, and an operation that failed changed nothing. Inputs of odd length run on an
// fp8 store (plans/0030-fp8-store.md), whose Appends take bf16 rows or rows in the fp8 layout, some
// with a NaN code (refused with no change).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "kvstore/kv_store.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

constexpr int kLayers = 2;
constexpr int kCapacity = 64;
constexpr int kMaxNodes = 8;
constexpr int kIds = 5;  // ids 0..4

void Require(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "kv_store_fuzz: %s\n", what);
  std::abort();
}

struct Snapshot {
  std::vector<SequenceId> ids;
  std::map<SequenceId, std::vector<int64_t>> fills;
  std::map<SequenceId, std::vector<int32_t>> slots;
  std::map<SequenceId, std::vector<int32_t>> tree_slots;
  int64_t used = 0, pending = 0;
  bool operator==(const Snapshot&) const = default;
};

Snapshot Take(const KvStore& store) {
  Snapshot s;
  s.ids = store.Sequences();
  for (SequenceId id : s.ids) {
    s.fills[id] = *store.LayerFill(id);
    s.slots[id] = *store.CommittedSlots(id);
    if (auto view = store.GetVerifyView(id); view.ok()) {
      s.tree_slots[id].assign(view->tree_slots.begin(), view->tree_slots.end());
    }
  }
  s.used = store.Stats().used_slots;
  s.pending = store.Stats().pending_slots;
  return s;
}

void CheckInvariants(const KvStore& store, const Snapshot& s) {
  const StoreStats stats = store.Stats();
  Require(stats.used_slots + stats.free_slots == stats.capacity_slots, "used + free = capacity");
  const FragmentationStats walked = testing_kv::WalkFragmentation(store);
  Require(walked.sequences == stats.fragmentation.sequences &&
              walked.tokens == stats.fragmentation.tokens &&
              walked.runs == stats.fragmentation.runs &&
              walked.tokens_outside_first_run == stats.fragmentation.tokens_outside_first_run,
          "incremental fragmentation = walk");
  std::set<int32_t> owned;
  int64_t count = 0;
  for (const auto& lists : {s.slots, s.tree_slots}) {
    for (const auto& [id, slots] : lists) {
      for (int32_t slot : slots) {
        Require(slot >= 0 && slot < kCapacity, "slot in range");
        owned.insert(slot);
        ++count;
      }
    }
  }
  Require(static_cast<int64_t>(owned.size()) == count, "no slot owned twice");
  Require(count == stats.used_slots, "owned slots = used");
}

std::vector<int32_t> Parents(fuzz::FuzzInput& in) {
  std::vector<int32_t> parents(in.Below(kMaxNodes + 2));
  for (size_t i = 0; i < parents.size(); ++i) {
    const uint8_t b = in.Take<uint8_t>();
    // Mostly valid (-1 or an earlier node), sometimes anything.
    parents[i] = b >= 240 ? static_cast<int32_t>(b) - 245
                          : (i == 0 || b % 3 == 0 ? -1 : static_cast<int32_t>(b % i));
  }
  return parents;
}

// Rows for Append and WriteTreeLayer. The target checks slots, fills and figures, never the bytes,
// so one buffer serves every input: hashing fresh rows for each call was ~70% of the target's time
// under ASan+UBSan (the coverage hooks on every hash step), ~500 inputs/s. An operation reads at
// most kLayers x 20 rows (an Append) or a tree's rows (WriteTreeLayer); `offset` (< kRowSpread)
// still gives consecutive calls different bytes.
// An fp8 store quantizes what it takes, so its bf16 rows keep within SPEC §1's bound; its Appends
// also take rows already in the fp8 layout.
constexpr int64_t kMaxRows = kLayers * 40;
constexpr int64_t kRowSpread = 16;
const bf16_bits* Rows(uint64_t offset, KvDtype dtype) {
  static const std::vector<bf16_bits> rows = testing_kv::HashedRows(1, kMaxRows + kRowSpread);
  static const std::vector<bf16_bits> bounded =
      testing_kv::HashedBoundedRows(1, kMaxRows + kRowSpread);
  return (dtype == KvDtype::kFp8 ? bounded : rows).data() + (offset % kRowSpread) * kKvDim;
}
const uint8_t* Fp8Rows(uint64_t offset) {
  static const std::vector<uint8_t> rows = testing_kv::HashedFp8Rows(1, kMaxRows + kRowSpread);
  return rows.data() + (offset % kRowSpread) * kFp8RowBytes;
}

std::vector<int32_t> Path(fuzz::FuzzInput& in) {
  std::vector<int32_t> path(in.Below(4));
  for (int32_t& node : path) node = static_cast<int32_t>(in.Below(kMaxNodes + 1));
  return path;
}

}  // namespace
}  // namespace verifyd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace verifyd;
  fuzz::FuzzInput in(data, size);
  absl::Time now = absl::UnixEpoch();
  KvStoreOptions options;
  options.num_layers = kLayers;
  options.max_tree_nodes = kMaxNodes;
  options.lease = absl::Seconds(10);
  options.now = [&now] { return now; };
  const KvDtype dtype = size % 2 == 1 ? KvDtype::kFp8 : KvDtype::kBf16;
  KvStore store(options, std::make_unique<HostKvStorage>(kLayers, kCapacity, dtype));
  uint64_t next_tag = size;

  for (int step = 0; step < 200 && !in.empty(); ++step) {
    const Snapshot before = Take(store);
    absl::Status status;
    const SequenceId id = in.Below(kIds);
    switch (in.Below(8)) {
      case 0: {
        const int layer_begin = static_cast<int>(in.Below(kLayers + 2)) - 1;  // -1 .. kLayers
        const int layer_count = static_cast<int>(in.Below(kLayers + 1));
        const int tokens = static_cast<int>(in.Below(21));
        AppendExpectation expect;
        switch (in.Below(3)) {
          case 1:
            expect = AppendExpectation::Create();
            break;
          case 2:
            expect = AppendExpectation::Fill(in.Below(40));
            break;
          default:
            break;
        }
        if (dtype == KvDtype::kFp8 && in.Below(2) == 1) {
          const uint8_t* fp8 = Fp8Rows(next_tag++);
          std::vector<uint8_t> bad;
          if (in.Below(4) == 0) {  // a NaN code somewhere in what the call reads: refused
            const int64_t bytes = int64_t{kLayers} * std::max(tokens, 1) * kFp8RowBytes;
            bad.assign(fp8, fp8 + bytes);
            bad[in.Below(static_cast<uint32_t>(bytes))] = 0xFF;
            fp8 = bad.data();
          }
          status = store.Append(id, layer_begin, layer_count, tokens, fp8, expect, RowMemory::kHost,
                                KvDtype::kFp8);
          break;
        }
        status =
            store.Append(id, layer_begin, layer_count, tokens, Rows(next_tag++, dtype), expect);
        break;
      }
      case 1: {
        const int layer = static_cast<int>(in.Below(kLayers + 1));
        std::vector<VerifyItem> items(in.Below(4));
        for (VerifyItem& item : items) {
          item.sequence = in.Below(kIds);
          item.parents = Parents(in);
          if (in.Below(3) == 0) item.commit = CommitPath{Path(in)};
        }
        status = store.PrepareVerify(layer, items);
        break;
      }
      case 2: {
        // A pending tree has at most kMaxNodes rows: within Rows()'s kMaxRows.
        status = store.WriteTreeLayer(id, static_cast<int>(in.Below(kLayers + 1)),
                                      Rows(next_tag++, dtype));
        break;
      }
      case 3:
        status = store.Commit(id, CommitPath{Path(in)});
        break;
      case 4:
        status = store.Release(id);
        break;
      case 5:
        status = store.ExecuteCompaction(
            store.PlanCompaction(in.Below(4) * 2 * KvRowBytes(dtype) * kLayers));
        break;
      case 6: {
        // A plan made stale by a later change must be refused with no change, or still be valid.
        const CompactionPlan plan = store.PlanCompaction(0);
        (void)store.Release(in.Below(kIds));
        const Snapshot mid = Take(store);
        status = store.ExecuteCompaction(plan);
        if (!status.ok()) Require(Take(store) == mid, "a refused stale plan changed the store");
        status = absl::OkStatus();  // the Release may have changed the state on purpose
        break;
      }
      default:
        now += absl::Seconds(in.Below(8));
        (void)store.ExpireLeases();
        break;
    }
    const Snapshot after = Take(store);
    if (!status.ok()) {
      Require(!status.message().empty(), "an error without a message");
      Require(after == before, "a failed operation changed the store");
    }
    CheckInvariants(store, after);
  }
  return 0;
}
