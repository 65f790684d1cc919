// The fragmentation figures KvStore keeps incrementally (kvstore/fragmentation_tracker.h) against a
// from-scratch walk of every slot list: the tracker alone on random lists and rewrites, and the
// store after every one of many random operations (appends, trees with scattered accepted paths,
// releases, compaction plans executed whole, cut into chunks mid-run, or shuffled).
// VERIFYD_TEST_SEED reproduces a run.
#include "kvstore/fragmentation_tracker.h"

#include <algorithm>
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
using testing_kv::WalkFragmentation;

// One list's figures from scratch.
FragmentationStats Walk(const std::map<SequenceId, std::vector<int32_t>>& lists) {
  FragmentationStats stats;
  for (const auto& [id, slots] : lists) {
    ++stats.sequences;
    if (slots.empty()) continue;
    int64_t first_run = 1;
    while (first_run < static_cast<int64_t>(slots.size()) &&
           slots[first_run] == slots[first_run - 1] + 1) {
      ++first_run;
    }
    int64_t runs = 1;
    for (size_t p = 1; p < slots.size(); ++p) runs += slots[p] != slots[p - 1] + 1;
    stats.tokens += static_cast<int64_t>(slots.size());
    stats.runs += runs;
    stats.tokens_outside_first_run += static_cast<int64_t>(slots.size()) - first_run;
  }
  return stats;
}

// Slot values are small (0..63) so that random pieces often continue one another: breaks appear
// and disappear, and the first break moves both ways.
TEST(FragmentationTrackerTest, RandomExtendsAndRewritesMatchAWalk) {
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(::testing::Message() << "reproduce with VERIFYD_TEST_SEED=" << seed);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  FragmentationTracker tracker;
  std::map<SequenceId, std::vector<int32_t>> lists;
  int64_t rewrites_moving_first_break = 0;
  for (int step = 0; step < 20000; ++step) {
    const SequenceId id = 1 + uniform(6);
    const int dice = static_cast<int>(uniform(100));
    auto it = lists.find(id);
    if (it == lists.end()) {
      tracker.Add(id);
      lists[id];
    } else if (dice < 5) {
      tracker.Remove(id);
      lists.erase(it);
    } else if (dice < 40 || it->second.size() < 2) {
      // Growth: a piece of consecutive slots, sometimes continuing the last one.
      std::vector<int32_t>& slots = it->second;
      const int64_t old_length = static_cast<int64_t>(slots.size());
      const int32_t start =
          !slots.empty() && uniform(2) == 0 ? slots.back() + 1 : static_cast<int32_t>(uniform(64));
      for (int64_t i = 0, n = 1 + uniform(6); i < n; ++i) {
        slots.push_back(start + static_cast<int32_t>(i));
      }
      tracker.Extend(id, slots, old_length);
    } else {
      // A compaction-like rewrite: one or two position ranges get consecutive new slots.
      std::vector<int32_t>& slots = it->second;
      const int64_t n = static_cast<int64_t>(slots.size());
      const int64_t first_run_before = tracker.FirstRunLength(id);
      std::vector<int64_t> boundaries;
      for (int r = 0, ranges = 1 + static_cast<int>(uniform(2)); r < ranges; ++r) {
        const int64_t begin = uniform(n);
        const int64_t length = 1 + uniform(std::min<int64_t>(n - begin, 8));
        // Often the slots that continue the previous position, or that the next one continues.
        int32_t dst = static_cast<int32_t>(uniform(64));
        if (begin > 0 && uniform(3) == 0) dst = slots[begin - 1] + 1;
        if (begin + length < n && uniform(3) == 0) {
          dst = slots[begin + length] - static_cast<int32_t>(length);
        }
        for (int64_t i = 0; i < length; ++i) boundaries.push_back(begin + i);
        boundaries.push_back(begin + length);
        std::vector<int32_t> next = slots;
        for (int64_t i = 0; i < length; ++i) next[begin + i] = dst + static_cast<int32_t>(i);
        // Report every boundary of the range once (a superset of the changeable ones is fine).
        std::sort(boundaries.begin(), boundaries.end());
        boundaries.erase(std::unique(boundaries.begin(), boundaries.end()), boundaries.end());
        std::vector<FragmentationTracker::BoundaryChange> changes;
        for (int64_t p : boundaries) {
          if (p < 1 || p >= n) continue;
          changes.push_back(
              {p, FragmentationTracker::IsBreak(slots, p), FragmentationTracker::IsBreak(next, p)});
        }
        slots = std::move(next);
        tracker.Rewrite(id, slots, changes);
        boundaries.clear();
      }
      rewrites_moving_first_break += tracker.FirstRunLength(id) != first_run_before;
    }
    ASSERT_EQ(tracker.totals(), Walk(lists)) << "step " << step;
    for (const auto& [sid, slots] : lists) {
      FragmentationStats one = Walk({{sid, slots}});
      ASSERT_EQ(tracker.FirstRunLength(sid), one.tokens - one.tokens_outside_first_run)
          << "sequence " << sid << " step " << step;
    }
  }
  // Otherwise the scan after a removed first break and the move back to an earlier one went
  // untested.
  EXPECT_GT(rewrites_moving_first_break, 1000);
}

// The store after each of many random operations on a small, crowded pool.
class StoreFragmentationCheck {
 public:
  explicit StoreFragmentationCheck(uint64_t seed) : rng_(seed) {
    KvStoreOptions options;
    options.num_layers = 1;
    options.max_tree_nodes = 16;
    store_ = std::make_unique<KvStore>(options, std::make_unique<HostKvStorage>(1, kCapacity));
  }

  void Step() {
    const SequenceId id = 1 + Uniform(kSequences);
    const int dice = static_cast<int>(Uniform(100));
    if (dice < 30) {
      const int tokens = 1 + static_cast<int>(Uniform(24));
      if (store_->Append(id, 0, 1, tokens, HashedRows(id, tokens).data()).ok()) ++appends_;
    } else if (dice < 50) {
      Tree(id);
    } else if (dice < 58) {
      (void)store_->Release(id);
    } else {
      Compact();
    }
    ASSERT_EQ(store_->Stats().fragmentation, WalkFragmentation(*store_));
    int64_t pending = 0;
    for (SequenceId s : store_->Sequences()) {
      if (auto view = store_->GetVerifyView(s); view.ok()) pending += view->tree_slots.size();
    }
    ASSERT_EQ(store_->Stats().pending_slots, pending);
    fragmented_seen_ += store_->Stats().fragmentation.tokens_outside_first_run > 0;
  }

  int64_t appends() const { return appends_; }
  int64_t slots_moved() const { return slots_moved_; }
  int64_t fragmented_seen() const { return fragmented_seen_; }

 private:
  static constexpr int64_t kCapacity = 2048;
  static constexpr int kSequences = 24;

  int64_t Uniform(int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }

  // Begins a tree, writes it, and commits a random root-to-node path (or leaves it pending, or
  // rejects it): the accepted slots of a branchy tree are scattered.
  void Tree(SequenceId id) {
    if (!store_->Contains(id)) return;
    if (!store_->GetVerifyView(id).ok()) {
      const int q = 1 + static_cast<int>(Uniform(12));
      VerifyItem item;
      item.sequence = id;
      for (int i = 0; i < q; ++i) item.parents.push_back(i == 0 ? -1 : Uniform(i + 1) - 1);
      if (!store_->PrepareVerify(0, {item}).ok()) return;
      ASSERT_TRUE(store_->WriteTreeLayer(id, 0, HashedRows(id + 100, q).data()).ok());
      parents_[id] = item.parents;
      if (Uniform(3) == 0) return;  // stays pending for a while
    }
    const std::vector<int32_t>& parents = parents_[id];
    CommitPath path;
    if (Uniform(5) != 0) {
      for (int32_t node = static_cast<int32_t>(Uniform(static_cast<int64_t>(parents.size())));
           node >= 0; node = parents[node]) {
        path.accepted_path.push_back(node);
      }
      std::reverse(path.accepted_path.begin(), path.accepted_path.end());
    }
    ASSERT_TRUE(store_->Commit(id, path).ok());
  }

  // A plan executed whole, in chunks cut anywhere inside runs (as the compaction manager does),
  // or with its runs shuffled (owners no longer grouped: the store must sort the boundaries).
  void Compact() {
    const int64_t move_bytes = kKvRowBytes;
    const CompactionPlan plan = store_->PlanCompaction((1 + Uniform(400)) * move_bytes);
    const int mode = static_cast<int>(Uniform(3));
    std::vector<CompactionPlan> chunks;
    if (mode == 0) {
      chunks.push_back(plan);
    } else if (mode == 1) {
      const int64_t chunk_slots = 1 + Uniform(40);
      CompactionPlan chunk;
      for (const CompactionRun& run : plan.runs) {
        for (int32_t offset = 0; offset < run.length;) {
          const auto take = static_cast<int32_t>(std::min<int64_t>(
              run.length - offset, chunk_slots - static_cast<int64_t>(chunk.slots())));
          chunk.runs.push_back({run.sequence, run.position + offset, run.src_begin + offset,
                                run.dst_begin + offset, take});
          offset += take;
          if (chunk.slots() == chunk_slots) chunks.push_back(std::exchange(chunk, {}));
        }
      }
      if (!chunk.runs.empty()) chunks.push_back(chunk);
    } else {
      CompactionPlan shuffled = plan;
      std::shuffle(shuffled.runs.begin(), shuffled.runs.end(), rng_);
      chunks.push_back(shuffled);
    }
    for (CompactionPlan& chunk : chunks) {
      chunk.bytes_per_slot = plan.bytes_per_slot;
      ASSERT_TRUE(store_->ExecuteCompaction(chunk).ok());
      slots_moved_ += chunk.slots();
      ASSERT_EQ(store_->Stats().fragmentation, WalkFragmentation(*store_));
    }
  }

  std::mt19937_64 rng_;
  std::unique_ptr<KvStore> store_;
  std::map<SequenceId, std::vector<int32_t>> parents_;
  int64_t appends_ = 0, slots_moved_ = 0, fragmented_seen_ = 0;
};

TEST(FragmentationTrackerTest, StoreFiguresMatchAWalkAfterEveryOperation) {
  const uint64_t seed = testing_kv::TestSeed();
  SCOPED_TRACE(::testing::Message() << "reproduce with VERIFYD_TEST_SEED=" << seed);
  StoreFragmentationCheck check(seed);
  for (int step = 0; step < 30000; ++step) {
    check.Step();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "operation " << step;
  }
  // The run must have fragmented the pool and compacted it, or it proves little.
  EXPECT_GT(check.appends(), 5000);
  EXPECT_GT(check.slots_moved(), 20000);
  EXPECT_GT(check.fragmented_seen(), 10000);
}

}  // namespace
}  // namespace verifyd
