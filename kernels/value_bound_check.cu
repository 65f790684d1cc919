// Math: element i is out of bound when (bits & 0x7fff) > 0x4780 (2^16 as bf16), which also
// catches Inf and NaN; the answer is the smallest such i (atomicMin of (i << 16) | bits, so the
// value comes with it), as on the host. The NaN fill writes 0xFFFF (bf16 NaN) / 0xFFFFFFFF (fp32
// NaN) when any check found something, and then hands the words to the host.
// Tiling: one 16-byte word (8 bf16) per thread per step, a grid-stride loop over n / 8 words, the
// tail (n % 8) by the first thread of a tensor's blocks; the launch's blocks are split by
// blockIdx.x: the first kSlotScatterBlocks place the slot-table upload when there is one
// (slot_table_scatter.cuh), then the tree-KV write's blocks when it rides along
// (tree_row_write.cuh), then each checked tensor gets the same number of blocks (up to two
// tensors per launch). The fill: one element per thread per step, at most 16 CTAs. Schedule: a
// bounded grid (at most 1024 CTAs of 256 threads per tensor); a CTA skips its atomic when it found
// nothing, so a clean tensor costs one read of its bytes, and the fill one read of `count` words
// per thread. Why the fill neither counts its CTAs nor re-arms the words: the caller's next upload
// arms them (they live in its staging), and the host arms its own copy before each call, so a
// clean call's fill writes nothing at all (plans/0031, change 7; change 2 had taken the memset
// and the copy back out of the graph by having the last CTA re-arm). Shared memory: none.
#include "kernels/value_bound_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/mla_verify_launch.h"
#include "kernels/programmatic_launch.cuh"
#include "kernels/slot_table_scatter.cuh"
#include "kernels/tree_row_write.cuh"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads == kTreeRowThreads, "the tree write's blocks are this launch's");
constexpr int kMaxBlocks = 1024;
constexpr unsigned kFillBlocks = 16;

__device__ __forceinline__ bool Bad(uint32_t half_bits) {
  return (half_bits & 0x7fffu) > kMaxInputMagnitudeBits;
}

// Block `block` of `blocks` checks its share of data[0, n) into *first.
__device__ __forceinline__ void FirstOutOfBoundBlock(const bf16_bits* data, int64_t n,
                                                     unsigned long long* first, int block,
                                                     int blocks) {
  const int64_t words = n / 8;
  unsigned long long found = ~0ull;
  const int64_t stride = static_cast<int64_t>(blocks) * kThreads;
  for (int64_t w = static_cast<int64_t>(block) * kThreads + threadIdx.x; w < words; w += stride) {
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
  if (block == 0 && threadIdx.x == 0) {
    for (int64_t i = words * 8; i < n && found == ~0ull; ++i) {
      if (Bad(data[i])) found = (static_cast<unsigned long long>(i) << 16) | data[i];
    }
  }
  if (found != ~0ull) atomicMin(first, found);
}

// Blocks [0, scatter_blocks) place the slot-table upload; then tree_blocks blocks write the tree
// rows (tree_row_write.cuh); then check_blocks blocks per tensor: (data0, n0) into firsts[0],
// (data1, n1) into firsts[1].
__global__ void __launch_bounds__(kThreads)
    ScatterAndFirstOutOfBoundKernel(SlotScatterArgs scatter, int scatter_blocks,
                                    TreeRowWriteArgs tree, int tree_blocks, const bf16_bits* data0,
                                    int64_t n0, const bf16_bits* data1, int64_t n1,
                                    unsigned long long* firsts, int check_blocks) {
  pdl::WaitForPriorGrid();
  pdl::AllowDependentLaunch();
  int block = static_cast<int>(blockIdx.x);
  if (block < scatter_blocks) {
    SlotScatterBlock(scatter, block, scatter_blocks);
    return;
  }
  block -= scatter_blocks;
  if (block < tree_blocks) {
    TreeRowWriteBlock(tree, block);
    return;
  }
  block -= tree_blocks;
  const int tensor = block / check_blocks;
  FirstOutOfBoundBlock(tensor == 0 ? data0 : data1, tensor == 0 ? n0 : n1, firsts + tensor,
                       block % check_blocks, check_blocks);
}

constexpr int kMaxFillWords = 2;

// Every thread reads the words itself (two loads that the warp shares): no barrier, no flag in
// shared memory. A clean call (the usual one) ends here and writes nothing.
__global__ void __launch_bounds__(kThreads)
    NanIfOutOfBoundKernel(const unsigned long long* firsts, int count,
                          unsigned long long* host_firsts, bf16_bits* out, int64_t out_n,
                          float* lse, int64_t lse_n) {
  pdl::WaitForPriorGrid();
  pdl::AllowDependentLaunch();
  unsigned long long words[kMaxFillWords];
  bool bad = false;
#pragma unroll
  for (int k = 0; k < kMaxFillWords; ++k) {
    words[k] = k < count ? firsts[k] : kNoneOutOfBound;
    bad |= words[k] != kNoneOutOfBound;
  }
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
  // The host reads its copy only after an event recorded behind this launch has completed, and a
  // grid's writes to mapped host memory are visible to a host that has synchronized with the
  // grid's completion: no fence (plans/0031, change 6).
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (int k = 0; k < count; ++k) host_firsts[k] = words[k];
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

absl::Status LaunchSlotScatterAndFirstOutOfBound(const SlotScatterArgs& scatter,
                                                 const FirstOutOfBoundArgs& check,
                                                 cudaStream_t stream,
                                                 const TreeRowWriteArgs& tree) {
  const bool place = scatter.header != nullptr || scatter.runs != nullptr ||
                     scatter.values != nullptr || scatter.arena != nullptr;
  if (place && (scatter.header == nullptr || scatter.runs == nullptr || scatter.values == nullptr ||
                scatter.arena == nullptr)) {
    return absl::InvalidArgumentError("slot scatter: header, runs, values and arena must be set");
  }
  VERIFYD_RETURN_IF_ERROR(CheckTensor("data", check.a, check.na));
  VERIFYD_RETURN_IF_ERROR(CheckTensor("second data", check.b, check.nb));
  const int check_rows = check.nb > 0 ? 2 : (check.na > 0 ? 1 : 0);
  if (check_rows > 0 && check.firsts == nullptr) {
    return absl::InvalidArgumentError("firsts must be set");
  }
  if (tree.total_q < 0 ||
      (tree.total_q > 0 && (tree.kv == nullptr || tree.rows == nullptr || tree.slots == nullptr ||
                            reinterpret_cast<uintptr_t>(tree.rows) % 16 != 0))) {
    return absl::InvalidArgumentError(
        absl::StrCat("tree write: total_q = ", tree.total_q,
                     " must be >= 0, and with rows the pool, 16-byte aligned rows and slots set"));
  }
  const int scatter_blocks = place ? kSlotScatterBlocks : 0;
  const int tree_blocks = TreeRowWriteBlocks(tree);
  const int64_t longest = check.na > check.nb ? check.na : check.nb;
  const int check_blocks = check_rows > 0 ? static_cast<int>(BlocksFor((longest + 7) / 8)) : 1;
  const int blocks = scatter_blocks + tree_blocks + check_rows * check_blocks;
  if (blocks == 0) return absl::OkStatus();
  VERIFYD_CUDA_CHECK(pdl::LaunchMaybeProgrammatic(
      ScatterAndFirstOutOfBoundKernel, dim3(blocks), dim3(kThreads), 0, stream,
      ProgrammaticLaunchRunsHere(), scatter, scatter_blocks, tree, tree_blocks, check.a, check.na,
      check.b, check.nb, check.firsts, check_blocks));
  return absl::OkStatus();
}

absl::Status LaunchFirstOutOfBoundOfTwo(const bf16_bits* a, int64_t na, const bf16_bits* b,
                                        int64_t nb, unsigned long long* firsts,
                                        cudaStream_t stream) {
  return LaunchSlotScatterAndFirstOutOfBound(SlotScatterArgs{},
                                             FirstOutOfBoundArgs{a, na, b, nb, firsts}, stream);
}

absl::Status LaunchFirstOutOfBound(const bf16_bits* data, int64_t n, unsigned long long* first,
                                   cudaStream_t stream) {
  if (n > 0 && first == nullptr) return absl::InvalidArgumentError("data and first must be set");
  return LaunchFirstOutOfBoundOfTwo(data, n, nullptr, 0, first, stream);
}

absl::Status LaunchNanIfOutOfBound(const unsigned long long* firsts, int count,
                                   unsigned long long* host_firsts, bf16_bits* out, int64_t out_n,
                                   float* lse, int64_t lse_n, cudaStream_t stream) {
  if (count <= 0 || count > kMaxFillWords || firsts == nullptr || host_firsts == nullptr ||
      out_n < 0 || lse_n < 0 || (out_n > 0 && out == nullptr) || (lse_n > 0 && lse == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("count = ", count, " (1 or 2), out_n = ", out_n, ", lse_n = ", lse_n,
                     ": firsts, host_firsts and every non-empty output must be set"));
  }
  const int64_t longest = out_n > lse_n ? out_n : lse_n;
  // At most kFillBlocks: a clean call (nearly every call) fills nothing and each CTA costs it a
  // read of the words (256 CTAs sat beside SH's combine: plans/0031, change 5); a refused call's
  // fill strides over the outputs with the few.
  const unsigned blocks = longest > 0 ? std::min(BlocksFor(longest), kFillBlocks) : 1u;
  VERIFYD_CUDA_CHECK(pdl::LaunchMaybeProgrammatic(
      NanIfOutOfBoundKernel, dim3(blocks), dim3(kThreads), 0, stream, ProgrammaticLaunchRunsHere(),
      firsts, count, host_firsts, out, out_n, lse, lse_n));
  return absl::OkStatus();
}

}  // namespace verifyd
