// CudaKvStorage with the fp8 dtype against HostKvStorage with it (whose rows are QuantizeFp8Row's,
// verify/kv_fp8_layout.h): bf16 rows written (host batch or registered device memory) are
// quantized on the device byte for byte as the host quantizes them; rows in the layout go in and
// out as they are; slot-list and run copies (compaction) move whole 656-byte rows; a bf16 read is
// refused. Every byte of both pools is compared. GPU tests: they skip without a device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstore/kv_storage.h"
#include "tests/backend/cuda/cuda_test_util.h"
#include "tests/kvstore/kv_test_util.h"
#include "tests/testing/fp8_test_rows.h"
#include "verify/kv_fp8_check.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using test::DistinctSlots;
using test::ExpectSamePools;
using test::Iota;

class CudaFp8StorageTest : public test::SeededCudaTest {
 protected:
  // A backend with an fp8 pool, every row written once through bf16 WriteRows (so whole pools
  // can be compared), and the host storage holding the same rows.
  void Make(int layers, int64_t capacity) {
    auto made = test::MakeBackend(CudaBackendOptions{}, layers, capacity, KvDtype::kFp8);
    ASSERT_TRUE(made.ok()) << made.status();
    made_ = std::move(*made);
    host_ = std::make_unique<HostKvStorage>(layers, capacity, KvDtype::kFp8);
    for (int layer = 0; layer < layers; ++layer) {
      const std::vector<bf16_bits> rows = test::RandomFp8EdgeRows(rng_, capacity);
      ASSERT_TRUE(host_->WriteRows(layer, Iota(capacity), rows.data()).ok());
      ASSERT_TRUE(cuda().WriteRows(layer, Iota(capacity), rows.data()).ok());
    }
  }
  CudaKvStorage& cuda() { return made_.cuda_storage(); }

  test::BackendWithStorage made_;
  std::unique_ptr<HostKvStorage> host_;
};

TEST_F(CudaFp8StorageTest, IsAnFp8PoolOf656ByteRows) {
  Make(2, 64);
  EXPECT_EQ(cuda().dtype(), KvDtype::kFp8);
  EXPECT_EQ(cuda().row_bytes(), 656);
  EXPECT_EQ(cuda().layer_device_data(0), nullptr);
  ASSERT_NE(cuda().layer_device_bytes(0), nullptr);
  EXPECT_EQ(cuda().layer_device_bytes(1) - cuda().layer_device_bytes(0), 64 * 656);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cuda().layer_device_bytes(1)) % 16, 0u);
  // Reading bf16 values out of an fp8 pool is refused, as on the host.
  std::vector<bf16_bits> out(kKvDim);
  const absl::Status read = cuda().ReadRows(0, {3}, out.data());
  EXPECT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
  EXPECT_NE(read.message().find("ReadEncodedRows"), std::string::npos) << read;
  EXPECT_EQ(host_->ReadRows(0, {3}, out.data()).code(), absl::StatusCode::kFailedPrecondition);
  ExpectSamePools(*host_, cuda());
}

TEST_F(CudaFp8StorageTest, RandomWritesCopiesAndReadsMatchTheHostByteForByte) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 3;
  const int64_t capacity = 3000;
  Make(layers, capacity);
  for (int op = 0; op < 300; ++op) {
    const int kind = static_cast<int>(rng_() % 5);
    const int layer = static_cast<int>(rng_() % layers);
    if (kind == 0) {  // bf16 rows, quantized at the flush
      const std::vector<int32_t> slots =
          DistinctSlots(rng_, capacity, 1 + static_cast<int>(rng_() % 400));
      const std::vector<bf16_bits> rows =
          test::RandomFp8EdgeRows(rng_, static_cast<int64_t>(slots.size()));
      ASSERT_TRUE(host_->WriteRows(layer, slots, rows.data()).ok());
      ASSERT_TRUE(cuda().WriteRows(layer, slots, rows.data()).ok());
    } else if (kind == 1) {  // rows already in the layout (the store checked them)
      const std::vector<int32_t> slots =
          DistinctSlots(rng_, capacity, 1 + static_cast<int>(rng_() % 400));
      const std::vector<uint8_t> rows =
          testing_kv::HashedFp8Rows(rng_(), static_cast<int64_t>(slots.size()));
      ASSERT_TRUE(host_->WriteEncodedRows(layer, slots, rows.data()).ok());
      ASSERT_TRUE(cuda().WriteEncodedRows(layer, slots, rows.data()).ok());
    } else if (kind == 2) {
      const int moves = 1 + static_cast<int>(rng_() % 500);
      const std::vector<int32_t> both = DistinctSlots(rng_, capacity, 2 * moves);
      const std::vector<int32_t> src(both.begin(), both.begin() + moves);
      const std::vector<int32_t> dst(both.begin() + moves, both.end());
      ASSERT_TRUE(host_->CopySlots(src, dst).ok());
      ASSERT_TRUE(cuda().CopySlots(src, dst).ok());
    } else if (kind == 3) {  // compaction's copy, not waited for
      const std::vector<SlotRunCopy> runs =
          testing_kv::RandomDisjointRuns(rng_, capacity, 1 + static_cast<int32_t>(rng_() % 300));
      ASSERT_TRUE(host_->CopyRuns(runs).ok());
      ASSERT_TRUE(cuda().CopyRuns(runs).ok());
    } else {  // a read with repeats
      std::vector<int32_t> slots(1 + rng_() % 300);
      for (int32_t& s : slots) s = static_cast<int32_t>(rng_() % capacity);
      std::vector<uint8_t> want(slots.size() * kFp8RowBytes), got(want.size(), 0xA5);
      ASSERT_TRUE(host_->ReadEncodedRows(layer, slots, want.data()).ok());
      ASSERT_TRUE(cuda().ReadEncodedRows(layer, slots, got.data()).ok());
      ASSERT_EQ(got, want) << "op " << op;
    }
  }
  ExpectSamePools(*host_, cuda());
}

// Both write batches (bf16 rows quantized, rows in the layout copied) hold writes of the same
// slots with no read in between: the later write of a slot must win, as on the host.
TEST_F(CudaFp8StorageTest, InterleavedBf16AndEncodedWritesKeepCallOrder) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 2;
  Make(layers, 300);
  for (int write = 0; write < 200; ++write) {
    const int layer = static_cast<int>(rng_() % layers);
    const std::vector<int32_t> slots = DistinctSlots(rng_, 60, 1 + static_cast<int>(rng_() % 30));
    if (rng_() % 2 == 0) {
      const std::vector<bf16_bits> rows =
          test::RandomFp8EdgeRows(rng_, static_cast<int64_t>(slots.size()));
      ASSERT_TRUE(host_->WriteRows(layer, slots, rows.data()).ok());
      ASSERT_TRUE(cuda().WriteRows(layer, slots, rows.data()).ok());
    } else {
      const std::vector<uint8_t> rows =
          testing_kv::HashedFp8Rows(rng_(), static_cast<int64_t>(slots.size()));
      ASSERT_TRUE(host_->WriteEncodedRows(layer, slots, rows.data()).ok());
      ASSERT_TRUE(cuda().WriteEncodedRows(layer, slots, rows.data()).ok());
    }
  }
  ExpectSamePools(*host_, cuda());
}

// Compaction's chained copies over 656-byte rows: runs of up to 1000 slots (segments that end
// mid-row), each copy's destinations the next one's sources, freed sources rewritten at once.
TEST_F(CudaFp8StorageTest, ChainedRunCopiesMoveWholeRows) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 4;
  const int64_t capacity = 9000;
  Make(layers, capacity);
  for (int round = 0; round < 30; ++round) {
    std::vector<SlotRunCopy> runs =
        testing_kv::RandomDisjointRuns(rng_, capacity, 1 + static_cast<int32_t>(rng_() % 1000));
    runs.resize(std::min<size_t>(runs.size(), 1 + rng_() % 64));
    ASSERT_TRUE(host_->CopyRuns(runs).ok());
    ASSERT_TRUE(cuda().CopyRuns(runs).ok());
    std::vector<SlotRunCopy> chained;
    for (size_t k = 0; k < runs.size(); ++k) {
      if (k > 0 && runs[k].src_begin == runs[0].src_begin) continue;
      chained.push_back({runs[k].dst_begin, runs[k].src_begin, runs[k].length});
    }
    chained.resize(1 + rng_() % chained.size());
    ASSERT_TRUE(host_->CopyRuns(chained).ok());
    ASSERT_TRUE(cuda().CopyRuns(chained).ok());
    const SlotRunCopy& last = runs.back();
    std::vector<int32_t> reused(static_cast<size_t>(last.length));
    for (int32_t i = 0; i < last.length; ++i) reused[i] = last.src_begin + i;
    const int layer = static_cast<int>(rng_() % layers);
    const std::vector<bf16_bits> rows = test::RandomFp8EdgeRows(rng_, last.length);
    ASSERT_TRUE(host_->WriteRows(layer, reused, rows.data()).ok());
    ASSERT_TRUE(cuda().WriteRows(layer, reused, rows.data()).ok());
  }
  ASSERT_TRUE(cuda().WaitForCopies().ok());
  ExpectSamePools(*host_, cuda());
}

// A write larger than the batch's flush threshold (32 MB of bf16 rows) lands intact.
TEST_F(CudaFp8StorageTest, LargeWritesFlushEarlyAndLandIntact) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int64_t capacity = 40000;
  Make(1, capacity);
  std::vector<int32_t> slots = Iota(capacity);
  std::shuffle(slots.begin(), slots.end(), rng_);
  const std::vector<bf16_bits> rows = test::RandomFp8EdgeRows(rng_, capacity);
  ASSERT_TRUE(host_->WriteRows(0, slots, rows.data()).ok());
  ASSERT_TRUE(cuda().WriteRows(0, slots, rows.data()).ok());
  ExpectSamePools(*host_, cuda());
}

// bf16 rows from device memory (a registered region): checked as bf16 against SPEC §1's bound,
// then quantized into the pool; a bad one is refused naming it and changes nothing.
TEST_F(CudaFp8StorageTest, DeviceRowsAreCheckedThenQuantized) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 2;
  const int64_t capacity = 2000;
  Make(layers, capacity);
  const size_t max_rows = 700;
  bf16_bits* device_rows = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_rows), max_rows * kKvRowBytes),
            cudaSuccess);
  int refused = 0;
  for (int round = 0; round < 30; ++round) {
    const int layer = static_cast<int>(rng_() % layers);
    const int k = 1 + static_cast<int>(rng_() % max_rows);
    const std::vector<int32_t> slots = DistinctSlots(rng_, capacity, k);
    std::vector<bf16_bits> rows = test::RandomFp8EdgeRows(rng_, k);
    // A queued encoded write of the first slot lands before the device rows (call order).
    const std::vector<uint8_t> earlier = testing_kv::HashedFp8Rows(rng_(), 1);
    ASSERT_TRUE(host_->WriteEncodedRows(layer, {slots[0]}, earlier.data()).ok());
    ASSERT_TRUE(cuda().WriteEncodedRows(layer, {slots[0]}, earlier.data()).ok());
    const bool plant = round % 3 == 2;
    int64_t bad = -1;
    if (plant) {
      bad = static_cast<int64_t>(rng_() % rows.size());
      rows[bad] = (rng_() % 2) ? 0x7fc0 /*NaN*/ : 0x4781 /*65792*/;
    }
    ASSERT_EQ(cudaMemcpy(device_rows, rows.data(), rows.size() * sizeof(bf16_bits),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    int64_t named = -1;
    const absl::Status s =
        cuda().WriteDeviceRows(layer, slots, device_rows, [&](int64_t index, bf16_bits bits) {
          named = index;
          return absl::InvalidArgumentError(absl::StrCat("named ", bits));
        });
    if (plant) {
      ++refused;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_EQ(named, bad) << "the planted value's flat index";
      EXPECT_EQ(s.message(), absl::StrCat("named ", rows[bad]));
    } else {
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE(host_->WriteRows(layer, slots, rows.data()).ok());
    }
  }
  EXPECT_EQ(refused, 10);
  ASSERT_EQ(cudaFree(device_rows), cudaSuccess);
  ExpectSamePools(*host_, cuda());
}

// Rows already in the layout from registered device memory: the device finds the first bad row,
// and the answer is the host check's own message for it (so it names the row by the caller's
// shape); nothing of a refused call is written; good rows land byte for byte as they are, also
// with the largest scale allowed. Every byte of both pools is compared at the end.
TEST_F(CudaFp8StorageTest, EncodedDeviceRowsAreCheckedThenCopiedAsTheyAre) {
  SCOPED_TRACE("VERIFYD_TEST_SEED=" + std::to_string(seed_));
  const int layers = 2;
  const int64_t capacity = 2000;
  Make(layers, capacity);
  const size_t max_rows = 700;
  uint8_t* device_rows = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_rows), max_rows * kFp8RowBytes),
            cudaSuccess);
  int refused = 0;
  for (int round = 0; round < 36; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const int layer = static_cast<int>(rng_() % layers);
    const int k = 1 + static_cast<int>(rng_() % max_rows);
    const std::vector<int32_t> slots = DistinctSlots(rng_, capacity, k);
    std::vector<uint8_t> rows = testing_kv::HashedFp8Rows(rng_(), k);
    // The bounds' own edges pass: the largest scale, rope values of exactly +-2^16.
    const float max_scale = kMaxFp8Scale;
    std::memcpy(rows.data() + kFp8ScalesOffset, &max_scale, 4);
    const bf16_bits edge = 0xC780;  // -65536
    std::memcpy(rows.data() + kFp8RopeOffset, &edge, 2);
    // A queued bf16 write of the first slot lands before the device rows (call order).
    const std::vector<bf16_bits> earlier = test::RandomFp8EdgeRows(rng_, 1);
    ASSERT_TRUE(host_->WriteRows(layer, {slots[0]}, earlier.data()).ok());
    ASSERT_TRUE(cuda().WriteRows(layer, {slots[0]}, earlier.data()).ok());
    const bool plant = round % 2 == 1;
    if (plant) {
      // One to three bad rows, any rule each: the answer names the first.
      const int bad_rows = 1 + static_cast<int>(rng_() % 3);
      for (int b = 0; b < bad_rows; ++b) {
        test::PlantFp8Violation(rng_, rows.data() + (rng_() % k) * kFp8RowBytes, round / 2 + b);
      }
    }
    ASSERT_EQ(cudaMemcpy(device_rows, rows.data(), rows.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    const int64_t shape[] = {k};
    int64_t named = -1;
    const absl::Status s = cuda().WriteEncodedDeviceRows(
        layer, slots, device_rows, [&](const uint8_t* row, int64_t index) {
          named = index;
          return CheckFp8Rows(row, 1, index, shape, "kv");
        });
    const absl::Status want = CheckFp8Rows(rows.data(), k, 0, shape, "kv");
    EXPECT_EQ(want.ok(), !plant) << want;
    if (plant) {
      ++refused;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_EQ(s.message(), want.message());
      EXPECT_GE(named, 0);
    } else {
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(named, -1) << "a clean call names no row";
      ASSERT_TRUE(host_->WriteEncodedRows(layer, slots, rows.data()).ok());
    }
  }
  EXPECT_EQ(refused, 18);
  // Misuse is refused before anything runs.
  const absl::Status unaligned = cuda().WriteEncodedDeviceRows(
      0, {1}, device_rows + 8, [](const uint8_t*, int64_t) { return absl::OkStatus(); });
  EXPECT_EQ(unaligned.code(), absl::StatusCode::kInvalidArgument) << unaligned;
  ASSERT_EQ(cudaFree(device_rows), cudaSuccess);
  ExpectSamePools(*host_, cuda());
}

}  // namespace
}  // namespace verifyd
