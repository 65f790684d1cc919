// Math: element i is out of bound when (bits & 0x7fff) > 0x4780 (2^16 as bf16), which also
// catches Inf and NaN; the answer is the smallest such i (atomicMin of (i << 16) | bits, so the
// value comes with it), as on the host. The NaN fill writes 0xFFFF (bf16 NaN) / 0xFFFFFFFF (fp32
// NaN) when any check found something.
// Tiling: one 16-byte word (8 bf16) per thread per step, a grid-stride loop over n / 8 words, the
// tail (n % 8) by the first thread; grid row y checks tensor y (up to two per launch); the fill,
// one element per thread per step. Schedule: a bounded grid (at most 1024 CTAs of 256 threads); a
// CTA skips its atomic when it found nothing, so a clean tensor costs one read of its bytes, and
// the fill one read of `count` words per thread. Shared memory: none.
#include "kernels/value_bound_check.h"

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/programmatic_launch.cuh"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

__device__ __forceinline__ bool Bad(uint32_t half_bits) {
  return (half_bits & 0x7fffu) > kMaxInputMagnitudeBits;
}

// Up to two tensors, one per grid row: (data0, n0) into firsts[0], (data1, n1) into firsts[1].
__global__ void __launch_bounds__(kThreads)
    FirstOutOfBoundKernel(const bf16_bits* data0, int64_t n0, const bf16_bits* data1, int64_t n1,
                          unsigned long long* firsts) {
  pdl::WaitForPriorGrid();
  pdl::AllowDependentLaunch();
  const bf16_bits* data = blockIdx.y == 0 ? data0 : data1;
  const int64_t n = blockIdx.y == 0 ? n0 : n1;
  unsigned long long* first = firsts + blockIdx.y;
  const int64_t words = n / 8;
  unsigned long long found = ~0ull;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; w < words;
       w += stride) {
    const uint4 v = reinterpret_cast<const uint4*>(data)[w];
    const uint32_t parts[4] = {v.x, v.y, v.z, v.w};
    for (int k = 0; k < 8; ++k) {
      const uint32_t bits = (parts[k / 2] >> (16 * (k % 2))) & 0xffffu;
      if (Bad(bits)) {
        found = (static_cast<unsigned long long>(w * 8 + k) << 16) | bits;
        break;
      }
    }
    if (found != ~0ull) break;  // later words of this thread have larger indices
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (int64_t i = words * 8; i < n && found == ~0ull; ++i) {
      if (Bad(data[i])) found = (static_cast<unsigned long long>(i) << 16) | data[i];
    }
  }
  if (found != ~0ull) atomicMin(first, found);
}

__global__ void __launch_bounds__(kThreads)
    NanIfOutOfBoundKernel(const unsigned long long* firsts, int count, bf16_bits* out,
                          int64_t out_n, float* lse, int64_t lse_n) {
  pdl::WaitForPriorGrid();
  pdl::AllowDependentLaunch();
  bool bad = false;
  for (int k = 0; k < count; ++k) bad |= firsts[k] != kNoneOutOfBound;
  if (!bad) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < out_n;
       i += stride) {
    out[i] = 0xffffu;
  }
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < lse_n;
       i += stride) {
    lse[i] = __int_as_float(-1);
  }
}

unsigned BlocksFor(int64_t threads_wanted) {
  const int64_t wanted = (threads_wanted + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < kMaxBlocks ? wanted : kMaxBlocks);
}

}  // namespace

namespace {

absl::Status CheckTensor(const char* name, const bf16_bits* data, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": n = ", n, " must be >= 0"));
  if (n == 0) return absl::OkStatus();
  if (data == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " must be set"));
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be 16-byte aligned"));
  }
  if (n >= (int64_t{1} << 48)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": n = ", n, " must be < 2^48"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchFirstOutOfBoundOfTwo(const bf16_bits* a, int64_t na, const bf16_bits* b,
                                        int64_t nb, unsigned long long* firsts,
                                        cudaStream_t stream) {
  VERIFYD_RETURN_IF_ERROR(CheckTensor("data", a, na));
  VERIFYD_RETURN_IF_ERROR(CheckTensor("second data", b, nb));
  if (na == 0 && nb == 0) return absl::OkStatus();
  if (firsts == nullptr) return absl::InvalidArgumentError("firsts must be set");
  const int64_t longest = na > nb ? na : nb;
  const dim3 grid(BlocksFor((longest + 7) / 8), b != nullptr && nb > 0 ? 2 : 1);
  VERIFYD_CUDA_CHECK(pdl::LaunchMaybeProgrammatic(FirstOutOfBoundKernel, grid, dim3(kThreads), 0,
                                                  stream, ProgrammaticLaunchRunsHere(), a, na, b,
                                                  nb, firsts));
  return absl::OkStatus();
}

absl::Status LaunchFirstOutOfBound(const bf16_bits* data, int64_t n, unsigned long long* first,
                                   cudaStream_t stream) {
  if (n > 0 && first == nullptr) return absl::InvalidArgumentError("data and first must be set");
  return LaunchFirstOutOfBoundOfTwo(data, n, nullptr, 0, first, stream);
}

absl::Status LaunchNanIfOutOfBound(const unsigned long long* firsts, int count, bf16_bits* out,
                                   int64_t out_n, float* lse, int64_t lse_n, cudaStream_t stream) {
  if (count <= 0 || firsts == nullptr || out_n < 0 || lse_n < 0 || (out_n > 0 && out == nullptr) ||
      (lse_n > 0 && lse == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("count = ", count, ", out_n = ", out_n, ", lse_n = ", lse_n,
                     ": firsts and every non-empty output must be set"));
  }
  const int64_t longest = out_n > lse_n ? out_n : lse_n;
  if (longest == 0) return absl::OkStatus();
  VERIFYD_CUDA_CHECK(pdl::LaunchMaybeProgrammatic(
      NanIfOutOfBoundKernel, dim3(BlocksFor(longest)), dim3(kThreads), 0, stream,
      ProgrammaticLaunchRunsHere(), firsts, count, out, out_n, lse, lse_n));
  return absl::OkStatus();
}

}  // namespace verifyd
