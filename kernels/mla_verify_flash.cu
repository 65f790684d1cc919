// The flash MLA tree-verify kernel: portable tensor-core path (mma.sync, sm_80 / sm_90 / sm_120).
//
// Math (SPEC §1). Rows r = node * H + head of one sequence; columns t = 0 .. L+Q-1 (prefix first,
// then tree nodes):
//   S[r, t] = scale * <q[r, 0:576], kv[slot(t), 0:576]>, -inf where node(r) cannot see t;
//   O[r, :] = softmax_t(S[r, :]) @ kv[slot(t), 0:512];   LSE[r] = ln sum_t exp(S[r, t]).
// Online softmax in fp32, in log2 units (scale folded with log2 e), 32 KV columns per tile.
//
// Tiling. One CTA = one work item: 64 rows of one sequence x a column range [col_begin, col_end)
// from the split planner. All 64 rows (every head and node in them) share one read of each KV
// tile from device memory: the latent is read once per row block, not once per head.
//   per tile: S (64 x 32, k = 576) = 576 mma m16n8k16;  O += P V (64 x 512, k = 32) = 512 mma.
//
// Warps (8, 256 threads) and why.
// - O (64 x 512 fp32 = 128 KB) fits in registers only spread over all 256 threads (128 each), so
//   for P.V warp w owns O[:, 64w .. 64w+64) for all 64 rows: each V fragment feeds 4 m-tiles and
//   each P fragment 8 n-tiles (128 B of ldmatrix per mma).
// - Q (64 x 576 bf16 = 72 KB) does not fit in shared memory beside a double-buffered KV tile
//   within 99 KB, so its latent part lives in registers as mma A fragments split by k: warp w =
//   (rg = w % 4, kg = w / 4) holds rows 16 rg .. 16 rg + 16 and latent dims 256 kg .. 256 kg + 256
//   (64 registers); the 64 rope dims stay in shared memory (two k-steps per warp).
// - Per tile each warp computes a partial S (16 rows x 32 cols over its half of k) reading only K
//   fragments (256 B per mma). The two warps of a row group swap halves of their partials through
//   shared memory and each finishes 8 of the 16 rows: add (k-group 0 first, so every run gives the
//   same bits), mask, online softmax, then P (bf16) and the row's rescale to shared memory.
//
// Shared memory (98048 B of the 101376 B that sm_120 allows per block):
//   KV tiles  2 x 32 x 584 bf16, rows padded by 16 B so ldmatrix rows hit distinct banks; the
//             prologue stages the 64-row Q tile, the epilogue O, through the same bytes  74752 B
//   S swap    4 row groups x 2 warps x 2 x 32 lanes x float4                       8192 B
//   P         64 x 40 bf16 (padded)                                                5120 B
//   Q rope    64 x 72 bf16 (padded)                                                9216 B
//   rescale, final row sum and max: 3 x 64 fp32                                     768 B
//
// Pipeline per tile: wait for tile j, barrier, issue cp.async for tile j+1 into the other buffer
// (and the slot-table load for tile j+2), S partials, barrier, softmax, barrier, P.V. The loads of
// tile j+1 overlap all of tile j. KV rows are gathered through the int32 slot table with 16-byte
// cp.async, warp w copying rows 4w .. 4w+3; lane i holds the slot of column i, and when the
// tile's 32 slots are one consecutive run (the common, compacted case) row addresses come from the
// first slot alone. Columns past col_end are zero-filled so a masked column never multiplies
// garbage (0 * NaN) into O.
//
// Output: an item that covers all columns writes O (bf16) and the LSE directly; a split writes its
// O normalised by its own sum (bf16 as well, since v16) plus its LSE, and mla_verify_combine.cu
// merges the splits. Either way O is staged in the idle KV buffers (64 rows of 1024 B, padded by
// 32: 67.6 KB of their 74.75 KB) and leaves as whole-row 16-byte coalesced stores.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/tree_visibility.cuh"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using flash::Exp2Ftz;
using flash::kFullMask;
using flash::kLog2e;
using flash::kRows;
using mma::CpAsync16;
using mma::CpAsyncCommit;
using mma::CpAsyncWaitAll;
using mma::LdMatrixX4;
using mma::LdMatrixX4Trans;
using mma::MmaBf16;
using mma::SmemAddr;

constexpr int kCols = kFlashBlockCols;
constexpr int kStride = kKvDim + 8;             // bf16 per padded shared row (1168 B)
constexpr int kChunksPerRow = kKvDim / 8;       // 16-byte chunks per KV row
constexpr int kNopeKSteps = kVDim / 16 / 2;     // latent k-steps per k-group, held in registers
constexpr int kRopeKSteps = kRopeDim / 16 / 2;  // rope k-steps per k-group, read from shared memory
constexpr int kRopeStride = kRopeDim + 8;
constexpr int kPStride = kCols + 8;
constexpr int kKvBufferBytes = kCols * kStride * 2;
constexpr int kKvBytes = 2 * kKvBufferBytes;
constexpr int kSPartialBytes = 4 * 16 * 32 * 4;
constexpr int kPBytes = kRows * kPStride * 2;
constexpr int kQRopeBytes = kRows * kRopeStride * 2;
constexpr int kSmemBytes = kKvBytes + kSPartialBytes + kPBytes + kQRopeBytes + 3 * kRows * 4;
static_assert(kRows * kStride * 2 <= kKvBytes, "the Q staging tile must fit in the KV buffers");
static_assert(kSmemBytes <= 99 * 1024, "sm_120 allows 99 KB of dynamic shared memory per block");
static_assert(kCols % (kFlashThreads / 32) == 0, "each warp copies whole rows of a tile");
static_assert(kRows * flash::kStageStride <= kKvBytes, "the staged O fits the KV buffers");

// Issues the cp.async copies of KV columns [tile_col, tile_col + 32) into `dst`. Warp w copies rows
// [4w, 4w + 4): lane i copies 16-byte chunks i, i + 32, i + 64 (< 72) of each, so a row's address
// is one multiply per row and consecutive lanes write consecutive 16 bytes. my_slot = the slot of
// column tile_col + lane, loaded a tile ahead (TileSlot) so that the gather never waits on the slot
// table's global-memory latency.
__device__ __forceinline__ void LoadKvTile(const bf16_bits* kv, int my_slot, int tile_col,
                                           int col_end, bf16_bits* dst, int warp, int lane) {
  const int my_col = tile_col + lane;
  const int slot0 = __shfl_sync(kFullMask, my_slot, 0);
  const bool run = __all_sync(kFullMask, my_col >= col_end || my_slot == slot0 + lane);
  constexpr int kRowsPerWarp = kCols / (kFlashThreads / 32);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    const int slot = run ? slot0 + r : __shfl_sync(kFullMask, my_slot, r);
    const bool valid = tile_col + r < col_end;
    const bf16_bits* src_row = kv + (valid ? static_cast<int64_t>(slot) * kKvDim : 0);
    const uint32_t dst_row = SmemAddr(dst + r * kStride);
#pragma unroll
    for (int j = 0; j < (kChunksPerRow + 31) / 32; ++j) {
      const int cc = lane + 32 * j;
      if (cc < kChunksPerRow) CpAsync16(dst_row + cc * 16, src_row + (valid ? cc * 8 : 0), valid);
    }
  }
  CpAsyncCommit();
}

__device__ __forceinline__ int TileSlot(const int32_t* slots, int tile_col, int col_end, int lane) {
  const int col = tile_col + lane;
  return col < col_end ? slots[col] : 0;
}

__global__ void __launch_bounds__(kFlashThreads, 1) MlaVerifyFlashKernel(MlaVerifyParams params) {
  pdl::AllowDependentLaunch();  // the combine may be scheduled early (programmatic_launch.cuh)
  extern __shared__ __align__(128) uint8_t smem[];
  bf16_bits* kv_smem = reinterpret_cast<bf16_bits*>(smem);
  float4* s_xchg = reinterpret_cast<float4*>(smem + kKvBytes);
  bf16_bits* p_smem = reinterpret_cast<bf16_bits*>(smem + kKvBytes + kSPartialBytes);
  bf16_bits* q_rope_smem = reinterpret_cast<bf16_bits*>(smem + kKvBytes + kSPartialBytes + kPBytes);
  float* alpha_smem =
      reinterpret_cast<float*>(smem + kKvBytes + kSPartialBytes + kPBytes + kQRopeBytes);
  float* row_sum_smem = alpha_smem + kRows;
  float* row_max_smem = row_sum_smem + kRows;

  const VerifyProblem& pr = params.problem;
  const FlashWorkItem item = params.work[blockIdx.x];
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int rg = warp & 3;
  const int kg = warp >> 2;

  const flash::ItemRows rows = flash::DecodeItem(pr, item);
  const int prefix_len = rows.prefix_len;
  const int heads = rows.heads;
  const int seq_rows = rows.seq_rows;
  const int rows_here = rows.rows_here;
  const int64_t first_row = rows.first_row;
  const int32_t* slots = rows.slots;
  const uint64_t* mask_rows = rows.mask_rows;
  const int words_per_row = rows.words_per_row;

  // Prologue: stage Q through the KV buffers, then keep it in registers as A fragments.
  for (int chunk = tid; chunk < kRows * kChunksPerRow; chunk += kFlashThreads) {
    const int r = chunk / kChunksPerRow;
    const int cc = chunk % kChunksPerRow;
    const bool valid = r < rows_here;
    const bf16_bits* src = valid ? pr.q + (first_row + r) * kKvDim + cc * 8 : pr.q;
    bf16_bits* dst = cc * 8 < kVDim ? kv_smem + r * kStride + cc * 8
                                    : q_rope_smem + r * kRopeStride + cc * 8 - kVDim;
    CpAsync16(SmemAddr(dst), src, valid);
  }
  CpAsyncCommit();
  CpAsyncWaitAll();
  __syncthreads();
  uint32_t q_frag[kNopeKSteps][4];
#pragma unroll
  for (int ks = 0; ks < kNopeKSteps; ++ks) {
    const int k0 = (kg * kNopeKSteps + ks) * 16;
    LdMatrixX4(q_frag[ks],
               SmemAddr(kv_smem + (rg * 16 + (lane & 15)) * kStride + k0 + (lane >> 4) * 8));
  }
  __syncthreads();

  float o[4][8][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mt][nt][i] = 0.f;
  // Softmax: warp kg of row group rg owns row rg*16 + g + 8*kg (the quad of lanes 4g .. 4g+3 shares
  // it).
  const int my_row = rg * 16 + g + 8 * kg;
  const int my_node = item.row_begin + my_row < seq_rows ? (item.row_begin + my_row) / heads : -1;
  float row_max = -INFINITY;
  float row_sum = 0.f;
  const float scale_log2 = pr.scale * kLog2e;

  const int num_tiles = (item.col_end - item.col_begin + kCols - 1) / kCols;
  LoadKvTile(pr.kv, TileSlot(slots, item.col_begin, item.col_end, lane), item.col_begin,
             item.col_end, kv_smem, warp, lane);
  int next_slot = TileSlot(slots, item.col_begin + kCols, item.col_end, lane);
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int tile_col = item.col_begin + tile * kCols;
    CpAsyncWaitAll();
    __syncthreads();  // tile lands for everyone; everyone is done with the other buffer
    if (tile + 1 < num_tiles) {
      LoadKvTile(pr.kv, next_slot, tile_col + kCols, item.col_end,
                 kv_smem + ((tile + 1) & 1) * kCols * kStride, warp, lane);
      next_slot = TileSlot(slots, tile_col + 2 * kCols, item.col_end, lane);
    }
    const bf16_bits* kv_tile = kv_smem + (tile & 1) * kCols * kStride;

    // S partial: 16 rows x 32 columns over this warp's 288 of the 576 dimensions.
    float s[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kNopeKSteps + kRopeKSteps; ++ks) {
      const bool rope = ks >= kNopeKSteps;
      const int k0 =
          rope ? kVDim + (kg * kRopeKSteps + ks - kNopeKSteps) * 16 : (kg * kNopeKSteps + ks) * 16;
      uint32_t rope_frag[4];
      if (rope) {
        LdMatrixX4(rope_frag, SmemAddr(q_rope_smem + (rg * 16 + (lane & 15)) * kRopeStride + k0 -
                                       kVDim + (lane >> 4) * 8));
      }
      const uint32_t(&a)[4] = rope ? rope_frag : q_frag[rope ? 0 : ks];
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t b[4];
        LdMatrixX4(b, SmemAddr(kv_tile + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kStride + k0 +
                               ((lane >> 3) & 1) * 8));
        MmaBf16(s[2 * np], a, b[0], b[1]);
        MmaBf16(s[2 * np + 1], a, b[2], b[3]);
      }
    }
    // Each warp of the pair hands over the 8 values of the row half the other finishes.
    {
      const int give = 1 - kg;  // the row half (0: rows g, 1: rows g + 8) this warp gives away
      float4* out = s_xchg + ((rg * 2 + kg) * 2) * 32 + lane;
      out[0] = give == 0 ? make_float4(s[0][0], s[0][1], s[1][0], s[1][1])
                         : make_float4(s[0][2], s[0][3], s[1][2], s[1][3]);
      out[32] = give == 0 ? make_float4(s[2][0], s[2][1], s[3][0], s[3][1])
                          : make_float4(s[2][2], s[2][3], s[3][2], s[3][3]);
    }
    __syncthreads();

    {
      const float4* in = s_xchg + ((rg * 2 + (1 - kg)) * 2) * 32 + lane;
      const float4 other0 = in[0];
      const float4 other1 = in[32];
      const float other[8] = {other0.x, other0.y, other0.z, other0.w,
                              other1.x, other1.y, other1.z, other1.w};
      // Own values of this warp's row half, in the same (nt, j) order; ?: keeps s in registers.
      const float own[8] = {kg == 0 ? s[0][0] : s[0][2], kg == 0 ? s[0][1] : s[0][3],
                            kg == 0 ? s[1][0] : s[1][2], kg == 0 ? s[1][1] : s[1][3],
                            kg == 0 ? s[2][0] : s[2][2], kg == 0 ? s[2][1] : s[2][3],
                            kg == 0 ? s[3][0] : s[3][2], kg == 0 ? s[3][1] : s[3][3]};
      const bool all_visible = tile_col + kCols <= prefix_len && tile_col + kCols <= item.col_end;
      float x[8];
      float tile_max = -INFINITY;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        // k-group 0's partial first in both warps, so both halves round the same way every run.
        x[e] = (kg == 0 ? own[e] + other[e] : other[e] + own[e]) * scale_log2;
        if (!all_visible) {
          // value e = (nt, j) with nt = e / 2 ... laid out as {nt0 j0, nt0 j1, nt1 j0, nt1 j1, nt2
          // .., nt3 ..}
          const int t = tile_col + (e >> 1) * 8 + 2 * c + (e & 1);
          const bool visible =
              t < item.col_end &&
              (t < prefix_len ||
               (my_node >= 0 && ColumnVisible(mask_rows, words_per_row, prefix_len, my_node, t)));
          x[e] = visible ? x[e] : -INFINITY;
        }
        tile_max = fmaxf(tile_max, x[e]);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 2));
      const float new_max = fmaxf(row_max, tile_max);
      // A row that has seen nothing yet keeps max -inf; subtracting 0 then keeps exp2 finite.
      const float base = new_max == -INFINITY ? 0.f : new_max;
      const float alpha = Exp2Ftz(row_max - base);
      row_max = new_max;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float p0 = Exp2Ftz(x[2 * nt] - base);
        const float p1 = Exp2Ftz(x[2 * nt + 1] - base);
        sum += p0 + p1;
        *reinterpret_cast<uint32_t*>(p_smem + my_row * kPStride + nt * 8 + 2 * c) =
            mma::PackBf16x2(p0, p1);
      }
      row_sum = row_sum * alpha + sum;
      if (c == 0) alpha_smem[my_row] = alpha;
    }
    __syncthreads();

    // O = O * alpha + P V over this warp's 64 value dimensions.
    {
      float alpha[4][2];
      bool rescale = false;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        alpha[mt][0] = alpha_smem[mt * 16 + g];
        alpha[mt][1] = alpha_smem[mt * 16 + g + 8];
        rescale |= alpha[mt][0] != 1.f || alpha[mt][1] != 1.f;
      }
      if (__any_sync(kFullMask, rescale)) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt)
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            o[mt][nt][0] *= alpha[mt][0];
            o[mt][nt][1] *= alpha[mt][0];
            o[mt][nt][2] *= alpha[mt][1];
            o[mt][nt][3] *= alpha[mt][1];
          }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kCols / 16; ++kk) {
      uint32_t pa[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        LdMatrixX4(pa[mt], SmemAddr(p_smem + (mt * 16 + (lane & 15)) * kPStride + kk * 16 +
                                    (lane >> 4) * 8));
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        const int n0 = warp * 64 + np * 16;
        uint32_t vb[4];
        LdMatrixX4Trans(
            vb, SmemAddr(kv_tile + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride + n0 +
                         (lane >> 4) * 8));
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          MmaBf16(o[mt][2 * np], pa[mt], vb[0], vb[1]);
          MmaBf16(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

  {
    float sum = row_sum;
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    if (c == 0) {
      row_sum_smem[my_row] = sum;
      row_max_smem[my_row] = row_max;
    }
  }
  __syncthreads();

  // O staged through the (now idle) KV buffers and written as whole rows with 16-byte coalesced
  // stores: the accumulator layout's 8-byte stores (32 bytes of a row per 4 lanes) cost ~3x longer
  // when every CTA ends at once (plans/0004-kernel.md v10).
  CpAsyncWaitAll();  // nothing is in flight after the last tile; this makes it certain
  uint8_t* stage = smem;
  uint8_t* dst = flash::OutRows(params, item, first_row);
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int r = mt * 16 + g + 8 * hi;
      const float sum = row_sum_smem[r];
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = warp * 64 + nt * 8 + 2 * c;
        const float x0 = o[mt][nt][2 * hi] * inv;
        const float x1 = o[mt][nt][2 * hi + 1] * inv;
        *reinterpret_cast<uint32_t*>(stage + r * flash::kStageStride + col * 2) =
            mma::PackBf16x2(x0, x1);
      }
    }
  }
  __syncthreads();
  constexpr int kUnitsPerRow = flash::kOutRowBytes / 16;
  for (int idx = tid; idx < rows_here * kUnitsPerRow; idx += kFlashThreads) {
    const int r = idx / kUnitsPerRow;
    const int u = idx % kUnitsPerRow;
    *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * flash::kOutRowBytes + u * 16) =
        *reinterpret_cast<const uint4*>(stage + r * flash::kStageStride + u * 16);
  }
  if (tid < rows_here) {
    const float sum = row_sum_smem[tid];
    flash::WriteLse(params, item, first_row, tid, flash::RowLse(row_max_smem[tid], sum));
  }
}

}  // namespace

int FlashSmemBytes() { return kSmemBytes; }

const void* FlashKernelSymbol() { return reinterpret_cast<const void*>(&MlaVerifyFlashKernel); }

cudaError_t LaunchFlashKernel(const MlaVerifyParams& params, cudaStream_t stream) {
  MlaVerifyFlashKernel<<<params.num_work, kFlashThreads, kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace verifyd
