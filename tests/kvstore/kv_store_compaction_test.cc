#include <map>
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
constexpr int64_t kMoveBytes = kLayers * kKvRowBytes;

std::vector<int32_t> Range(int32_t begin, int32_t end) {
  std::vector<int32_t> slots;
  for (int32_t s = begin; s < end; ++s) slots.push_back(s);
  return slots;
}

class CompactionTest : public ::testing::Test {
 protected:
  CompactionTest() { Reset(64); }

  void Reset(int capacity) {
    KvStoreOptions options;
    options.num_layers = kLayers;
    store_ = std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(kLayers, capacity));
    expected_.clear();
    next_tag_ = 1;
  }

  // Appends T tokens to every layer and records what each layer must read back.
  void Append(SequenceId seq, int tokens) {
    std::vector<bf16_bits> kv;
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<bf16_bits> rows = HashedRows(next_tag_++, tokens);
      kv.insert(kv.end(), rows.begin(), rows.end());
      std::vector<std::vector<bf16_bits>>& layers = expected_[seq];
      layers.resize(kLayers);
      layers[l].insert(layers[l].end(), rows.begin(), rows.end());
    }
    ASSERT_TRUE(store_->Append(seq, 0, kLayers, tokens, kv.data()).ok());
  }

  void Release(SequenceId seq) {
    ASSERT_TRUE(store_->Release(seq).ok());
    expected_.erase(seq);
  }

  void ExpectContentsIntact() {
    for (const auto& [seq, layers] : expected_) {
      for (int l = 0; l < kLayers; ++l) {
        std::vector<bf16_bits> out(layers[l].size());
        ASSERT_TRUE(store_->ReadCommitted(seq, l, out.data()).ok());
        ASSERT_EQ(out, layers[l]) << "sequence " << seq << " layer " << l;
      }
    }
  }

  std::unique_ptr<KvStore> store_;
  std::map<SequenceId, std::vector<std::vector<bf16_bits>>> expected_;
  uint64_t next_tag_ = 1;
};

TEST_F(CompactionTest, NothingToDoWhenEverySequenceIsContiguous) {
  Append(1, 5);
  Append(2, 7);
  EXPECT_TRUE(store_->PlanCompaction(int64_t{1} << 40).moves.empty());
  EXPECT_TRUE(store_->PlanCompaction(0).moves.empty());
}

TEST_F(CompactionTest, GrowsTheFirstRunInPlaceWhenTheSlotsAfterItAreFree) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11
  Release(2);
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_EQ(plan.moves.size(), 4u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(plan.moves[k].sequence, 1u);
    EXPECT_EQ(plan.moves[k].position, 4 + k);
    EXPECT_EQ(plan.moves[k].src, 8 + k);
    EXPECT_EQ(plan.moves[k].dst, 4 + k);
  }
  EXPECT_EQ(plan.bytes(), 4 * kMoveBytes);
  ASSERT_TRUE(store_->ExecuteCompaction(plan).ok());
  EXPECT_EQ(*store_->CommittedSlots(1), Range(0, 8));
  EXPECT_EQ(store_->Stats().used_slots, 8);
  EXPECT_EQ(store_->Stats().fragmentation.runs, 1);
  ExpectContentsIntact();
}

TEST_F(CompactionTest, NeverExceedsTheBudgetAndMovesPartiallyInPositionOrder) {
  Append(1, 4);
  Append(2, 4);
  Append(1, 4);
  Release(2);
  const CompactionPlan plan = store_->PlanCompaction(3 * kMoveBytes - 1);
  ASSERT_EQ(plan.moves.size(), 2u);
  EXPECT_LE(plan.bytes(), 3 * kMoveBytes - 1);
  EXPECT_EQ(plan.moves[0].position, 4);
  EXPECT_EQ(plan.moves[1].position, 5);
  const double before = store_->Stats().fragmentation.fragmented_ratio();
  ASSERT_TRUE(store_->ExecuteCompaction(plan).ok());
  EXPECT_LT(store_->Stats().fragmentation.fragmented_ratio(), before);
  EXPECT_EQ(*store_->CommittedSlots(1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 10, 11}));
  ExpectContentsIntact();
  EXPECT_TRUE(store_->PlanCompaction(kMoveBytes - 1).moves.empty());
}

TEST_F(CompactionTest, MovesAWholeBlockedSequenceToTheLowestRunThatHoldsIt) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11
  Append(3, 2);  // 12..13
  Release(3);    // 12..13 free, too short for sequence 1
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_EQ(plan.moves.size(), 8u);
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(plan.moves[p].position, p);
    EXPECT_EQ(plan.moves[p].dst, 12 + p);
  }
  // Over the budget: the head moves now, and the next call grows it in place.
  const CompactionPlan head = store_->PlanCompaction(3 * kMoveBytes);
  ASSERT_EQ(head.moves.size(), 3u);
  EXPECT_EQ(head.moves[2].position, 2);
  EXPECT_EQ(head.moves[2].dst, 14);
  ASSERT_TRUE(store_->ExecuteCompaction(head).ok());
  ExpectContentsIntact();
  const CompactionPlan rest = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_EQ(rest.moves.size(), 5u);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(rest.moves[k].position, 3 + k);
    EXPECT_EQ(rest.moves[k].dst, 15 + k);
  }
  ASSERT_TRUE(store_->ExecuteCompaction(rest).ok());
  EXPECT_EQ(*store_->CommittedSlots(1), Range(12, 20));
  EXPECT_TRUE(store_->allocator().IsFree(0));
  EXPECT_TRUE(store_->allocator().IsFree(11));
  EXPECT_EQ(store_->Stats().fragmentation.runs, 2);
  ExpectContentsIntact();
}

TEST_F(CompactionTest, TwoRelocationsInOnePlanNeverShareADestination) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11: blocked by sequence 2
  Append(2, 4);  // 12..15: blocked by sequence 1
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_EQ(plan.moves.size(), 16u);
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(plan.moves[p].sequence, 1u);
    EXPECT_EQ(plan.moves[p].dst, 16 + p);
    EXPECT_EQ(plan.moves[8 + p].sequence, 2u);
    EXPECT_EQ(plan.moves[8 + p].dst, 24 + p);
  }
  ASSERT_TRUE(store_->ExecuteCompaction(plan).ok());
  EXPECT_EQ(store_->Stats().fragmentation.runs, 2);
  EXPECT_EQ(store_->Stats().largest_free_run, 32);
  ExpectContentsIntact();
}

TEST_F(CompactionTest, PendingTreeSlotsAreNeverMoved) {
  Append(1, 3);                                                                        // 0..2
  Append(2, 3);                                                                        // 3..5
  Append(1, 3);                                                                        // 6..8
  ASSERT_TRUE(store_->PrepareVerify(0, {VerifyItem{1, {-1, 0}, std::nullopt}}).ok());  // 9..10
  Release(2);
  const std::vector<int32_t> tree_slots = {9, 10};
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  for (const SlotMove& move : plan.moves) {
    EXPECT_NE(move.src, 9);
    EXPECT_NE(move.src, 10);
    EXPECT_NE(move.dst, 9);
    EXPECT_NE(move.dst, 10);
  }
  ASSERT_TRUE(store_->ExecuteCompaction(plan).ok());
  EXPECT_EQ(*store_->CommittedSlots(1), Range(0, 6));
  auto view = store_->GetVerifyView(1);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(std::vector<int32_t>(view->tree_slots.begin(), view->tree_slots.end()), tree_slots);
  ExpectContentsIntact();
}

TEST_F(CompactionTest, AStaleOrMalformedPlanIsRejectedWithNoChange) {
  Append(1, 4);
  Append(2, 4);
  Append(1, 4);
  Release(2);
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_FALSE(plan.moves.empty());

  CompactionPlan repeated_dst = plan;
  repeated_dst.moves[1].dst = repeated_dst.moves[0].dst;
  EXPECT_EQ(store_->ExecuteCompaction(repeated_dst).code(), absl::StatusCode::kInvalidArgument);
  CompactionPlan out_of_range = plan;
  out_of_range.moves[0].dst = 64;
  EXPECT_EQ(store_->ExecuteCompaction(out_of_range).code(), absl::StatusCode::kInvalidArgument);
  CompactionPlan wrong_owner = plan;
  wrong_owner.moves[2].position = 1;
  EXPECT_EQ(store_->ExecuteCompaction(wrong_owner).code(), absl::StatusCode::kFailedPrecondition);

  Append(3, 2);  // takes slots 4..5, destinations of the plan
  const std::vector<int32_t> slots_before = *store_->CommittedSlots(1);
  const StoreStats stats_before = store_->Stats();
  absl::Status s = store_->ExecuteCompaction(plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("moves[0].dst = 4 is not free"), std::string::npos) << s;
  EXPECT_EQ(*store_->CommittedSlots(1), slots_before);
  EXPECT_EQ(store_->Stats().free_slots, stats_before.free_slots);
  Release(1);
  EXPECT_EQ(store_->ExecuteCompaction(plan).code(), absl::StatusCode::kFailedPrecondition);
  ExpectContentsIntact();
}

// Interleaved appends fragment many sequences; compaction with random budgets must converge to
// zero fragmentation (free space is ample), never exceed a budget and never lose a byte.
TEST_F(CompactionTest, RepeatedCallsConvergeToZeroFragmentation) {
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(testing::Message() << "VERIFYD_SEED=" << seed);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 5; ++round) {
    Reset(2048);
    for (int chunk = 0; chunk < 160; ++chunk) {
      const SequenceId seq = 1 + rng() % 24;
      Append(seq, 1 + rng() % 6);
      if (rng() % 10 == 0 && !expected_.empty()) Release(expected_.begin()->first);
    }
    ASSERT_GT(store_->Stats().fragmentation.runs, store_->Stats().fragmentation.sequences);
    int calls = 0;
    while (store_->Stats().fragmentation.runs > store_->Stats().fragmentation.sequences) {
      ASSERT_LT(++calls, 400) << "no convergence";
      const int64_t budget = static_cast<int64_t>(rng() % 64) * kMoveBytes + rng() % kMoveBytes;
      const int64_t free_before = store_->Stats().free_slots;
      const CompactionPlan plan = store_->PlanCompaction(budget);
      ASSERT_LE(plan.bytes(), budget);
      ASSERT_TRUE(store_->ExecuteCompaction(plan).ok());
      ASSERT_EQ(store_->Stats().free_slots, free_before);
      ExpectContentsIntact();
    }
    EXPECT_EQ(store_->Stats().fragmentation.tokens_outside_first_run, 0);
    EXPECT_TRUE(store_->PlanCompaction(int64_t{1} << 40).moves.empty());
  }
}

// A device mirror of a slot list trusts the generation: it must change exactly when an existing
// entry may have changed, and stay through appends and verifies.
TEST_F(CompactionTest, SlotGenerationChangesWhenCompactionMovesASequence) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11
  Append(3, 2);  // 12..13
  auto generation = [&](SequenceId seq) {
    EXPECT_TRUE(store_->PrepareVerify(0, {VerifyItem{seq, {-1}, {}}}).ok());
    auto view = store_->GetVerifyView(seq);
    EXPECT_TRUE(view.ok());
    const uint64_t g = view->slot_generation;
    EXPECT_TRUE(store_->Commit(seq, CommitPath{}).ok());
    return g;
  };
  const uint64_t g1 = generation(1), g2 = generation(2), g3 = generation(3);
  EXPECT_NE(g1, g2);
  EXPECT_NE(g2, g3);
  EXPECT_NE(g1, g3);
  Append(1, 1);
  EXPECT_EQ(generation(1), g1) << "an append only extends the list";
  Release(2);
  ASSERT_TRUE(store_->ExecuteCompaction(store_->PlanCompaction(int64_t{1} << 40)).ok());
  EXPECT_NE(generation(1), g1) << "sequence 1 moved";
  EXPECT_EQ(generation(3), g3) << "sequence 3 did not move";
  Append(2, 1);
  EXPECT_NE(generation(2), g2) << "a re-created sequence is a new list";
  ExpectContentsIntact();
}

}  // namespace
}  // namespace verifyd
