// The Hopper flash kernel's plan (mla_verify_flash_sm90.cuh): its constants, its shared memory
// as one struct whose size is the byte budget, the named points a probe may stamp, and the
// product's probe, which does nothing. sm_90a only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_kernels.h"
#include "kernels/wgmma_sm90.cuh"
#include "verify/mla_dims.h"

namespace verifyd::flash_sm90 {

using flash::kRows;
using wgmma::kChunkBytes;

// S's first kQRegSteps k-steps (16 dims each) take A = Q from registers, loaded once: each is a
// 2 KB shared-memory read per warpgroup per tile that S no longer makes (S at N = 32 is bound by
// its operand reads: wgmma_rate_bench on the H200, m64n32k16 with both operands in shared memory
// 24 clocks per SM, with A from registers 17.3, against 16 at the tensor peak). Measured (v20,
// plans/0004): 8, 12, 16, 20 steps ran faster in that order;
// 20 brings the kernel to 255 registers with no spills, 24 makes ptxas serialise the wgmma (C7512).
constexpr int kQRegSteps = 20;
static_assert(kQRegSteps > 0 && kQRegSteps <= kKvDim / 16, "a k-step count of S");
// How far (log2 units) a score may pass its row's reference maximum before the reference moves: P
// stays <= 2^8, exact enough in bf16 and far from overflow in the fp32 sums.
constexpr float kMaxSlackLog2 = 8.f;
constexpr int kUnitsPerRow = kKvDim / 8;  // 16-byte units per KV row (72)
constexpr int kKvChunks = kKvDim / 64;    // 9
constexpr int kTileBytes = kKvChunks * kChunkBytes;
// A half: 32 columns of a tile, 9 chunks of 32 rows.
constexpr int kHalfCols = 32;
constexpr int kHalfChunkBytes = kHalfCols * wgmma::kSwizzleRowBytes;
constexpr int kHalfBytes = kKvChunks * kHalfChunkBytes;
// The ring's slots: the two 64-row stages as four halves, and Q's first five chunks (40 KB, in
// registers after the prologue) as the fifth.
constexpr int kRingHalves = 5;

// Shared memory (wgmma_sm90.cuh: rows of 128 bytes, 128-byte swizzle; the base aligned to 1024,
// every chunk 1024-aligned). Addresses are shared-window words (uint32), the plan's offsets added
// to the aligned base.
struct SharedPlan {
  // 9 chunks of 64 rows (576 dims). Chunks 0-4 are read into registers in the prologue and their
  // 40 KB then hold ring slot 4.
  uint8_t q[kTileBytes];
  // Ring slots 0-3; slots 0-1 are the epilogue's stage once the loop is done.
  uint8_t ring[4][kHalfBytes];
  // 1 chunk: 64 rows x 64 tokens, warpgroup w's P in tokens 32w ..
  uint8_t p[kChunkBytes];
  float published_ref[2][kRows];  // per warpgroup, the reference its last P was made on
  float sum_xchg[2][kRows];       // per warpgroup, its row sums (the epilogue)
  float final_ref[2][kRows];      // per warpgroup, its last references (the epilogue)
  // Ring slot b's data in (128 arrivals: its owner's threads) / its owner done with it (1).
  uint64_t full_bar[kRingHalves];
  uint64_t done_bar[kRingHalves];
  // P(w) and its reference published / read by the other: 128 arrivals each (every thread of the
  // warpgroup that wrote or read it; an arrive and a wait are a release and an acquire).
  uint64_t p_full[2];
  uint64_t p_empty[2];
  uint64_t q_bar;  // Q's copy (where Q comes by one)
  // Per warpgroup, the fp8 widening's three meetings a half (128 arrivals: its threads).
  uint64_t widen_bar[2];
};
constexpr int kQOffset = offsetof(SharedPlan, q);
constexpr int kRingOffset = offsetof(SharedPlan, ring);
constexpr int kPOffset = offsetof(SharedPlan, p);
constexpr int kSmemBytes = sizeof(SharedPlan) + 1024;  // room to align the base to 1024
static_assert(sizeof(SharedPlan) == 231048, "the plan as measured (plans/0004)");
static_assert(kSmemBytes <= 232448, "an sm_90 block may take 227 KB of dynamic shared memory");
static_assert(kQOffset % 1024 == 0 && kRingOffset % 1024 == 0 && kPOffset % 1024 == 0,
              "chunks are 1024-byte aligned (the swizzle's phase is the row)");
static_assert(4 * kHalfBytes == 2 * kTileBytes, "the two stages are four halves");
static_assert(kHalfBytes <= (kQRegSteps / 4) * kChunkBytes,
              "the fifth half fits in the chunks of Q that live in registers");
static_assert(kRows * flash::kStageStride <= 2 * kTileBytes,
              "the staged epilogue fits the KV stages");
static_assert(kRows == 64, "one warpgroup's wgmma covers 64 rows");
static_assert(kHopperFlashThreads == 256, "two warpgroups");

// Named points of the kernel, where a probe may stamp a clock.
enum KernelPoint { kQIssued, kFirstHalvesIssued, kQLanded, kLoopDone };
// Points of a warpgroup's half, in HalfStep's order: at its top, its data in, S issued, the
// other's P V issued and S done, the reference maximum checked (and moved where a score passed
// it), P made, the own P V issued, P's buffer free (the other has read the last one), P published
// and the other's P V done, the refill's slot free (the other is done with it), the ring refilled
// (half h+4 issued or gathered; then the own P V's wait, up to the next top).
enum SmPhase {
  kTop,
  kHalfIn,
  kSIssued,
  kSDone,
  kMaxChecked,
  kPMade,
  kOwnPvIssued,
  kPBufferFree,
  kOtherPvDone,
  kSlotFree,
  kRefilled,
  kPhasePoints
};

// The probe policy: what an instantiation adds to the kernel. This one is the product's and adds
// nothing. The benchmark's (tools/bench/mla_verify_flash_sm90_probes.cu) stamp clocks at these
// points (a timeline), or drop the ring's refills (kGathers false) or the wgmma (kMath false):
// those two write garbage on purpose.
struct NoProbe {
  static constexpr bool kGathers = true;
  static constexpr bool kMath = true;
  __device__ explicit NoProbe(uint64_t* /*timeline*/) {}
  __device__ void At(KernelPoint) {}
  // Warpgroup 0's half 2 * tile is in.
  __device__ void TileIn(int /*tile*/) {}
  __device__ void Phase(int /*tile*/, SmPhase) {}
  __device__ void End() {}
};

}  // namespace verifyd::flash_sm90
