// Host-only checks of the CUDA backend's slot mirror bookkeeping (backend/cuda/cuda_slot_mirror.h):
// random life cycles of sequences (appends, verifies on several layers, commits, compactions,
// releases, id reuse) against a plain model, with the device arena emulated on the host. After
// every call, every list of the batch must read back from the emulated arena exactly; uploads must
// be the tail the model predicts; live regions never overlap; resets re-upload everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backend/cuda/cuda_slot_mirror.h"
#include "tests/testing/problem_builder.h"

namespace verifyd {
namespace {

constexpr int64_t kNumSlots = 1 << 20;

// What the store would hold for one sequence.
struct ModelSequence {
  uint64_t generation = 0;
  std::vector<int32_t> prefix;
  std::vector<int32_t> tree;  // empty: no pending tree
};

// What the mirror should remember, as the test predicts it.
struct Expected {
  uint64_t generation = 0;
  int64_t mirrored = 0;
  std::vector<int32_t> tree;
};

class MirrorHarness {
 public:
  MirrorHarness(int64_t arena_entries, uint64_t seed)
      : mirror_(arena_entries), rng_(seed), device_(arena_entries, -1) {}

  int32_t RandomSlot() { return static_cast<int32_t>(rng_() % kNumSlots); }
  std::vector<int32_t> RandomSlots(size_t n) {
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = RandomSlot();
    return v;
  }

  // One Verify call over `ids`; checks everything about it.
  void Verify(const std::vector<SequenceId>& ids, bool anonymous = false) {
    std::vector<VerifySlotList> lists;
    for (SequenceId id : ids) {
      const ModelSequence& s = sequences_.at(id);
      lists.push_back(VerifySlotList{id, anonymous ? 0 : s.generation, s.prefix, s.tree});
    }
    std::map<SequenceId, std::optional<SlotMirror::Region>> before;
    for (SequenceId id : ids) before[id] = mirror_.RegionOf(id);
    const SlotMirrorCounters counters_before = mirror_.counters();

    absl::StatusOr<const SlotMirrorPlan*> planned = mirror_.Plan(lists, kNumSlots);
    ASSERT_TRUE(planned.ok()) << planned.status();
    const SlotMirrorPlan& plan = **planned;
    ASSERT_EQ(plan.list_offset.size(), lists.size());
    if (plan.reset) {
      ++resets_seen_;
      expected_.clear();
      if (static_cast<int64_t>(device_.size()) < mirror_.arena_entries()) {
        device_.assign(mirror_.arena_entries(), -1);  // a new device buffer: contents lost
      }
    }
    ASSERT_LE(mirror_.arena_entries(), static_cast<int64_t>(device_.size()));

    // The upload as the staging would carry it, then the scatter kernel's work done on the host.
    SlotScatterHeader header;
    std::vector<SlotScatterRun> runs(lists.size() + 1, SlotScatterRun{-7, -7});
    std::vector<int32_t> values(plan.num_values + 1, -9);
    WriteSlotUploads(lists, plan, &header, runs.data(), values.data());
    ASSERT_EQ(header.num_runs, static_cast<int32_t>(plan.runs.size()));
    ASSERT_EQ(header.num_values, plan.num_values);
    ASSERT_EQ(values.back(), -9) << "wrote past num_values";
    for (int32_t i = 0; i < header.num_values; ++i) {
      int r = header.num_runs - 1;
      while (runs[r].value_begin > i) --r;
      ASSERT_GE(r, 0);
      device_[runs[r].arena_offset + (i - runs[r].value_begin)] = values[i];
    }

    // Every list reads back from its region.
    for (size_t b = 0; b < lists.size(); ++b) {
      const int64_t offset = plan.list_offset[b];
      const size_t n = lists[b].prefix_slots.size(), q = lists[b].tree_slots.size();
      ASSERT_LE(offset + static_cast<int64_t>(n + q), mirror_.arena_entries());
      for (size_t t = 0; t < n + q; ++t) {
        const int32_t want = t < n ? lists[b].prefix_slots[t] : lists[b].tree_slots[t - n];
        ASSERT_EQ(device_[offset + t], want) << "list " << b << " position " << t;
      }
    }

    // Each list's upload is exactly the predicted one.
    std::map<int, std::pair<int64_t, int64_t>> uploaded;  // b -> (first position, count)
    for (size_t r = 0; r < plan.runs.size(); ++r) {
      const int b = plan.run_list[r];
      const int64_t end = r + 1 < plan.runs.size() ? plan.runs[r + 1].value_begin : plan.num_values;
      ASSERT_TRUE(
          uploaded.emplace(b, std::make_pair(plan.run_first[r], end - plan.runs[r].value_begin))
              .second);
    }
    for (size_t b = 0; b < lists.size(); ++b) {
      const VerifySlotList& list = lists[b];
      const int64_t n = static_cast<int64_t>(list.prefix_slots.size());
      const int64_t total = n + static_cast<int64_t>(list.tree_slots.size());
      int64_t first = 0;  // what the model predicts
      auto e = expected_.find(list.sequence);
      const std::optional<SlotMirror::Region> now = mirror_.RegionOf(list.sequence);
      // A relocation always takes a larger region, so equal {offset, capacity} means "kept".
      const bool same_region = !anonymous && !plan.reset && e != expected_.end() &&
                               before[list.sequence].has_value() && now.has_value() &&
                               before[list.sequence]->offset == now->offset &&
                               before[list.sequence]->capacity == now->capacity;
      if (same_region && e->second.generation == list.generation) {
        first = std::min(e->second.mirrored, n);
        if (first == n && e->second.tree == std::vector<int32_t>(list.tree_slots.begin(),
                                                                 list.tree_slots.end())) {
          first = total;
        }
      }
      if (!same_region || plan.reset) first = 0;
      const auto got = uploaded.find(static_cast<int>(b));
      if (first == total) {
        EXPECT_EQ(got, uploaded.end()) << "list " << b << " needed nothing";
      } else {
        ASSERT_NE(got, uploaded.end()) << "list " << b;
        EXPECT_EQ(got->second.first, first) << "list " << b;
        EXPECT_EQ(got->second.second, total - first) << "list " << b;
      }
      if (!anonymous) {
        expected_[list.sequence] =
            Expected{list.generation, n,
                     std::vector<int32_t>(list.tree_slots.begin(), list.tree_slots.end())};
        ASSERT_TRUE(now.has_value());
        EXPECT_EQ(now->offset, plan.list_offset[b]);
        EXPECT_GE(now->capacity, total);
      }
    }
    const SlotMirrorCounters& c = mirror_.counters();
    EXPECT_EQ(c.uploaded_entries - counters_before.uploaded_entries, plan.num_values);
    EXPECT_EQ((c.full_uploads + c.delta_uploads + c.unchanged) -
                  (counters_before.full_uploads + counters_before.delta_uploads +
                   counters_before.unchanged),
              static_cast<int64_t>(lists.size()));
    CheckRegionsDisjoint(plan, anonymous);
  }

  // Live regions (and this call's one-shot ones) never overlap and lie inside the arena.
  void CheckRegionsDisjoint(const SlotMirrorPlan& plan, bool anonymous) {
    std::vector<std::pair<int64_t, int64_t>> spans;  // [begin, end)
    for (const auto& [id, s] : sequences_) {
      if (auto r = mirror_.RegionOf(id)) spans.push_back({r->offset, r->offset + r->capacity});
    }
    if (anonymous) {
      for (int32_t offset : plan.list_offset) spans.push_back({offset, offset + 1});
    }
    std::sort(spans.begin(), spans.end());
    for (size_t i = 0; i < spans.size(); ++i) {
      ASSERT_GE(spans[i].first, 0);
      ASSERT_LE(spans[i].second, mirror_.arena_entries());
      if (i > 0) ASSERT_LE(spans[i - 1].second, spans[i].first) << "regions overlap";
    }
  }

  SlotMirror mirror_;
  std::mt19937_64 rng_;
  std::vector<int32_t> device_;  // the emulated device arena
  std::map<SequenceId, ModelSequence> sequences_;
  std::map<SequenceId, Expected> expected_;
  uint64_t next_generation_ = 1;
  int resets_seen_ = 0;
};

void RunLifeCycle(int64_t arena_entries, int ops, int max_append, int* resets) {
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  MirrorHarness h(arena_entries, seed);
  std::mt19937_64& rng = h.rng_;
  int verifies = 0;
  for (int op = 0; op < ops; ++op) {
    SCOPED_TRACE(absl::StrCat("op ", op));
    std::vector<SequenceId> live;
    for (const auto& [id, s] : h.sequences_) live.push_back(id);
    const int kind = live.empty() ? 0 : static_cast<int>(rng() % 12);
    if (kind <= 1) {  // a new sequence (ids are reused on purpose) or an append
      const SequenceId id = 1 + rng() % 24;
      ModelSequence& s = h.sequences_[id];
      if (s.generation == 0) s.generation = h.next_generation_++;
      if (s.tree.empty()) {
        const std::vector<int32_t> more = h.RandomSlots(1 + rng() % max_append);
        s.prefix.insert(s.prefix.end(), more.begin(), more.end());
      }
    } else if (kind <= 7) {  // a decode step: the same batch on several layers, then a commit
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(1 + rng() % std::min<size_t>(live.size(), 6));
      for (SequenceId id : live) {
        ModelSequence& s = h.sequences_.at(id);
        if (s.tree.empty()) s.tree = h.RandomSlots(1 + rng() % 40);
      }
      const int layers = 1 + static_cast<int>(rng() % 3);
      for (int layer = 0; layer < layers; ++layer) {
        h.Verify(live);
        if (testing::Test::HasFatalFailure()) return;
        ++verifies;
      }
      for (SequenceId id : live) {
        ModelSequence& s = h.sequences_.at(id);
        const size_t k = rng() % (s.tree.size() + 1);
        s.prefix.insert(s.prefix.end(), s.tree.begin(), s.tree.begin() + k);
        s.tree.clear();
      }
    } else if (kind <= 8) {  // compaction moves some positions: a fresh generation
      ModelSequence& s = h.sequences_.at(live[rng() % live.size()]);
      for (int32_t& slot : s.prefix) {
        if (rng() % 4 == 0) slot = h.RandomSlot();
      }
      s.generation = h.next_generation_++;
    } else if (kind <= 9) {  // release; the backend is told (usually) and the id may come back
      const SequenceId id = live[rng() % live.size()];
      if (rng() % 4 != 0) h.mirror_.Forget(id);
      h.sequences_.erase(id);
    } else if (kind <= 10) {  // the concatenated form: never remembered
      std::vector<SequenceId> one = {live[rng() % live.size()]};
      ModelSequence& s = h.sequences_.at(one[0]);
      const bool had_tree = !s.tree.empty();
      if (!had_tree) s.tree = h.RandomSlots(1 + rng() % 8);
      h.Verify(one, /*anonymous=*/true);
      if (testing::Test::HasFatalFailure()) return;
      if (!had_tree) s.tree.clear();
    } else {  // a failed call: everything dropped
      h.mirror_.Clear();
      h.expected_.clear();
    }
  }
  EXPECT_GT(verifies, 0);
  const SlotMirrorCounters& c = h.mirror_.counters();
  EXPECT_GT(c.delta_uploads, 0);
  EXPECT_GT(c.unchanged, 0);
  EXPECT_GT(c.full_uploads, 0);
  *resets = h.resets_seen_;
  EXPECT_EQ(c.resets, h.resets_seen_);
}

TEST(SlotMirror, RandomLifeCycleMatchesTheModel) {
  int resets = 0;
  RunLifeCycle(/*arena_entries=*/1 << 20, 3000, 200, &resets);
  EXPECT_EQ(resets, 0) << "a roomy arena never resets";
}

TEST(SlotMirror, TinyArenaResetsAndGrowsAndStaysCorrect) {
  int resets = 0;
  RunLifeCycle(/*arena_entries=*/512, 3000, 300, &resets);
  EXPECT_GT(resets, 0);
}

TEST(SlotMirror, DecodeStepsUploadOnlyTheCommittedTailAndTheTree) {
  SlotMirror mirror(1 << 16);
  std::mt19937_64 rng(test::TestSeed());
  std::vector<int32_t> prefix(1000);
  for (int32_t& s : prefix) s = static_cast<int32_t>(rng() % kNumSlots);
  std::vector<int32_t> tree(16);
  int64_t mirrored = -1;
  for (int step = 0; step < 50; ++step) {
    for (int32_t& s : tree) s = static_cast<int32_t>(rng() % kNumSlots);
    for (int layer = 0; layer < 4; ++layer) {
      const VerifySlotList list{42, 7, prefix, tree};
      absl::StatusOr<const SlotMirrorPlan*> plan = mirror.Plan({&list, 1}, kNumSlots);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t n = static_cast<int64_t>(prefix.size());
      int64_t want = 0;
      if (layer > 0) {
        want = 0;
      } else if (mirrored < 0 || (*plan)->runs.empty() || (*plan)->run_first[0] == 0) {
        want = n + 16;  // first call, or the region was outgrown and moved
      } else {
        want = n - mirrored + 16;
      }
      EXPECT_EQ((*plan)->num_values, want) << "step " << step << " layer " << layer;
      mirrored = n;
    }
    const size_t k = 1 + rng() % tree.size();
    prefix.insert(prefix.end(), tree.begin(), tree.begin() + k);
  }
  EXPECT_EQ(mirror.counters().resets, 0);
  EXPECT_EQ(mirror.counters().unchanged, 50 * 3);
  EXPECT_GE(mirror.counters().delta_uploads, 45) << "regions have headroom: few relocations";
}

TEST(SlotMirror, BadValuesAreRefusedAndChangeNothing) {
  SlotMirror mirror(4096);
  const std::vector<int32_t> prefix = {5, 9, 2, 7}, tree = {11, 12};
  const VerifySlotList good{3, 1, prefix, tree};
  ASSERT_TRUE(mirror.Plan({&good, 1}, 100).ok());
  const SlotMirror::Region region = *mirror.RegionOf(3);
  const SlotMirrorCounters counters = mirror.counters();

  std::vector<int32_t> longer = prefix;
  longer.push_back(11);
  longer.push_back(100);  // == num_slots: out of range
  const std::vector<int32_t> next_tree = {20};
  const VerifySlotList bad{3, 1, longer, next_tree};
  absl::Status s = mirror.Plan({&bad, 1}, 100).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slot_lists[0].prefix_slots[5] = 100"), std::string::npos) << s;
  const std::vector<int32_t> negative_tree = {-1};
  const VerifySlotList bad_tree{3, 1, prefix, negative_tree};
  s = mirror.Plan({&bad_tree, 1}, 100).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slot_lists[0].tree_slots[0] = -1"), std::string::npos) << s;
  const VerifySlotList twice[2] = {good, good};
  s = mirror.Plan(twice, 100).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("appears twice"), std::string::npos) << s;

  EXPECT_EQ(mirror.RegionOf(3)->offset, region.offset);
  EXPECT_EQ(mirror.counters().uploaded_entries, counters.uploaded_entries);
  // Still the old state: the good list again needs nothing; the tail alone is uploaded next.
  absl::StatusOr<const SlotMirrorPlan*> again = mirror.Plan({&good, 1}, 100);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->num_values, 0);
  longer.back() = 13;
  const VerifySlotList fixed{3, 1, longer, next_tree};
  again = mirror.Plan({&fixed, 1}, 100);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ((*again)->runs.size(), 1u);
  EXPECT_EQ((*again)->run_first[0], 4);
  EXPECT_EQ((*again)->num_values, 3);
}

TEST(SlotArena, AllocationsNeverOverlapAndFreesCoalesce) {
  std::mt19937_64 rng(test::TestSeed());
  SlotArena arena(10000);
  std::map<int64_t, int64_t> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      const int64_t want = 1 + static_cast<int64_t>(rng() % 700);
      if (std::optional<int64_t> at = arena.Allocate(want)) {
        auto next = live.lower_bound(*at);
        if (next != live.end()) ASSERT_LE(*at + want, next->first);
        if (next != live.begin()) ASSERT_LE(std::prev(next)->first + std::prev(next)->second, *at);
        ASSERT_LE(*at + want, arena.size());
        live.emplace(*at, want);
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      arena.Free(it->first, it->second);
      live.erase(it);
    }
    int64_t used = 0;
    for (const auto& [offset, length] : live) used += length;
    ASSERT_EQ(arena.free_entries(), arena.size() - used);
  }
  for (const auto& [offset, length] : live) arena.Free(offset, length);
  // Everything coalesced back into one run.
  EXPECT_EQ(arena.Allocate(10000), std::optional<int64_t>(0));
}

// The problem-level checks with slot lists: sizes against prefix_len and Q_b; the rest (masks,
// tree slots, heads) through the reference validation; prefix slots not read.
TEST(SlotMirror, ValidateProblemWithSlotListsNamesTheField) {
  test::HostProblem host = test::MakeRandomProblem(
      {{300, 12, test::TreeShape::kRandom}, {40, 5, test::TreeShape::kForest}}, 4, test::TestSeed(),
      /*scattered=*/true, 9);
  VerifyProblem p = host.problem();
  std::vector<VerifySlotList> lists;
  for (int b = 0; b < 2; ++b) {
    const int32_t* at = host.slots.data() + host.slot_indptr[b];
    const int n = host.prefix_len[b], q = host.qo_indptr[b + 1] - host.qo_indptr[b];
    lists.push_back({static_cast<SequenceId>(b + 1),
                     1,
                     {at, static_cast<size_t>(n)},
                     {at + n, static_cast<size_t>(q)}});
  }
  p.slots = nullptr;
  p.slot_indptr = nullptr;
  EXPECT_TRUE(ValidateProblemWithSlotLists(p, lists).ok());

  absl::Status s = ValidateProblemWithSlotLists(p, absl::MakeConstSpan(lists).subspan(0, 1));
  EXPECT_NE(s.message().find("slot_lists has 1 entries; must equal batch = 2"), std::string::npos)
      << s;
  std::vector<VerifySlotList> short_prefix = lists;
  short_prefix[1].prefix_slots.remove_suffix(1);
  s = ValidateProblemWithSlotLists(p, short_prefix);
  EXPECT_NE(s.message().find("slot_lists[1].prefix_slots has 39 entries; must equal "
                             "prefix_len[1] = 40"),
            std::string::npos)
      << s;
  std::vector<VerifySlotList> short_tree = lists;
  short_tree[0].tree_slots.remove_suffix(1);
  s = ValidateProblemWithSlotLists(p, short_tree);
  EXPECT_NE(s.message().find("slot_lists[0].tree_slots has 11 entries"), std::string::npos) << s;

  // A tree slot out of the pool, and a mask row without its own bit.
  std::vector<int32_t> tree(lists[1].tree_slots.begin(), lists[1].tree_slots.end());
  tree[2] = static_cast<int32_t>(p.num_slots);
  std::vector<VerifySlotList> bad_tree = lists;
  bad_tree[1].tree_slots = tree;
  EXPECT_EQ(ValidateProblemWithSlotLists(p, bad_tree).code(), absl::StatusCode::kInvalidArgument);
  const uint64_t saved_mask = host.mask_bits[0];
  host.mask_bits[0] = 0;
  s = ValidateProblemWithSlotLists(p, lists);
  EXPECT_NE(s.message().find("(the node itself) must be set"), std::string::npos) << s;
  host.mask_bits[0] = saved_mask;
  // Prefix slots are not read here: the mirror checks the ones it uploads.
  const std::vector<int32_t> wild(lists[0].prefix_slots.size(), -5);
  std::vector<VerifySlotList> wild_prefix = lists;
  wild_prefix[0].prefix_slots = wild;
  EXPECT_TRUE(ValidateProblemWithSlotLists(p, wild_prefix).ok());
}

}  // namespace
}  // namespace verifyd
