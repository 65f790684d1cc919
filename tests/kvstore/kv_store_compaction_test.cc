#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
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

// One slot's move, the unit the runs are made of.
struct SlotMove {
  SequenceId sequence;
  int32_t position, src, dst;
  bool operator==(const SlotMove&) const = default;
};

std::vector<SlotMove> Expand(const CompactionPlan& plan) {
  std::vector<SlotMove> moves;
  for (const CompactionRun& run : plan.runs) {
    for (int32_t i = 0; i < run.length; ++i) {
      moves.push_back({run.sequence, run.position + i, run.src_begin + i, run.dst_begin + i});
    }
  }
  return moves;
}

// Runs are maximal: a run never continues the previous one in position, source and destination.
void ExpectMaximalRuns(const CompactionPlan& plan) {
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    const CompactionRun& run = plan.runs[k];
    EXPECT_GE(run.length, 1) << "runs[" << k << "]";
    if (k == 0) continue;
    const CompactionRun& prev = plan.runs[k - 1];
    EXPECT_FALSE(prev.sequence == run.sequence && prev.position + prev.length == run.position &&
                 prev.src_begin + prev.length == run.src_begin &&
                 prev.dst_begin + prev.length == run.dst_begin)
        << "runs[" << k << "] continues runs[" << k - 1 << "]";
  }
}

// The planner as it was written per slot (plans/0001-core.md), on the store's public view: the
// reference the run planner must agree with, move for move.
std::vector<SlotMove> ReferencePlan(const KvStore& store, int64_t budget_bytes) {
  const int64_t move_bytes = int64_t{store.options().num_layers} * kKvRowBytes;
  int64_t moves_left = budget_bytes > 0 ? budget_bytes / move_bytes : 0;
  std::vector<SlotMove> moves;
  if (moves_left == 0) return moves;
  const SlotAllocator& allocator = store.allocator();
  auto first_run = [](const std::vector<int32_t>& slots) {
    size_t r = slots.empty() ? 0 : 1;
    while (r < slots.size() && slots[r] == slots[r - 1] + 1) ++r;
    return r;
  };
  std::vector<std::pair<SequenceId, std::vector<int32_t>>> order;
  for (SequenceId id : store.Sequences()) {
    std::vector<int32_t> slots = *store.CommittedSlots(id);
    if (first_run(slots) < slots.size()) order.emplace_back(id, std::move(slots));
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.second[0] < b.second[0]; });
  std::set<int32_t> reserved;
  auto available = [&](int64_t slot) {
    return slot < allocator.capacity() && allocator.IsFree(static_cast<int32_t>(slot)) &&
           !reserved.contains(static_cast<int32_t>(slot));
  };
  std::vector<const std::pair<SequenceId, std::vector<int32_t>>*> blocked;
  for (const auto& entry : order) {
    const std::vector<int32_t>& slots = entry.second;
    bool moved = false;
    for (size_t p = first_run(slots); p < slots.size() && moves_left > 0; ++p) {
      const int64_t target = int64_t{slots[0]} + static_cast<int64_t>(p);
      if (slots[p] == target) continue;
      if (!available(target)) break;
      reserved.insert(static_cast<int32_t>(target));
      moves.push_back(
          {entry.first, static_cast<int32_t>(p), slots[p], static_cast<int32_t>(target)});
      --moves_left;
      moved = true;
    }
    if (!moved) blocked.push_back(&entry);
  }
  for (const auto* entry : blocked) {
    if (moves_left == 0) break;
    const std::vector<int32_t>& slots = entry->second;
    const int64_t n = static_cast<int64_t>(slots.size());
    std::optional<int32_t> begin;
    for (int64_t b = 0; b + n <= allocator.capacity() && !begin;) {
      int64_t e = b;
      while (e < b + n && available(e)) ++e;
      if (e == b + n) begin = static_cast<int32_t>(b);
      b = e + 1;  // every window starting in [b, e] contains the unavailable slot e
    }
    if (!begin) continue;
    const int64_t count = std::min(n, moves_left);
    for (int64_t p = 0; p < count; ++p) {
      reserved.insert(static_cast<int32_t>(*begin + p));
      moves.push_back(
          {entry->first, static_cast<int32_t>(p), slots[p], static_cast<int32_t>(*begin + p)});
    }
    moves_left -= count;
  }
  return moves;
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
  EXPECT_TRUE(store_->PlanCompaction(int64_t{1} << 40).runs.empty());
  EXPECT_TRUE(store_->PlanCompaction(0).runs.empty());
}

TEST_F(CompactionTest, GrowsTheFirstRunInPlaceWhenTheSlotsAfterItAreFree) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11
  Release(2);
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(plan.runs[0], (CompactionRun{1, 4, 8, 4, 4}));
  EXPECT_EQ(plan.slots(), 4);
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
  ASSERT_EQ(plan.runs.size(), 1u);
  EXPECT_EQ(plan.runs[0], (CompactionRun{1, 4, 8, 4, 2}));
  EXPECT_LE(plan.bytes(), 3 * kMoveBytes - 1);
  const double before = store_->Stats().fragmentation.fragmented_ratio();
  ASSERT_TRUE(store_->ExecuteCompaction(plan).ok());
  EXPECT_LT(store_->Stats().fragmentation.fragmented_ratio(), before);
  EXPECT_EQ(*store_->CommittedSlots(1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 10, 11}));
  ExpectContentsIntact();
  EXPECT_TRUE(store_->PlanCompaction(kMoveBytes - 1).runs.empty());
}

TEST_F(CompactionTest, MovesAWholeBlockedSequenceToTheLowestRunThatHoldsIt) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11
  Append(3, 2);  // 12..13
  Release(3);    // 12..13 free, too short for sequence 1
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  // One destination range, cut where the sources jump.
  ASSERT_EQ(plan.runs.size(), 2u);
  EXPECT_EQ(plan.runs[0], (CompactionRun{1, 0, 0, 12, 4}));
  EXPECT_EQ(plan.runs[1], (CompactionRun{1, 4, 8, 16, 4}));
  // Over the budget: the head moves now, and the next call grows it in place.
  const CompactionPlan head = store_->PlanCompaction(3 * kMoveBytes);
  ASSERT_EQ(head.runs.size(), 1u);
  EXPECT_EQ(head.runs[0], (CompactionRun{1, 0, 0, 12, 3}));
  ASSERT_TRUE(store_->ExecuteCompaction(head).ok());
  ExpectContentsIntact();
  const CompactionPlan rest = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_EQ(rest.runs.size(), 2u);
  EXPECT_EQ(rest.runs[0], (CompactionRun{1, 3, 3, 15, 1}));
  EXPECT_EQ(rest.runs[1], (CompactionRun{1, 4, 8, 16, 4}));
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
  const std::vector<CompactionRun> expected = {
      {1, 0, 0, 16, 4}, {1, 4, 8, 20, 4}, {2, 0, 4, 24, 4}, {2, 4, 12, 28, 4}};
  EXPECT_EQ(plan.runs, expected);
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
  ASSERT_FALSE(plan.runs.empty());
  for (const SlotMove& move : Expand(plan)) {
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

// Runs may come in any order, and a run may be cut anywhere: the executor checks each run on its
// own, so halves of the planner's runs, shuffled, do the same work.
TEST_F(CompactionTest, CutAndShuffledRunsExecuteLikeThePlan) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11
  Append(2, 4);  // 12..15
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  CompactionPlan cut;
  cut.bytes_per_slot = plan.bytes_per_slot;
  for (const CompactionRun& run : plan.runs) {
    cut.runs.push_back({run.sequence, run.position, run.src_begin, run.dst_begin, 1});
    cut.runs.push_back(
        {run.sequence, run.position + 1, run.src_begin + 1, run.dst_begin + 1, run.length - 1});
  }
  std::mt19937_64 rng(testing_kv::TestSeed());
  std::shuffle(cut.runs.begin(), cut.runs.end(), rng);
  EXPECT_EQ(cut.bytes(), plan.bytes());
  ASSERT_TRUE(store_->ExecuteCompaction(cut).ok());
  EXPECT_EQ(*store_->CommittedSlots(1), Range(16, 24));
  EXPECT_EQ(*store_->CommittedSlots(2), Range(24, 32));
  EXPECT_EQ(store_->Stats().free_slots, 64 - 16);
  EXPECT_EQ(store_->Stats().largest_free_run, 32);
  ExpectContentsIntact();
}

TEST_F(CompactionTest, AStaleOrMalformedPlanIsRejectedWithNoChange) {
  Append(1, 4);  // 0..3
  Append(2, 4);  // 4..7
  Append(1, 4);  // 8..11
  Release(2);
  const CompactionPlan plan = store_->PlanCompaction(int64_t{1} << 30);
  ASSERT_EQ(plan.runs.size(), 1u);  // {1, 4, 8, 4, 4}
  const std::vector<int32_t> slots_before = *store_->CommittedSlots(1);
  const std::vector<SlotRun> free_before = store_->allocator().FreeRuns();
  auto expect_refused = [&](const CompactionPlan& bad, absl::StatusCode code,
                            const std::string& message) {
    const absl::Status s = store_->ExecuteCompaction(bad);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(message), std::string::npos) << s;
    EXPECT_EQ(*store_->CommittedSlots(1), slots_before);
    const std::vector<SlotRun> free_after = store_->allocator().FreeRuns();
    ASSERT_EQ(free_after.size(), free_before.size());
    for (size_t i = 0; i < free_after.size(); ++i) {
      EXPECT_EQ(free_after[i].begin, free_before[i].begin);
      EXPECT_EQ(free_after[i].length, free_before[i].length);
    }
  };
  auto with_runs = [&](std::vector<CompactionRun> runs) {
    CompactionPlan p;
    p.bytes_per_slot = plan.bytes_per_slot;
    p.runs = std::move(runs);
    return p;
  };
  using Code = absl::StatusCode;
  expect_refused(with_runs({{1, 4, 8, 4, 2}, {1, 6, 10, 5, 2}}), Code::kInvalidArgument,
                 "runs[1].dst_begin = 5: its slots overlap those of runs[0]");
  expect_refused(with_runs({{1, 4, 8, 4, 2}, {1, 5, 9, 6, 2}}), Code::kInvalidArgument,
                 "runs[1].src_begin = 9: its slots overlap those of runs[0]");
  expect_refused(with_runs({{1, 4, 8, 4, 0}}), Code::kInvalidArgument,
                 "runs[0].length = 0 must be >= 1");
  expect_refused(with_runs({{1, 4, 8, 62, 4}}), Code::kInvalidArgument,
                 "runs[0].dst_begin = 62 with length 4 must lie in [0, 64)");
  expect_refused(with_runs({{1, 4, 8, 4, 2}, {1, 1, 9, 6, 1}}), Code::kFailedPrecondition,
                 "runs[1].src_begin = 9: position 1 of sequence 1 is in slot 1, not 9");
  expect_refused(with_runs({{1, 6, 8, 4, 4}}), Code::kFailedPrecondition,
                 "runs[0]: positions [6, 10) are not all held by sequence 1, which holds 8");
  expect_refused(with_runs({{7, 0, 8, 4, 4}}), Code::kFailedPrecondition,
                 "runs[0].sequence = 7 is not a live sequence");
  expect_refused(with_runs({{1, 4, 8, 2, 4}}), Code::kFailedPrecondition,
                 "runs[0].dst_begin = 2: slots [2, 6) are not all free");

  Append(3, 2);  // takes slots 4..5, destinations of the plan
  const std::vector<int32_t> slots_now = *store_->CommittedSlots(1);
  const StoreStats stats_before = store_->Stats();
  absl::Status s = store_->ExecuteCompaction(plan);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("runs[0].dst_begin = 4: slots [4, 8) are not all free"),
            std::string::npos)
      << s;
  EXPECT_EQ(*store_->CommittedSlots(1), slots_now);
  EXPECT_EQ(store_->Stats().free_slots, stats_before.free_slots);
  Release(1);
  EXPECT_EQ(store_->ExecuteCompaction(plan).code(), absl::StatusCode::kFailedPrecondition);
  ExpectContentsIntact();
}

// Interleaved appends fragment many sequences; compaction with random budgets must plan exactly
// the per-slot reference's moves as maximal runs, converge to zero fragmentation (free space is
// ample), never exceed a budget and never lose a byte.
TEST_F(CompactionTest, RepeatedCallsConvergeToZeroFragmentation) {
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(testing::Message() << "VERIFYD_TEST_SEED=" << seed);
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
      ASSERT_EQ(Expand(plan), ReferencePlan(*store_, budget)) << "call " << calls;
      ExpectMaximalRuns(plan);
      ASSERT_TRUE(store_->ExecuteCompaction(plan).ok());
      ASSERT_EQ(store_->Stats().free_slots, free_before);
      ExpectContentsIntact();
    }
    EXPECT_EQ(store_->Stats().fragmentation.tokens_outside_first_run, 0);
    EXPECT_TRUE(store_->PlanCompaction(int64_t{1} << 40).runs.empty());
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
