// The client's shared-memory pieces without a daemon: the test plays the daemon's part (creates
// the POSIX object), then maps it as a client would and places / reads tensors in it.
#include "client/shared_tensor.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace verifyd {
namespace {

using ::testing::HasSubstr;

class SharedTensorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    info_.set_region(absl::StrCat("client-test-", getpid()));
    info_.set_path(absl::StrCat("/verifyd-client-test-", getpid()));
    info_.set_bytes(8192);
    const int fd = shm_open(info_.path().c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 8192), 0);
    close(fd);
  }
  void TearDown() override { shm_unlink(info_.path().c_str()); }

  std::vector<uint16_t> Random(size_t n) {
    std::vector<uint16_t> v(n);
    for (uint16_t& x : v) x = static_cast<uint16_t>(rng_());
    return v;
  }

  v1::SharedMemoryRegion info_;
  std::mt19937 rng_{3};
};

TEST_F(SharedTensorTest, PlacedTensorsReadBackAndNameTheirRange) {
  auto region = SharedMemoryRegion::Map(nullptr, info_);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->size(), 8192u);
  const std::vector<uint16_t> a = Random(2 * 3 * 5), b = Random(7 * 11);
  const int64_t a_shape[] = {2, 3, 5}, b_shape[] = {7, 11};
  auto ta = tensor::PlaceBf16(*region, 0, a_shape, a);
  const uint64_t b_at = AlignSharedOffset(a.size() * 2);
  EXPECT_EQ(b_at, 64u);
  auto tb = tensor::PlaceBf16(*region, b_at, b_shape, b);
  ASSERT_TRUE(ta.ok() && tb.ok());
  EXPECT_EQ(ta->shared_memory().region(), info_.region());
  EXPECT_EQ(ta->shared_memory().length(), 60u);
  EXPECT_EQ(tb->shared_memory().offset(), 64u);
  EXPECT_EQ(tb->dtype(), v1::DTYPE_BF16);
  EXPECT_THAT(tb->shape(), ::testing::ElementsAre(7, 11));

  // A second mapping of the same name (what the daemon holds) sees exactly these bytes.
  auto other = SharedMemoryRegion::Map(nullptr, info_);
  ASSERT_TRUE(other.ok());
  auto read_a = tensor::ReadBf16(*ta, &*other, "a", a_shape);
  auto read_b = tensor::ReadBf16(*tb, &*other, "b");
  ASSERT_TRUE(read_a.ok() && read_b.ok()) << read_a.status() << read_b.status();
  EXPECT_EQ(*read_a, a);
  EXPECT_EQ(*read_b, b);

  // fp32 written by "the daemon" into a range named by a ref.
  v1::Tensor lse;
  lse.set_dtype(v1::DTYPE_FP32);
  lse.add_shape(3);
  lse.add_shape(4);
  *lse.mutable_shared_memory() = *region->Ref(4096, 48);
  std::vector<float> want(12);
  for (float& f : want) f = std::uniform_real_distribution<float>(-5, 5)(rng_);
  std::memcpy(other->bytes().data() + 4096, want.data(), 48);
  auto got = tensor::ReadFp32(lse, &*region, "lse", {3, 4});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);

  // Inline tensors go through the same readers.
  auto inline_tensor = tensor::MakeBf16(b_shape, b);
  auto read_inline = tensor::ReadBf16(*inline_tensor, nullptr, "b");
  ASSERT_TRUE(read_inline.ok());
  EXPECT_EQ(*read_inline, b);
}

TEST_F(SharedTensorTest, BadRangesAndMismatchesAreRefused) {
  auto region = SharedMemoryRegion::Map(nullptr, info_);
  ASSERT_TRUE(region.ok());
  EXPECT_THAT(region->Ref(32, 8).status().message(), HasSubstr("offset = 32 must be a multiple"));
  EXPECT_THAT(region->Ref(8128, 65).status().message(),
              HasSubstr("offset = 8128 + length = 65 must be <= the region's 8192 bytes"));
  EXPECT_FALSE(region->Ref(8256, 0).ok());
  EXPECT_TRUE(region->Ref(8128, 64).ok());
  const std::vector<uint16_t> data = Random(12);
  const int64_t wrong_shape[] = {5, 2};
  EXPECT_FALSE(tensor::PlaceBf16(*region, 0, wrong_shape, data).ok());
  const int64_t shape[] = {3, 4};
  auto t = tensor::PlaceBf16(*region, 0, shape, data);
  ASSERT_TRUE(t.ok());
  auto shape_mismatch = tensor::ReadBf16(*t, &*region, "out", {4, 3});
  EXPECT_THAT(shape_mismatch.status().message(), HasSubstr("out.shape = [3, 4] must equal [4, 3]"));
  v1::Tensor other_region = *t;
  other_region.mutable_shared_memory()->set_region("elsewhere");
  EXPECT_THAT(tensor::ReadBf16(other_region, &*region, "out").status().message(),
              HasSubstr("out.shared_memory.region = 'elsewhere' is not this region"));
  v1::Tensor short_range = *t;
  short_range.mutable_shared_memory()->set_length(22);
  EXPECT_THAT(tensor::ReadBf16(short_range, &*region, "out").status().message(),
              HasSubstr("out.shared_memory.length = 22 must be 24"));
  EXPECT_THAT(tensor::ReadBf16(*t, nullptr, "out").status().message(),
              HasSubstr("no region was given"));
  EXPECT_THAT(tensor::ReadFp32(*t, &*region, "lse").status().message(),
              HasSubstr("lse.dtype = DTYPE_BF16 must be DTYPE_FP32"));

  v1::SharedMemoryRegion missing = info_;
  missing.set_path("/verifyd-client-test-does-not-exist");
  EXPECT_EQ(SharedMemoryRegion::Map(nullptr, missing).status().code(), absl::StatusCode::kNotFound);
  v1::SharedMemoryRegion larger = info_;
  larger.set_bytes(8193);
  EXPECT_EQ(SharedMemoryRegion::Map(nullptr, larger).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "mapping past the end of the object would SIGBUS";
}

TEST_F(SharedTensorTest, MovedRegionsUnmapOnce) {
  auto region = SharedMemoryRegion::Map(nullptr, info_);
  ASSERT_TRUE(region.ok());
  region->bytes()[100] = 42;
  SharedMemoryRegion moved = std::move(*region);
  EXPECT_FALSE(region->mapped());
  ASSERT_TRUE(moved.mapped());
  EXPECT_EQ(moved.bytes()[100], 42);
  SharedMemoryRegion assigned;
  assigned = std::move(moved);
  EXPECT_FALSE(moved.mapped());
  EXPECT_EQ(assigned.bytes()[100], 42);
  EXPECT_TRUE(assigned.Release().ok());
  EXPECT_FALSE(assigned.mapped());
  EXPECT_TRUE(assigned.Release().ok()) << "releasing twice is a no-op";
}

TEST(SharedVerifyBytesTest, LayoutFitsEveryTensorAligned) {
  // q [16, 8, 576] bf16 | tree_kv [16, 576] | out [16, 8, 512] | lse [16, 8] fp32.
  EXPECT_EQ(SharedVerifyBytes(16, 8, false), 147456u + 18432u + 131072u);
  EXPECT_EQ(SharedVerifyBytes(16, 8, true), 147456u + 18432u + 131072u + 512u);
  // Q = 3, H = 1: q 3456 -> 3456 (a multiple of 64), tree_kv 3456, out 3072 -> 9984, lse 12.
  EXPECT_EQ(SharedVerifyBytes(3, 1, true), 9984u + 12u);
}

}  // namespace
}  // namespace verifyd
