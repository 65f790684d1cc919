// The Hopper flash kernel's load stage for an fp8 pool (DeepSeek's 656-byte rows,
// verify/kv_fp8_layout.h): a half's 32 rows land in their ring slot as raw bytes, and the owner
// warpgroup widens them in place into the nine swizzled bf16 chunks the wgmma read, so S, the
// softmax and P V are the bf16 kernel's (mla_verify_flash_sm90.cuh). sm_90a only.
//
// Math. Element d < 512 of a row = bf16_rn(e4m3(code[d]) x scale[d / 128]) (kv_fp8_widen.cuh, the
// portable kernel's conversion); elements 512 .. 575 are the row's bf16 rope values, as they are.
//
// Why in place: the plan (mla_verify_flash_sm90_plan.cuh) has 392 bytes of shared memory left, and
// a staging area of a half's raw rows (20,992 B) would cost a ring slot, i.e. a quarter of the
// ring's lead. The raw bytes are a little over half a slot, so they wait in its upper half.
//
// Byte plan of a ring slot (36,864 B; bf16 chunk c = dims 64c .. 64c+63 of the 32 rows, 4 KB at
// 4096 c, rows of 128 B with the 128-byte swizzle):
//   [0, 15872)       nothing until widened
//   [15872, 16384)   kScalesOffset: the rows' four float32 scales, 16 B a row
//   [16384, 32768)   kCodesOffset: raw chunk c (c = 0..7) at 2048 c: the codes of dims 64c ..
//   64c+63,
//                    64 B a row
//   [32768, 36864)   bf16 chunk 8: the rope, swizzled as it lands (it needs no widening)
// A half that is one run of 32 slots comes by three bulk tensor copies (kv_tile_map.h's
// Fp8KvTileMaps: codes, scales, rope), any other by 16-byte cp.async gathers into the same places.
//
// Widening: the owner's 128 threads, thread t taking row t / 4 and codes 16 (t % 4) .. +15 of each
// raw chunk (a contiguous 2 KB per chunk and warpgroup: no bank conflicts; the two 16-byte stores
// of a chunk row go to units 2 (t % 4) and + 1, which the swizzle spreads over all banks per 8
// threads). Writing bf16 chunk c destroys [4096 c, 4096 c + 4096), so the order is:
//   scales; chunks 0-2 (below every raw byte); raw chunk 3 to registers;     -- meeting 1
//   chunk 3 (over the scales); chunks 4-5 (over raw 0-3); raw 6-7 to registers; -- meeting 2
//   chunks 6-7 (over raw 4-7); fence.proxy.async;                             -- meeting 3
// so no byte is overwritten before every thread has read it, and the wgmma (the async proxy) of
// any warp of the warpgroup sees every thread's stores. A meeting is an arrival and a wait on the
// warpgroup's own mbarrier (SharedPlan::widen_bar, 128 arrivals): the other warpgroup runs on.
// Why not named barriers (bar.sync 1 + warpgroup, 128), which ran at the same speed: racecheck
// pairs named-barrier epochs by count, and the warpgroups' counts differ whenever one widens a half
// more, so the tool reported thousands of hazards that are not there (plans/0036 has the probe).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/kv_fp8_widen.cuh"
#include "kernels/kv_tile_map.h"
#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_flash_sm90_ops.cuh"
#include "kernels/mla_verify_flash_sm90_plan.cuh"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/tma_sm90.cuh"
#include "kernels/wgmma_sm90.cuh"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd::flash_sm90::fp8 {

inline constexpr int kCodesOffset = 4 * kHalfChunkBytes;                         // 16384
inline constexpr int kRawChunkBytes = kHalfCols * 64;                            // 2048
inline constexpr int kScaleRowBytes = kFp8Groups * 4;                            // 16
inline constexpr int kScalesOffset = kCodesOffset - kHalfCols * kScaleRowBytes;  // 15872
inline constexpr int kRopeChunk = kVDim / 64;                                    // 8
inline constexpr int kRawHalfBytes = kHalfCols * kFp8RowBytes;                   // 20992
static_assert(kVDim / 64 * kRawChunkBytes + kHalfCols * kScaleRowBytes + kHalfCols * kRopeDim * 2 ==
                  kRawHalfBytes,
              "a half's raw bytes: codes, scales, rope");
static_assert(kCodesOffset + kVDim / 64 * kRawChunkBytes == kRopeChunk * kHalfChunkBytes,
              "the codes end where the rope's chunk begins");
static_assert(kScalesOffset >= 3 * kHalfChunkBytes,
              "chunks 0-2, widened before meeting 1, lie below the scales");
static_assert(kRopeDim == 64 && kFp8GroupSize == 128, "chunk 8 is the rope; two chunks a group");

// The three maps' boxes into ring slot `dst`, completing on `bar` (one thread).
__device__ __forceinline__ void IssueFp8HalfCopy(const Fp8KvTileMaps& maps, int run_base,
                                                 uint32_t dst, uint32_t bar) {
  tma::MbarrierArriveExpectTx(bar, kRawHalfBytes);
  tma::TensorCopy3d(dst + kCodesOffset, &maps.latent, 0, run_base, 0, bar);
  tma::TensorCopy2d(dst + kScalesOffset, &maps.scales, 0, run_base, bar);
  tma::TensorCopy2d(dst + kRopeChunk * kHalfChunkBytes, &maps.rope, 0, run_base, bar);
}

// As CopyHalfByOwner (mla_verify_flash_sm90_ops.cuh): the first thread announces the bytes and
// issues the copies, the other 127 of the owner arrive plainly.
__device__ __forceinline__ void CopyFp8HalfByOwner(const Fp8KvTileMaps& maps, int run_base,
                                                   uint32_t dst, uint32_t bar, int wg_tid) {
  if (wg_tid == 0) {
    IssueFp8HalfCopy(maps, run_base, dst, bar);
  } else {
    tma::MbarrierArrive(bar);
  }
}

// Row r's 41 16-byte units, unit u from byte 16 u of the row: codes (u < 32) to raw chunk u / 4,
// the scales (u = 32), the rope (u > 32) to chunk 8, swizzled.
__device__ __forceinline__ uint32_t Fp8UnitDst(uint32_t slot, int r, int u) {
  if (u < kVDim / 16)
    return slot + kCodesOffset + (u >> 2) * kRawChunkBytes + r * 64 + (u & 3) * 16;
  if (u == kVDim / 16) return slot + kScalesOffset + r * kScaleRowBytes;
  return slot + kRopeChunk * kHalfChunkBytes + wgmma::SwizzledOffset(r, u - kVDim / 16 - 1);
}

// A half that is not one run, by the owner's 128 threads: warp w of the warpgroup takes rows
// 8w .. 8w+7, lane i units i and (i < 9) 32 + i of each; columns past col_end are zero-filled
// (codes 0 at scale 0: zeros, so a masked column never multiplies garbage). Each thread arrives on
// `bar` once its own copies have landed.
__device__ __forceinline__ void GatherFp8HalfByOwner(const uint8_t* kv_fp8, int slot_word,
                                                     int half_col, int col_end, uint32_t dst,
                                                     uint32_t bar, int wg_warp, int lane) {
  constexpr int kUnits = kFp8RowBytes / 16;  // 41
#pragma unroll 1
  for (int rr = 0; rr < 8; ++rr) {
    const int r = wg_warp * 8 + rr;
    const int slot = __shfl_sync(flash::kFullMask, slot_word, r);
    const bool valid = half_col + r < col_end;
    const uint8_t* src_row = kv_fp8 + (valid ? static_cast<int64_t>(slot) * kFp8RowBytes : 0);
    mma::CpAsync16(Fp8UnitDst(dst, r, lane), src_row + (valid ? lane * 16 : 0), valid);
    if (lane < kUnits - 32) {
      mma::CpAsync16(Fp8UnitDst(dst, r, 32 + lane), src_row + (valid ? (32 + lane) * 16 : 0),
                     valid);
    }
  }
  tma::CpAsyncMbarrierArriveNoInc(bar);
}

// The warpgroup's meeting on its mbarrier `bar` (128 arrivals): an arrival (a release of this
// thread's reads and writes) and a wait on the phase it completes (an acquire of everyone's). A
// half takes three meetings, so meeting k of the warpgroup's n-th own half completes phase 3n + k.
__device__ __forceinline__ void WarpgroupMeet(uint32_t bar, uint32_t phase) {
  tma::MbarrierArrive(bar);
  tma::MbarrierWait(bar, phase & 1);
}

__device__ __forceinline__ uint4 LdShared128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ void StShared128(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// This thread's 16 codes of raw chunk c (already read: `codes`) as bf16 into chunk c of the slot.
__device__ __forceinline__ void StoreWidened(uint32_t slot, int c, int r, int quarter, uint4 codes,
                                             float scale) {
  const uint32_t chunk = slot + c * kHalfChunkBytes;
  StShared128(chunk + wgmma::SwizzledOffset(r, 2 * quarter),
              verifyd::fp8::WidenEight(make_uint2(codes.x, codes.y), scale));
  StShared128(chunk + wgmma::SwizzledOffset(r, 2 * quarter + 1),
              verifyd::fp8::WidenEight(make_uint2(codes.z, codes.w), scale));
}

// The landed raw half in `slot` widened in place by its owner warpgroup (wg_tid its thread; `bar`
// its mbarrier; own_half: how many halves it widened before in this item), in the header's order.
// On return every chunk is bf16 and visible to the warpgroup's wgmma.
__device__ __forceinline__ void WidenHalf(uint32_t slot, uint32_t bar, int own_half, int wg_tid) {
  const int r = wg_tid >> 2;
  const int quarter = wg_tid & 3;
  const uint32_t codes = slot + kCodesOffset + 16 * wg_tid;  // chunk c at + c x kRawChunkBytes
  const uint32_t scales = slot + kScalesOffset + r * kScaleRowBytes;
#pragma unroll
  for (int c = 0; c < 3; ++c) {
    StoreWidened(slot, c, r, quarter, LdShared128(codes + c * kRawChunkBytes),
                 LdSharedF32(scales + 4 * (c >> 1)));
  }
  // What chunks 3-7 need of the bytes that meeting 1 lets be overwritten.
  const uint4 codes3 = LdShared128(codes + 3 * kRawChunkBytes);
  const float scale1 = LdSharedF32(scales + 4);
  const float scale2 = LdSharedF32(scales + 8);
  const float scale3 = LdSharedF32(scales + 12);
  WarpgroupMeet(bar, 3 * own_half);
  StoreWidened(slot, 3, r, quarter, codes3, scale1);
#pragma unroll
  for (int c = 4; c < 6; ++c) {
    StoreWidened(slot, c, r, quarter, LdShared128(codes + c * kRawChunkBytes), scale2);
  }
  const uint4 codes6 = LdShared128(codes + 6 * kRawChunkBytes);
  const uint4 codes7 = LdShared128(codes + 7 * kRawChunkBytes);
  WarpgroupMeet(bar, 3 * own_half + 1);
  StoreWidened(slot, 6, r, quarter, codes6, scale3);
  StoreWidened(slot, 7, r, quarter, codes7, scale3);
  wgmma::FenceProxyAsyncShared();
  WarpgroupMeet(bar, 3 * own_half + 2);
}

}  // namespace verifyd::flash_sm90::fp8
