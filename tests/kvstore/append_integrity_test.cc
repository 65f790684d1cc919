// Append's expected position (SPEC §2) and its rollback after a storage error: every refused call
// leaves the store exactly as it was (slot lists, fills, bytes, statistics, allocator).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/failing_storage.h"
#include "tests/kvstore/kv_test_util.h"

namespace verifyd {
namespace {

using testing_kv::FailingStorage;
using testing_kv::HashedRows;
using testing_kv::TestSeed;

constexpr int kLayers = 4;
constexpr int kCapacity = 256;

// Everything observable about the store, to compare before and after a refused call.
struct Snapshot {
  std::vector<SequenceId> sequences;
  std::vector<std::vector<int64_t>> fills;
  std::vector<std::vector<int32_t>> slots;
  std::vector<std::vector<bf16_bits>> rows;  // per sequence and layer, the committed bytes
  int64_t used = 0, free = 0, pending = 0, largest_free_run = 0;
  FragmentationStats fragmentation;

  bool operator==(const Snapshot& o) const {
    return sequences == o.sequences && fills == o.fills && slots == o.slots && rows == o.rows &&
           used == o.used && free == o.free && pending == o.pending &&
           largest_free_run == o.largest_free_run &&
           fragmentation.sequences == o.fragmentation.sequences &&
           fragmentation.tokens == o.fragmentation.tokens &&
           fragmentation.runs == o.fragmentation.runs &&
           fragmentation.tokens_outside_first_run == o.fragmentation.tokens_outside_first_run;
  }
};

Snapshot Take(const KvStore& store) {
  Snapshot s;
  s.sequences = store.Sequences();
  for (SequenceId id : s.sequences) {
    s.fills.push_back(*store.LayerFill(id));
    s.slots.push_back(*store.CommittedSlots(id));
    for (int l = 0; l < kLayers; ++l) {
      std::vector<bf16_bits> rows(static_cast<size_t>(s.fills.back()[l]) * kKvDim);
      EXPECT_TRUE(store.ReadCommitted(id, l, rows.data()).ok());
      s.rows.push_back(std::move(rows));
    }
  }
  const StoreStats stats = store.Stats();
  s.used = stats.used_slots;
  s.free = stats.free_slots;
  s.pending = stats.pending_slots;
  s.largest_free_run = stats.largest_free_run;
  s.fragmentation = stats.fragmentation;
  return s;
}

class AppendIntegrityTest : public ::testing::Test {
 protected:
  AppendIntegrityTest() : seed_(TestSeed()), rng_(seed_) {
    auto storage = std::make_unique<FailingStorage>(kLayers, kCapacity);
    storage_ = storage.get();
    KvStoreOptions options;
    options.num_layers = kLayers;
    store_ = std::make_unique<KvStore>(options, std::move(storage));
  }

  void SetUp() override { RecordProperty("seed", std::to_string(seed_)); }

  std::vector<bf16_bits> Rows(int layers, int tokens) {
    return HashedRows(rng_(), int64_t{layers} * tokens);
  }

  absl::Status Append(SequenceId seq, int layer_begin, int layer_count, int tokens,
                      AppendExpectation expect) {
    const std::vector<bf16_bits> kv = Rows(layer_count, tokens);
    return store_->Append(seq, layer_begin, layer_count, tokens, kv.data(), expect);
  }

  void ExpectRefused(const absl::Status& status, absl::StatusCode code,
                     const std::vector<std::string>& parts, const Snapshot& before) {
    EXPECT_EQ(status.code(), code) << status << " seed " << seed_;
    for (const std::string& part : parts) {
      EXPECT_NE(status.message().find(part), std::string::npos)
          << "'" << status.message() << "' lacks '" << part << "'";
    }
    EXPECT_TRUE(Take(*store_) == before) << "a refused Append changed the store; seed " << seed_;
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
  FailingStorage* storage_ = nullptr;
  std::unique_ptr<KvStore> store_;
};

TEST_F(AppendIntegrityTest, ChunksThatStateTheirPositionAppendInOrder) {
  const int a = 1 + static_cast<int>(rng_() % 40), b = 1 + static_cast<int>(rng_() % 40);
  ASSERT_TRUE(Append(5, 0, kLayers, a, AppendExpectation::Create()).ok());
  ASSERT_TRUE(Append(5, 0, kLayers, b, AppendExpectation::Fill(a)).ok());
  // A per-layer prefill: layer 1 alone moves ahead, then layers [2, 4) at their own fill.
  ASSERT_TRUE(Append(5, 1, 1, 3, AppendExpectation::Fill(a + b)).ok());
  ASSERT_TRUE(Append(5, 2, 2, 3, AppendExpectation::Fill(a + b)).ok());
  EXPECT_EQ(*store_->LayerFill(5), (std::vector<int64_t>{a + b, a + b + 3, a + b + 3, a + b + 3}));
  // Unset: today's behaviour for older clients (creates, or appends at each layer's fill).
  ASSERT_TRUE(Append(6, 0, kLayers, 2, AppendExpectation::Any()).ok());
  ASSERT_TRUE(Append(6, 0, kLayers, 2, AppendExpectation::Any()).ok());
  EXPECT_EQ(*store_->CommittedLength(6), 4);
}

TEST_F(AppendIntegrityTest, MismatchesAreFailedPreconditionNamingBothNumbersAndChangeNothing) {
  const int a = 2 + static_cast<int>(rng_() % 30);
  ASSERT_TRUE(Append(1, 0, kLayers, a, AppendExpectation::Create()).ok());
  ASSERT_TRUE(Append(2, 0, 2, a + 1, AppendExpectation::Create()).ok());
  const Snapshot before = Take(*store_);

  // create on a live sequence.
  ExpectRefused(Append(1, 0, kLayers, 3, AppendExpectation::Create()),
                absl::StatusCode::kFailedPrecondition,
                {"create", "sequence 1", std::to_string(a) + " committed tokens"}, before);
  // A later chunk after the sequence went away (released, expired, restarted): no re-creation.
  ExpectRefused(
      Append(9, 0, kLayers, 3, AppendExpectation::Fill(a)), absl::StatusCode::kFailedPrecondition,
      {"expected_fill = " + std::to_string(a), "sequence 9 does not exist (0 tokens)"}, before);
  // The wrong fill: too few, too many, and a range whose layers differ (layer 2 of sequence 2
  // holds 0 tokens while layers 0 and 1 hold a + 1).
  ExpectRefused(Append(1, 0, kLayers, 3, AppendExpectation::Fill(a - 1)),
                absl::StatusCode::kFailedPrecondition,
                {"expected_fill = " + std::to_string(a - 1), "holds " + std::to_string(a)}, before);
  ExpectRefused(Append(1, 1, 2, 3, AppendExpectation::Fill(a + 7)),
                absl::StatusCode::kFailedPrecondition,
                {"expected_fill = " + std::to_string(a + 7),
                 "layer 1 of sequence 1 holds " + std::to_string(a)},
                before);
  ExpectRefused(
      Append(2, 0, 3, 3, AppendExpectation::Fill(a + 1)), absl::StatusCode::kFailedPrecondition,
      {"expected_fill = " + std::to_string(a + 1), "layer 2 of sequence 2 holds 0"}, before);
  // The right numbers still work afterwards.
  EXPECT_TRUE(Append(2, 2, 2, a + 1, AppendExpectation::Fill(0)).ok());
  EXPECT_EQ(*store_->CommittedLength(2), a + 1);
}

TEST_F(AppendIntegrityTest, StorageErrorOnAnyLayerKeepsNothingOfTheCall) {
  ASSERT_TRUE(Append(1, 0, kLayers, 5, AppendExpectation::Create()).ok());
  ASSERT_TRUE(Append(2, 0, kLayers, 9, AppendExpectation::Create()).ok());
  // Every layer of the call in turn fails: for a new sequence and for an existing one.
  for (int failing = 0; failing < kLayers; ++failing) {
    const Snapshot before = Take(*store_);
    storage_->FailWritesAfter(failing);
    ExpectRefused(Append(3, 0, kLayers, 4 + failing, AppendExpectation::Create()),
                  absl::StatusCode::kInternal, {"injected device error"}, before);
    storage_->FailWritesAfter(failing);
    ExpectRefused(Append(1, 0, kLayers, 4 + failing, AppendExpectation::Fill(5)),
                  absl::StatusCode::kInternal, {"injected device error"}, before);
    storage_->Heal();
  }
  EXPECT_EQ(storage_->injected(), 2 * kLayers);
  // The healed storage takes the same calls.
  EXPECT_TRUE(Append(3, 0, kLayers, 4, AppendExpectation::Create()).ok());
  EXPECT_TRUE(Append(1, 0, kLayers, 4, AppendExpectation::Fill(5)).ok());
  EXPECT_EQ(*store_->CommittedLength(1), 9);
}

}  // namespace
}  // namespace verifyd
