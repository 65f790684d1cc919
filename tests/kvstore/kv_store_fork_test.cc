// Fork in the store (plans/0019-shared-prefixes.md): slots shared without a copy, releases in
// either order, the memory of 64 forks of a 100k-token prefix, compaction of shared runs (moved
// once, every holder rewritten, generations bumped), and a fork's suffix placed after its prefix.
// The randomized model check (kv_store_model_test) covers Fork among every other operation.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

using testing_kv::HashedRows;

std::unique_ptr<KvStore> MakeStore(int layers, int64_t capacity) {
  KvStoreOptions options;
  options.num_layers = layers;
  return std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(layers, capacity));
}

// Appends `tokens` hashed rows on every layer and records them in `expected` (per layer).
void AppendRows(KvStore& store, SequenceId id, int tokens, uint64_t tag,
                std::vector<std::vector<bf16_bits>>& expected) {
  const int layers = store.options().num_layers;
  const std::vector<bf16_bits> kv = HashedRows(tag, int64_t{layers} * tokens);
  ASSERT_TRUE(store.Append(id, 0, layers, tokens, kv.data()).ok());
  expected.resize(layers);
  for (int l = 0; l < layers; ++l) {
    const auto begin = kv.begin() + int64_t{l} * tokens * kKvDim;
    expected[l].insert(expected[l].end(), begin, begin + int64_t{tokens} * kKvDim);
  }
}

// Every layer of `id` read back equals `expected` byte for byte.
void ExpectReadBack(const KvStore& store, SequenceId id,
                    const std::vector<std::vector<bf16_bits>>& expected) {
  for (int l = 0; l < store.options().num_layers; ++l) {
    std::vector<bf16_bits> out(expected[l].size());
    ASSERT_TRUE(store.ReadCommitted(id, l, out.data()).ok());
    ASSERT_EQ(0, std::memcmp(out.data(), expected[l].data(), out.size() * sizeof(bf16_bits)))
        << "sequence " << id << " layer " << l;
  }
}

std::vector<std::vector<bf16_bits>> Prefix(const std::vector<std::vector<bf16_bits>>& rows,
                                           int64_t length) {
  std::vector<std::vector<bf16_bits>> prefix;
  for (const auto& layer : rows)
    prefix.emplace_back(layer.begin(), layer.begin() + length * kKvDim);
  return prefix;
}

TEST(KvStoreForkTest, ReleasingEitherSideFirstFreesOnlyWhatNobodyHolds) {
  std::mt19937_64 rng(testing_kv::TestSeed());
  for (bool parent_first : {true, false}) {
    SCOPED_TRACE(parent_first ? "parent released first" : "fork released first");
    auto store = MakeStore(2, 512);
    std::vector<std::vector<bf16_bits>> parent, child;
    const int n = 20 + static_cast<int>(rng() % 80);
    AppendRows(*store, 1, n, rng(), parent);
    const int k = 1 + static_cast<int>(rng() % n);
    ASSERT_TRUE(store->Fork(1, 2, k).ok());
    child = Prefix(parent, k);
    const std::vector<int32_t> parent_slots = *store->CommittedSlots(1);
    const std::vector<int32_t> child_slots = *store->CommittedSlots(2);
    ASSERT_TRUE(std::equal(child_slots.begin(), child_slots.end(), parent_slots.begin()));
    EXPECT_EQ(store->Stats().used_slots, n);
    EXPECT_EQ(store->Stats().shared_slots, k);
    EXPECT_EQ(store->Stats().shared_references, 2 * k);
    // Both grow on their own after the fork.
    const int more_parent = 1 + static_cast<int>(rng() % 30);
    const int more_child = 1 + static_cast<int>(rng() % 30);
    AppendRows(*store, 1, more_parent, rng(), parent);
    AppendRows(*store, 2, more_child, rng(), child);
    ExpectReadBack(*store, 1, parent);
    ExpectReadBack(*store, 2, child);

    const SequenceId first = parent_first ? 1 : 2;
    const SequenceId second = parent_first ? 2 : 1;
    const int64_t first_own = parent_first ? n + more_parent - k : more_child;
    const int64_t free_before = store->Stats().free_slots;
    ASSERT_TRUE(store->Release(first).ok());
    EXPECT_EQ(store->Stats().free_slots - free_before, first_own);
    EXPECT_EQ(store->Stats().shared_slots, 0);
    for (int32_t slot : std::vector<int32_t>(child_slots.begin(), child_slots.end())) {
      EXPECT_EQ(store->Holders(slot), 1) << "slot " << slot;
    }
    ExpectReadBack(*store, second, parent_first ? child : parent);
    // The survivor accounts its whole list now, and compacts like any sequence.
    EXPECT_EQ(*store->AccountedBegin(second), 0);
    EXPECT_EQ(store->Stats().fragmentation, testing_kv::WalkFragmentation(*store));
    for (int round = 0; round < 8; ++round) {
      ASSERT_TRUE(store->ExecuteCompaction(store->PlanCompaction(int64_t{1} << 30)).ok());
    }
    EXPECT_EQ(store->Stats().fragmentation.runs, 1);
    ExpectReadBack(*store, second, parent_first ? child : parent);
    ASSERT_TRUE(store->Release(second).ok());
    EXPECT_EQ(store->Stats().free_slots, 512);
    EXPECT_EQ(store->allocator().largest_free_run(), 512);
  }
}

// The example: 64 sequences on one 100k-token prompt. One layer keeps the test's memory
// at the size of the figures it checks (the slot counts do not depend on layers).
TEST(KvStoreForkTest, SixtyFourForksOfAHundredThousandTokenPrefixTakeOnePrefix) {
  constexpr int kPrefix = 100000, kForks = 64, kSuffix = 16;
  constexpr int64_t kCapacity = kPrefix + kForks * kSuffix + 1000;
  std::mt19937_64 rng(testing_kv::TestSeed());
  auto store = MakeStore(1, kCapacity);
  std::vector<std::vector<bf16_bits>> prompt;
  AppendRows(*store, 1, kPrefix, rng(), prompt);
  const StoreStats before = store->Stats();
  std::vector<std::vector<std::vector<bf16_bits>>> suffixes(kForks);  // each fork's own rows
  for (int f = 0; f < kForks; ++f) {
    ASSERT_TRUE(store->Fork(1, 100 + f, kPrefix).ok());
    AppendRows(*store, 100 + f, kSuffix, rng(), suffixes[f]);
  }
  // A fork reads back as the prompt followed by its own rows (one copy of the prompt in the test).
  std::vector<bf16_bits> out((kPrefix + kSuffix) * size_t{kKvDim});
  auto expect_fork = [&](int f) {
    ASSERT_TRUE(store->ReadCommitted(100 + f, 0, out.data()).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), prompt[0].data(), prompt[0].size() * sizeof(bf16_bits)));
    EXPECT_EQ(0, std::memcmp(out.data() + prompt[0].size(), suffixes[f][0].data(),
                             suffixes[f][0].size() * sizeof(bf16_bits)))
        << "fork " << f;
  };
  const StoreStats after = store->Stats();
  std::cout << "before: used " << before.used_slots << " of " << before.capacity_slots
            << ", shared " << before.shared_slots << "\n"
            << "after " << kForks << " forks of " << kPrefix << " + " << kSuffix
            << " own tokens each: used " << after.used_slots << " (without sharing "
            << int64_t{kForks + 1} * kPrefix + kForks * kSuffix << "), shared "
            << after.shared_slots << ", references " << after.shared_references
            << ", accounted tokens " << after.fragmentation.tokens << ", runs "
            << after.fragmentation.runs << "\n";
  EXPECT_EQ(before.used_slots, kPrefix);
  EXPECT_EQ(before.shared_slots, 0);
  EXPECT_EQ(after.used_slots, kPrefix + kForks * kSuffix);
  EXPECT_EQ(after.shared_slots, kPrefix);
  EXPECT_EQ(after.shared_references, int64_t{kForks + 1} * kPrefix);
  EXPECT_EQ(after.fragmentation.tokens, after.used_slots);
  EXPECT_EQ(after.fragmentation.runs, kForks + 1);  // the prompt, and each suffix in one run
  EXPECT_EQ(after.fragmentation.tokens_outside_first_run, 0);
  for (int f = 0; f < kForks; f += 21) expect_fork(f);

  // The prompt's owner leaves first: the forks keep it, and only then is it freed.
  ASSERT_TRUE(store->Release(1).ok());
  EXPECT_EQ(store->Stats().used_slots, after.used_slots);
  EXPECT_EQ(store->Stats().shared_slots, kPrefix);
  EXPECT_EQ(store->Stats().shared_references, int64_t{kForks} * kPrefix);
  EXPECT_EQ(store->Stats().fragmentation, testing_kv::WalkFragmentation(*store));
  for (int f = kForks - 1; f >= 0; --f) {
    if (f % 16 == 0) expect_fork(f);
    ASSERT_TRUE(store->Release(100 + f).ok());
  }
  EXPECT_EQ(store->Stats().free_slots, kCapacity);
  EXPECT_EQ(store->Stats().shared_references, 0);
}

TEST(KvStoreForkTest, CompactionMovesASharedRunOnceAndRewritesEveryHolder) {
  std::mt19937_64 rng(testing_kv::TestSeed());
  auto store = MakeStore(2, 1024);
  std::vector<std::vector<bf16_bits>> parent, filler;
  // The parent's prefill interleaved with a filler that then leaves: a fragmented prefix.
  for (int chunk = 0; chunk < 6; ++chunk) {
    AppendRows(*store, 1, 5 + static_cast<int>(rng() % 10), rng(), parent);
    AppendRows(*store, 9, 3 + static_cast<int>(rng() % 5), rng(), filler);
  }
  ASSERT_TRUE(store->Release(9).ok());
  const int64_t n = static_cast<int64_t>(parent[0].size()) / kKvDim;
  // Forks at several lengths, one of them a fork of a fork; each grows a little.
  std::vector<std::vector<std::vector<bf16_bits>>> expected(6);
  expected[1] = parent;
  const std::vector<std::pair<SequenceId, int64_t>> forks = {
      {2, n}, {3, 1 + static_cast<int64_t>(rng() % n)}, {4, 1 + static_cast<int64_t>(rng() % n)}};
  for (const auto& [id, k] : forks) {
    ASSERT_TRUE(store->Fork(1, id, k).ok());
    expected[id] = Prefix(parent, k);
    AppendRows(*store, id, 1 + static_cast<int>(rng() % 6), rng(), expected[id]);
  }
  const int64_t k5 = 1 + static_cast<int64_t>(rng() % (expected[3][0].size() / kKvDim));
  ASSERT_TRUE(store->Fork(3, 5, k5).ok());
  expected[5] = Prefix(expected[3], k5);
  // Pending one-node trees expose each sequence's slot generation.
  std::vector<VerifyItem> items;
  for (SequenceId id = 1; id <= 5; ++id) items.push_back({id, {-1}, std::nullopt});
  ASSERT_TRUE(store->PrepareVerify(0, items).ok());
  std::vector<uint64_t> generation(6);
  std::vector<std::vector<int32_t>> slots(6);
  for (SequenceId id = 1; id <= 5; ++id) {
    generation[id] = store->GetVerifyView(id)->slot_generation;
    slots[id] = *store->CommittedSlots(id);
  }
  const StoreStats before = store->Stats();
  ASSERT_GT(before.fragmentation.tokens_outside_first_run, 0);

  int64_t moved = 0;
  for (int round = 0; round < 20; ++round) {
    const CompactionPlan plan = store->PlanCompaction(int64_t{1} << 30);
    if (plan.runs.empty()) break;
    // A shared run is planned once, by the holder that accounts it.
    for (const CompactionRun& run : plan.runs) {
      EXPECT_GE(run.position, *store->AccountedBegin(run.sequence));
    }
    ASSERT_TRUE(store->ExecuteCompaction(plan).ok());
    moved += plan.slots();
  }
  const StoreStats after = store->Stats();
  EXPECT_GT(moved, 0);
  EXPECT_EQ(after.used_slots, before.used_slots);
  EXPECT_EQ(after.shared_slots, before.shared_slots);
  EXPECT_EQ(after.shared_references, before.shared_references);
  // Each accounted list is one run: the parent's whole list, each fork's own suffix.
  EXPECT_EQ(after.fragmentation.tokens_outside_first_run, 0);
  EXPECT_EQ(after.fragmentation, testing_kv::WalkFragmentation(*store));
  const std::vector<int32_t> parent_slots = *store->CommittedSlots(1);
  for (SequenceId id = 1; id <= 5; ++id) {
    SCOPED_TRACE(id);
    ExpectReadBack(*store, id, expected[id]);
    const std::vector<int32_t> now = *store->CommittedSlots(id);
    // Still sharing: the prefix is in the parent's (moved) slots, not a copy.
    const int64_t shared = id == 1 ? 0 : id == 5 ? k5 : forks[id - 2].second;
    const std::vector<int32_t>& source = id == 5 ? *store->CommittedSlots(3) : parent_slots;
    EXPECT_TRUE(std::equal(now.begin(), now.begin() + shared, source.begin()));
    // A list whose entries changed has a new generation (the device mirror's key).
    const uint64_t g = store->GetVerifyView(id)->slot_generation;
    if (now != slots[id]) EXPECT_NE(g, generation[id]);
  }
}

TEST(KvStoreForkTest, AForksNewTokensGoRightAfterTheSharedRunWhereTheyFit) {
  auto store = MakeStore(1, 256);
  std::vector<std::vector<bf16_bits>> a, b, c;
  AppendRows(*store, 1, 10, 1, a);  // slots [0, 10)
  ASSERT_TRUE(store->Fork(1, 2, 10).ok());
  AppendRows(*store, 2, 5, 2, b);  // the slot after the prefix is free: [10, 15)
  std::vector<int32_t> slots = *store->CommittedSlots(2);
  for (int p = 0; p < 15; ++p) EXPECT_EQ(slots[p], p);
  // The parent grows past the fork's suffix; a fork at 10 finds [10, 15) taken and gets the
  // first free run after it, not the lowest free slots.
  AppendRows(*store, 1, 4, 3, a);       // [15, 19)
  ASSERT_TRUE(store->Release(2).ok());  // frees [10, 15)
  AppendRows(*store, 7, 3, 4, c);       // lowest fit: [10, 13)
  ASSERT_TRUE(store->Fork(1, 3, 10).ok());
  std::vector<std::vector<bf16_bits>> d = Prefix(a, 10);
  AppendRows(*store, 3, 6, 5, d);
  slots = *store->CommittedSlots(3);
  ASSERT_EQ(slots.size(), 16u);
  EXPECT_EQ(slots[10], 19);  // [13, 15) is too short; [19, 25) is the first fit after the prefix
  for (int p = 11; p < 16; ++p) EXPECT_EQ(slots[p], slots[p - 1] + 1);
  ExpectReadBack(*store, 3, d);
}

}  // namespace
}  // namespace verifyd
