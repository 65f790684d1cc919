// The wgmma building blocks of the Hopper flash kernel (kernels/wgmma_sm90.cuh) on one warpgroup,
// against a float64 CPU product of the same bf16 inputs, before any softmax is involved:
//   - K-major A and B (S = Q K^T): 64 x 32 x 128, B at row 32 of its chunks (as warpgroup 1 reads
//     K), k crossing a chunk boundary; again with A's first four k-steps from registers (ldmatrix
//     fragments, as the kernel holds Q's first k-steps);
//   - K-major A, MN-major B (O = P V): 64 x 256 x 64, B from chunks 4..7 (as warpgroup 1 reads V).
// A wrong descriptor, swizzle or fragment layout shows up as a large error in many elements. When
// the MN-major product fails, the test also tries the other LBO/SBO reading and says which one
// matches, so one device run is enough to fix it.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/wgmma_sm90.cuh"
#include "verify/bf16.h"

namespace verifyd::test {
namespace {

constexpr int kM = 64;
constexpr int kChunkElems = 64;  // bf16 per swizzled row

// Copies a row-major [rows][64 * chunks] bf16 matrix into swizzled chunks (chunk c = columns
// 64c .. 64c+63) starting at row `row0` of each chunk.
__device__ void StoreSwizzled(const bf16_bits* src, int rows, int chunks, int row0, uint8_t* dst) {
  for (int idx = threadIdx.x; idx < rows * chunks * 8; idx += blockDim.x) {
    const int r = idx / (chunks * 8);
    const int u = idx % (chunks * 8);
    const uint4 v = reinterpret_cast<const uint4*>(src + r * chunks * kChunkElems)[u];
    *reinterpret_cast<uint4*>(dst + (u >> 3) * wgmma::kChunkBytes +
                              wgmma::SwizzledOffset(row0 + r, u & 7)) = v;
  }
}

// Fragment layout of a 64 x N fp32 accumulator: warp w rows 16w + g (+8), columns 8i + 2c (+1).
template <int N>
__device__ void StoreAccumulator(const float (&d)[N / 2], float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int i = 0; i < N / 8; ++i) {
    const int row = warp * 16 + g, col = 8 * i + 2 * c;
    out[row * N + col] = d[4 * i];
    out[row * N + col + 1] = d[4 * i + 1];
    out[(row + 8) * N + col] = d[4 * i + 2];
    out[(row + 8) * N + col + 1] = d[4 * i + 3];
  }
}

// a: [64][128], b: [32][128] (rows = n), out: [64][32]. kRegASteps: the first k-steps take A from
// registers (MmaM64N32K16RegA), the rest from shared memory.
template <int kRegASteps>
__global__ void KMajorKernel(const bf16_bits* a, const bf16_bits* b, float* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* a_smem = smem;
  uint8_t* b_smem = smem + 2 * wgmma::kChunkBytes;
  StoreSwizzled(a, kM, 2, 0, a_smem);
  StoreSwizzled(b, 32, 2, 32, b_smem);
  wgmma::FenceProxyAsyncShared();
  __syncthreads();
  float d[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) d[i] = 0.f;
  wgmma::PinRegisters(d);
  wgmma::Fence();
  const uint32_t a_addr = static_cast<uint32_t>(__cvta_generic_to_shared(a_smem));
  const uint32_t b_addr =
      static_cast<uint32_t>(__cvta_generic_to_shared(b_smem)) + 32 * wgmma::kSwizzleRowBytes;
  // Lane l addresses row 16w + (l & 15), 16-byte unit 2 (ks % 4) + (l >> 4) of chunk ks / 4.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t a_frag[kRegASteps > 0 ? kRegASteps : 1][4];
#pragma unroll
  for (int ks = 0; ks < kRegASteps; ++ks) {
    mma::LdMatrixX4(a_frag[ks],
                    a_addr + (ks / 4) * wgmma::kChunkBytes +
                        wgmma::SwizzledOffset(warp * 16 + (lane & 15), 2 * (ks % 4) + (lane >> 4)));
  }
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const uint32_t off = (ks / 4) * wgmma::kChunkBytes + (ks % 4) * 32;
    if (ks < kRegASteps) {
      wgmma::MmaM64N32K16RegA(d, a_frag[ks < kRegASteps ? ks : 0],
                              wgmma::MakeDescriptor(b_addr + off, 16, 1024));
    } else {
      wgmma::MmaM64N32K16(d, wgmma::MakeDescriptor(a_addr + off, 16, 1024),
                          wgmma::MakeDescriptor(b_addr + off, 16, 1024));
    }
  }
  wgmma::Commit();
  wgmma::WaitAll();
  wgmma::PinRegisters(d);
  StoreAccumulator<32>(d, out);
}

// a: [64][64] (k = 64), v: [64][512] (rows = k), out: [64][256] = a * v[:, 256:512].
__global__ void MnMajorKernel(const bf16_bits* a, const bf16_bits* v, float* out, uint32_t lbo,
                              uint32_t sbo) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* a_smem = smem;
  uint8_t* v_smem = smem + wgmma::kChunkBytes;
  StoreSwizzled(a, kM, 1, 0, a_smem);
  StoreSwizzled(v, 64, 8, 0, v_smem);
  wgmma::FenceProxyAsyncShared();
  __syncthreads();
  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  wgmma::PinRegisters(d);
  wgmma::Fence();
  const uint32_t a_addr = static_cast<uint32_t>(__cvta_generic_to_shared(a_smem));
  const uint32_t v_addr =
      static_cast<uint32_t>(__cvta_generic_to_shared(v_smem)) + 4 * wgmma::kChunkBytes;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma::MmaM64N256K16TransB(
        d, wgmma::MakeDescriptor(a_addr + kk * 32, 16, 1024),
        wgmma::MakeDescriptor(v_addr + kk * 16 * wgmma::kSwizzleRowBytes, lbo, sbo));
  }
  wgmma::Commit();
  wgmma::WaitAll();
  wgmma::PinRegisters(d);
  StoreAccumulator<256>(d, out);
}

bool HaveHopper() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major == 9;
}

std::vector<bf16_bits> RandomBf16(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<bf16_bits> v(n);
  for (auto& x : v) x = FloatToBf16(dist(rng));
  return v;
}

template <typename T>
T* ToDevice(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// Max over elements of |got - ref| / (max |ref|): exact bf16 products summed in fp32 stay ~1e-6.
double MaxScaledError(const std::vector<float>& got, const std::vector<double>& ref) {
  double scale = 0, err = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err = std::max(err, std::fabs(got[i] - ref[i]));
  }
  return err / scale;
}

uint64_t Seed() {
  const uint64_t seed = std::random_device{}();
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

// The S product both ways: A from shared memory throughout, and A's first four k-steps from
// registers.
template <int kRegASteps>
void CheckKMajor(const char* what) {
  std::mt19937_64 rng(Seed());
  const auto a = RandomBf16(kM * 128, rng);
  const auto b = RandomBf16(32 * 128, rng);
  std::vector<double> ref(kM * 32);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < 32; ++n) {
      double s = 0;
      for (int k = 0; k < 128; ++k)
        s += double(Bf16ToFloat(a[m * 128 + k])) * Bf16ToFloat(b[n * 128 + k]);
      ref[m * 32 + n] = s;
    }
  bf16_bits* da = ToDevice(a);
  bf16_bits* db = ToDevice(b);
  float* dout = ToDevice(std::vector<float>(kM * 32, NAN));
  const int smem = 4 * wgmma::kChunkBytes;
  ASSERT_EQ(cudaFuncSetAttribute(KMajorKernel<kRegASteps>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            cudaSuccess);
  KMajorKernel<kRegASteps><<<1, 128, smem>>>(da, db, dout);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> out(kM * 32);
  cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
  const double err = MaxScaledError(out, ref);
  std::printf("k-major 64x32x128 (%s): max scaled error %.2e\n", what, err);
  EXPECT_LE(err, 1e-4);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
}

TEST(Wgmma, KMajorBothOperands) {
  if (!HaveHopper()) GTEST_SKIP() << "no sm_90 device";
  CheckKMajor<0>("A from shared memory");
}

TEST(Wgmma, KMajorAFromRegisters) {
  if (!HaveHopper()) GTEST_SKIP() << "no sm_90 device";
  CheckKMajor<4>("A's first four k-steps from registers");
}

TEST(Wgmma, MnMajorB) {
  if (!HaveHopper()) GTEST_SKIP() << "no sm_90 device";
  std::mt19937_64 rng(Seed());
  const auto a = RandomBf16(kM * 64, rng);
  const auto v = RandomBf16(64 * 512, rng);
  std::vector<double> ref(kM * 256);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < 256; ++n) {
      double s = 0;
      for (int k = 0; k < 64; ++k)
        s += double(Bf16ToFloat(a[m * 64 + k])) * Bf16ToFloat(v[k * 512 + 256 + n]);
      ref[m * 256 + n] = s;
    }
  bf16_bits* da = ToDevice(a);
  bf16_bits* dv = ToDevice(v);
  float* dout = ToDevice(std::vector<float>(kM * 256, NAN));
  const int smem = 9 * wgmma::kChunkBytes;
  ASSERT_EQ(cudaFuncSetAttribute(MnMajorKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
            cudaSuccess);
  // The reading the flash kernel uses first, then the swapped one for diagnosis.
  const uint32_t variants[2][2] = {{wgmma::kChunkBytes, 1024}, {1024, wgmma::kChunkBytes}};
  for (int var = 0; var < 2; ++var) {
    cudaMemset(dout, 0xFF, kM * 256 * 4);
    MnMajorKernel<<<1, 128, smem>>>(da, dv, dout, variants[var][0], variants[var][1]);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> out(kM * 256);
    cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
    const double err = MaxScaledError(out, ref);
    std::printf("mn-major 64x256x64, lbo=%u sbo=%u: max scaled error %.2e\n", variants[var][0],
                variants[var][1], err);
    if (var == 0) EXPECT_LE(err, 1e-4) << "the flash kernel's V descriptor reading is wrong";
  }
  cudaFree(da);
  cudaFree(dv);
  cudaFree(dout);
}

}  // namespace
}  // namespace verifyd::test
