// The CUDA backend with its device slot mirror under real store traffic (GPU; skips without one):
//  - 50 decode steps on every layer (prefix grows by the committed 1..Q nodes each step) through
//    a KvStore over CudaKvStorage: outputs against the float64 oracle on a host twin store (every
//    5th step; L ~ 10K), graphs on vs off identical bytes every step, the graph replayed (at most a
//    handful of captures) and the mirror uploading only tails;
//  - random appends / verifies / commits / compactions / releases with a small arena (mirror
//    resets happen): every output against the oracle on the host twin;
//  - forks sharing a fragmented prompt, compactions moving the shared runs between steps, the
//    prompt's owner released first, then random operations with forks (plans/0019).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvstore/kv_storage.h"
#include "kvstore/kv_store.h"
#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/testing/problem_builder.h"
#include "verify/bf16.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

constexpr double kTolerance = 1e-2;
constexpr float kScale = 0.07216878f;

// One store's view of a Verify batch: the index arrays, the slot lists (spans into the store) and,
// for the reference, the concatenated lists.
struct Gathered {
  std::vector<int32_t> qo_indptr{0}, prefix_len, mask_indptr{0}, slot_indptr{0}, slots;
  std::vector<uint64_t> mask_bits;
  std::vector<VerifySlotList> lists;

  VerifyProblem Problem(const std::vector<bf16_bits>& q, int heads, bf16_bits* out,
                        float* lse) const {
    VerifyProblem p;
    p.q = q.data();
    p.out = out;
    p.lse = lse;
    p.num_heads = heads;
    p.scale = kScale;
    p.batch = static_cast<int>(prefix_len.size());
    p.total_q = qo_indptr.back();
    p.qo_indptr = qo_indptr.data();
    p.prefix_len = prefix_len.data();
    p.slot_indptr = slot_indptr.data();
    p.slots = slots.data();
    p.mask_indptr = mask_indptr.data();
    p.mask_bits = mask_bits.data();
    return p;
  }
};

Gathered Gather(const KvStore& store, const std::vector<VerifyItem>& items) {
  Gathered g;
  for (const VerifyItem& item : items) {
    const VerifyView v = *store.GetVerifyView(item.sequence);
    g.qo_indptr.push_back(g.qo_indptr.back() + static_cast<int32_t>(item.parents.size()));
    g.prefix_len.push_back(v.prefix_len);
    g.mask_bits.insert(g.mask_bits.end(), v.mask->bits().begin(), v.mask->bits().end());
    g.mask_indptr.push_back(static_cast<int32_t>(g.mask_bits.size()));
    g.slots.insert(g.slots.end(), v.prefix_slots.begin(), v.prefix_slots.end());
    g.slots.insert(g.slots.end(), v.tree_slots.begin(), v.tree_slots.end());
    g.slot_indptr.push_back(static_cast<int32_t>(g.slots.size()));
    g.lists.push_back({item.sequence, v.slot_generation, v.prefix_slots, v.tree_slots});
  }
  return g;
}

// Stores that receive the same operations: CUDA stores (one per backend) and a host twin whose
// pool the oracle reads.
class Stores {
 public:
  Stores(std::vector<test::BackendWithStorage*> backends, int layers, int64_t capacity) {
    KvStoreOptions options;
    options.num_layers = layers;
    options.max_tree_nodes = 64;
    for (test::BackendWithStorage* b : backends) {
      cuda_.push_back(std::make_unique<KvStore>(options, std::move(b->storage)));
    }
    auto host_storage = std::make_unique<HostKvStorage>(layers, capacity);
    host_storage_ = host_storage.get();
    host_ = std::make_unique<KvStore>(options, std::move(host_storage));
  }

  // Applies `op` to every store; all must agree on the status code.
  template <typename Op>
  absl::Status Each(Op op) {
    const absl::Status want = op(*host_);
    for (auto& store : cuda_) {
      const absl::Status got = op(*store);
      EXPECT_EQ(got.code(), want.code()) << got << " vs " << want;
    }
    return want;
  }

  KvStore& cuda(size_t i) { return *cuda_[i]; }
  KvStore& host() { return *host_; }
  const HostKvStorage& host_storage() const { return *host_storage_; }

 private:
  std::vector<std::unique_ptr<KvStore>> cuda_;
  std::unique_ptr<KvStore> host_;
  HostKvStorage* host_storage_ = nullptr;
};

// One layer of a step on every backend; outputs against the oracle, and (with two backends)
// against each other byte for byte.
void VerifyLayer(Stores& stores, std::vector<CudaBackend*> backends, int layer,
                 const std::vector<VerifyItem>& items, int heads, std::mt19937_64& rng,
                 bool check_reference = true) {
  for (const VerifyItem& item : items) {
    const std::vector<bf16_bits> tree_kv =
        test::RandomValues(rng, item.parents.size() * kKvDim, 1.f);
    ASSERT_TRUE(stores
                    .Each([&](KvStore& s) {
                      return s.WriteTreeLayer(item.sequence, layer, tree_kv.data());
                    })
                    .ok());
  }
  const Gathered reference = Gather(stores.host(), items);
  const int total_q = reference.qo_indptr.back();
  const std::vector<bf16_bits> q = test::RandomValues(rng, size_t(total_q) * heads * kKvDim, 3.f);
  const size_t rows = size_t(total_q) * heads;
  std::vector<std::vector<bf16_bits>> outs;
  std::vector<std::vector<float>> lses;
  for (size_t i = 0; i < backends.size(); ++i) {
    const Gathered mine = Gather(stores.cuda(i), items);
    std::vector<bf16_bits> out(rows * kVDim, 0xFFFF);
    std::vector<float> lse(rows, std::nanf(""));
    VerifyProblem p = mine.Problem(q, heads, out.data(), lse.data());
    // The service's form: lists only, no concatenated arrays.
    p.slots = nullptr;
    p.slot_indptr = nullptr;
    const absl::Status s = backends[i]->ComputeVerify(layer, p, mine.lists);
    ASSERT_TRUE(s.ok()) << s;
    outs.push_back(std::move(out));
    lses.push_back(std::move(lse));
  }
  if (check_reference) {
    VerifyProblem on_host = reference.Problem(q, heads, nullptr, nullptr);
    on_host.kv = stores.host_storage().layer_data(layer);
    on_host.num_slots = stores.host_storage().capacity_slots();
    const test::ReferenceF64 want = test::ComputeReferenceF64(on_host);
    const test::Accuracy acc = test::Compare(want, outs[0], lses[0]);
    EXPECT_LE(acc.out, kTolerance);
    EXPECT_LE(acc.lse, kTolerance);
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    ASSERT_EQ(outs[i], outs[0]) << "backend " << i << " differs from backend 0";
    ASSERT_EQ(0, std::memcmp(lses[i].data(), lses[0].data(), lses[0].size() * sizeof(float)));
  }
}

TEST(CudaDecodeMirror, DecodeStepsReplayTheGraphAndUploadOnlyTails) {
  if (!test::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Long enough prefixes that 50 steps of growth (~8.5 tokens a step) cross at most one of the
  // planner's bands (1/8 of L's power of two) per sequence.
  constexpr int kLayers = 2, kHeads = 4, kNodes = 16, kSteps = 50;
  constexpr int64_t kCapacity = 32768;
  auto on = test::MakeBackend(/*cuda_graphs=*/true, kLayers, kCapacity);
  auto off = test::MakeBackend(/*cuda_graphs=*/false, kLayers, kCapacity);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE(off.ok()) << off.status();
  Stores stores({&*on, &*off}, kLayers, kCapacity);
  const std::vector<SequenceId> ids = {11, 12};
  for (SequenceId id : ids) {
    const int tokens = 9000 + static_cast<int>(rng() % 3000);
    const std::vector<bf16_bits> kv =
        test::RandomValues(rng, size_t(kLayers) * tokens * kKvDim, 1.f);
    ASSERT_TRUE(
        stores.Each([&](KvStore& s) { return s.Append(id, 0, kLayers, tokens, kv.data()); }).ok());
  }
  std::vector<int32_t> chain(kNodes);
  for (int i = 0; i < kNodes; ++i) chain[i] = i - 1;
  int calls = 0;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<VerifyItem> items;
    for (SequenceId id : ids) items.push_back({id, chain, std::nullopt});
    for (int layer = 0; layer < kLayers; ++layer) {
      ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.PrepareVerify(layer, items); }).ok());
      VerifyLayer(stores, {on->backend.get(), off->backend.get()}, layer, items, kHeads, rng,
                  /*check_reference=*/step % 5 == 0);
      if (testing::Test::HasFatalFailure()) return;
      ++calls;
    }
    for (SequenceId id : ids) {
      CommitPath path;
      const int k = 1 + static_cast<int>(rng() % kNodes);
      for (int i = 0; i < k; ++i) path.accepted_path.push_back(i);
      ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Commit(id, path); }).ok());
    }
  }
  const GraphCounters& g = on->backend->graph_counters();
  EXPECT_EQ(g.fallbacks, 0);
  EXPECT_EQ(g.warmups, kLayers);
  EXPECT_EQ(g.replays + g.warmups, calls);
  // Every layer's bucket is instantiated once; growth of L within the planner's bands is data.
  // Where a sequence's L crosses into the next band the item counts step up: one graph update
  // per sequence and layer at most.
  EXPECT_EQ(g.captures, kLayers);
  EXPECT_LE(g.updates, 2 * kLayers) << "captures " << g.captures << " updates " << g.updates;
  const SlotMirrorCounters m = on->backend->slot_mirror_counters();
  EXPECT_EQ(m.resets, 0);
  // Layer 0 of each step uploads the committed tail + the tree; later layers nothing.
  EXPECT_EQ(m.unchanged, int64_t{kSteps} * (kLayers - 1) * 2);
  EXPECT_LE(m.full_uploads, 2 * 4) << "first calls and a few region moves only";
  EXPECT_EQ(off->backend->graph_counters().replays, 0);
  RecordProperty("captures", static_cast<int>(g.captures));
  RecordProperty("updates", static_cast<int>(g.updates));
  RecordProperty("replays", static_cast<int>(g.replays));
  RecordProperty("uploaded_entries", static_cast<int>(m.uploaded_entries));
}

TEST(CudaDecodeMirror, RandomStoreOperationsWithCompactionMatchTheOracle) {
  if (!test::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kLayers = 2, kHeads = 4;
  constexpr int64_t kCapacity = 3000;
  CudaBackendOptions options;
  options.cuda_graphs = true;
  options.slot_arena_entries = 1500;  // smaller than the live lists: the mirror must reset
  auto made = test::MakeBackend(options, kLayers, kCapacity);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& backend = *made->backend;
  Stores stores({&*made}, kLayers, kCapacity);
  SequenceId next_id = 1;
  int verifies = 0, compactions_moving = 0;
  for (int op = 0; op < 200; ++op) {
    SCOPED_TRACE("op " + std::to_string(op));
    std::vector<SequenceId> live = stores.host().Sequences();
    const int kind = live.empty() ? 0 : static_cast<int>(rng() % 10);
    if (kind <= 2) {
      const SequenceId seq =
          (live.empty() || rng() % 3 == 0) ? next_id++ : live[rng() % live.size()];
      const int tokens = 1 + static_cast<int>(rng() % 80);
      const std::vector<bf16_bits> kv =
          test::RandomValues(rng, size_t(kLayers) * tokens * kKvDim, 1.f);
      stores.Each([&](KvStore& s) { return s.Append(seq, 0, kLayers, tokens, kv.data()); })
          .IgnoreError();  // RESOURCE_EXHAUSTED is fine: every store agrees
    } else if (kind <= 6) {
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(std::min<size_t>(live.size(), 1 + rng() % 4));
      std::vector<VerifyItem> items(live.size());
      for (size_t i = 0; i < live.size(); ++i) {
        items[i].sequence = live[i];
        items[i].parents = test::MakeParents(static_cast<test::TreeShape>(rng() % 4),
                                             1 + static_cast<int>(rng() % 40), rng);
      }
      if (!stores.Each([&](KvStore& s) { return s.PrepareVerify(0, items); }).ok()) continue;
      for (int layer = 0; layer < kLayers; ++layer) {
        if (layer > 0) {
          ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.PrepareVerify(layer, items); }).ok());
        }
        VerifyLayer(stores, {&backend}, layer, items, kHeads, rng);
        if (testing::Test::HasFatalFailure()) return;
        ++verifies;
      }
      for (const VerifyItem& item : items) {
        const CommitPath path{test::RandomPath(item.parents, rng)};
        ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Commit(item.sequence, path); }).ok());
      }
    } else if (kind <= 8) {
      const int64_t budget =
          int64_t{kLayers} * kKvRowBytes * (1 + static_cast<int64_t>(rng() % 300));
      const CompactionPlan a = stores.cuda(0).PlanCompaction(budget);
      const CompactionPlan b = stores.host().PlanCompaction(budget);
      ASSERT_EQ(a.bytes(), b.bytes());
      ASSERT_TRUE(stores.cuda(0).ExecuteCompaction(a).ok());
      ASSERT_TRUE(stores.host().ExecuteCompaction(b).ok());
      if (a.bytes() > 0) ++compactions_moving;
    } else {
      const SequenceId seq = live[rng() % live.size()];
      ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Release(seq); }).ok());
      // As DeviceOperations does; sometimes not, which must be harmless (a new generation).
      if (rng() % 4 != 0) backend.ForgetSequence(seq);
    }
  }
  EXPECT_GT(verifies, 0);
  const SlotMirrorCounters m = backend.slot_mirror_counters();
  EXPECT_GT(m.delta_uploads + m.unchanged, 0);
  EXPECT_GT(m.full_uploads, 0);
  RecordProperty("verifies", verifies);
  RecordProperty("compactions_moving", compactions_moving);
  RecordProperty("mirror_resets", static_cast<int>(m.resets));
  RecordProperty("mirror_grows", static_cast<int>(m.grows));
}

// Forks (plans/0019) on the device: sequences share their prefix's slots, and a compaction that
// moves a shared run rewrites every holder's list, so each holder's mirrored list must be
// refreshed (a new generation) or the kernel reads moved-away rows. A fragmented prompt, eight
// forks of it (one a fork of a fork) verified every step with graphs on and off, compactions that
// move the shared runs between steps, the prompt's owner released first; then random operations
// with forks. Every output against the float64 oracle on the host twin, both backends identical.
TEST(CudaDecodeMirror, ForksThroughCompactionAndReleaseMatchTheOracle) {
  if (!test::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kLayers = 2, kHeads = 4;
  constexpr int64_t kCapacity = 8192;
  auto on = test::MakeBackend(/*cuda_graphs=*/true, kLayers, kCapacity);
  auto off = test::MakeBackend(/*cuda_graphs=*/false, kLayers, kCapacity);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE(off.ok()) << off.status();
  Stores stores({&*on, &*off}, kLayers, kCapacity);
  const std::vector<CudaBackend*> backends = {on->backend.get(), off->backend.get()};
  auto append = [&](SequenceId seq, int tokens) {
    const std::vector<bf16_bits> kv =
        test::RandomValues(rng, size_t(kLayers) * tokens * kKvDim, 1.f);
    return stores.Each([&](KvStore& s) { return s.Append(seq, 0, kLayers, tokens, kv.data()); });
  };
  // One step on every layer for `ids`, then a random commit of each tree.
  auto step = [&](const std::vector<SequenceId>& ids) {
    std::vector<VerifyItem> items;
    for (SequenceId id : ids) {
      items.push_back({id,
                       test::MakeParents(static_cast<test::TreeShape>(rng() % 4),
                                         1 + static_cast<int>(rng() % 24), rng),
                       std::nullopt});
    }
    // A full pool refuses the trees in every store alike; nothing to verify then.
    if (!stores.Each([&](KvStore& s) { return s.PrepareVerify(0, items); }).ok()) return;
    for (int layer = 0; layer < kLayers; ++layer) {
      if (layer > 0) {
        ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.PrepareVerify(layer, items); }).ok());
      }
      VerifyLayer(stores, backends, layer, items, kHeads, rng);
      if (testing::Test::HasFatalFailure()) return;
    }
    for (const VerifyItem& item : items) {
      const CommitPath path{test::RandomPath(item.parents, rng)};
      ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Commit(item.sequence, path); }).ok());
    }
  };
  auto compact = [&](int64_t budget_slots) {
    const int64_t budget = int64_t{kLayers} * kKvRowBytes * budget_slots;
    std::vector<CompactionPlan> plans;
    for (size_t i = 0; i < backends.size(); ++i) {
      plans.push_back(stores.cuda(i).PlanCompaction(budget));
    }
    const CompactionPlan host = stores.host().PlanCompaction(budget);
    for (size_t i = 0; i < backends.size(); ++i) {
      ASSERT_EQ(plans[i].runs, host.runs);
      ASSERT_TRUE(stores.cuda(i).ExecuteCompaction(plans[i]).ok());
    }
    ASSERT_TRUE(stores.host().ExecuteCompaction(host).ok());
  };

  // The prompt (sequence 1), its prefill interleaved with a filler that then leaves.
  for (int chunk = 0; chunk < 8; ++chunk) {
    ASSERT_TRUE(append(1, 150 + static_cast<int>(rng() % 200)).ok());
    ASSERT_TRUE(append(99, 20 + static_cast<int>(rng() % 60)).ok());
  }
  ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Release(99); }).ok());
  for (CudaBackend* b : backends) b->ForgetSequence(99);
  const int64_t prompt = *stores.host().CommittedLength(1);
  std::vector<SequenceId> live = {1};
  for (SequenceId f = 2; f <= 8; ++f) {
    const int64_t k = f == 2 ? prompt : 1 + static_cast<int64_t>(rng() % prompt);
    ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Fork(1, f, k); }).ok());
    live.push_back(f);
  }
  ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Fork(2, 9, prompt / 2); }).ok());
  live.push_back(9);
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    step(live);
    if (testing::Test::HasFatalFailure()) return;
    compact(1 + static_cast<int64_t>(rng() % 400));  // moves shared runs between steps
    if (testing::Test::HasFatalFailure()) return;
    if (round == 2) {  // the prompt's owner leaves first; its forks keep the prefix
      ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Release(1); }).ok());
      for (CudaBackend* b : backends) b->ForgetSequence(1);
      live.erase(live.begin());
    }
  }
  EXPECT_GT(stores.host().Stats().shared_slots, 0);

  // Random operations with forks among them.
  SequenceId next_id = 100;
  for (int op = 0; op < 150; ++op) {
    SCOPED_TRACE("op " + std::to_string(op));
    live = stores.host().Sequences();
    const int kind = live.empty() ? 0 : static_cast<int>(rng() % 10);
    if (kind <= 1) {
      const SequenceId seq = live.empty() || rng() % 3 == 0 ? next_id++ : live[rng() % live.size()];
      append(seq, 1 + static_cast<int>(rng() % 60)).IgnoreError();  // every store agrees
    } else if (kind <= 3) {
      const SequenceId source = live[rng() % live.size()];
      const int64_t n = *stores.host().CommittedLength(source);
      if (n < 1) continue;
      const SequenceId fork = next_id++;
      const int64_t k = 1 + static_cast<int64_t>(rng() % n);
      ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Fork(source, fork, k); }).ok());
    } else if (kind <= 6) {
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(std::min<size_t>(live.size(), 1 + rng() % 4));
      step(live);
      if (testing::Test::HasFatalFailure()) return;
    } else if (kind <= 8) {
      compact(1 + static_cast<int64_t>(rng() % 300));
      if (testing::Test::HasFatalFailure()) return;
    } else {
      const SequenceId seq = live[rng() % live.size()];
      ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Release(seq); }).ok());
      for (CudaBackend* b : backends) b->ForgetSequence(seq);
    }
  }
  for (SequenceId seq : stores.host().Sequences()) {
    ASSERT_TRUE(stores.Each([&](KvStore& s) { return s.Release(seq); }).ok());
  }
  EXPECT_EQ(stores.host().Stats().free_slots, kCapacity);
  EXPECT_EQ(stores.cuda(0).Stats().free_slots, kCapacity);
}

}  // namespace
}  // namespace verifyd
