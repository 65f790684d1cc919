// FormatGpuUuid (base/gpu_uuid.h): the cuda backend's gpu_uuid label must equal what DCGM's
// exporter puts in its UUID label (nvidia-smi -L's "GPU-..." form), or the metrics' join finds
// nothing. Fixed bytes, no GPU needed; the cpu backend reports no UUID.
#include "base/gpu_uuid.h"

#include <array>

#include "backend/cpu/cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace verifyd {
namespace {

TEST(GpuUuidTest, FormatsLikeNvidiaSmiAndDcgm) {
  // An H200's UUID as nvidia-smi -L printed it, and the 16 bytes cudaDeviceProp::uuid holds.
  const std::array<uint8_t, 16> h200 = {0x6d, 0x6b, 0x1b, 0x03, 0x2e, 0x4c, 0x1e, 0x5f,
                                        0x8a, 0x0e, 0x9b, 0x8f, 0x4d, 0x5c, 0x60, 0x7a};
  EXPECT_EQ(FormatGpuUuid(h200), "GPU-6d6b1b03-2e4c-1e5f-8a0e-9b8f4d5c607a");
  // Byte order is kept (no swapping of the first groups as some GUID printers do), leading zeros
  // are printed, and hex is lower-case.
  std::array<uint8_t, 16> counting{};
  for (size_t i = 0; i < counting.size(); ++i) counting[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(FormatGpuUuid(counting), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
  std::array<uint8_t, 16> ones;
  ones.fill(0xAB);
  EXPECT_THAT(FormatGpuUuid(ones), ::testing::MatchesRegex("GPU-(ab){4}-abab-abab-abab-(ab){6}"));
}

TEST(GpuUuidTest, TheCpuBackendHasNone) { EXPECT_EQ(CpuBackend(1).gpu_uuid(), ""); }

}  // namespace
}  // namespace verifyd
