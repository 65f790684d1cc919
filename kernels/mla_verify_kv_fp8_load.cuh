// The portable kernel's dequantizing load stage for an fp8 pool (DeepSeek's 656-byte row,
// verify/kv_fp8_layout.h): KV rows arrive as their 656 bytes and leave as the bf16 tile rows the
// mma phases read, so everything after the load (S, softmax, P V) is the bf16 kernel's.
//
// Math. Tile element d < 512 of a row = bf16_rn(e4m3(code[d]) x scale[d / 128]), the product
// taken in float32 (the CPU reference's dequantized value, DequantizeFp8Row), then rounded to
// bf16 for the mma (one more rounding, ~2^-9 relative, below the output's own bf16 rounding);
// elements 512 .. 575 are the row's bf16 rope values, as they are.
//
// Where the bytes wait (no shared memory of their own: the bf16 kernel uses 100,384 of 101,376
// bytes). Warp w owns rows 4w .. 4w+3 of a tile, i.e. bytes [4w x 1168, 4w x 1168 + 4672) of the
// tile's buffer. Its four raw rows land, contiguous, in the last 4 x 656 = 2624 of those bytes
// (offset kRawOffset = 2048) and the warp widens them in place, row 0 first:
//   bf16 row r = [1168 r, 1168 r + 1152)   raw row r = [2048 + 656 r, 2048 + 656 r + 656)
// bf16 row r overlaps only raw rows r-1 and r (row 0 and 1: none and raw row 0), so once raw row r
// is in registers (a __syncwarp between its loads and its stores) widening it destroys nothing
// still unread, and the rows of one warp never touch another warp's bytes: no CTA barrier.
//
// Schedule (PortableFlash): raw row r of tile j+1 is issued at S(j) step 1 + 4r (one cp.async group
// per row) and widened during P V(j) (after cp.async.wait_group lets row r's group complete); the
// tile-top barrier of j+1 publishes the widened rows to every warp, as it does the bf16 copies.
#pragma once

#include <cstdint>

#include "kernels/kv_fp8_widen.cuh"
#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_mma.cuh"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd::portable::fp8 {

using verifyd::fp8::WidenEight;

inline constexpr int kRowBytes = kFp8RowBytes;                   // 656
inline constexpr int kRowChunks = kRowBytes / 16;                // 41 16-byte chunks per raw row
inline constexpr int kTileRowBytes = (kKvDim + 8) * 2;           // a padded bf16 tile row: 1168
inline constexpr int kRowsPerWarp = 4;                           // the rows each warp copies
inline constexpr int kWarpBytes = kRowsPerWarp * kTileRowBytes;  // 4672
inline constexpr int kRawOffset = kWarpBytes - kRowsPerWarp * kRowBytes;  // 2048
static_assert(kRowBytes % 16 == 0, "raw rows are copied in 16-byte chunks");
static_assert(kRawOffset % 16 == 0 && kWarpBytes % 16 == 0, "16-byte aligned raw rows");
// Widening row r must not reach raw row r + 1; with 1168 > 656 the last such pair is the tightest.
static_assert((kRowsPerWarp - 2) * kTileRowBytes + kKvDim * 2 <=
                  kRawOffset + (kRowsPerWarp - 1) * kRowBytes,
              "bf16 row r overlaps raw rows r-1 and r only (see the header)");
static_assert(kFp8GroupSize == 128 && kVDim == 512, "lanes take 8 codes of each half row");

// Issues the cp.async copies of raw row rr (0..3) of this warp, tile column `my_slot`'s lane
// holding the slot of column lane (TileSlot): lane i copies chunk i and, for i < 9, chunk 32 + i.
__device__ __forceinline__ void LoadRawRow(const uint8_t* kv_fp8, int my_slot, uint8_t* buffer,
                                           int warp, int rr, int lane) {
  const int slot = __shfl_sync(flash::kFullMask, my_slot, warp * kRowsPerWarp + rr);
  const uint8_t* src = kv_fp8 + static_cast<int64_t>(slot) * kRowBytes + lane * 16;
  const uint32_t to =
      mma::SmemAddr(buffer + warp * kWarpBytes + kRawOffset + rr * kRowBytes + lane * 16);
  mma::CpAsync16Full(to, src);
  if (lane < kRowChunks - 32) mma::CpAsync16Full(to + 512, src + 512);
}

// Widens raw row rr of this warp into its bf16 tile row (4 warp + rr), in place (the header says
// why nothing unread is overwritten). Lane i takes values 8i .. 8i+7 (group i / 16) and
// 256 + 8i .. (group 2 + i / 16), and lanes 0..7 the rope's 16-byte chunk i: every load and store
// of the warp is one contiguous run, so none conflicts on a bank.
__device__ __forceinline__ void WidenRow(uint8_t* buffer, int warp, int rr, int lane) {
  uint8_t* region = buffer + warp * kWarpBytes;
  const uint8_t* raw = region + kRawOffset + rr * kRowBytes;
  const uint2 lo = *reinterpret_cast<const uint2*>(raw + lane * 8);
  const uint2 hi = *reinterpret_cast<const uint2*>(raw + 256 + lane * 8);
  const float* scales = reinterpret_cast<const float*>(raw + kFp8ScalesOffset);
  const float scale_lo = scales[lane >> 4];
  const float scale_hi = scales[2 + (lane >> 4)];
  uint4 rope = make_uint4(0, 0, 0, 0);
  if (lane < 8) rope = *reinterpret_cast<const uint4*>(raw + kFp8RopeOffset + lane * 16);
  __syncwarp();  // every lane has its bytes of raw row rr before any lane overwrites them
  uint8_t* row = region + rr * kTileRowBytes;
  *reinterpret_cast<uint4*>(row + lane * 16) = WidenEight(lo, scale_lo);
  *reinterpret_cast<uint4*>(row + 512 + lane * 16) = WidenEight(hi, scale_hi);
  if (lane < 8) *reinterpret_cast<uint4*>(row + kVDim * 2 + lane * 16) = rope;
}

// cp.async.wait_group with the count as a template argument (PTX wants an immediate).
template <int kPending>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace verifyd::portable::fp8
