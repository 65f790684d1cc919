// CudaKvStorage against HostKvStorage: the same random writes, compaction copies (slot lists and
// runs) and reads on both must leave byte-identical pools; bad input is refused and changes
// nothing.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstore/kv_storage.h"
#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/kvstore/kv_test_util.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::DistinctSlots;
using test::ExpectSamePools;
using test::Iota;
using testing_kv::HashedRows;

using CudaKvStorageTest = test::SeededCudaTest;

TEST_F(CudaKvStorageTest, RandomWritesCopiesAndReadsMatchHostStorage) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 3;
  const int64_t capacity = 3000;
  auto made = test::MakeBackend(/*cuda_graphs=*/true, layers, capacity);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaKvStorage& cuda = made->cuda_storage();
  HostKvStorage host(layers, capacity);
  // Every row defined first, so whole pools can be compared.
  for (int layer = 0; layer < layers; ++layer) {
    const std::vector<bf16_bits> rows = HashedRows(rng_(), capacity);
    const std::vector<int32_t> slots = Iota(capacity);
    ASSERT_TRUE(host.WriteRows(layer, slots, rows.data()).ok());
    ASSERT_TRUE(cuda.WriteRows(layer, slots, rows.data()).ok());
  }
  for (int op = 0; op < 300; ++op) {
    const int kind = static_cast<int>(rng_() % 4);
    if (kind == 0) {
      const int layer = static_cast<int>(rng_() % layers);
      const std::vector<int32_t> slots =
          DistinctSlots(rng_, capacity, 1 + static_cast<int>(rng_() % 400));
      const std::vector<bf16_bits> rows = HashedRows(rng_(), static_cast<int64_t>(slots.size()));
      ASSERT_TRUE(host.WriteRows(layer, slots, rows.data()).ok());
      ASSERT_TRUE(cuda.WriteRows(layer, slots, rows.data()).ok());
    } else if (kind == 1) {
      const int moves = 1 + static_cast<int>(rng_() % 500);
      std::vector<int32_t> both = DistinctSlots(rng_, capacity, 2 * moves);
      const std::vector<int32_t> src(both.begin(), both.begin() + moves);
      const std::vector<int32_t> dst(both.begin() + moves, both.end());
      ASSERT_TRUE(host.CopySlots(src, dst).ok());
      ASSERT_TRUE(cuda.CopySlots(src, dst).ok());
    } else if (kind == 3) {
      // Not waited for: the next operation's stream order must see the copy.
      const std::vector<SlotRunCopy> runs =
          testing_kv::RandomDisjointRuns(rng_, capacity, 1 + static_cast<int32_t>(rng_() % 300));
      ASSERT_TRUE(host.CopyRuns(runs).ok());
      ASSERT_TRUE(cuda.CopyRuns(runs).ok());
    } else {
      const int layer = static_cast<int>(rng_() % layers);
      // Repeats allowed in a read.
      std::vector<int32_t> slots(1 + rng_() % 300);
      for (int32_t& s : slots) s = static_cast<int32_t>(rng_() % capacity);
      std::vector<bf16_bits> want(slots.size() * kKvDim), got(slots.size() * kKvDim, 0xFFFF);
      ASSERT_TRUE(host.ReadRows(layer, slots, want.data()).ok());
      ASSERT_TRUE(cuda.ReadRows(layer, slots, got.data()).ok());
      ASSERT_EQ(got, want) << "op " << op;
    }
  }
  ExpectSamePools(host, cuda);
}

// Compaction's order argument, exercised: copies are chained (each run's destination is the next
// copy's source), freed sources are rewritten right after the copy that read them, and nothing
// waits in between but what the storage itself does. Runs span up to 1000 slots (many 4 KB
// segments, lengths that end mid-segment) on 5 layers; whole pools are compared at the end.
TEST_F(CudaKvStorageTest, ChainedRunCopiesAndRewrittenSourcesKeepStreamOrder) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 5;
  const int64_t capacity = 12000;
  auto made = test::MakeBackend(true, layers, capacity);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaKvStorage& cuda = made->cuda_storage();
  HostKvStorage host(layers, capacity);
  for (int layer = 0; layer < layers; ++layer) {
    const std::vector<bf16_bits> rows = HashedRows(rng_(), capacity);
    ASSERT_TRUE(host.WriteRows(layer, Iota(capacity), rows.data()).ok());
    ASSERT_TRUE(cuda.WriteRows(layer, Iota(capacity), rows.data()).ok());
  }
  for (int round = 0; round < 40; ++round) {
    std::vector<SlotRunCopy> runs =
        testing_kv::RandomDisjointRuns(rng_, capacity, 1 + static_cast<int32_t>(rng_() % 1000));
    runs.resize(std::min<size_t>(runs.size(), 1 + rng_() % 64));
    ASSERT_TRUE(host.CopyRuns(runs).ok());
    ASSERT_TRUE(cuda.CopyRuns(runs).ok());
    // The next copy reads what this one wrote (back into the sources; a source copied twice is
    // left out, so no destination repeats).
    std::vector<SlotRunCopy> chained;
    for (size_t k = 0; k < runs.size(); ++k) {
      if (k > 0 && runs[k].src_begin == runs[0].src_begin) continue;
      chained.push_back({runs[k].dst_begin, runs[k].src_begin, runs[k].length});
    }
    chained.resize(1 + rng_() % chained.size());
    ASSERT_TRUE(host.CopyRuns(chained).ok());
    ASSERT_TRUE(cuda.CopyRuns(chained).ok());
    // A freed source reused at once: the write is queued after the copy that read the old row.
    const SlotRunCopy& last = runs.back();
    const int layer = static_cast<int>(rng_() % layers);
    std::vector<int32_t> reused(static_cast<size_t>(last.length));
    for (int32_t i = 0; i < last.length; ++i) reused[i] = last.src_begin + i;
    const std::vector<bf16_bits> rows = HashedRows(rng_(), last.length);
    ASSERT_TRUE(host.WriteRows(layer, reused, rows.data()).ok());
    ASSERT_TRUE(cuda.WriteRows(layer, reused, rows.data()).ok());
  }
  ASSERT_TRUE(cuda.WaitForCopies().ok());
  ExpectSamePools(host, cuda);
}

TEST_F(CudaKvStorageTest, LargeWritesGrowTheBatchFlushEarlyAndLandIntact) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 2;
  const int64_t capacity = 40000;  // 46 MB per layer write: past the 32 MB flush threshold
  auto made = test::MakeBackend(true, layers, capacity);
  ASSERT_TRUE(made.ok()) << made.status();
  HostKvStorage host(layers, capacity);
  for (int round = 0; round < 2; ++round) {
    for (int layer = 0; layer < layers; ++layer) {
      std::vector<int32_t> slots = Iota(capacity);
      std::shuffle(slots.begin(), slots.end(), rng_);
      const std::vector<bf16_bits> rows = HashedRows(rng_(), capacity);
      ASSERT_TRUE(host.WriteRows(layer, slots, rows.data()).ok());
      ASSERT_TRUE(made->cuda_storage().WriteRows(layer, slots, rows.data()).ok());
    }
  }
  ExpectSamePools(host, made->cuda_storage());
}

// A slot freed and reused before anything reads the pool is written twice in one write batch;
// the later bytes must win, as they do on the host.
TEST_F(CudaKvStorageTest, RewritesBeforeAFlushKeepTheLastBytes) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 4;
  const int64_t capacity = 700;
  auto made = test::MakeBackend(true, layers, capacity);
  ASSERT_TRUE(made.ok()) << made.status();
  HostKvStorage host(layers, capacity);
  for (int layer = 0; layer < layers; ++layer) {
    const std::vector<bf16_bits> rows = HashedRows(rng_(), capacity);
    ASSERT_TRUE(host.WriteRows(layer, Iota(capacity), rows.data()).ok());
    ASSERT_TRUE(made->cuda_storage().WriteRows(layer, Iota(capacity), rows.data()).ok());
  }
  // Many small overlapping writes (slot sets of 1..50 from a 100-slot window), no read between.
  for (int write = 0; write < 200; ++write) {
    const int layer = static_cast<int>(rng_() % layers);
    std::vector<int32_t> slots = DistinctSlots(rng_, 100, 1 + static_cast<int>(rng_() % 50));
    for (int32_t& s : slots) s += static_cast<int32_t>(layer * 7);
    const std::vector<bf16_bits> rows = HashedRows(rng_(), static_cast<int64_t>(slots.size()));
    ASSERT_TRUE(host.WriteRows(layer, slots, rows.data()).ok());
    ASSERT_TRUE(made->cuda_storage().WriteRows(layer, slots, rows.data()).ok());
  }
  ExpectSamePools(host, made->cuda_storage());
}

TEST_F(CudaKvStorageTest, BadInputIsRefusedAndChangesNothing) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 2;
  const int64_t capacity = 500;
  auto made = test::MakeBackend(true, layers, capacity);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaKvStorage& cuda = made->cuda_storage();
  HostKvStorage host(layers, capacity);
  for (int layer = 0; layer < layers; ++layer) {
    const std::vector<bf16_bits> rows = HashedRows(rng_(), capacity);
    ASSERT_TRUE(host.WriteRows(layer, Iota(capacity), rows.data()).ok());
    ASSERT_TRUE(cuda.WriteRows(layer, Iota(capacity), rows.data()).ok());
  }
  const std::vector<bf16_bits> rows = HashedRows(rng_(), 3);
  const std::vector<int32_t> out_of_range = {4, static_cast<int32_t>(capacity), 7};
  absl::Status s = cuda.WriteRows(0, out_of_range, rows.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("slots[1] = 500 must be in [0, 500)"), std::string::npos) << s;
  s = cuda.WriteRows(layers, {1, 2, 3}, rows.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer = 2"), std::string::npos) << s;
  EXPECT_EQ(cuda.WriteRows(0, {-1}, rows.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda.CopySlots({1, 2}, {3}).code(), absl::StatusCode::kInvalidArgument);
  s = cuda.CopySlots({1, 2}, {3, 3});
  EXPECT_NE(s.message().find("twice"), std::string::npos) << s;
  s = cuda.CopySlots({1, 2}, {2, 5});
  EXPECT_NE(s.message().find("disjoint"), std::string::npos) << s;
  EXPECT_EQ(cuda.CopySlots({1}, {static_cast<int32_t>(capacity)}).code(),
            absl::StatusCode::kInvalidArgument);
  s = cuda.CopyRuns({{0, 8, 4}, {20, 10, 2}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s;
  s = cuda.CopyRuns({{0, 4, 4}, {6, 10, 2}});
  EXPECT_NE(s.message().find("disjoint"), std::string::npos) << s;
  EXPECT_EQ(cuda.CopyRuns({{0, static_cast<int32_t>(capacity) - 1, 2}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda.CopyRuns({{3, 9, 0}}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<bf16_bits> out(kKvDim);
  EXPECT_EQ(cuda.ReadRows(0, {static_cast<int32_t>(capacity)}, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectSamePools(host, cuda);
}

// bf16 rows inside SPEC §1's bound (magnitude < 2, either sign), random bits otherwise.
std::vector<bf16_bits> BoundedRows(std::mt19937_64& rng, int64_t count) {
  std::vector<bf16_bits> rows(static_cast<size_t>(count) * kKvDim);
  for (bf16_bits& v : rows) v = static_cast<bf16_bits>(rng() & 0xbfffu);
  return rows;
}

TEST_F(CudaKvStorageTest, DeviceRowsAreCheckedThenWrittenAndBadOnesChangeNothing) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 2;
  const int64_t capacity = 2000;
  auto made = test::MakeBackend(true, layers, capacity);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaKvStorage& cuda = made->cuda_storage();
  HostKvStorage host(layers, capacity);
  for (int layer = 0; layer < layers; ++layer) {
    const std::vector<bf16_bits> rows = BoundedRows(rng_, capacity);
    ASSERT_TRUE(host.WriteRows(layer, Iota(capacity), rows.data()).ok());
    ASSERT_TRUE(cuda.WriteRows(layer, Iota(capacity), rows.data()).ok());
  }
  // The rows stand in for a scheduler's registered region: device memory the storage reads.
  const size_t max_rows = 700;
  bf16_bits* device_rows = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_rows),
                       max_rows * kKvDim * sizeof(bf16_bits) + 64),
            cudaSuccess);
  const bf16_bits bad_values[] = {0x7fc0 /*NaN*/, 0xff80 /*-Inf*/, 0x4781 /*65792*/,
                                  0xf149 /*-1e30*/};
  int refused = 0;
  for (int round = 0; round < 40; ++round) {
    const int layer = static_cast<int>(rng_() % layers);
    const int k = 1 + static_cast<int>(rng_() % max_rows);
    const std::vector<int32_t> slots = DistinctSlots(rng_, capacity, k);
    std::vector<bf16_bits> rows = BoundedRows(rng_, k);
    // A host write still in the batch must land before the device rows (call order).
    const std::vector<bf16_bits> earlier = BoundedRows(rng_, 1);
    ASSERT_TRUE(host.WriteRows(layer, {slots[0]}, earlier.data()).ok());
    ASSERT_TRUE(cuda.WriteRows(layer, {slots[0]}, earlier.data()).ok());
    const bool plant = round % 3 == 2;
    int64_t bad = -1;
    if (plant) {
      bad = static_cast<int64_t>(rng_() % rows.size());
      rows[bad] = bad_values[rng_() % 4];
      if (rng_() % 2 == 0 && bad + 1 < static_cast<int64_t>(rows.size())) {
        rows[bad + 1] = 0x7f80;  // a second bad value after it: the first one is named
      }
    }
    ASSERT_EQ(cudaMemcpy(device_rows, rows.data(), rows.size() * sizeof(bf16_bits),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    int64_t named = -1;
    bf16_bits named_bits = 0;
    const absl::Status s =
        cuda.WriteDeviceRows(layer, slots, device_rows, [&](int64_t index, bf16_bits bits) {
          named = index;
          named_bits = bits;
          return absl::InvalidArgumentError("named");
        });
    if (plant) {
      ++refused;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_EQ(s.message(), "named") << "the caller's namer gives the answer";
      EXPECT_EQ(named, bad) << "the first bad value's flat index";
      EXPECT_EQ(named_bits, rows[bad]);
    } else {
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE(host.WriteRows(layer, slots, rows.data()).ok());
    }
  }
  EXPECT_GT(refused, 10);
  // Misaligned rows and a bad slot are refused before anything moves.
  auto unused = [](int64_t, bf16_bits) { return absl::InternalError("never named"); };
  EXPECT_EQ(cuda.WriteDeviceRows(0, {1}, device_rows + 1, unused).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda.WriteDeviceRows(0, {static_cast<int32_t>(capacity)}, device_rows, unused).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(cudaFree(device_rows), cudaSuccess);
  ExpectSamePools(host, cuda);
}

}  // namespace
}  // namespace verifyd
