// Kernel benchmark (SPEC §5): measures the device's copy bandwidth, bf16 matmul rate (cuBLAS) and
// mma.sync rate (the portable kernel's instruction, mma_sync_rate.h), then times the flash kernel
// on S1-S8 and SH against the floor max(bytes / bandwidth, FLOPs / matmul rate): the Hopper path's
// with cuBLAS's rate, the portable path's with mma.sync's ("/floor"); "/mma" divides by the floor
// at the best mma.sync rate for both paths, "/burst" by the floor at cuBLAS's best rate;
// with scattered (page size 1, random) vs contiguous slots, graph replay vs eager, and the naive
// kernel. Prints one line per shape as it goes and a short table last. Every timed loop (the
// ceilings too) runs after 100 ms of its own work; "/floor" uses those sustained ceilings, "/burst"
// the best rate measured either way (the GEMM from a cold start runs at a higher clock, before the
// power limit), and "MHz" is the SM clock while the shape's loop runs (plans/0004, session 5).
//
// Usage: mla_verify_bench [--iters N] [--shapes S1,S3,...] [--no-naive] [--launcher-path-only]
//                         [--copies N]   (KV replicas to rotate through; default: > 400 MB)
//                         [--breakdown]  (flash vs combine time per shape, and an L sweep)
//                         [--timeline]   (per-CTA clock stamps of the sm_90a kernel, and the
//                                         clocks of each phase of a steady tile)
//                         [--diag]       (the sm_90a kernel without its KV gathers, without its
//                                         wgmma: which side bounds it, plans/0004 session 4)
//                         [--fp8]        (also times an fp8 pool of the same KV, on the paths
//                                         that read it: fp8 / bf16, and its own floor)
// The three instruments may be given together: each runs, in that order, and the table does not.
// On a Hopper device both flash paths are measured (FlashPath::kHopper, then kPortable);
// --launcher-path-only measures kAuto alone. The timeline and diag instruments are other
// instantiations of the shipped sm_90a kernel, built into this program only
// (mla_verify_flash_sm90_probes.cu).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/split_planner.h"
#include "tools/bench/bench_cuda_check.h"
#include "tools/bench/mla_verify_flash_sm90_probes.h"
#include "tools/bench/mma_sync_rate.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/tree_mask.h"

namespace verifyd::bench {
namespace {

#define BENCH_OK(expr)                                                                             \
  do {                                                                                             \
    absl::Status st_ = (expr);                                                                     \
    if (!st_.ok()) {                                                                               \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, std::string(st_.message()).c_str()); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

// Uniform bf16 in [-amp, amp) from a counter hash: random data on the device without a host copy.
__global__ void FillRandomBf16(bf16_bits* x, int64_t n, uint64_t seed, float amp) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
    const float v = (2.f * u - 1.f) * amp;
    x[i] = static_cast<bf16_bits>(__float_as_uint(v) >> 16);
  }
}

void FillRandom(bf16_bits* x, int64_t n, uint64_t seed, float amp) {
  FillRandomBf16<<<1024, 256>>>(x, n, seed, amp);
  BENCH_CUDA(cudaGetLastError());
}

template <typename T>
T* DeviceAlloc(size_t count) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(count * sizeof(T), 16)));
  return static_cast<T*>(p);
}

template <typename T>
T* DeviceCopy(const std::vector<T>& v) {
  T* p = DeviceAlloc<T>(v.size());
  if (!v.empty()) BENCH_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median of `pairs` (start, end) event pairs from events[2 * first_pair].
double MedianElapsedMs(const std::vector<cudaEvent_t>& events, int first_pair, int pairs) {
  std::vector<double> ms(pairs);
  for (int i = 0; i < pairs; ++i) {
    float t = 0;
    BENCH_CUDA(
        cudaEventElapsedTime(&t, events[2 * (first_pair + i)], events[2 * (first_pair + i) + 1]));
    ms[i] = t;
  }
  return Median(ms);
}

// Times `body(i)` per iteration with a pair of events each, after warm-up; returns the median in
// ms.
// `calls` calls, then (calls > 0) more until 100 ms of device time has passed. The SM clock leaves
// its idle state slowly: short shapes (S1, S2: ~70 µs a launch) were timed at 1.4-1.8 GHz in some
// processes and 1.98 GHz in others, with the same cycles per tile (plans/0004), while the
// ceilings measured before them ran at full clock. calls = 0 (the naive kernel, ~1 s a launch at
// S6) skips it.
template <typename Body>
void WarmUp(int calls, Body body) {
  for (int i = 0; i < calls; ++i) body(i);
  if (calls == 0) return;
  cudaEvent_t start, now;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&now));
  BENCH_CUDA(cudaEventRecord(start));
  for (int batch = 0; batch < 8000; ++batch) {
    for (int i = 0; i < 4; ++i) body(calls + 4 * batch + i);
    BENCH_CUDA(cudaEventRecord(now));
    BENCH_CUDA(cudaEventSynchronize(now));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, now));
    if (ms >= 100.f) break;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(now);
}

// sustain = false: only the `warmup` calls (the ceilings' burst figures, plans/0004 session 5).
template <typename Body>
double MedianMs(int warmup, int iters, Body body, bool sustain = true) {
  if (sustain) {
    WarmUp(warmup, body);
  } else {
    for (int i = 0; i < warmup; ++i) body(i);
  }
  std::vector<cudaEvent_t> events(2 * iters);
  for (auto& e : events) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(events[2 * i]));
    body(i);
    BENCH_CUDA(cudaEventRecord(events[2 * i + 1]));
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  const double median = MedianElapsedMs(events, 0, iters);
  for (auto& e : events) cudaEventDestroy(e);
  return median;
}

// Medians (ms) of two ways of running the same work, timed per call on `stream` in alternating
// blocks of `block` calls (one call counter across both, so the KV-copy rotation goes on), so that
// the clock's drift over the measurement falls on both alike. Timed one after the other, the long
// shapes' graph / eager read 0.99-1.015, launches of 0.15-3.7 ms whose launch path is a few
// microseconds (plans/0004, session 18).
template <typename BodyA, typename BodyB>
std::pair<double, double> InterleavedMedianMs(int iters, int block, cudaStream_t stream, BodyA a,
                                              BodyB b) {
  std::vector<cudaEvent_t> events(4 * iters);
  for (auto& e : events) BENCH_CUDA(cudaEventCreate(&e));
  int call = 0;
  for (int done = 0; done < iters; done += block) {
    const int n = std::min(block, iters - done);
    for (int side = 0; side < 2; ++side) {
      for (int k = 0; k < n; ++k, ++call) {
        cudaEvent_t* e = &events[2 * (side * iters + done + k)];
        BENCH_CUDA(cudaEventRecord(e[0], stream));
        if (side == 0) {
          a(call);
        } else {
          b(call);
        }
        BENCH_CUDA(cudaEventRecord(e[1], stream));
      }
    }
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  const std::pair<double, double> medians = {MedianElapsedMs(events, 0, iters),
                                             MedianElapsedMs(events, iters, iters)};
  for (auto& e : events) cudaEventDestroy(e);
  return medians;
}

// The SM clock: one thread spins 20 µs of globaltimer and counts clock64 cycles (SmClockDuringMhz
// runs it while a loop is in flight).
__global__ void SmClockProbe(unsigned long long* out) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  const long long c0 = clock64();
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  } while (t1 - t0 < 20000);
  out[0] = static_cast<unsigned long long>(clock64() - c0);
  out[1] = t1 - t0;
}

// The SM clock while `calls` calls of `body` run: they are queued on the legacy stream, the probe
// on a stream of its own, so it runs on an SM with room to spare or in a gap between two launches,
// under the same load either way (the clock moves in ms, the probe takes 20 µs).
template <typename Body>
double SmClockDuringMhz(int calls, Body body) {
  static unsigned long long* probe = DeviceAlloc<unsigned long long>(2);
  static cudaStream_t side = [] {
    cudaStream_t stream;
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return stream;
  }();
  for (int i = 0; i < calls / 2; ++i) body(i);
  SmClockProbe<<<1, 1, 0, side>>>(probe);
  BENCH_CUDA(cudaGetLastError());
  for (int i = calls / 2; i < calls; ++i) body(i);
  BENCH_CUDA(cudaDeviceSynchronize());
  unsigned long long h[2];
  BENCH_CUDA(cudaMemcpy(h, probe, sizeof(h), cudaMemcpyDeviceToHost));
  return double(h[0]) / double(h[1]) * 1e3;
}

// A ceiling measured twice: after the 100 ms warm-up every kernel timing also gets (`sustained`,
// what the floor uses: the device in the same state as the kernels), and straight from a cold
// start (`burst`: short bursts run at a higher clock, so the GEMM comes out ~15 % faster there;
// the table's "/burst" column divides by the best of both, the strictest reading).
struct Ceiling {
  double sustained = 0, burst = 0, sustained_mhz = 0, burst_mhz = 0;
  double best() const { return std::max(sustained, burst); }
};

// Device-to-device copy bandwidth, counting bytes read plus bytes written (4 GiB moved per copy).
Ceiling MeasureCopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  auto* a = DeviceAlloc<uint8_t>(bytes);
  auto* b = DeviceAlloc<uint8_t>(bytes);
  BENCH_CUDA(cudaMemset(a, 1, bytes));
  auto copy = [&](int) { BENCH_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); };
  Ceiling c;
  c.burst = 2.0 * bytes / (MedianMs(3, 20, copy, /*sustain=*/false) * 1e-3);
  c.burst_mhz = SmClockDuringMhz(4, copy);
  c.sustained = 2.0 * bytes / (MedianMs(3, 20, copy) * 1e-3);
  c.sustained_mhz = SmClockDuringMhz(20, copy);
  cudaFree(a);
  cudaFree(b);
  return c;
}

// bf16 x bf16 -> bf16 GEMM, fp32 accumulate, 8192^3, random inputs: the tensor-core ceiling.
Ceiling MeasureMatmulRate() {
  const int n = 8192;
  auto* a = DeviceAlloc<bf16_bits>(size_t{n} * n);
  auto* b = DeviceAlloc<bf16_bits>(size_t{n} * n);
  auto* c = DeviceAlloc<bf16_bits>(size_t{n} * n);
  FillRandom(a, int64_t{n} * n, 1, 1.f);
  FillRandom(b, int64_t{n} * n, 2, 1.f);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    std::exit(1);
  }
  const float alpha = 1.f, beta = 0.f;
  auto gemm = [&](int) {
    const cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a,
                                          CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF,
                                          n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed: %d\n", static_cast<int>(s));
      std::exit(1);
    }
  };
  const double flops = 2.0 * n * n * double(n);
  Ceiling rate;
  rate.burst = flops / (MedianMs(3, 20, gemm, /*sustain=*/false) * 1e-3);
  rate.burst_mhz = SmClockDuringMhz(4, gemm);
  rate.sustained = flops / (MedianMs(3, 20, gemm) * 1e-3);
  rate.sustained_mhz = SmClockDuringMhz(40, gemm);
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return rate;
}

// mma.sync m16n8k16 bf16 (fp32 accumulation) on every SM: B by ldmatrix.x4 from shared memory (the
// portable kernel's S loop's form) and both operands in registers, 8 warps per SM as the kernel
// runs and 16. The ceiling is the fastest of the four, sustained and burst as for the GEMM: the
// tensor pipe's rate (SPEC §5: "a chain of m16n8k16 bf16 mma.sync"). Not the ldmatrix form's alone:
// its tile addresses do not move with the loop, so ptxas may keep loads out of it (ncu counted one
// ldmatrix per 16 mma, plans/0034), and loads that did run would make the floor the shared-memory
// pipe's, which would flatter every portable ratio.
Ceiling MeasureMmaSyncRate(int sms) {
  constexpr int kIters = 40000;
  auto* sink = DeviceAlloc<float>(size_t(sms) * 16);
  Ceiling best;
  for (const MmaOperands operands : {MmaOperands::kLdmatrixB, MmaOperands::kRegisters}) {
    for (const int warps : {8, 16}) {
      auto run = [&](int) {
        BENCH_CUDA(LaunchMmaSyncRate(operands, sms, warps, kIters, sink, nullptr));
      };
      const double flops = MmaSyncRateFlops(sms, warps, kIters);
      Ceiling c;
      c.burst = flops / (MedianMs(2, 10, run, /*sustain=*/false) * 1e-3);
      c.sustained = flops / (MedianMs(2, 10, run) * 1e-3);
      c.sustained_mhz = SmClockDuringMhz(4, run);
      const bool ld = operands == MmaOperands::kLdmatrixB;
      std::printf(
          "measured: mma.sync m16n8k16 bf16, %s, %d warps/SM: %.0f TFLOP/s sustained at %.0f "
          "MHz [burst %.0f]\n",
          ld ? "B by ldmatrix.x4 per 2 mma" : "operands in registers", warps, c.sustained / 1e12,
          c.sustained_mhz, c.burst / 1e12);
      if (c.best() > best.best()) best = c;
    }
  }
  cudaFree(sink);
  return best;
}

struct Shape {
  const char* name;
  int batch, heads, q, l;
};

// One shape's device data: `copies` replicas of the KV (so rotating them defeats the L2), a slot
// table per layout, the queries, tree masks and outputs.
struct ShapeData {
  int copies = 1;
  int64_t slots_per_copy = 0;
  bf16_bits* kv = nullptr;
  bf16_bits* q = nullptr;
  bf16_bits* out = nullptr;
  bf16_bits* out_naive = nullptr;
  float* lse = nullptr;
  int32_t *qo_indptr = nullptr, *prefix_len = nullptr, *slot_indptr = nullptr,
          *mask_indptr = nullptr;
  int32_t* slots_contiguous = nullptr;
  int32_t* slots_scattered = nullptr;
  uint64_t* mask_bits = nullptr;
  // --fp8: the same KV quantized into the fp8 layout (656 bytes a row, the daemon's rule), and the
  // naive kernel's output over it.
  uint8_t* kv_fp8 = nullptr;
  bf16_bits* out_naive_fp8 = nullptr;
  VerifyProblem problem;  // slots and kv filled in per launch
};

// --copies N: the number of KV replicas the timing rotates through (default: enough to pass
// 400 MB, so the L2 holds none of them); a diagnosis of placement effects (plans/0004).
int& CopiesOverride() {
  static int copies = 0;
  return copies;
}

ShapeData BuildShape(const Shape& s, std::mt19937_64& rng) {
  ShapeData d;
  const int64_t cols = int64_t{s.l} + s.q;
  d.slots_per_copy = cols * s.batch;
  const double kv_bytes = double(d.slots_per_copy) * kKvRowBytes;
  d.copies = CopiesOverride() > 0
                 ? CopiesOverride()
                 : static_cast<int>(std::clamp(std::ceil(400e6 / kv_bytes), 1.0, 16.0));
  d.kv = DeviceAlloc<bf16_bits>(size_t(d.copies) * d.slots_per_copy * kKvDim);
  FillRandom(d.kv, int64_t(d.copies) * d.slots_per_copy * kKvDim, rng(), 1.f);
  const int64_t total_q = int64_t{s.batch} * s.q;
  d.q = DeviceAlloc<bf16_bits>(size_t(total_q) * s.heads * kKvDim);
  FillRandom(d.q, total_q * s.heads * kKvDim, rng(), 1.f);
  d.out = DeviceAlloc<bf16_bits>(size_t(total_q) * s.heads * kVDim);
  d.out_naive = DeviceAlloc<bf16_bits>(size_t(total_q) * s.heads * kVDim);
  d.lse = DeviceAlloc<float>(size_t(total_q) * s.heads);

  std::vector<int32_t> qo{0}, prefix, slot_indptr{0}, mask_indptr{0}, contiguous, scattered;
  std::vector<uint64_t> mask_bits;
  std::vector<int32_t> perm(d.slots_per_copy);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int b = 0; b < s.batch; ++b) {
    qo.push_back(qo.back() + s.q);
    prefix.push_back(s.l);
    slot_indptr.push_back(slot_indptr.back() + static_cast<int32_t>(cols));
    for (int64_t t = 0; t < cols; ++t) {
      contiguous.push_back(static_cast<int32_t>(b * cols + t));
      scattered.push_back(perm[b * cols + t]);
    }
    // A random tree: each node the child of the previous or of a random earlier node (a DDTree-like
    // shape).
    std::vector<int32_t> parents(s.q);
    for (int i = 0; i < s.q; ++i) {
      parents[i] = i == 0 ? -1 : (rng() % 2 ? i - 1 : static_cast<int32_t>(rng() % i));
    }
    auto mask = TreeMask::FromParents(parents, kMaxTreeNodes);
    BENCH_OK(mask.status());
    mask_bits.insert(mask_bits.end(), mask->bits().begin(), mask->bits().end());
    mask_indptr.push_back(static_cast<int32_t>(mask_bits.size()));
  }
  d.qo_indptr = DeviceCopy(qo);
  d.prefix_len = DeviceCopy(prefix);
  d.slot_indptr = DeviceCopy(slot_indptr);
  d.mask_indptr = DeviceCopy(mask_indptr);
  d.slots_contiguous = DeviceCopy(contiguous);
  d.slots_scattered = DeviceCopy(scattered);
  d.mask_bits = DeviceCopy(mask_bits);

  VerifyProblem& p = d.problem;
  p.num_slots = d.slots_per_copy;
  p.q = d.q;
  p.out = d.out;
  p.lse = d.lse;
  p.num_heads = s.heads;
  p.scale = 1.f / std::sqrt(192.f);
  p.batch = s.batch;
  p.total_q = static_cast<int>(total_q);
  p.qo_indptr = d.qo_indptr;
  p.prefix_len = d.prefix_len;
  p.slot_indptr = d.slot_indptr;
  p.mask_indptr = d.mask_indptr;
  p.mask_bits = d.mask_bits;
  return d;
}

// The shape's KV replicas in the fp8 layout, quantized on the host exactly as the daemon does.
void AddFp8Pool(ShapeData& d, const Shape& s) {
  const int64_t rows = int64_t{d.copies} * d.slots_per_copy;
  std::vector<bf16_bits> bf16(size_t(rows) * kKvDim);
  BENCH_CUDA(cudaMemcpy(bf16.data(), d.kv, bf16.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> fp8(size_t(rows) * kFp8RowBytes);
  for (int64_t r = 0; r < rows; ++r)
    QuantizeFp8Row(&bf16[size_t(r) * kKvDim], &fp8[size_t(r) * kFp8RowBytes]);
  d.kv_fp8 = DeviceCopy(fp8);
  d.out_naive_fp8 = DeviceAlloc<bf16_bits>(size_t(s.batch) * s.q * s.heads * kVDim);
}

void FreeShape(ShapeData& d) {
  for (void* p :
       {static_cast<void*>(d.kv), static_cast<void*>(d.q), static_cast<void*>(d.out),
        static_cast<void*>(d.out_naive), static_cast<void*>(d.lse), static_cast<void*>(d.qo_indptr),
        static_cast<void*>(d.prefix_len), static_cast<void*>(d.slot_indptr),
        static_cast<void*>(d.mask_indptr), static_cast<void*>(d.slots_contiguous),
        static_cast<void*>(d.slots_scattered), static_cast<void*>(d.mask_bits),
        static_cast<void*>(d.kv_fp8), static_cast<void*>(d.out_naive_fp8)}) {
    cudaFree(p);
  }
}

VerifyProblem ProblemFor(const ShapeData& d, int copy, bool scattered, bool fp8 = false) {
  VerifyProblem p = d.problem;
  if (fp8) {
    p.kv_fp8 = d.kv_fp8 + size_t(copy) * d.slots_per_copy * kFp8RowBytes;
  } else {
    p.kv = d.kv + size_t(copy) * d.slots_per_copy * kKvDim;
  }
  p.slots = scattered ? d.slots_scattered : d.slots_contiguous;
  return p;
}

double RelativeErrorBf16(const bf16_bits* a_dev, const bf16_bits* b_dev, size_t n) {
  std::vector<bf16_bits> a(n), b(n);
  BENCH_CUDA(cudaMemcpy(a.data(), a_dev, n * 2, cudaMemcpyDeviceToHost));
  BENCH_CUDA(cudaMemcpy(b.data(), b_dev, n * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = Bf16ToFloat(a[i]), y = Bf16ToFloat(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

struct Row {
  std::string name;
  std::string path;
  double us = 0, tflops = 0, gbs = 0, floor_us = 0, ratio = 0, burst_ratio = 0, mma_ratio = 0,
         mhz = 0, scattered_ratio = 0, graph_ratio = 0, naive_ms = 0, err = 0;
  // --fp8, on a path that reads the fp8 layout: the fp8 pool's time over the bf16 pool's, over its
  // own floor (656-byte rows), its scattered / contiguous, and its error against the naive kernel
  // on the same fp8 pool. fp8_ratio 0: not measured.
  double fp8_us = 0, fp8_ratio = 0, fp8_floor_ratio = 0, fp8_scattered_ratio = 0, fp8_err = 0;
  int ctas = 0;
};

// A shape's split plan for this device, uploaded into a workspace of its own (cudaFree it).
struct UploadedPlan {
  SplitPlan plan;
  WorkspaceLayout layout;
  uint8_t* workspace = nullptr;
};

UploadedPlan PlanAndUpload(const Shape& s, int sms) {
  std::vector<int32_t> prefix(s.batch, s.l), qlen(s.batch, s.q);
  auto plan = PlanSplits(prefix, qlen, s.heads, sms);
  BENCH_OK(plan.status());
  UploadedPlan up{*std::move(plan), {}, nullptr};
  up.layout = LayoutWorkspace(up.plan);
  up.workspace = DeviceAlloc<uint8_t>(up.layout.total_bytes);
  BENCH_OK(UploadPlan(up.plan, up.layout, up.workspace, nullptr));
  BENCH_CUDA(cudaDeviceSynchronize());
  return up;
}

// Times the flash kernel alone, the combine alone and both, for one shape:
// where a shape's time goes, and what the fixed cost per CTA is (sweep L at a fixed split count).
void Breakdown(const Shape& s, std::mt19937_64& rng, int sms, int iters) {
  ShapeData d = BuildShape(s, rng);
  UploadedPlan up = PlanAndUpload(s, sms);
  const SplitPlan* plan = &up.plan;
  const WorkspaceLayout& layout = up.layout;
  uint8_t* workspace = up.workspace;
  auto run = [&](int i, VerifyStages stages) {
    BENCH_OK(LaunchMlaVerify(ProblemFor(d, i % d.copies, true), *plan, layout, workspace, nullptr,
                             stages));
  };
  const double all = MedianMs(5, iters, [&](int i) { run(i, VerifyStages::kFlashAndCombine); });
  const double flash = MedianMs(5, iters, [&](int i) { run(i, VerifyStages::kFlashOnly); });
  double combine = 0;
  if (!plan->combine.empty()) {
    combine = MedianMs(5, iters, [&](int i) { run(i, VerifyStages::kCombineOnly); });
  }
  int max_cols = 0;
  for (const FlashWorkItem& w : plan->work) max_cols = std::max(max_cols, w.col_end - w.col_begin);
  std::printf(
      "breakdown %s [%s] B=%d H=%d Q=%d L=%d: %zu CTAs, <=%d cols each, %zu combine items: "
      "flash+combine %.1f us, flash %.1f us, combine %.1f us\n",
      s.name, FlashKernelName(), s.batch, s.heads, s.q, s.l, plan->work.size(), max_cols,
      plan->combine.size(), all * 1e3, flash * 1e3, combine * 1e3);
  std::fflush(stdout);
  cudaFree(workspace);
  FreeShape(d);
}

// Where a flash CTA's time goes (sm_90a kernel, clock stamps per CTA): the start skew over CTAs,
// the prologue (Q and the first KV tile), the first tiles and the steady per-tile time, the
// epilogue (partials out), and the span from the first start to the last end. scattered: the
// page-size-1 random slot table (the gathered tile loop), else one run per sequence (one-run tiles
// by bulk copies).
void Timeline(const Shape& s, bool scattered, std::mt19937_64& rng, int sms) {
  if (!HopperFlashAvailable()) return;
  ShapeData d = BuildShape(s, rng);
  UploadedPlan up = PlanAndUpload(s, sms);
  const SplitPlan* plan = &up.plan;
  const WorkspaceLayout& layout = up.layout;
  uint8_t* workspace = up.workspace;
  const int n = static_cast<int>(plan->work.size());
  auto* timeline = DeviceAlloc<uint64_t>(size_t(n) * kSm90TimelineStride);
  WarmUp(10, [&](int i) {
    BENCH_OK(
        LaunchMlaVerify(ProblemFor(d, i % d.copies, scattered), *plan, layout, workspace, nullptr));
  });
  const MlaVerifyParams params =
      MakeMlaVerifyParams(ProblemFor(d, 10 % d.copies, scattered), *plan, layout, workspace);
  BENCH_CUDA(LaunchSm90Instrumented(Sm90Instrument::kTimeline, params, timeline, nullptr));
  BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<uint64_t> t(size_t(n) * kSm90TimelineStride);
  BENCH_CUDA(cudaMemcpy(t.data(), timeline, t.size() * 8, cudaMemcpyDeviceToHost));
  const int T = kSm90TimelineTiles;
  uint64_t first_start = UINT64_MAX, last_end = 0;
  for (int b = 0; b < n; ++b) {
    first_start = std::min(first_start, t[size_t(b) * kSm90TimelineStride]);
    last_end = std::max(last_end, t[size_t(b) * kSm90TimelineStride + 4 + T]);
  }
  std::vector<double> skew, prologue, tile0, tile1, steady, epilogue, total, end, mhz, steady_kclk;
  std::vector<double> q_issued, tile0_issued, landed, to_barrier;
  for (int b = 0; b < n; ++b) {
    const uint64_t* c = &t[size_t(b) * kSm90TimelineStride];
    const double ns_per_clk = double(c[4 + T] - c[0]) / double(c[3 + T] - c[1]);
    auto us = [&](uint64_t a, uint64_t z) { return double(z - a) * ns_per_clk * 1e-3; };
    const int tiles = (plan->work[b].col_end - plan->work[b].col_begin + 63) / 64;
    skew.push_back((c[0] - first_start) * 1e-3);
    prologue.push_back(us(c[1], c[2]));
    q_issued.push_back(us(c[1], c[6 + T]));
    tile0_issued.push_back(us(c[6 + T], c[7 + T]));
    landed.push_back(us(c[7 + T], c[8 + T]));
    to_barrier.push_back(us(c[8 + T], c[2]));
    if (tiles >= 2) tile0.push_back(us(c[2], c[3]));
    if (tiles >= 3) tile1.push_back(us(c[3], c[4]));
    const int last = std::min(tiles, T) - 1;  // stamp of the last tile's data arriving
    if (last >= 3) {
      steady.push_back(us(c[4], c[2 + last]) / (last - 2));
      steady_kclk.push_back(double(c[2 + last] - c[4]) / (last - 2) * 1e-3);
    }
    mhz.push_back(1e3 / ns_per_clk);
    epilogue.push_back(us(c[2 + T], c[3 + T]));
    total.push_back((c[4 + T] - c[0]) * 1e-3);
    end.push_back((c[4 + T] - first_start) * 1e-3);
  }
  auto med = [](std::vector<double> v) { return v.empty() ? 0.0 : Median(v); };
  auto max = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  std::printf(
      "timeline %s %s: %d CTAs, span %.1f us | start skew med %.1f max %.1f | prologue med %.1f "
      "max %.1f | tile0 %.2f tile1 %.2f steady/tile %.2f (max %.2f) | last tile+epilogue med "
      "%.1f | CTA total med %.1f max %.1f | end med %.1f max %.1f (us) | SM clock med %.0f MHz, "
      "steady/tile %.2f kclk\n",
      s.name, scattered ? "scattered" : "contiguous", n, (last_end - first_start) * 1e-3, med(skew),
      max(skew), med(prologue), max(prologue), med(tile0), med(tile1), med(steady), max(steady),
      med(epilogue), med(total), max(total), med(end), max(end), med(mhz), med(steady_kclk));
  std::printf(
      "prologue %s %s (us, medians): item decoded and Q's copies issued %.2f | tiles 0 and 1's "
      "slots read and their copies issued %.2f | Q landed %.2f | to tile 0 in, the loop's first "
      "wait %.2f\n",
      s.name, scattered ? "scattered" : "contiguous", med(q_issued), med(tile0_issued), med(landed),
      med(to_barrier));
  // Where a steady tile's clocks go, per warpgroup: the intervals between the kernel's phase points
  // (SmPhase), medians over the CTAs that run every phase tile and one more.
  const int points = kSm90PhasePoints;
  const char* kIntervals[] = {"data wait",
                              "S issue",
                              "other's P V issue + S wait",
                              "max check",
                              "P made",
                              "own P V issue",
                              "P buffer wait",
                              "P published + other's P V wait",
                              "slot free wait",
                              "refill issue",
                              "own P V wait + to next top"};
  for (int wg = 0; wg < 2; ++wg) {
    std::vector<std::vector<double>> clk(points);
    for (int b = 0; b < n; ++b) {
      const int tiles = (plan->work[b].col_end - plan->work[b].col_begin + 63) / 64;
      if (tiles <= kSm90PhaseFirstTile + kSm90PhaseTiles) continue;
      const uint64_t* c = &t[size_t(b) * kSm90TimelineStride + kSm90PhaseBase];
      for (int k = 0; k < kSm90PhaseTiles; ++k) {
        const uint64_t* p = c + (k * 2 + wg) * points;
        for (int i = 0; i + 1 < points; ++i) clk[i].push_back(double(p[i + 1] - p[i]));
        if (k + 1 < kSm90PhaseTiles) {
          clk[points - 1].push_back(double(c[((k + 1) * 2 + wg) * points] - p[points - 1]));
        }
      }
    }
    std::printf("phases %s %s warpgroup %d (clocks):", s.name,
                scattered ? "scattered" : "contiguous", wg);
    for (int i = 0; i < points; ++i) std::printf(" %s %.0f;", kIntervals[i], med(clk[i]));
    std::printf("\n");
  }
  std::fflush(stdout);
  cudaFree(timeline);
  cudaFree(workspace);
  FreeShape(d);
}

// Which side bounds the sm_90a kernel (plans/0004, session 4): flash + combine as shipped, then
// with the flash kernel's main loop stripped of its KV gathers, then of its wgmma (same plan, same
// combine; the stripped kernels' outputs are garbage, only their time counts).
void Diagnose(const Shape& s, std::mt19937_64& rng, int sms, int iters) {
  if (!HopperFlashAvailable()) return;
  ShapeData d = BuildShape(s, rng);
  UploadedPlan up = PlanAndUpload(s, sms);
  auto shipped = [&](int i) {
    BENCH_OK(LaunchMlaVerify(ProblemFor(d, i % d.copies, true), up.plan, up.layout, up.workspace,
                             nullptr, VerifyStages::kFlashAndCombine, FlashPath::kHopper));
  };
  auto stripped = [&](Sm90Instrument instrument) {
    return [&, instrument](int i) {
      const MlaVerifyParams params =
          MakeMlaVerifyParams(ProblemFor(d, i % d.copies, true), up.plan, up.layout, up.workspace);
      BENCH_CUDA(LaunchSm90Instrumented(instrument, params, nullptr, nullptr));
      if (!up.plan.combine.empty()) {
        BENCH_OK(LaunchMlaVerify(ProblemFor(d, i % d.copies, true), up.plan, up.layout,
                                 up.workspace, nullptr, VerifyStages::kCombineOnly));
      }
    };
  };
  const double full = MedianMs(5, iters, shipped);
  const double no_gathers = MedianMs(5, iters, stripped(Sm90Instrument::kNoGathers));
  const double no_math = MedianMs(5, iters, stripped(Sm90Instrument::kNoMath));
  std::printf(
      "diag %s [sm90a-wgmma] B=%d H=%d Q=%d L=%d: full %.1f us, no gathers %.1f us, "
      "no wgmma %.1f us\n",
      s.name, s.batch, s.heads, s.q, s.l, full * 1e3, no_gathers * 1e3, no_math * 1e3);
  std::fflush(stdout);
  cudaFree(up.workspace);
  FreeShape(d);
}

int Main(int argc, char** argv) {
  int iters = 50;
  bool run_naive = true;
  bool both_paths = true;
  bool breakdown = false;
  bool timeline = false;
  bool diag = false;
  bool fp8 = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc)
      only = argv[++i];
    else if (!std::strcmp(argv[i], "--no-naive"))
      run_naive = false;
    else if (!std::strcmp(argv[i], "--copies") && i + 1 < argc)
      CopiesOverride() = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--launcher-path-only"))
      both_paths = false;
    else if (!std::strcmp(argv[i], "--breakdown"))
      breakdown = true;
    else if (!std::strcmp(argv[i], "--timeline"))
      timeline = true;
    else if (!std::strcmp(argv[i], "--diag"))
      diag = true;
    else if (!std::strcmp(argv[i], "--fp8"))
      fp8 = true;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, sm_%d%d, %d SMs, L2 %d MB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20);
  // The GEMM first: its burst figure wants the device as cold as the process finds it.
  const Ceiling matmul_ceiling = MeasureMatmulRate();
  const Ceiling copy_ceiling = MeasureCopyBandwidth();
  const double bandwidth = copy_ceiling.sustained;
  const double matmul = matmul_ceiling.sustained;
  std::printf(
      "measured: copy bandwidth %.0f GB/s (read+write) at %.0f MHz [burst %.0f GB/s at %.0f MHz], "
      "bf16 matmul %.0f TFLOP/s (cuBLAS 8192^3) at %.0f MHz [burst %.0f TFLOP/s at %.0f MHz]\n",
      bandwidth / 1e9, copy_ceiling.sustained_mhz, copy_ceiling.burst / 1e9, copy_ceiling.burst_mhz,
      matmul / 1e12, matmul_ceiling.sustained_mhz, matmul_ceiling.burst / 1e12,
      matmul_ceiling.burst_mhz);
  const Ceiling mma_ceiling = MeasureMmaSyncRate(prop.multiProcessorCount);
  std::printf(
      "measured: mma.sync ceiling (fastest operand form) %.0f TFLOP/s sustained [best %.0f]\n",
      mma_ceiling.sustained / 1e12, mma_ceiling.best() / 1e12);

  // SPEC §5: S1-S7, and S8 / SH (issue 16: a long Q at H = 8, and L no multiple of the tile).
  const std::vector<Shape> shapes = {
      {"S1", 1, 8, 16, 65536},  {"S2", 1, 64, 9, 16384},   {"S3", 1, 64, 33, 65536},
      {"S4", 8, 16, 16, 8192},  {"S5", 32, 8, 8, 4096},    {"S6", 1, 128, 64, 131072},
      {"S7", 1, 8, 16, 262144}, {"S8", 1, 8, 128, 131072}, {"SH", 1, 8, 16, 185000}};
  const int sms = prop.multiProcessorCount;
  std::mt19937_64 rng(20261129);
  // The instruments: each one asked for runs, in this order, then the program ends (one device
  // call can take all three).
  auto selected = [&](const Shape& s) {
    return only.empty() || only.find(s.name) != std::string::npos;
  };
  if (breakdown) {
    // The SPEC shapes less S6 (no splits), then L swept at S1's and S2's (H, Q): the planner keeps
    // ~1 CTA per SM, so the flash time against columns per CTA gives the per-tile cost and the
    // fixed cost per CTA.
    std::vector<Shape> sweep;
    for (const Shape& s : shapes) {
      if (std::strcmp(s.name, "S6") != 0) sweep.push_back(s);
    }
    for (const Shape& s : std::vector<Shape>{{"S1L8K", 1, 8, 16, 8192},
                                             {"S1L16K", 1, 8, 16, 16384},
                                             {"S1L32K", 1, 8, 16, 32768},
                                             {"S1L128K", 1, 8, 16, 131072},
                                             {"S2L4K", 1, 64, 9, 4096},
                                             {"S2L64K", 1, 64, 9, 65536}}) {
      sweep.push_back(s);
    }
    for (const Shape& s : sweep) {
      if (selected(s)) Breakdown(s, rng, sms, iters);
    }
  }
  if (timeline) {
    for (const Shape& s : std::vector<Shape>{{"S1", 1, 8, 16, 65536},
                                             {"S2", 1, 64, 9, 16384},
                                             {"S3", 1, 64, 33, 65536},
                                             {"S5", 32, 8, 8, 4096},
                                             {"S6", 1, 128, 64, 131072},
                                             {"S7", 1, 8, 16, 262144},
                                             {"SH", 1, 8, 16, 185000},
                                             {"S1L8K", 1, 8, 16, 8192}}) {
      if (!selected(s)) continue;
      for (const bool scattered : {false, true}) Timeline(s, scattered, rng, sms);
    }
  }
  if (diag) {
    for (const Shape& s : shapes) {
      if (selected(s)) Diagnose(s, rng, sms, iters);
    }
  }
  if (breakdown || timeline || diag) return 0;
  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    if (!selected(s)) continue;
    ShapeData d = BuildShape(s, rng);
    if (fp8) AddFp8Pool(d, s);
    UploadedPlan up = PlanAndUpload(s, sms);
    const SplitPlan* plan = &up.plan;
    const WorkspaceLayout& layout = up.layout;
    uint8_t* workspace = up.workspace;

    FlashPath path = FlashPath::kAuto;
    auto launch = [&](int i, bool scattered, cudaStream_t stream) {
      BENCH_OK(LaunchMlaVerify(ProblemFor(d, i % d.copies, scattered), *plan, layout, workspace,
                               stream, VerifyStages::kFlashAndCombine, path));
    };
    auto launch_fp8 = [&](int i, bool scattered) {
      BENCH_OK(LaunchMlaVerify(ProblemFor(d, i % d.copies, scattered, /*fp8=*/true), *plan, layout,
                               workspace, nullptr, VerifyStages::kFlashAndCombine, path));
    };
    double naive_ms = 0;
    if (run_naive) {
      VerifyProblem naive = ProblemFor(d, 0, true);
      naive.out = d.out_naive;
      naive_ms = MedianMs(0, 1, [&](int) { BENCH_OK(LaunchMlaVerifyNaive(naive, nullptr)); });
      if (fp8) {
        VerifyProblem naive_fp8 = ProblemFor(d, 0, true, /*fp8=*/true);
        naive_fp8.out = d.out_naive_fp8;
        BENCH_OK(LaunchMlaVerifyNaive(naive_fp8, nullptr));
        BENCH_CUDA(cudaDeviceSynchronize());
      }
    }
    // Each flash path this device has (the Hopper kernel where it runs, then the portable one),
    // measured against the same ceilings and the same naive output.
    const std::vector<FlashPath> paths =
        both_paths ? AvailableFlashPaths() : std::vector<FlashPath>{FlashPath::kAuto};
    for (const FlashPath p : paths) {
      path = p;
      Row row;
      row.name = s.name;
      row.path = FlashKernelName(path);
      row.ctas = static_cast<int>(plan->work.size());
      const double contiguous_ms = MedianMs(5, iters, [&](int i) { launch(i, false, nullptr); });
      row.mhz = SmClockDuringMhz(std::max(4, static_cast<int>(20.0 / contiguous_ms)),
                                 [&](int i) { launch(i, false, nullptr); });
      const double scattered_ms = MedianMs(5, iters, [&](int i) { launch(i, true, nullptr); });

      // Graph replay of the same launch (one graph per KV copy, replayed in rotation).
      cudaStream_t stream;
      BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      std::vector<cudaGraphExec_t> graphs(d.copies);
      for (int c = 0; c < d.copies; ++c) {
        cudaGraph_t graph;
        BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        launch(c, true, stream);
        BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
        BENCH_CUDA(cudaGraphInstantiate(&graphs[c], graph, 0));
        cudaGraphDestroy(graph);
      }
      BENCH_CUDA(cudaStreamSynchronize(stream));
      for (int i = 0; i < 5; ++i) BENCH_CUDA(cudaGraphLaunch(graphs[i % d.copies], stream));
      // Eager and graph replay of the scattered launch, interleaved (the eager one on this stream
      // too, so that only the launch path differs).
      const auto [eager_ms, graph_ms] = InterleavedMedianMs(
          iters, 5, stream, [&](int i) { launch(i, true, stream); },
          [&](int i) { BENCH_CUDA(cudaGraphLaunch(graphs[i % d.copies], stream)); });
      for (auto& g : graphs) cudaGraphExecDestroy(g);
      cudaStreamDestroy(stream);

      const double flops = double(s.batch) * s.q * s.heads * (double(s.l) + s.q) * 2176.0;
      const double bytes = double(s.batch) * (double(s.l) + s.q) * kKvRowBytes;
      // The path's own tensor-core ceiling: cuBLAS's (wgmma) for the Hopper kernel, mma.sync's
      // for the portable one (SPEC §5).
      const bool portable =
          path == FlashPath::kPortable || (path == FlashPath::kAuto && !HopperFlashAvailable());
      const double rate = portable ? mma_ceiling.sustained : matmul;
      const double floor_s = std::max(bytes / bandwidth, flops / rate);
      row.us = contiguous_ms * 1e3;
      row.tflops = flops / (contiguous_ms * 1e-3) / 1e12;
      row.gbs = bytes / (contiguous_ms * 1e-3) / 1e9;
      row.floor_us = floor_s * 1e6;
      row.ratio = contiguous_ms * 1e-3 / floor_s;
      row.burst_ratio = contiguous_ms * 1e-3 /
                        std::max(bytes / copy_ceiling.best(), flops / matmul_ceiling.best());
      row.mma_ratio =
          contiguous_ms * 1e-3 / std::max(bytes / copy_ceiling.best(), flops / mma_ceiling.best());
      row.scattered_ratio = scattered_ms / contiguous_ms;
      row.graph_ratio = graph_ms / eager_ms;
      if (run_naive) {
        // This path's flash output of copy 0 (scattered) vs the naive kernel on the same inputs.
        launch(0, true, nullptr);
        BENCH_CUDA(cudaDeviceSynchronize());
        row.naive_ms = naive_ms;
        row.err = RelativeErrorBf16(d.out, d.out_naive, size_t(s.batch) * s.q * s.heads * kVDim);
      }
      if (fp8) {
        const double fp8_ms = MedianMs(5, iters, [&](int i) { launch_fp8(i, false); });
        const double fp8_scattered_ms = MedianMs(5, iters, [&](int i) { launch_fp8(i, true); });
        const double fp8_bytes = double(s.batch) * (double(s.l) + s.q) * kFp8RowBytes;
        row.fp8_us = fp8_ms * 1e3;
        row.fp8_ratio = fp8_ms / contiguous_ms;
        row.fp8_floor_ratio = fp8_ms * 1e-3 / std::max(fp8_bytes / bandwidth, flops / rate);
        row.fp8_scattered_ratio = fp8_scattered_ms / fp8_ms;
        if (run_naive) {
          launch_fp8(0, true);
          BENCH_CUDA(cudaDeviceSynchronize());
          row.fp8_err =
              RelativeErrorBf16(d.out, d.out_naive_fp8, size_t(s.batch) * s.q * s.heads * kVDim);
        }
        std::printf(
            "%s [%s] fp8 pool: %.1f us, fp8/bf16 %.3f, x%.2f its floor (656-byte rows), "
            "scattered/contiguous %.3f, err vs naive on fp8 %.1e\n",
            s.name, row.path.c_str(), row.fp8_us, row.fp8_ratio, row.fp8_floor_ratio,
            row.fp8_scattered_ratio, row.fp8_err);
      }
      std::printf(
          "%s [%s] B=%d H=%d Q=%d L=%d: %.1f us, %.0f TFLOP/s, %.0f GB/s, floor %.1f us "
          "(%s-bound), x%.2f "
          "floor (x%.2f burst floor, x%.2f mma.sync floor) at %.0f MHz, "
          "scattered/contiguous %.3f, graph/eager %.3f, naive %.2f ms (err vs flash %.1e), %d "
          "CTAs, "
          "%d tiles/split\n",
          s.name, row.path.c_str(), s.batch, s.heads, s.q, s.l, row.us, row.tflops, row.gbs,
          row.floor_us, bytes / bandwidth > flops / rate ? "memory" : "compute", row.ratio,
          row.burst_ratio, row.mma_ratio, row.mhz, row.scattered_ratio, row.graph_ratio,
          row.naive_ms, row.err, row.ctas, plan->tiles_per_split);
      std::fflush(stdout);
      rows.push_back(row);
    }
    cudaFree(workspace);
    FreeShape(d);
  }

  std::printf("\n%-4s %-18s %10s %8s %8s %10s %7s %7s %7s %5s %8s %8s %10s %8s\n", "shape", "path",
              "time_us", "TFLOP/s", "GB/s", "floor_us", "/floor", "/burst", "/mma", "MHz",
              "scat/ctg", "grph/eag", "naive_ms", "err");
  for (const Row& r : rows) {
    std::printf(
        "%-5s %-18s %10.1f %8.0f %8.0f %10.1f %7.2f %7.2f %7.2f %5.0f %8.3f %8.3f %10.2f %8.1e\n",
        r.name.c_str(), r.path.c_str(), r.us, r.tflops, r.gbs, r.floor_us, r.ratio, r.burst_ratio,
        r.mma_ratio, r.mhz, r.scattered_ratio, r.graph_ratio, r.naive_ms, r.err);
  }
  if (fp8) {
    std::printf("\n%-4s %-18s %10s %9s %7s %8s %8s\n", "shape", "path", "fp8_us", "fp8/bf16",
                "/floor", "scat/ctg", "err");
    for (const Row& r : rows) {
      if (r.fp8_ratio == 0) continue;
      std::printf("%-5s %-18s %10.1f %9.3f %7.2f %8.3f %8.1e\n", r.name.c_str(), r.path.c_str(),
                  r.fp8_us, r.fp8_ratio, r.fp8_floor_ratio, r.fp8_scattered_ratio, r.fp8_err);
    }
  }
  std::printf(
      "ceilings (sustained, the floor's): copy %.0f GB/s, bf16 matmul %.0f TFLOP/s at %.0f MHz, "
      "mma.sync %.0f TFLOP/s; burst: %.0f GB/s, %.0f TFLOP/s at %.0f MHz, mma.sync %.0f TFLOP/s\n",
      bandwidth / 1e9, matmul / 1e12, matmul_ceiling.sustained_mhz, mma_ceiling.sustained / 1e12,
      copy_ceiling.burst / 1e9, matmul_ceiling.burst / 1e12, matmul_ceiling.burst_mhz,
      mma_ceiling.best() / 1e12);
  return 0;
}

}  // namespace
}  // namespace verifyd::bench

int main(int argc, char** argv) { return verifyd::bench::Main(argc, argv); }
