// The launcher rejects what the host can see is wrong before touching the GPU (runs without one).
#include "kernels/mla_verify_launch.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kv_tile_map.h"
#include "verify/kv_fp8_layout.h"

namespace verifyd {
namespace {

// Host addresses stand in for device pointers: every case here must fail before any dereference.
struct FakeProblem {
  std::vector<bf16_bits> kv = std::vector<bf16_bits>(576 * 4), q = std::vector<bf16_bits>(576 * 2),
                         out = std::vector<bf16_bits>(512 * 2);
  std::vector<int32_t> indptr = {0, 1}, prefix = {1}, slots = {0, 1};
  std::vector<uint64_t> mask = {1};

  VerifyProblem Make() {
    VerifyProblem p;
    p.kv = kv.data();
    p.num_slots = 4;
    p.q = q.data();
    p.out = out.data();
    p.num_heads = 2;
    p.scale = 0.1f;
    p.batch = 1;
    p.total_q = 1;
    p.qo_indptr = indptr.data();
    p.prefix_len = prefix.data();
    p.slot_indptr = indptr.data();
    p.slots = slots.data();
    p.mask_indptr = indptr.data();
    p.mask_bits = mask.data();
    return p;
  }
};

TEST(MlaVerifyLaunch, RejectsBadProblemsNamingTheField) {
  FakeProblem fake;
  auto plan = PlanSplits(std::vector<int32_t>{1}, std::vector<int32_t>{1}, 2, 132);
  ASSERT_TRUE(plan.ok());
  const WorkspaceLayout layout = LayoutWorkspace(*plan);
  std::vector<uint8_t> workspace(layout.total_bytes + 16);

  VerifyProblem p = fake.Make();
  p.num_heads = 0;
  absl::Status s = LaunchMlaVerify(p, *plan, layout, workspace.data(), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("num_heads = 0"), std::string::npos) << s;

  p = fake.Make();
  p.slots = nullptr;
  EXPECT_EQ(LaunchMlaVerify(p, *plan, layout, workspace.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  p = fake.Make();
  p.total_q = 0;
  s = LaunchMlaVerify(p, *plan, layout, workspace.data(), nullptr);
  EXPECT_NE(std::string(s.message()).find("total_q = 0"), std::string::npos) << s;

  p = fake.Make();
  EXPECT_EQ(LaunchMlaVerify(p, SplitPlan{}, layout, workspace.data(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchMlaVerify(p, *plan, layout, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);

  p = fake.Make();
  p.batch = 0;
  EXPECT_EQ(LaunchMlaVerifyNaive(p, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// FlashPath::kHopper where the Hopper kernel cannot run (no device, or not compute capability 9)
// is an error, not a quiet fallback to the portable kernel; kPortable is always there.
TEST(MlaVerifyLaunch, HopperPathWhereItCannotRunIsAnError) {
  if (HopperFlashAvailable()) GTEST_SKIP() << "this device runs the Hopper kernel";
  FakeProblem fake;
  auto plan = PlanSplits(std::vector<int32_t>{1}, std::vector<int32_t>{1}, 2, 132);
  ASSERT_TRUE(plan.ok());
  const WorkspaceLayout layout = LayoutWorkspace(*plan);
  std::vector<uint8_t> workspace(layout.total_bytes + 16);
  const absl::Status s = LaunchMlaVerify(fake.Make(), *plan, layout, workspace.data(), nullptr,
                                         VerifyStages::kFlashAndCombine, FlashPath::kHopper);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(AvailableFlashPaths(), std::vector<FlashPath>{FlashPath::kPortable});
  EXPECT_STREQ(FlashKernelName(FlashPath::kAuto), "portable-mma-sync");
}

// The first 16-byte-aligned element of `rows` (a host stand-in for a device tensor: the driver
// encodes a map without reading the memory).
bf16_bits* Aligned16(std::vector<bf16_bits>& rows) {
  return reinterpret_cast<bf16_bits*>((reinterpret_cast<uintptr_t>(rows.data()) + 15) &
                                      ~static_cast<uintptr_t>(15));
}

// Whether a map can be made at all here (the driver's encoder needs a driver and a device).
bool HaveDriverAndDevice() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return false;
  }
  return true;
}

// The Hopper kernel's bulk copies need a tensor map of the pool; where none can be made the map
// says so (usable = 0) and the kernel gathers every half.
TEST(KvTileMap, NoMapForAPoolTheCopiesCannotAddress) {
  std::vector<bf16_bits> pool(576 * 64 + 8);
  bf16_bits* aligned = Aligned16(pool);
  EXPECT_EQ(EncodeKvTileMap(nullptr, 8).usable, 0);
  EXPECT_EQ(EncodeKvTileMap(aligned + 1, 4).usable, 0);  // 2 bytes off: not 16-byte aligned
  EXPECT_EQ(EncodeKvTileMap(aligned, 0).usable, 0);
  EXPECT_EQ(EncodeKvTileMap(aligned, (int64_t{1} << 31) + 1).usable, 0);
  if (!HaveDriverAndDevice()) GTEST_SKIP() << "no CUDA driver and device: no map can be made";
  EXPECT_EQ(EncodeKvTileMap(aligned, 64).usable, 1);  // a pool of more slots than one box holds
}

// The fp8 pool's three maps (codes, scales, rope; kv_tile_map.h): none where any of them cannot be
// made (no pool, an unaligned one, fewer slots than one box of 32), so the kernel gathers.
TEST(Fp8KvTileMaps, NoMapsForAPoolTheCopiesCannotAddress) {
  std::vector<uint8_t> pool(kFp8RowBytes * 64 + 16);
  uint8_t* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(pool.data()) + 15) &
                                                ~static_cast<uintptr_t>(15));
  EXPECT_EQ(EncodeFp8KvTileMaps(nullptr, 64).usable, 0);
  EXPECT_EQ(EncodeFp8KvTileMaps(aligned + 1, 63).usable, 0);  // not 16-byte aligned
  EXPECT_EQ(EncodeFp8KvTileMaps(aligned, 31).usable, 0);      // fewer slots than one box
  EXPECT_EQ(EncodeFp8KvTileMaps(aligned, 0).usable, 0);
  EXPECT_EQ(EncodeFp8KvTileMaps(aligned, (int64_t{1} << 31) + 1).usable, 0);
  if (!HaveDriverAndDevice()) GTEST_SKIP() << "no CUDA driver and device: no map can be made";
  EXPECT_EQ(EncodeFp8KvTileMaps(aligned, 32).usable, 1);  // one box: the whole pool
  EXPECT_EQ(EncodeFp8KvTileMaps(aligned, 64).usable, 1);
}

// The same for the queries' map (box: 64 rows): none for a batch of fewer rows than a box (the
// kernel then gathers Q), nor for an unaligned or missing tensor; one from 64 rows up.
TEST(QTileMap, NoMapForQueriesTheCopyCannotAddress) {
  std::vector<bf16_bits> q(576 * 65 + 8);
  bf16_bits* aligned = Aligned16(q);
  EXPECT_EQ(EncodeQTileMap(nullptr, 64).usable, 0);
  EXPECT_EQ(EncodeQTileMap(aligned + 1, 64).usable, 0);  // 2 bytes off: not 16-byte aligned
  EXPECT_EQ(EncodeQTileMap(aligned, 63).usable, 0);      // fewer rows than one box
  EXPECT_EQ(EncodeQTileMap(aligned, 0).usable, 0);
  if (!HaveDriverAndDevice()) GTEST_SKIP() << "no CUDA driver and device: no map can be made";
  EXPECT_EQ(EncodeQTileMap(aligned, 64).usable, 1);
  EXPECT_EQ(EncodeQTileMap(aligned, 65).usable, 1);  // a last box past the end: zero-filled
}

}  // namespace
}  // namespace verifyd
