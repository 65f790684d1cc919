// Issue 33 N2: host memory a client can make the store hold without taking KV slots. 3,000 Forks
// of a 60,000-token sequence grew the daemon's RSS by ~236 KB each (the fork's slot table) while
// used_tokens did not move; ~100,000 forks reached the OOM killer. The store now bounds the live
// sequences and the slot tables' entries (KvStoreOptions::max_sequences, max_slot_table_entries):
// past either, a new sequence or a Fork is RESOURCE_EXHAUSTED naming the bound, and nothing
// changes.
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;
using testing_kv::HashedRows;

constexpr int kLayers = 2;

std::unique_ptr<KvStore> MakeStore(int64_t capacity, int64_t max_sequences, int64_t max_entries) {
  KvStoreOptions options;
  options.num_layers = kLayers;
  options.max_sequences = max_sequences;
  options.max_slot_table_entries = max_entries;
  options.field_names.max_sequences = "--max-sequences";
  options.field_names.max_slot_table_entries = "--max-slot-table-entries";
  return std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(kLayers, capacity));
}

absl::Status Append(KvStore& store, SequenceId id, int tokens, uint64_t tag,
                    AppendExpectation expect = AppendExpectation::Any()) {
  const std::vector<bf16_bits> kv = HashedRows(tag, int64_t{kLayers} * tokens);
  return store.Append(id, 0, kLayers, tokens, kv.data(), expect);
}

// What a refused call must leave as it was.
struct Shape {
  std::vector<SequenceId> ids;
  std::vector<std::vector<int32_t>> slots;
  StoreStats stats;
};
Shape Take(const KvStore& store) {
  Shape s;
  s.ids = store.Sequences();
  for (SequenceId id : s.ids) s.slots.push_back(*store.CommittedSlots(id));
  s.stats = store.Stats();
  return s;
}
void ExpectUnchanged(const Shape& before, const KvStore& store) {
  const Shape after = Take(store);
  EXPECT_EQ(after.ids, before.ids);
  EXPECT_EQ(after.slots, before.slots);
  EXPECT_EQ(after.stats.used_slots, before.stats.used_slots);
  EXPECT_EQ(after.stats.shared_references, before.stats.shared_references);
  EXPECT_EQ(after.stats.slot_table_entries, before.stats.slot_table_entries);
}

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(KvStoreBoundsTest, NewSequencesPastMaxSequencesAreRefusedAndChangeNothing) {
  std::mt19937_64 rng(testing_kv::TestSeed());
  const int64_t max = 3 + static_cast<int64_t>(rng() % 6);
  auto store = MakeStore(4096, max, 0);
  for (SequenceId id = 0; id < static_cast<SequenceId>(max); ++id) {
    ASSERT_TRUE(Append(*store, id, 1 + static_cast<int>(rng() % 30), rng()).ok());
  }
  const Shape before = Take(*store);
  const absl::Status appended = Append(*store, 100, 5, rng(), AppendExpectation::Create());
  EXPECT_EQ(appended.code(), absl::StatusCode::kResourceExhausted) << appended;
  EXPECT_THAT(appended.message(),
              HasSubstr(absl::StrCat("sequence = 100 would be live sequence ", max + 1,
                                     ", past --max-sequences = ", max)));
  ExpectUnchanged(before, *store);
  const absl::Status forked = store->Fork(0, 101, 1);
  EXPECT_EQ(forked.code(), absl::StatusCode::kResourceExhausted) << forked;
  EXPECT_THAT(forked.message(), HasSubstr("--max-sequences"));
  ExpectUnchanged(before, *store);
  // Appending to a live sequence is no new sequence.
  EXPECT_TRUE(Append(*store, 0, 3, rng()).ok());
  ASSERT_TRUE(store->Release(1).ok());
  EXPECT_TRUE(store->Fork(0, 101, 1).ok());
  EXPECT_EQ(store->Stats().sequences, max);
}

TEST(KvStoreBoundsTest, ForksPastMaxSlotTableEntriesAreRefusedAndChangeNothing) {
  std::mt19937_64 rng(testing_kv::TestSeed());
  const int length = 200 + static_cast<int>(rng() % 400);
  const int64_t max_entries = int64_t{length} * (5 + static_cast<int64_t>(rng() % 5)) + length / 2;
  auto store = MakeStore(8192, 0, max_entries);
  ASSERT_TRUE(Append(*store, 1, length, rng()).ok());
  // Every fork copies the whole prefix's table: (max - length) / length of them fit.
  const int64_t fit = (max_entries - length) / length;
  for (int64_t k = 0; k < fit; ++k) {
    ASSERT_TRUE(store->Fork(1, 1000 + k, length).ok()) << "fork " << k;
  }
  EXPECT_EQ(store->Stats().slot_table_entries, length * (fit + 1));
  EXPECT_EQ(store->Stats().used_slots, length);  // no KV slot was taken
  const Shape before = Take(*store);
  const absl::Status refused = store->Fork(1, 5000, length);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat("past --max-slot-table-entries = ", max_entries)));
  ExpectUnchanged(before, *store);
  EXPECT_FALSE(store->Contains(5000));
  // A shorter fork that fits, and an Append past the bound, are judged by the same count.
  const int64_t room = max_entries - store->Stats().slot_table_entries;
  EXPECT_TRUE(store->Fork(1, 5001, room).ok());
  const Shape full = Take(*store);
  const absl::Status appended = Append(*store, 1, 1, rng());
  EXPECT_EQ(appended.code(), absl::StatusCode::kResourceExhausted) << appended;
  ExpectUnchanged(full, *store);
  // Releasing a fork gives its entries back.
  ASSERT_TRUE(store->Release(1000).ok());
  EXPECT_TRUE(store->Fork(1, 5000, length).ok());
  for (SequenceId id : store->Sequences()) ASSERT_TRUE(store->Release(id).ok());
  EXPECT_EQ(store->Stats().slot_table_entries, 0);
  EXPECT_EQ(store->Stats().used_slots, 0);
}

// The probe at the store: 3,000 Forks of a 60,000-token sequence. Unbounded, each copied
// 240 KB of slot table (720 MB in all); bounded at 2^22 entries (16 MiB of tables) the forks past
// it are refused and the resident memory stays within the bound's bytes plus slack.
TEST(KvStoreBoundsTest, ThreeThousandForksOfASixtyThousandTokenSequenceStayWithinTheBound) {
  constexpr int kLength = 60'000;
  constexpr int64_t kMaxEntries = int64_t{1} << 22;
  auto store = MakeStore(kLength + 16, 0, kMaxEntries);
  ASSERT_TRUE(Append(*store, 1, kLength, 7).ok());
  const int64_t rss_before = RssBytes();
  int forked = 0;
  for (int k = 0; k < 3000; ++k) {
    const absl::Status status = store->Fork(1, 10 + static_cast<SequenceId>(k), kLength);
    if (status.ok()) {
      ++forked;
    } else {
      ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    }
  }
  const int64_t grown = RssBytes() - rss_before;
  EXPECT_EQ(forked, (kMaxEntries - kLength) / kLength);
  EXPECT_LE(store->Stats().slot_table_entries, kMaxEntries);
  // 4 bytes an entry, and per sequence its bookkeeping (well under a KiB): 16 MiB + 16 MiB slack.
  EXPECT_LE(grown, kMaxEntries * 4 + (int64_t{16} << 20))
      << "RSS grew " << grown << " bytes over " << forked << " forks";
  std::cout << "forks " << forked << ", RSS growth " << grown << " bytes ("
            << (forked > 0 ? grown / forked : 0) << " per fork)\n";
}

}  // namespace
}  // namespace verifyd
