// What each wgmma form the sm_90a flash kernel issues costs on the tensor cores (plans/0004,
// session 10). Every SM runs one CTA whose one or two warpgroups issue a long chain of one form, A
// and B from shared memory laid out as the kernel's (or A from registers), 16 per commit group (4
// for m64n256) with one group left in flight. Printed: clocks per instruction per SM, and the rate
// against the dense bf16 peak of 4096 FLOP per clock per SM (989 TFLOP/s at 1830 MHz over 132 SMs,
// Hopper's whitepaper). The kernel's S uses m64n32k16 (RS and SS), its P V m64n256k16 (RS and SS,
// B transposed); m64n64k16 is the form S would take with a warpgroup per 64 columns.
// Not a test: prints a table. Usage: wgmma_rate_bench [--iters N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/wgmma_sm90.cuh"
#include "tools/bench/bench_cuda_check.h"

namespace verifyd::bench {
namespace {

enum Form : int { kN32SS, kN32RS, kN64SS, kN64RS, kN256RS, kN256SS, kForms };
constexpr const char* kFormNames[kForms] = {
    "m64n32k16 SS (S, smem Q)",   "m64n32k16 RS (S, reg Q)",     "m64n64k16 SS", "m64n64k16 RS",
    "m64n256k16 RS tB (P V own)", "m64n256k16 SS tB (P V other)"};
constexpr int kFormN[kForms] = {32, 32, 64, 64, 256, 256};
// wgmma per commit group: 16, but 4 for m64n256 (as P V commits them; 16 in flight of the
// register form make ptxas serialise them, C7511).
__host__ __device__ constexpr int PerGroup(int form) {
  return form == kN256RS || form == kN256SS ? 4 : 16;
}
constexpr int kSmemBytes = 160 * 1024;  // one CTA per SM

#define RATE_D32_OUT                                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define RATE_D32_REGS                                                                          \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"

__device__ __forceinline__ void MmaM64N64K16(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" RATE_D32_REGS
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : RATE_D32_OUT
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void MmaM64N64K16RegA(float (&d)[32], const uint32_t (&a)[4],
                                                 uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" RATE_D32_REGS
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : RATE_D32_OUT
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// out[blockIdx.x] = clocks of the issuing loop; out[gridDim.x + blockIdx.x] = a sum of the
// accumulators (kept so that nothing is dropped).
template <int kForm>
__global__ void __launch_bounds__(256, 1) RateKernel(int64_t* out, int iters, int warpgroups) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  // bf16 1/64 everywhere: products stay small and finite.
  for (int i = threadIdx.x; i < (kSmemBytes - 1024) / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3C803C80u;
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int wg = __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // The kernel's layouts: Q (A) K-major at the base; K / V at 72 KB, K-major for S (rows 32 wg),
  // MN-major for P V (LBO one chunk). Each warpgroup its own accumulators.
  const uint64_t a_desc = wgmma::MakeDescriptor(base, 16, 1024);
  const uint64_t b_desc = kFormN[kForm] == 256
                              ? wgmma::MakeDescriptor(base + 73728 + wg * 4 * 8192, 8192, 1024)
                              : wgmma::MakeDescriptor(base + 73728 + wg * 32 * 128, 16, 1024);
  const uint32_t a_frag[4] = {0x3C803C80u, 0x3C803C80u, 0x3C803C80u, 0x3C803C80u};
  // This form's accumulators alone (64 x N fp32 over 128 threads).
  float d[kFormN[kForm] / 2] = {};
  auto& d32 = *reinterpret_cast<float(*)[16]>(d);
  auto& d64 = *reinterpret_cast<float(*)[32]>(d);
  auto& d256 = *reinterpret_cast<float(*)[128]>(d);
  __syncthreads();
  const int64_t t0 = clock64();
  if (wg < warpgroups) {
    for (int it = 0; it < iters; ++it) {
      wgmma::Fence();
#pragma unroll
      for (int k = 0; k < PerGroup(kForm); ++k) {
        // k-steps walk 16 of the 36 a tile has: 4 per 8 KB chunk.
        const uint32_t off = (k / 4) * 8192 + (k % 4) * 32;
        if (kForm == kN32SS) {
          wgmma::MmaM64N32K16(d32, wgmma::AdvanceDescriptor(a_desc, off),
                              wgmma::AdvanceDescriptor(b_desc, off));
        } else if (kForm == kN32RS) {
          wgmma::MmaM64N32K16RegA(d32, a_frag, wgmma::AdvanceDescriptor(b_desc, off));
        } else if (kForm == kN64SS) {
          MmaM64N64K16(d64, wgmma::AdvanceDescriptor(a_desc, off),
                       wgmma::AdvanceDescriptor(b_desc, off));
        } else if (kForm == kN64RS) {
          MmaM64N64K16RegA(d64, a_frag, wgmma::AdvanceDescriptor(b_desc, off));
        } else if (kForm == kN256RS) {
          wgmma::MmaM64N256K16RegATransB(d256, a_frag,
                                         wgmma::AdvanceDescriptor(b_desc, (k % 4) * 16 * 128));
        } else {
          wgmma::MmaM64N256K16TransB(d256, wgmma::AdvanceDescriptor(a_desc, (k % 4) * 32),
                                     wgmma::AdvanceDescriptor(b_desc, (k % 4) * 16 * 128));
        }
      }
      wgmma::Commit();
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    wgmma::WaitAll();
  }
  __syncthreads();
  const int64_t t1 = clock64();
  float sum = 0.f;
  for (float x : d) sum += x;
  if (threadIdx.x == 0) {
    out[blockIdx.x] = t1 - t0;
    out[gridDim.x + blockIdx.x] = static_cast<int64_t>(sum);
  }
}

template <int kForm>
double ClocksPerInstruction(int sms, int iters, int warpgroups, int64_t* out) {
  BENCH_CUDA(cudaFuncSetAttribute(&RateKernel<kForm>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes));
  RateKernel<kForm><<<sms, 256, kSmemBytes>>>(out, iters / 10, warpgroups);  // warm-up
  RateKernel<kForm><<<sms, 256, kSmemBytes>>>(out, iters, warpgroups);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<int64_t> clocks(sms);
  BENCH_CUDA(cudaMemcpy(clocks.data(), out, sms * sizeof(int64_t), cudaMemcpyDeviceToHost));
  std::sort(clocks.begin(), clocks.end());
  return static_cast<double>(clocks[sms / 2]) / (double(iters) * PerGroup(kForm) * warpgroups);
}

template <int kForm>
void Row(int sms, int iters, int64_t* out) {
  for (int warpgroups = 1; warpgroups <= 2; ++warpgroups) {
    const double clk = ClocksPerInstruction<kForm>(sms, iters, warpgroups, out);
    const double flop = 64.0 * kFormN[kForm] * 16 * 2;
    std::printf("%-30s %d WG  %7.1f clk/instr per SM  %6.0f FLOP/clk/SM  %5.2f of peak\n",
                kFormNames[kForm], warpgroups, clk, flop / clk, flop / clk / 4096.0);
  }
}

int Main(int argc, char** argv) {
  int iters = 4000;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::atoi(argv[++i]);
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("wgmma_rate_bench: no CUDA device\n");
    return 0;
  }
  if (prop.major != 9) {
    std::printf("wgmma_rate_bench: needs a compute-capability-9 device (found %d.%d)\n", prop.major,
                prop.minor);
    return 0;
  }
  const int sms = prop.multiProcessorCount;
  int64_t* out = nullptr;
  BENCH_CUDA(cudaMalloc(&out, 2 * sms * sizeof(int64_t)));
  std::printf("device: %s, %d SMs; %d commit groups per warpgroup\n", prop.name, sms, iters);
  Row<kN32SS>(sms, iters, out);
  Row<kN32RS>(sms, iters, out);
  Row<kN64SS>(sms, iters, out);
  Row<kN64RS>(sms, iters, out);
  Row<kN256RS>(sms, iters, out);
  Row<kN256SS>(sms, iters, out);
  cudaFree(out);
  return 0;
}

}  // namespace
}  // namespace verifyd::bench

int main(int argc, char** argv) { return verifyd::bench::Main(argc, argv); }
