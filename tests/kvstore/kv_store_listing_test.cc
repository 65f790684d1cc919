// KvStore::ListSequences (issue 17, the "release what leaked" runbook): every field against what
// the test did, pages that cover every id once in order, and a listing that renews no lease.
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

using testing_kv::HashedRows;

class KvStoreListingTest : public ::testing::Test {
 protected:
  static constexpr int kLayers = 3;

  void SetUp() override {
    KvStoreOptions options;
    options.num_layers = kLayers;
    options.lease = absl::Seconds(60);
    options.now = [this] { return now_; };
    store_ = std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(kLayers, 4096));
  }

  // `tokens` rows on layers [begin, begin + count).
  void Append(SequenceId id, int begin, int count, int tokens) {
    const std::vector<bf16_bits> kv = HashedRows(id * 31 + begin, int64_t{count} * tokens);
    ASSERT_TRUE(store_->Append(id, begin, count, tokens, kv.data()).ok());
  }

  const SequenceSummary& Find(const SequencePage& page, SequenceId id) {
    auto it = std::find_if(page.sequences.begin(), page.sequences.end(),
                           [id](const SequenceSummary& s) { return s.id == id; });
    EXPECT_NE(it, page.sequences.end()) << "sequence " << id << " not listed";
    return *it;
  }

  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  std::unique_ptr<KvStore> store_;
};

TEST_F(KvStoreListingTest, AnEmptyStoreListsNothing) {
  const SequencePage page = store_->ListSequences(std::nullopt, 100);
  EXPECT_TRUE(page.sequences.empty());
  EXPECT_FALSE(page.truncated);
  EXPECT_EQ(page.total, 0);
}

TEST_F(KvStoreListingTest, EachFieldIsWhatTheCallsDid) {
  // 7: 40 tokens on every layer, then idle for 25 s.
  Append(7, 0, kLayers, 40);
  now_ += absl::Seconds(5);
  // 3: layers filled unevenly (committed = the minimum, 10), renewed 20 s after 7.
  Append(3, 0, kLayers, 10);
  Append(3, 0, 2, 6);
  // 9: a fork of 7's first 30 tokens, with a pending tree of 4 nodes.
  now_ += absl::Seconds(15);
  ASSERT_TRUE(store_->Fork(7, 9, 30).ok());
  ASSERT_TRUE(store_->PrepareVerify(0, {VerifyItem{9, {-1, 0, 0, 1}, std::nullopt}}).ok());
  now_ += absl::Seconds(5);

  const SequencePage page = store_->ListSequences(std::nullopt, 100);
  EXPECT_EQ(page.total, 3);
  EXPECT_FALSE(page.truncated);
  ASSERT_EQ(page.sequences.size(), 3u);
  EXPECT_EQ(page.sequences[0].id, 3u);
  EXPECT_EQ(page.sequences[1].id, 7u);
  EXPECT_EQ(page.sequences[2].id, 9u);

  const SequenceSummary& s3 = Find(page, 3);
  EXPECT_EQ(s3.committed_length, 10);
  EXPECT_EQ(s3.pending_nodes, 0);
  EXPECT_EQ(s3.idle, absl::Seconds(20));
  EXPECT_EQ(s3.lease_left, absl::Seconds(40));
  EXPECT_EQ(s3.shared_slots, 0);

  // Fork renews both leases (KvStore::Fork), 5 s ago.
  const SequenceSummary& s7 = Find(page, 7);
  EXPECT_EQ(s7.committed_length, 40);
  EXPECT_EQ(s7.idle, absl::Seconds(5));
  EXPECT_EQ(s7.lease_left, absl::Seconds(55));
  EXPECT_EQ(s7.shared_slots, 30);

  const SequenceSummary& s9 = Find(page, 9);
  EXPECT_EQ(s9.committed_length, 30);
  EXPECT_EQ(s9.pending_nodes, 4);
  EXPECT_EQ(s9.shared_slots, 30);
  EXPECT_EQ(s9.idle, absl::Seconds(5));

  // Past the lease without a call: lease_left goes negative (the next sweep takes it).
  now_ += absl::Seconds(70);
  const SequencePage late = store_->ListSequences(std::nullopt, 100);
  EXPECT_EQ(Find(late, 3).lease_left, absl::Seconds(-30));
  EXPECT_EQ(Find(late, 3).idle, absl::Seconds(90));

  // Releasing the source leaves the fork's slots its own: nothing shared any more.
  now_ = absl::FromUnixSeconds(1'000'000);
  ASSERT_TRUE(store_->Release(7).ok());
  EXPECT_EQ(Find(store_->ListSequences(std::nullopt, 100), 9).shared_slots, 0);
}

TEST_F(KvStoreListingTest, PagesCoverEveryIdOnceInOrder) {
  std::mt19937_64 rng(testing_kv::TestSeed());
  std::vector<SequenceId> ids;
  while (ids.size() < 57) {
    const SequenceId id = rng() % 2 == 0 ? rng() : rng() % 1000;  // near 0 and near 2^64
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) continue;
    ids.push_back(id);
    Append(id, 0, kLayers, 1 + static_cast<int>(rng() % 4));
  }
  std::sort(ids.begin(), ids.end());
  const int64_t limit = 1 + static_cast<int64_t>(rng() % 10);
  std::vector<SequenceId> seen;
  std::optional<SequenceId> after;
  for (int pages = 0;; ++pages) {
    ASSERT_LT(pages, 100) << "paging does not end";
    const SequencePage page = store_->ListSequences(after, limit);
    EXPECT_EQ(page.total, 57);
    ASSERT_LE(static_cast<int64_t>(page.sequences.size()), limit);
    for (const SequenceSummary& s : page.sequences) seen.push_back(s.id);
    if (!page.truncated) break;
    ASSERT_FALSE(page.sequences.empty());
    after = page.sequences.back().id;
  }
  EXPECT_EQ(seen, ids) << "limit " << limit;

  // limit 0 lists nothing and says that more are there; past the largest id, nothing is left.
  const SequencePage none = store_->ListSequences(std::nullopt, 0);
  EXPECT_TRUE(none.sequences.empty());
  EXPECT_TRUE(none.truncated);
  const SequencePage past = store_->ListSequences(ids.back(), 10);
  EXPECT_TRUE(past.sequences.empty());
  EXPECT_FALSE(past.truncated);
}

TEST_F(KvStoreListingTest, ListingRenewsNoLease) {
  Append(1, 0, kLayers, 8);
  for (int i = 0; i < 7; ++i) {
    now_ += absl::Seconds(10);
    (void)store_->ListSequences(std::nullopt, 10);
  }
  // 70 s after the only call that named it: the sweep releases it although it was listed.
  EXPECT_EQ(store_->ExpireLeases(), std::vector<SequenceId>{1});
}

}  // namespace
}  // namespace verifyd
