// The store over an fp8 pool (plans/0030-fp8-store.md): bf16 rows are quantized on the way in,
// rows in the 656-byte layout are kept byte for byte, bad fp8 rows are refused naming the element
// with nothing kept (inline and from memory a client may rewrite), a bf16 store refuses fp8 rows,
// and compaction and Fork move whole 656-byte rows. Stats report the dtype and the pool's bytes.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_test_util.h"
#include "verify/kv_fp8_layout.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

constexpr int kLayers = 2;

std::unique_ptr<KvStore> MakeStore(KvDtype dtype, int64_t capacity = 256) {
  KvStoreOptions options;
  options.num_layers = kLayers;
  return std::make_unique<KvStore>(options,
                                   std::make_unique<HostKvStorage>(kLayers, capacity, dtype));
}

std::vector<uint8_t> Read(const KvStore& store, SequenceId seq, int layer) {
  std::vector<uint8_t> out(static_cast<size_t>((*store.LayerFill(seq))[layer]) *
                           store.storage().row_bytes());
  EXPECT_EQ(store.ReadCommittedEncoded(seq, layer, out.data()), absl::OkStatus());
  return out;
}

TEST(KvStoreFp8, StatsReportTheDtypeAndThePoolBytes) {
  const StoreStats bf16 = MakeStore(KvDtype::kBf16, 1000)->Stats();
  const StoreStats fp8 = MakeStore(KvDtype::kFp8, 1000)->Stats();
  EXPECT_EQ(bf16.kv_dtype, KvDtype::kBf16);
  EXPECT_EQ(fp8.kv_dtype, KvDtype::kFp8);
  EXPECT_EQ(bf16.row_bytes, 1152);
  EXPECT_EQ(fp8.row_bytes, 656);
  EXPECT_EQ(bf16.pool_bytes, 1000 * kLayers * 1152);
  EXPECT_EQ(fp8.pool_bytes, 1000 * kLayers * 656);
}

TEST(KvStoreFp8, Bf16RowsAreQuantizedAndFp8RowsKeptAsTheyAre) {
  auto store = MakeStore(KvDtype::kFp8);
  const std::vector<bf16_bits> bf16 = testing_kv::HashedBoundedRows(1, kLayers * 5);
  ASSERT_EQ(store->Append(7, 0, kLayers, 5, bf16.data()), absl::OkStatus());
  const std::vector<uint8_t> fp8 = testing_kv::HashedFp8Rows(2, kLayers * 3);
  ASSERT_EQ(store->Append(7, 0, kLayers, 3, fp8.data(), AppendExpectation::Fill(5),
                          RowMemory::kShared, KvDtype::kFp8),
            absl::OkStatus());
  for (int l = 0; l < kLayers; ++l) {
    const std::vector<uint8_t> got = Read(*store, 7, l);
    ASSERT_EQ(got.size(), 8u * kFp8RowBytes);
    std::vector<uint8_t> want(kFp8RowBytes);
    for (int t = 0; t < 5; ++t) {
      QuantizeFp8Row(bf16.data() + (l * 5 + t) * kKvDim, want.data());
      EXPECT_EQ(0, std::memcmp(got.data() + t * kFp8RowBytes, want.data(), kFp8RowBytes)) << t;
    }
    EXPECT_EQ(0, std::memcmp(got.data() + 5 * kFp8RowBytes, fp8.data() + l * 3 * kFp8RowBytes,
                             3 * kFp8RowBytes));
  }
  std::vector<bf16_bits> as_bf16(8 * kKvDim);
  EXPECT_EQ(store->ReadCommitted(7, 0, as_bf16.data()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(KvStoreFp8, BadFp8RowsAreRefusedNamingTheElementAndNothingIsKept) {
  for (const RowMemory memory : {RowMemory::kHost, RowMemory::kShared}) {
    auto store = MakeStore(KvDtype::kFp8);
    const std::vector<uint8_t> good = testing_kv::HashedFp8Rows(3, kLayers * 4);
    ASSERT_EQ(store->Append(1, 0, kLayers, 4, good.data(), AppendExpectation::Create(), memory,
                            KvDtype::kFp8),
              absl::OkStatus());
    const StoreStats before = store->Stats();
    std::vector<uint8_t> bad = testing_kv::HashedFp8Rows(4, kLayers * 4);
    bad[(4 + 2) * kFp8RowBytes + 77] = 0x7F;  // layer 1, token 2
    absl::Status s = store->Append(1, 0, kLayers, 4, bad.data(), AppendExpectation::Fill(4), memory,
                                   KvDtype::kFp8);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("kv[1, 2] byte 77 (group 0 element 77) = 0x7f"));
    bad = testing_kv::HashedFp8Rows(4, kLayers * 4);
    const float inf = INFINITY;
    std::memcpy(bad.data() + 3 * kFp8RowBytes + kFp8ScalesOffset + 12, &inf, 4);
    s = store->Append(2, 0, kLayers, 4, bad.data(), AppendExpectation::Create(), memory,
                      KvDtype::kFp8);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("kv[0, 3] group 3 scale"));
    EXPECT_FALSE(store->Contains(2));
    const StoreStats after = store->Stats();
    EXPECT_EQ(after.used_slots, before.used_slots);
    EXPECT_EQ(*store->LayerFill(1), (std::vector<int64_t>{4, 4}));
    EXPECT_EQ(Read(*store, 1, 1),
              std::vector<uint8_t>(good.begin() + 4 * kFp8RowBytes, good.end()));
  }
}

TEST(KvStoreFp8, ABf16StoreRefusesFp8Rows) {
  auto store = MakeStore(KvDtype::kBf16);
  const std::vector<uint8_t> fp8 = testing_kv::HashedFp8Rows(5, kLayers);
  const absl::Status s = store->Append(1, 0, kLayers, 1, fp8.data(), AppendExpectation::Create(),
                                       RowMemory::kHost, KvDtype::kFp8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("the store holds bf16 rows"));
  EXPECT_FALSE(store->Contains(1));
}

// Two sequences interleaved (so both are fragmented), a fork, then compaction to convergence:
// every row of every sequence is still the same 656 bytes.
TEST(KvStoreFp8, CompactionAndForkMoveWholeRows) {
  auto store = MakeStore(KvDtype::kFp8, 128);
  std::map<SequenceId, std::vector<std::vector<uint8_t>>> want;
  for (int chunk = 0; chunk < 6; ++chunk) {
    for (SequenceId seq : {1, 2}) {
      const std::vector<uint8_t> rows = testing_kv::HashedFp8Rows(10 * chunk + seq, kLayers * 5);
      ASSERT_EQ(store->Append(seq, 0, kLayers, 5, rows.data(), AppendExpectation::Any(),
                              RowMemory::kHost, KvDtype::kFp8),
                absl::OkStatus());
    }
  }
  ASSERT_EQ(store->Fork(1, 3, 17), absl::OkStatus());
  ASSERT_EQ(store->Release(2), absl::OkStatus());
  for (SequenceId seq : {1, 3}) {
    for (int l = 0; l < kLayers; ++l) want[seq].push_back(Read(*store, seq, l));
  }
  ASSERT_GT(store->Stats().fragmentation.runs, 2);
  for (int i = 0; i < 20; ++i) {
    const CompactionPlan plan = store->PlanCompaction(3 * kLayers * kFp8RowBytes);
    if (plan.runs.empty()) break;
    EXPECT_EQ(plan.bytes_per_slot, kLayers * kFp8RowBytes);
    ASSERT_EQ(store->ExecuteCompaction(plan), absl::OkStatus());
  }
  EXPECT_EQ(store->Stats().fragmentation.tokens_outside_first_run, 0);
  for (SequenceId seq : {1, 3}) {
    for (int l = 0; l < kLayers; ++l) EXPECT_EQ(Read(*store, seq, l), want[seq][l]) << seq;
  }
}

}  // namespace
}  // namespace verifyd
