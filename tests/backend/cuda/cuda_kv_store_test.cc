// A KvStore over CudaKvStorage and a twin over HostKvStorage receive the same random life cycle:
// appends, verify steps over every layer (tree KV writes + attention on the GPU), commits, live
// compaction and releases. Slot tables, statistics and every committed row must stay identical,
// and every Verify (often over slots that compaction moved) must match the float64 oracle.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "kvstore/kv_storage.h"
#include "kvstore/kv_store.h"
#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/kvstore/kv_test_util.h"
#include "tests/testing/fp8_test_rows.h"
#include "tests/testing/problem_builder.h"
#include "verify/bf16.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

constexpr int kLayers = 3;
constexpr int kHeads = 4;
constexpr int64_t kCapacity = 2500;
constexpr double kTolerance = 1e-2;

class TwinStores {
 public:
  TwinStores(std::unique_ptr<KvStorage> cuda_storage, std::mt19937_64* rng) : rng_(*rng) {
    KvStoreOptions options;
    options.num_layers = kLayers;
    options.max_tree_nodes = 64;
    auto host_storage = std::make_unique<HostKvStorage>(kLayers, kCapacity);
    host_storage_ = host_storage.get();
    cuda_ = std::make_unique<KvStore>(options, std::move(cuda_storage));
    host_ = std::make_unique<KvStore>(options, std::move(host_storage));
  }

  KvStore& cuda() { return *cuda_; }
  KvStore& host() { return *host_; }
  const HostKvStorage& host_storage() const { return *host_storage_; }

  void ExpectIdentical() {
    const StoreStats a = cuda_->Stats(), b = host_->Stats();
    ASSERT_EQ(a.used_slots, b.used_slots);
    ASSERT_EQ(a.pending_slots, b.pending_slots);
    ASSERT_EQ(a.fragmentation.runs, b.fragmentation.runs);
    ASSERT_EQ(cuda_->Sequences(), host_->Sequences());
    for (SequenceId seq : host_->Sequences()) {
      ASSERT_EQ(*cuda_->CommittedSlots(seq), *host_->CommittedSlots(seq));
      const std::vector<int64_t> fill = *host_->LayerFill(seq);
      for (int layer = 0; layer < kLayers; ++layer) {
        std::vector<bf16_bits> want(static_cast<size_t>(fill[layer]) * kKvDim);
        std::vector<bf16_bits> got(want.size(), 0xFFFF);
        ASSERT_TRUE(host_->ReadCommitted(seq, layer, want.data()).ok());
        ASSERT_TRUE(cuda_->ReadCommitted(seq, layer, got.data()).ok());
        ASSERT_EQ(got, want) << "sequence " << seq << " layer " << layer;
      }
    }
  }

 private:
  std::mt19937_64& rng_;
  HostKvStorage* host_storage_ = nullptr;
  std::unique_ptr<KvStore> cuda_, host_;
};

TEST(CudaKvStore, RandomLifeCycleMatchesHostTwinAndTheOracle) {
  if (!test::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto made = test::MakeBackend(/*cuda_graphs=*/true, kLayers, kCapacity);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& backend = *made->backend;
  TwinStores twins(std::move(made->storage), &rng);
  SequenceId next_id = 1;
  int verifies = 0, compactions_moving = 0;

  for (int op = 0; op < 160; ++op) {
    SCOPED_TRACE("op " + std::to_string(op));
    std::vector<SequenceId> live = twins.host().Sequences();
    const int kind = live.empty() ? 0 : static_cast<int>(rng() % 10);
    if (kind <= 2) {  // append to a new or a live sequence
      const SequenceId seq =
          (live.empty() || rng() % 3 == 0) ? next_id++ : live[rng() % live.size()];
      const int tokens = 1 + static_cast<int>(rng() % 60);
      const std::vector<bf16_bits> kv =
          test::RandomValues(rng, static_cast<size_t>(kLayers) * tokens * kKvDim, 1.f);
      const absl::Status a = twins.cuda().Append(seq, 0, kLayers, tokens, kv.data());
      const absl::Status b = twins.host().Append(seq, 0, kLayers, tokens, kv.data());
      ASSERT_EQ(a.code(), b.code()) << a << " vs " << b;
    } else if (kind <= 6) {  // one decode step over every layer, then a commit
      std::shuffle(live.begin(), live.end(), rng);
      live.resize(std::min<size_t>(live.size(), 1 + rng() % 4));
      std::vector<VerifyItem> items(live.size());
      for (size_t i = 0; i < live.size(); ++i) {
        items[i].sequence = live[i];
        items[i].parents = test::MakeParents(static_cast<test::TreeShape>(rng() % 4),
                                             1 + static_cast<int>(rng() % 40), rng);
      }
      const absl::Status a = twins.cuda().PrepareVerify(0, items);
      const absl::Status b = twins.host().PrepareVerify(0, items);
      ASSERT_EQ(a.code(), b.code()) << a << " vs " << b;
      if (!a.ok()) continue;
      for (int layer = 0; layer < kLayers; ++layer) {
        if (layer > 0) {
          ASSERT_TRUE(twins.cuda().PrepareVerify(layer, items).ok());
          ASSERT_TRUE(twins.host().PrepareVerify(layer, items).ok());
        }
        test::HostProblem reference;  // host twin's layer; holds the index arrays
        reference.num_heads = kHeads;
        reference.scale = 0.07216878f;
        reference.qo_indptr = {0};
        reference.slot_indptr = {0};
        reference.mask_indptr = {0};
        for (const VerifyItem& item : items) {
          const int q = static_cast<int>(item.parents.size());
          const std::vector<bf16_bits> tree_kv = test::RandomValues(rng, size_t(q) * kKvDim, 1.f);
          ASSERT_TRUE(twins.cuda().WriteTreeLayer(item.sequence, layer, tree_kv.data()).ok());
          ASSERT_TRUE(twins.host().WriteTreeLayer(item.sequence, layer, tree_kv.data()).ok());
          const VerifyView cv = *twins.cuda().GetVerifyView(item.sequence);
          const VerifyView hv = *twins.host().GetVerifyView(item.sequence);
          ASSERT_TRUE(absl::c_equal(cv.prefix_slots, hv.prefix_slots));
          ASSERT_TRUE(absl::c_equal(cv.tree_slots, hv.tree_slots));
          ASSERT_EQ(cv.prefix_len, hv.prefix_len);
          reference.prefix_len.push_back(hv.prefix_len);
          reference.qo_indptr.push_back(reference.qo_indptr.back() + q);
          reference.slots.insert(reference.slots.end(), hv.prefix_slots.begin(),
                                 hv.prefix_slots.end());
          reference.slots.insert(reference.slots.end(), hv.tree_slots.begin(), hv.tree_slots.end());
          reference.slot_indptr.push_back(static_cast<int32_t>(reference.slots.size()));
          reference.mask_bits.insert(reference.mask_bits.end(), hv.mask->bits().begin(),
                                     hv.mask->bits().end());
          reference.mask_indptr.push_back(static_cast<int32_t>(reference.mask_bits.size()));
        }
        const int total_q = reference.qo_indptr.back();
        reference.q = test::RandomValues(rng, size_t(total_q) * kHeads * kKvDim, 3.f);
        reference.out.assign(size_t(total_q) * kHeads * kVDim, 0);
        reference.lse.assign(size_t(total_q) * kHeads, 0.f);
        reference.Poison();
        VerifyProblem problem = reference.problem();
        ASSERT_TRUE(backend.ComputeVerify(layer, problem).ok());
        VerifyProblem on_host = problem;
        on_host.kv = twins.host_storage().layer_data(layer);
        on_host.num_slots = kCapacity;
        const test::Accuracy acc = test::CompareToF64(on_host, reference.out, reference.lse);
        EXPECT_LE(acc.out, kTolerance);
        EXPECT_LE(acc.lse, kTolerance);
        ++verifies;
      }
      for (const VerifyItem& item : items) {
        CommitPath path{test::RandomPath(item.parents, rng)};
        ASSERT_TRUE(twins.cuda().Commit(item.sequence, path).ok());
        ASSERT_TRUE(twins.host().Commit(item.sequence, path).ok());
      }
    } else if (kind <= 8) {  // live compaction with a random budget
      const int64_t budget =
          int64_t{kLayers} * kKvRowBytes * (1 + static_cast<int64_t>(rng() % 200));
      const CompactionPlan a = twins.cuda().PlanCompaction(budget);
      const CompactionPlan b = twins.host().PlanCompaction(budget);
      ASSERT_EQ(a.runs, b.runs);
      ASSERT_TRUE(twins.cuda().ExecuteCompaction(a).ok());
      ASSERT_TRUE(twins.host().ExecuteCompaction(b).ok());
      if (!a.runs.empty()) ++compactions_moving;
    } else {  // release
      const SequenceId seq = live[rng() % live.size()];
      ASSERT_TRUE(twins.cuda().Release(seq).ok());
      ASSERT_TRUE(twins.host().Release(seq).ok());
    }
    twins.ExpectIdentical();
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(verifies, 0);
  RecordProperty("verifies", verifies);
  RecordProperty("compactions_moving", compactions_moving);
}

// Append from device memory (the data plane's registered regions): the rows land where host rows
// would (the twin appends the same bytes from the host), and a value out of SPEC §1's bound in any
// layer of a chunk refuses the whole Append, naming the layer, row and element, keeping nothing.
TEST(CudaKvStore, AppendFromDeviceRowsMatchesHostAppendAndBadValuesKeepNothing) {
  if (!test::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto made = test::MakeBackend(/*cuda_graphs=*/true, kLayers, kCapacity);
  ASSERT_TRUE(made.ok()) << made.status();
  TwinStores twins(std::move(made->storage), &rng);
  const int max_tokens = 80;  // 30 Appends of at most 80 tokens fit the pool
  bf16_bits* device_kv = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_kv),
                       size_t{kLayers} * max_tokens * kKvDim * sizeof(bf16_bits)),
            cudaSuccess);
  int refused = 0;
  for (int op = 0; op < 30; ++op) {
    const SequenceId seq = 1 + rng() % 4;
    const int tokens = 1 + static_cast<int>(rng() % max_tokens);
    std::vector<bf16_bits> kv(size_t{kLayers} * tokens * kKvDim);
    for (bf16_bits& v : kv) v = static_cast<bf16_bits>(rng() & 0xbfffu);  // |v| < 2
    const bool plant = op % 4 == 3;
    int bad_layer = -1;
    if (plant) {
      bad_layer = static_cast<int>(rng() % kLayers);
      kv[(size_t{static_cast<size_t>(bad_layer)} * tokens + rng() % tokens) * kKvDim +
         rng() % kKvDim] = 0x7fc0;
    }
    ASSERT_EQ(
        cudaMemcpy(device_kv, kv.data(), kv.size() * sizeof(bf16_bits), cudaMemcpyHostToDevice),
        cudaSuccess);
    const absl::Status got = twins.cuda().Append(seq, 0, kLayers, tokens, device_kv,
                                                 AppendExpectation::Any(), RowMemory::kDevice);
    if (plant) {
      ++refused;
      // Named by kv's own shape, as the same rows from host memory are (CheckValueBound).
      const int64_t shape[] = {kLayers, tokens, kKvDim};
      EXPECT_EQ(got, CheckValueBound(kv.data(), shape, "kv"));
      EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << got;
      EXPECT_NE(got.message().find(absl::StrCat("kv[", bad_layer, ", ")), std::string::npos) << got;
    } else {
      ASSERT_TRUE(got.ok()) << got;
      ASSERT_TRUE(twins.host().Append(seq, 0, kLayers, tokens, kv.data()).ok());
    }
    twins.ExpectIdentical();
    if (::testing::Test::HasFatalFailure()) break;
  }
  EXPECT_GE(refused, 5);
  ASSERT_EQ(cudaFree(device_kv), cudaSuccess);
}

// An fp8 store: Appends of rows already in the 656-byte layout from device memory (a scheduler's
// registered buffer) against the same Appends from host memory into a host twin. Both answer the
// same, word for word (a bad row is named by the host check's message: kv[layer, token], the rule),
// a refused Append keeps nothing in either, and the committed rows stay byte-identical.
TEST(CudaKvStore, Fp8AppendFromDeviceRowsMatchesHostAppendAndBadRowsKeepNothing) {
  if (!test::HaveCudaDevice()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::TestSeed();
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto made = test::MakeBackend(CudaBackendOptions{}, kLayers, kCapacity, KvDtype::kFp8);
  ASSERT_TRUE(made.ok()) << made.status();
  KvStoreOptions options;
  options.num_layers = kLayers;
  options.max_tree_nodes = 64;
  KvStorage* cuda_storage = made->storage.get();
  auto host_owned = std::make_unique<HostKvStorage>(kLayers, kCapacity, KvDtype::kFp8);
  HostKvStorage* host_storage = host_owned.get();
  KvStore cuda(options, std::move(made->storage));
  KvStore host(options, std::move(host_owned));
  const int max_tokens = 80;
  uint8_t* device_kv = nullptr;
  ASSERT_EQ(
      cudaMalloc(reinterpret_cast<void**>(&device_kv), size_t{kLayers} * max_tokens * kFp8RowBytes),
      cudaSuccess);
  int refused = 0;
  for (int op = 0; op < 27; ++op) {
    SCOPED_TRACE("op " + std::to_string(op));
    const SequenceId seq = 1 + rng() % 4;
    const int tokens = 1 + static_cast<int>(rng() % max_tokens);
    std::vector<uint8_t> kv = testing_kv::HashedFp8Rows(rng(), int64_t{kLayers} * tokens);
    const bool plant = op % 3 == 2;
    if (plant) {
      test::PlantFp8Violation(rng, kv.data() + (rng() % (kLayers * tokens)) * kFp8RowBytes, op / 3);
    }
    ASSERT_EQ(cudaMemcpy(device_kv, kv.data(), kv.size(), cudaMemcpyHostToDevice), cudaSuccess);
    const absl::Status got =
        cuda.Append(seq, 0, kLayers, tokens, device_kv, AppendExpectation::Any(),
                    RowMemory::kDevice, KvDtype::kFp8);
    const absl::Status want =
        host.Append(seq, 0, kLayers, tokens, kv.data(), AppendExpectation::Any(), RowMemory::kHost,
                    KvDtype::kFp8);
    EXPECT_EQ(got.code(), want.code()) << got << " vs " << want;
    EXPECT_EQ(got.message(), want.message());
    EXPECT_EQ(want.ok(), !plant) << want;
    refused += !got.ok();
    ASSERT_EQ(cuda.Sequences(), host.Sequences());
    for (SequenceId s : host.Sequences()) {
      const std::vector<int32_t> slots = *host.CommittedSlots(s);
      ASSERT_EQ(*cuda.CommittedSlots(s), slots);
      for (int layer = 0; layer < kLayers; ++layer) {
        std::vector<uint8_t> a(slots.size() * kFp8RowBytes), b(a.size(), 0xAB);
        ASSERT_TRUE(host_storage->ReadEncodedRows(layer, slots, a.data()).ok());
        ASSERT_TRUE(cuda_storage->ReadEncodedRows(layer, slots, b.data()).ok());
        ASSERT_EQ(a, b) << "sequence " << s << " layer " << layer;
      }
    }
  }
  EXPECT_EQ(refused, 9);
  ASSERT_EQ(cudaFree(device_kv), cudaSuccess);
}

}  // namespace
}  // namespace verifyd
