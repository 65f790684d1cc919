#include "kvstore/kv_store.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

using testing_kv::HashedRows;

constexpr int kLayers = 3;
constexpr int kCapacity = 64;

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> slots;
  for (int32_t s = begin; s < end; ++s) slots.push_back(s);
  return slots;
}

std::vector<bf16_bits> Concat(std::vector<bf16_bits> a, const std::vector<bf16_bits>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Row r of HashedRows(tag, n): rows are per (tag, r), so slicing is taking a sub-range.
std::vector<bf16_bits> Row(uint64_t tag, int r) {
  std::vector<bf16_bits> all = HashedRows(tag, r + 1);
  return std::vector<bf16_bits>(all.end() - kKvDim, all.end());
}

bool Contains(const absl::Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

class KvStoreTest : public ::testing::Test {
 protected:
  KvStoreTest() { Reset(kCapacity); }

  void Reset(int capacity, KvFieldNames names = {}) {
    KvStoreOptions options;
    options.field_names = std::move(names);
    options.num_layers = kLayers;
    options.max_tree_nodes = 16;
    options.lease = absl::Seconds(10);
    options.now = [this] { return now_; };
    store_ = std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(kLayers, capacity));
  }

  // Appends T tokens to every layer; layer l's rows are HashedRows(tag + l, T).
  absl::Status AppendAll(SequenceId seq, int tokens, uint64_t tag) {
    std::vector<bf16_bits> kv;
    for (int l = 0; l < kLayers; ++l) kv = Concat(std::move(kv), HashedRows(tag + l, tokens));
    return store_->Append(seq, 0, kLayers, tokens, kv.data());
  }

  // Begins a tree and writes every layer (layer l's tree rows: HashedRows(tag + l, Q)).
  void VerifyTree(SequenceId seq, const std::vector<int32_t>& parents, uint64_t tag) {
    VerifyItem item{seq, parents, std::nullopt};
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(store_->PrepareVerify(l, {item}).ok());
      ASSERT_TRUE(store_->WriteTreeLayer(seq, l, HashedRows(tag + l, parents.size()).data()).ok());
    }
  }

  std::vector<bf16_bits> Read(SequenceId seq, int layer) {
    auto fill = store_->LayerFill(seq);
    EXPECT_TRUE(fill.ok());
    std::vector<bf16_bits> out((*fill)[layer] * kKvDim);
    EXPECT_TRUE(store_->ReadCommitted(seq, layer, out.data()).ok());
    return out;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<KvStore> store_;
};

TEST_F(KvStoreTest, AppendCreatesSequencesAndExtendsTheLastRunInPlace) {
  ASSERT_TRUE(AppendAll(1, 5, 10).ok());
  ASSERT_TRUE(AppendAll(1, 3, 20).ok());
  ASSERT_TRUE(AppendAll(2, 4, 30).ok());
  ASSERT_TRUE(AppendAll(1, 2, 40).ok());  // slot 8 is taken by sequence 2: one new run at 12
  EXPECT_EQ(*store_->CommittedSlots(1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 12, 13}));
  EXPECT_EQ(*store_->CommittedSlots(2), Range(8, 12));
  EXPECT_EQ(*store_->CommittedLength(1), 10);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(Read(1, l),
              Concat(Concat(HashedRows(10 + l, 5), HashedRows(20 + l, 3)), HashedRows(40 + l, 2)));
    EXPECT_EQ(Read(2, l), HashedRows(30 + l, 4));
  }
  EXPECT_EQ(store_->Sequences(), (std::vector<SequenceId>{1, 2}));
  EXPECT_TRUE(store_->Contains(2));
  EXPECT_FALSE(store_->Contains(3));
}

TEST_F(KvStoreTest, LayersFillIndependentlyAndCommittedLengthIsTheMinimum) {
  const std::vector<bf16_bits> first = HashedRows(1, 4);
  ASSERT_TRUE(store_->Append(7, 0, 1, 4, first.data()).ok());
  EXPECT_EQ(*store_->LayerFill(7), (std::vector<int64_t>{4, 0, 0}));
  EXPECT_EQ(*store_->CommittedLength(7), 0);
  EXPECT_EQ(store_->CommittedSlots(7)->size(), 4u);
  const std::vector<bf16_bits> second = Concat(HashedRows(2, 2), HashedRows(3, 2));
  ASSERT_TRUE(store_->Append(7, 1, 2, 2, second.data()).ok());
  EXPECT_EQ(*store_->LayerFill(7), (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(store_->Stats().used_slots, 4);  // layers 1-2 reuse the slots layer 0 allocated
  const std::vector<bf16_bits> third = Concat(HashedRows(4, 3), HashedRows(5, 3));
  ASSERT_TRUE(store_->Append(7, 1, 2, 3, third.data()).ok());
  EXPECT_EQ(*store_->LayerFill(7), (std::vector<int64_t>{4, 5, 5}));
  EXPECT_EQ(*store_->CommittedLength(7), 4);
  EXPECT_EQ(*store_->CommittedSlots(7), Range(0, 5));
  EXPECT_EQ(Read(7, 0), first);
  EXPECT_EQ(Read(7, 1), Concat(HashedRows(2, 2), HashedRows(4, 3)));
  EXPECT_EQ(Read(7, 2), Concat(HashedRows(3, 2), HashedRows(5, 3)));
}

TEST_F(KvStoreTest, AppendRejectsBadArgumentsNamingTheField) {
  const std::vector<bf16_bits> kv = HashedRows(1, 2 * kLayers);
  absl::Status s = store_->Append(1, -1, 1, 2, kv.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "layer_begin = -1 must be in [0, 3)")) << s;
  s = store_->Append(1, 3, 1, 2, kv.data());
  EXPECT_TRUE(Contains(s, "layer_begin = 3")) << s;
  s = store_->Append(1, 1, 3, 2, kv.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "layer_count = 3 must be in [1, layers - layer_begin = 2]")) << s;
  s = store_->Append(1, 0, 0, 2, kv.data());
  EXPECT_TRUE(Contains(s, "layer_count = 0")) << s;
  s = store_->Append(1, 0, 1, 0, kv.data());
  EXPECT_TRUE(Contains(s, "num_tokens = 0 must be >= 1")) << s;
  s = store_->Append(1, 0, 1, 2, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(store_->Contains(1));
}

TEST_F(KvStoreTest, AppendExhaustionKeepsNothingNotEvenANewSequence) {
  ASSERT_TRUE(AppendAll(1, 60, 1).ok());
  absl::Status s = AppendAll(2, 5, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s, "num_tokens: need 5 free KV slots, only 4 of 64 are free")) << s;
  EXPECT_FALSE(store_->Contains(2));
  EXPECT_EQ(AppendAll(1, 5, 3).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*store_->LayerFill(1), (std::vector<int64_t>(kLayers, 60)));
  EXPECT_EQ(store_->Stats().free_slots, 4);
  EXPECT_TRUE(AppendAll(1, 4, 4).ok());
  EXPECT_EQ(store_->Stats().free_slots, 0);
}

// Device rows need a storage with device memory; the host pool refuses them and keeps nothing
// (the cuda storage's path: tests/backend/cuda, CudaKvStore.AppendFromDeviceRows...).
TEST_F(KvStoreTest, DeviceRowsOnAHostPoolAreRefusedAndKeepNothing) {
  ASSERT_TRUE(AppendAll(1, 7, 1).ok());
  const std::vector<bf16_bits> kv = HashedRows(9, 3);
  absl::Status s =
      store_->Append(1, 0, 1, 3, kv.data(), AppendExpectation::Any(), RowMemory::kDevice);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  s = store_->Append(2, 0, 1, 3, kv.data(), AppendExpectation::Any(), RowMemory::kDevice);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_FALSE(store_->Contains(2));
  EXPECT_EQ(*store_->LayerFill(1), (std::vector<int64_t>(kLayers, 7)));
  EXPECT_EQ(store_->Stats().used_slots, 7);
}

TEST_F(KvStoreTest, TreeSlotsFollowThePrefixAndCommitRewritesTheSlotTable) {
  ASSERT_TRUE(AppendAll(1, 6, 100).ok());
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 3};
  VerifyTree(1, parents, 200);
  auto view = store_->GetVerifyView(1);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->prefix_len, 6);
  EXPECT_EQ(view->AllSlots(), Range(0, 12));
  ASSERT_NE(view->mask, nullptr);
  EXPECT_EQ(view->mask->num_nodes(), 6);
  EXPECT_TRUE(view->mask->Visible(5, 1));
  EXPECT_FALSE(view->mask->Visible(5, 2));
  EXPECT_EQ(store_->Stats().pending_slots, 6);

  ASSERT_TRUE(store_->Commit(1, CommitPath{{0, 1, 3, 5}}).ok());
  EXPECT_EQ(*store_->CommittedLength(1), 10);
  EXPECT_EQ(*store_->CommittedSlots(1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 9, 11}));
  EXPECT_TRUE(store_->allocator().IsFree(8));
  EXPECT_TRUE(store_->allocator().IsFree(10));
  EXPECT_EQ(store_->Stats().pending_slots, 0);
  EXPECT_EQ(store_->Stats().used_slots, 10);
  for (int l = 0; l < kLayers; ++l) {
    std::vector<bf16_bits> expected = HashedRows(100 + l, 6);
    for (int node : {0, 1, 3, 5}) expected = Concat(std::move(expected), Row(200 + l, node));
    EXPECT_EQ(Read(1, l), expected) << "layer " << l;
  }
  EXPECT_EQ(store_->GetVerifyView(1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(KvStoreTest, CommitRidingOnTheNextVerifyFreesFirstThenBeginsTheNextTree) {
  Reset(12);
  ASSERT_TRUE(AppendAll(1, 4, 1).ok());
  VerifyTree(1, {-1, 0, 0, 1}, 50);  // 8 of 12 used
  // The next tree (Q=5) fits only because the commit frees 2 slots.
  VerifyItem item{1, {-1, 0, 1, 2, 3}, CommitPath{{0, 1}}};
  ASSERT_TRUE(store_->PrepareVerify(0, {item}).ok());
  EXPECT_EQ(*store_->CommittedLength(1), 6);
  auto view = store_->GetVerifyView(1);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->prefix_len, 6);
  // Tree slots start right after the new prefix (slots 6,7 were the rejected nodes).
  EXPECT_EQ(view->AllSlots(), Range(0, 11));
  EXPECT_EQ(store_->Stats().free_slots, 1);
}

TEST_F(KvStoreTest, CommitValidatesThePath) {
  ASSERT_TRUE(AppendAll(1, 3, 1).ok());
  EXPECT_EQ(store_->Commit(1, CommitPath{{0}}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Commit(9, CommitPath{{0}}).code(), absl::StatusCode::kNotFound);
  VerifyItem item{1, {-1, 0, -1, 2, 1}, std::nullopt};
  ASSERT_TRUE(store_->PrepareVerify(0, {item}).ok());
  const std::vector<bf16_bits> tree = HashedRows(5, 5);
  ASSERT_TRUE(store_->WriteTreeLayer(1, 0, tree.data()).ok());

  absl::Status s = store_->Commit(1, CommitPath{{0, 1, 4, 3, 2, 1}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "accepted_path has 6 nodes; must be <= the tree's 5")) << s;
  s = store_->Commit(1, CommitPath{{1}});
  EXPECT_TRUE(Contains(s, "accepted_path[0] = 1 must be a root (its parent is 0)")) << s;
  s = store_->Commit(1, CommitPath{{0, 3}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "accepted_path[1] = 3 must be a child of accepted_path[0] = 0")) << s;
  s = store_->Commit(1, CommitPath{{2, 7}});
  EXPECT_TRUE(Contains(s, "accepted_path[1] = 7 must be in [0, 5)")) << s;
  s = store_->Commit(1, CommitPath{{0, 1, 4}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "layer 1 of sequence 1's pending tree was never verified")) << s;
  EXPECT_EQ(store_->Stats().pending_slots, 5);  // every rejection left the tree as it was

  // An empty path rejects the tree even when layers are missing.
  ASSERT_TRUE(store_->Commit(1, CommitPath{}).ok());
  EXPECT_EQ(*store_->CommittedLength(1), 3);
  EXPECT_EQ(store_->Stats().used_slots, 3);
}

TEST_F(KvStoreTest, PrepareVerifyRejectsEachBadInputAndChangesNothing) {
  ASSERT_TRUE(AppendAll(1, 3, 1).ok());
  ASSERT_TRUE(AppendAll(2, 3, 2).ok());
  const std::vector<bf16_bits> partial = HashedRows(3, 1);
  ASSERT_TRUE(store_->Append(3, 0, 1, 1, partial.data()).ok());
  const StoreStats before = store_->Stats();

  absl::Status s = store_->PrepareVerify(3, {VerifyItem{1, {-1}, std::nullopt}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "layer = 3 must be in [0, 3)")) << s;
  EXPECT_EQ(store_->PrepareVerify(0, {}).code(), absl::StatusCode::kInvalidArgument);
  s = store_->PrepareVerify(0, {VerifyItem{1, {-1}, std::nullopt}, VerifyItem{9, {-1}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s, "items[1].sequence = 9 is not a live sequence")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{1, {-1}, {}}, VerifyItem{1, {-1}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "items[1].sequence = 1 repeats items[0]")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{2, {-1, 0, 5}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "items[0].parents[2] = 5 must be < 2")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{2, std::vector<int32_t>(17, -1), {}}});
  EXPECT_TRUE(Contains(s, "items[0].parents has 17 nodes, must be in [1, 16]")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{3, {-1}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "layer 1 holds 0 tokens, layer 0 holds 1")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{1, {-1}, CommitPath{}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "items[0].commit: sequence 1 has no pending tree")) << s;

  // Capacity is checked for the whole batch: the first tree alone would fit.
  s = store_->PrepareVerify(
      0, {VerifyItem{1, {-1, 0, 1, 2, 3, 4, 5, 6, 7, 8}, {}},
          VerifyItem{2, std::vector<int32_t>(16, -1), {}}, VerifyItem{3, {-1}, CommitPath{}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);  // item 2 has no tree to commit
  EXPECT_EQ(store_->Stats().used_slots, before.used_slots);
  EXPECT_EQ(store_->Stats().pending_slots, 0);
  Reset(20);
  ASSERT_TRUE(AppendAll(1, 3, 1).ok());
  ASSERT_TRUE(AppendAll(2, 3, 2).ok());
  s = store_->PrepareVerify(
      0, {VerifyItem{1, {-1, 0, 1, 2, 3, 4, 5, 6}, {}}, VerifyItem{2, {-1, 0, 1, 2, 3, 4, 5}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s, "need 15 free KV slots, only 14 of 20")) << s;
  EXPECT_EQ(store_->Stats().pending_slots, 0);
  EXPECT_EQ(store_->GetVerifyView(1).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A caller's field names replace the store's own in every message that names a parameter.
TEST_F(KvStoreTest, MessagesNameTheCallersFields) {
  KvFieldNames names;
  names.sequence = "sid";
  names.num_tokens = "kv.T";
  names.items = "batch";
  names.item_sequence = "id";
  names.item_commit = "previous";
  Reset(8, names);
  ASSERT_TRUE(AppendAll(1, 3, 1).ok());
  const std::vector<bf16_bits> kv = HashedRows(4, 9);
  absl::Status s = store_->Append(2, 0, 1, 0, kv.data());
  EXPECT_TRUE(Contains(s, "kv.T = 0 must be >= 1")) << s;
  s = store_->Append(2, 0, 1, 9, kv.data());
  EXPECT_TRUE(Contains(s, "kv.T: need 9 free KV slots")) << s;
  EXPECT_TRUE(Contains(store_->Release(5), "sid = 5 is not a live sequence"));
  EXPECT_TRUE(Contains(store_->Commit(5, CommitPath{}), "sid = 5 is not a live sequence"));
  EXPECT_TRUE(Contains(store_->CommittedLength(5).status(), "sid = 5 is not a live sequence"));
  s = store_->PrepareVerify(0, {VerifyItem{1, {-1}, std::nullopt}, VerifyItem{9, {-1}, {}}});
  EXPECT_TRUE(Contains(s, "batch[1].id = 9 is not a live sequence")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{1, {-1}, {}}, VerifyItem{1, {-1}, {}}});
  EXPECT_TRUE(Contains(s, "batch[1].id = 1 repeats batch[0]")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{1, {-1, 0, 5}, {}}});
  EXPECT_TRUE(Contains(s, "batch[0].parents[2] = 5 must be < 2")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{1, {-1}, CommitPath{}}});
  EXPECT_TRUE(Contains(s, "batch[0].previous: sequence 1 has no pending tree")) << s;
  s = store_->PrepareVerify(0, {VerifyItem{1, std::vector<int32_t>(6, -1), {}}});
  EXPECT_TRUE(Contains(s, "batch: the new trees need 6 free KV slots, only 5 of 8")) << s;
  s = store_->PrepareVerify(0, {});
  EXPECT_TRUE(Contains(s, "batch must not be empty")) << s;
}

TEST_F(KvStoreTest, APendingTreeMustBeVerifiedWithTheSameParents) {
  ASSERT_TRUE(AppendAll(1, 2, 1).ok());
  ASSERT_TRUE(store_->PrepareVerify(0, {VerifyItem{1, {-1, 0, 0}, {}}}).ok());
  ASSERT_TRUE(store_->PrepareVerify(1, {VerifyItem{1, {-1, 0, 0}, {}}}).ok());
  absl::Status s = store_->PrepareVerify(2, {VerifyItem{1, {-1, 0, 1}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "items[0].parents differ from sequence 1's pending tree")) << s;
  EXPECT_EQ(store_->Stats().pending_slots, 3);
  EXPECT_EQ(AppendAll(1, 1, 2).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(KvStoreTest, WriteTreeLayerChecksItsArguments) {
  ASSERT_TRUE(AppendAll(1, 2, 1).ok());
  const std::vector<bf16_bits> rows = HashedRows(2, 2);
  EXPECT_EQ(store_->WriteTreeLayer(1, 0, rows.data()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->WriteTreeLayer(4, 0, rows.data()).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_->PrepareVerify(0, {VerifyItem{1, {-1, 0}, {}}}).ok());
  EXPECT_EQ(store_->WriteTreeLayer(1, 3, rows.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->WriteTreeLayer(1, 0, nullptr).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store_->WriteTreeLayer(1, 2, rows.data()).ok());
  auto view = store_->GetVerifyView(1);
  std::vector<bf16_bits> out(2 * kKvDim);
  ASSERT_TRUE(
      store_->storage().ReadRows(2, absl::MakeConstSpan(view->tree_slots), out.data()).ok());
  EXPECT_EQ(out, rows);
}

TEST_F(KvStoreTest, ReleaseFreesCommittedAndPendingSlots) {
  ASSERT_TRUE(AppendAll(1, 5, 1).ok());
  ASSERT_TRUE(AppendAll(2, 5, 2).ok());
  VerifyTree(1, {-1, -1, 0}, 3);
  ASSERT_TRUE(store_->Release(1).ok());
  EXPECT_EQ(store_->Stats().used_slots, 5);
  EXPECT_EQ(store_->Stats().pending_slots, 0);
  EXPECT_EQ(store_->Release(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->CommittedLength(1).status().code(), absl::StatusCode::kNotFound);
  // The freed low run is handed out first.
  ASSERT_TRUE(AppendAll(3, 4, 4).ok());
  EXPECT_EQ(*store_->CommittedSlots(3), Range(0, 4));
}

TEST_F(KvStoreTest, LeasesAreRenewedByEveryCallAndExpiredSequencesReleased) {
  ASSERT_TRUE(AppendAll(1, 2, 1).ok());
  ASSERT_TRUE(AppendAll(2, 2, 2).ok());
  ASSERT_TRUE(AppendAll(3, 2, 3).ok());
  now_ += absl::Seconds(6);
  ASSERT_TRUE(store_->PrepareVerify(0, {VerifyItem{2, {-1}, {}}}).ok());  // renews 2
  ASSERT_TRUE(AppendAll(3, 1, 4).ok());                                   // renews 3
  now_ += absl::Seconds(4);
  EXPECT_EQ(store_->ExpireLeases(), (std::vector<SequenceId>{1}));
  now_ += absl::Seconds(5);
  ASSERT_TRUE(store_->WriteTreeLayer(2, 0, HashedRows(5, 1).data()).ok());  // renews 2
  now_ += absl::Seconds(1);
  EXPECT_EQ(store_->ExpireLeases(), (std::vector<SequenceId>{3}));
  EXPECT_EQ(store_->Sequences(), (std::vector<SequenceId>{2}));
  EXPECT_EQ(store_->Stats().used_slots, 3);
  now_ += absl::Seconds(10);
  EXPECT_EQ(store_->ExpireLeases(), (std::vector<SequenceId>{2}));
  EXPECT_EQ(store_->Stats().used_slots, 0);
}

TEST_F(KvStoreTest, ACallNamingAnExpiredSequenceHearsThatItsLeaseExpired) {
  ASSERT_TRUE(AppendAll(1, 2, 1).ok());
  now_ += absl::Seconds(11);
  ASSERT_EQ(store_->ExpireLeases(), (std::vector<SequenceId>{1}));
  const absl::Status gone = store_->PrepareVerify(0, {VerifyItem{1, {-1}, {}}});
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(gone, "= 1 is not a live sequence: its lease expired at ")) << gone;
  EXPECT_TRUE(Contains(gone, "Append it again")) << gone;
  EXPECT_EQ(store_->Release(1).code(), absl::StatusCode::kNotFound);
  // Never seen: the plain answer. Appended again: live, and the record is gone with it.
  EXPECT_FALSE(Contains(store_->Release(9), "lease"));
  ASSERT_TRUE(AppendAll(1, 2, 2).ok());
  ASSERT_TRUE(store_->Release(1).ok());
  EXPECT_FALSE(Contains(store_->Release(1), "lease"));
}

TEST_F(KvStoreTest, StatsCountRunsAndTokensOutsideTheFirstRun) {
  ASSERT_TRUE(AppendAll(1, 4, 1).ok());  // 0..3
  ASSERT_TRUE(AppendAll(2, 4, 2).ok());  // 4..7
  ASSERT_TRUE(AppendAll(1, 3, 3).ok());  // 8..10
  ASSERT_TRUE(AppendAll(3, 2, 4).ok());  // 11..12
  ASSERT_TRUE(AppendAll(1, 1, 5).ok());  // 13
  ASSERT_TRUE(AppendAll(2, 2, 6).ok());  // 14..15
  VerifyTree(3, {-1, 0}, 7);             // pending 16..17
  ASSERT_TRUE(store_->Release(2).ok());
  const StoreStats stats = store_->Stats();
  EXPECT_EQ(stats.capacity_slots, kCapacity);
  EXPECT_EQ(stats.used_slots, 8 + 2 + 2);
  EXPECT_EQ(stats.free_slots, kCapacity - 12);
  EXPECT_EQ(stats.pending_slots, 2);
  EXPECT_EQ(stats.largest_free_run, kCapacity - 18);
  EXPECT_EQ(stats.fragmentation.sequences, 2);
  EXPECT_EQ(stats.fragmentation.tokens, 10);
  EXPECT_EQ(stats.fragmentation.runs, 3 + 1);
  EXPECT_EQ(stats.fragmentation.tokens_outside_first_run, 4);
  EXPECT_DOUBLE_EQ(stats.fragmentation.fragmented_ratio(), 0.4);
}

}  // namespace
}  // namespace verifyd
