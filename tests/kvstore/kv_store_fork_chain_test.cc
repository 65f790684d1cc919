// Issue 33 N1: a chain of 150,000 forks (each the fork of the previous) and a compaction that must
// move the slot they all share. The rewrite of every holder walked the sharing tree recursively,
// one stack frame per link, and the daemon died of a stack overflow (SIGSEGV) in the compaction
// the nightly timer starts by itself. Now every holder is rewritten, the data reads back, and the
// chain releases in either direction with the whole pool free at the end.
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

using testing_kv::HashedRows;

constexpr int kLayers = 2;
constexpr int kLinks = 150'000;
constexpr SequenceId kFirstLink = 100'000;

std::unique_ptr<KvStore> MakeStore(int64_t capacity, KvStoreOptions options = {}) {
  options.num_layers = kLayers;
  return std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(kLayers, capacity));
}

void Append(KvStore& store, SequenceId id, int tokens, uint64_t tag) {
  const std::vector<bf16_bits> kv = HashedRows(tag, int64_t{kLayers} * tokens);
  ASSERT_TRUE(store.Append(id, 0, kLayers, tokens, kv.data()).ok());
}

// The layout: sequence 2's first 10 tokens sit after sequence 1's 30, which are released,
// so compaction moves them down, and with them the position every link of the chain shares.
void FragmentAndChain(KvStore& store, bool* ok) {
  *ok = false;
  Append(store, 1, 30, 11);
  Append(store, 2, 10, 12);
  Append(store, 3, 10, 13);
  Append(store, 2, 10, 14);
  ASSERT_TRUE(store.Release(1).ok());
  SequenceId source = 2;
  for (int i = 0; i < kLinks; ++i) {
    const SequenceId link = kFirstLink + static_cast<SequenceId>(i);
    const absl::Status forked = store.Fork(source, link, 1);
    ASSERT_TRUE(forked.ok()) << "link " << i << ": " << forked;
    source = link;
  }
  *ok = true;
}

TEST(KvStoreForkChainTest, CompactionRewritesEveryLinkOfA150000ForkChain) {
  auto store = MakeStore(256);
  bool built = false;
  FragmentAndChain(*store, &built);
  ASSERT_TRUE(built);
  std::vector<bf16_bits> first_row(kKvDim);
  {
    std::vector<bf16_bits> layer0(20 * kKvDim);
    ASSERT_TRUE(store->ReadCommitted(2, 0, layer0.data()).ok());
    std::memcpy(first_row.data(), layer0.data(), kKvDim * sizeof(bf16_bits));
  }
  const int32_t before = (*store->CommittedSlots(2))[0];
  for (int round = 0; round < 8; ++round) {
    const CompactionPlan plan = store->PlanCompaction(int64_t{1} << 40);
    if (plan.runs.empty()) break;
    ASSERT_TRUE(store->ExecuteCompaction(plan).ok());
  }
  const int32_t after = (*store->CommittedSlots(2))[0];
  ASSERT_NE(before, after) << "the layout did not make compaction move the shared slot";
  EXPECT_EQ(store->PlanCompaction(int64_t{1} << 40).runs.size(), 0u)
      << "compaction did not converge";
  // Every link holds the moved slot, and reads the row it shares.
  for (int i = 0; i < kLinks; ++i) {
    const SequenceId link = kFirstLink + static_cast<SequenceId>(i);
    const std::vector<int32_t> slots = *store->CommittedSlots(link);
    ASSERT_EQ(slots.size(), 1u);
    ASSERT_EQ(slots[0], after) << "link " << i << " was not rewritten";
  }
  std::vector<bf16_bits> last(kKvDim);
  ASSERT_TRUE(store->ReadCommitted(kFirstLink + kLinks - 1, 0, last.data()).ok());
  EXPECT_EQ(0, std::memcmp(last.data(), first_row.data(), kKvDim * sizeof(bf16_bits)));
  EXPECT_EQ(store->Holders(after), kLinks + 1);
}

TEST(KvStoreForkChainTest, AChainReleasesFromEitherEndAndFreesThePool) {
  for (bool from_root : {true, false}) {
    SCOPED_TRACE(from_root ? "released from the root" : "released from the tip");
    auto store = MakeStore(256);
    bool built = false;
    FragmentAndChain(*store, &built);
    ASSERT_TRUE(built);
    // The root first hands the shared slot down the chain one heir at a time.
    if (from_root) ASSERT_TRUE(store->Release(2).ok());
    for (int i = 0; i < kLinks; ++i) {
      const int k = from_root ? i : kLinks - 1 - i;
      ASSERT_TRUE(store->Release(kFirstLink + static_cast<SequenceId>(k)).ok()) << "link " << k;
    }
    if (!from_root) ASSERT_TRUE(store->Release(2).ok());
    ASSERT_TRUE(store->Release(3).ok());
    EXPECT_EQ(store->Stats().used_slots, 0);
    EXPECT_EQ(store->Stats().shared_slots, 0);
    EXPECT_EQ(store->Stats().fragmentation.sequences, 0);
  }
}

}  // namespace
}  // namespace verifyd
