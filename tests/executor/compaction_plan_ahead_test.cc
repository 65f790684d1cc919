// CompactionManager's plan made ahead (executor/compaction_manager.h): when a chunk uses a plan
// up, the next plan is made in the same Step; traffic before the next Step can make it stale, and
// then it must be re-planned, never failed, and no KV may be lost. (Here rather than in
// tests/service because this session owns tests/kvstore; it needs only the manager and a store.)
// VERIFYD_TEST_SEED reproduces a run.
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "executor/compaction_manager.h"
#include "gtest/gtest.h"
#include "kvstore/kv_storage.h"
#include "kvstore/kv_store.h"
#include "tests/executor/recording_metrics.h"
#include "tests/kvstore/kv_test_util.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using testing_kv::HashedRows;
using testing_kv::WalkFragmentation;

constexpr int kLayers = 2;
constexpr int64_t kMoveBytes = int64_t{kKvRowBytes} * kLayers;

class PlanAheadTest : public ::testing::Test {
 protected:
  static constexpr int64_t kCapacity = 1024;

  PlanAheadTest() {
    KvStoreOptions options;
    options.num_layers = kLayers;
    store_ =
        std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(kLayers, kCapacity));
  }

  bool Append(SequenceId id, int tokens) {
    const std::vector<bf16_bits> kv = HashedRows(next_tag_++, int64_t{kLayers} * tokens);
    if (!store_->Append(id, 0, kLayers, tokens, kv.data()).ok()) return false;
    for (int l = 0; l < kLayers; ++l) {
      auto& rows = written_[id][l];
      rows.insert(rows.end(), kv.begin() + static_cast<int64_t>(l) * tokens * kKvDim,
                  kv.begin() + static_cast<int64_t>(l + 1) * tokens * kKvDim);
    }
    return true;
  }

  void Release(SequenceId id) {
    ASSERT_TRUE(store_->Release(id).ok());
    written_.erase(id);
  }

  void ExpectKvIntact() {
    for (const auto& [id, layers] : written_) {
      for (const auto& [l, rows] : layers) {
        std::vector<bf16_bits> back(rows.size());
        ASSERT_TRUE(store_->ReadCommitted(id, l, back.data()).ok());
        ASSERT_EQ(back, rows) << "sequence " << id << " layer " << l;
      }
    }
  }

  testing::RecordingMetrics metrics_;
  std::unique_ptr<KvStore> store_;
  std::map<SequenceId, std::map<int, std::vector<bf16_bits>>> written_;
  uint64_t next_tag_ = 1;
};

// Sequences appended round-robin in pieces of 8, every other released: the first plan only fills
// each survivor's next hole, so more plans follow. A chunk holds a whole plan, so the first Step
// uses it up and plans ahead; a new sequence then takes the lowest free slots, which that plan
// meant to fill, leaving 64 free at the top (room to relocate a whole sequence).
TEST_F(PlanAheadTest, AStalePlanMadeAheadIsRePlanned) {
  for (int round = 0; round < 4; ++round) {
    for (SequenceId id = 1; id <= 16; ++id) ASSERT_TRUE(Append(id, 8));
  }
  for (SequenceId id = 2; id <= 16; id += 2) Release(id);
  CompactionManager manager(8, kCapacity * kMoveBytes, &metrics_);
  const std::string id = manager.Create(0);
  ASSERT_TRUE(manager.Step(*store_));
  const CompactionOperation first = *manager.Get(id);
  ASSERT_EQ(first.state, CompactionOperation::State::kRunning);
  ASSERT_EQ(first.chunks, 1);
  ASSERT_EQ(first.plans, 2) << "the first plan fits one chunk: the second is made ahead";
  ASSERT_GT(store_->Stats().free_slots, 64);
  ASSERT_TRUE(Append(100, static_cast<int>(store_->Stats().free_slots) - 64));
  for (int i = 0; i < 1000 && manager.Step(*store_); ++i) {
  }
  const CompactionOperation op = *manager.Get(id);
  EXPECT_EQ(op.state, CompactionOperation::State::kDone) << op.error;
  EXPECT_TRUE(op.error.empty()) << op.error;
  EXPECT_GE(op.plans, 3);
  EXPECT_GT(op.tokens_moved, first.tokens_moved);
  EXPECT_EQ(op.after, WalkFragmentation(*store_));
  ExpectKvIntact();
}

// Random traffic between Steps (appends, releases), random chunk sizes, operations one after
// another: after every Step each sequence reads back exactly what it was given, the figures match
// a walk, and no operation fails.
TEST_F(PlanAheadTest, RandomTrafficBetweenStepsLosesNothing) {
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(::testing::Message() << "reproduce with VERIFYD_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  int64_t moved = 0, plans = 0, operations = 0;
  for (int round = 0; round < 120; ++round) {
    CompactionManager manager(4, (1 + uniform(64)) * kMoveBytes, &metrics_);
    const std::string id = manager.Create(uniform(2) == 0 ? 0 : (1 + uniform(300)) * kMoveBytes);
    ++operations;
    for (int step = 0; step < 200; ++step) {
      const int traffic = static_cast<int>(uniform(4));
      for (int t = 0; t < traffic; ++t) {
        const SequenceId seq = 1 + uniform(12);
        // Releases keep the pool around two thirds full: room to move, and holes to fill.
        const bool crowded = store_->Stats().free_slots < kCapacity / 3;
        if (uniform(crowded ? 2 : 6) == 0 && written_.contains(seq)) {
          Release(seq);
        } else {
          (void)Append(seq, 1 + static_cast<int>(uniform(16)));
        }
      }
      const bool more = manager.Step(*store_);
      ASSERT_NO_FATAL_FAILURE(ExpectKvIntact()) << "round " << round << " step " << step;
      ASSERT_EQ(store_->Stats().fragmentation, WalkFragmentation(*store_));
      if (!more) break;
    }
    const CompactionOperation op = *manager.Get(id);
    ASSERT_NE(op.state, CompactionOperation::State::kFailed) << op.error;
    moved += op.tokens_moved;
    plans += op.plans;
  }
  // Plans beyond each operation's first are made ahead (or after a stale chunk), and traffic met
  // them: typically 100-200 of them, 4000-10000 slots moved.
  EXPECT_GT(moved, 1500);
  EXPECT_GE(plans, operations + 40);
}

}  // namespace
}  // namespace verifyd
