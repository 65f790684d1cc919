// The flash MLA tree-verify kernel, Hopper path (sm_90a only: wgmma). Same work items, mask
// semantics, outputs and split partials as the portable kernel (mla_verify_flash.cu); the
// launcher picks this one on a compute-capability-9 device when this sm_90a image is present.
// Built the way FlashMLA and FlashAttention-3 build theirs: a shared-memory plan (SharedPlan), and
// a short kernel (at the end) composing named phases (Prologue, HalfStep, Epilogue). The kernel is
// a template over a probe policy (NoProbe here, the product's, which does nothing) so that the
// benchmark builds its instruments from this same source
// (tools/bench/mla_verify_flash_sm90_probes.cu, never linked into the product). Why each step is
// where it is, with the measurements: plans/0004
// ("The sm_90a kernel's schedule").
//
// Math (SPEC §1): rows r = node * H + head of one sequence, columns t = 0 .. L+Q-1 (prefix, then
// tree nodes); S = scale * Q K^T, -inf where node(r) cannot see t; O = softmax(S) V, LSE = ln sum
// exp(S). Online softmax in fp32 in log2 units, 32 KV columns (half a tile) per step.
//
// Tiling. One CTA = one work item = 64 rows x a column range, taken in halves of 32 columns. Two
// warpgroups (256 threads); warpgroup w owns the halves h = w, w + 2, w + 4, ... and the two run
// half a step apart, so that one's softmax runs while the other's S is on the tensor cores.
// - S of a half (64 x 32, k = 576), by its owner: 36 wgmma m64n32k16, B = K from the half's ring
//   slot, A = Q from shared memory except for the first kQRegSteps k-steps, whose A fragments each
//   warp holds in registers for the whole item (80 registers: the kernel uses 255, no spills).
// - Softmax: each warpgroup has its own reference maximum per row, which moves lazily: only when a
//   score passes it by more than kMaxSlackLog2 (so P <= 2^8). A P goes to shared memory with the
//   reference it was made on, which is never below the reader's (IssueOtherPv says why): where a
//   row's two differ (rare: after the writer moved), the reader adopts the writer's, rescaling its
//   own O and sums in registers, so P is used as it is and no barrier is needed. Each keeps the row
//   sum of its own halves; the two sums and references meet once, in the epilogue.
// - O (64 x 512 fp32, 128 KB) is split by d_v: warpgroup w owns O[:, 256w .. 256w+256) for all 64
//   rows, 128 accumulator registers per thread. For its half h it adds P(h) V(h) (P from registers,
//   2 wgmma m64n256k16) and the other's P(h-1) V(h-1) (P from shared memory), B = V read MN-major
//   (transposed) from the same ring slot that served as K. Splitting d_v rather than two passes
//   over the KV: a second pass would read every KV tile twice and recompute S; the split costs only
//   the P exchange (4 KB per half).
// - The ring: five 36 KB slots of a half each (SharedPlan), half h in slot h % 5; KV rows come
//   through the int32 slot table (page size 1), columns past col_end zero-filled so that a masked
//   column never multiplies garbage. A half that is one run of 32 consecutive slots before col_end
//   (compaction leaves most sequences so) comes by one bulk tensor copy (TMA, box 64 dims x 32
//   slots x 9 chunks, kv_tile_map.h) issued by its owner's first thread; any other (a fragmented
//   pool, the tree's columns, the range's end) is gathered by the owner's 128 threads, 16-byte
//   cp.async completing on the slot's mbarrier (cp.async.mbarrier.arrive.noinc). A slot's mbarrier
//   expects its owner's 128 threads either way (for a copy, the first thread's arrival also
//   announces the bytes), so the warpgroups pass no barrier but __syncthreads and mbarriers.
// - An fp8 pool (the instance with KvMaps = Fp8KvTileMaps): a half's 656-byte rows come the same
//   two ways, raw, into the upper part of their slot, and at step 7 the owner widens them in place
//   into the nine bf16 chunks (mla_verify_flash_sm90_fp8_load.cuh: its byte plan, its order, and
//   the warpgroup's meetings on its own mbarrier); everything after is the bf16 instance's.
//
// The schedule, once:
//  Prologue (every thread)
//   1. Let the combine (launched programmatically behind this grid, programmatic_launch.cuh) be
//      scheduled onto each SM this CTA leaves; it waits for the whole grid itself.
//   2. Read the slot words of the first four halves, in one round trip.
//   3. Thread 0 initialises the mbarriers and issues Q's bulk copy (the item's 64 rows, 9 chunks;
//      16-byte gathers by all threads where the batch has fewer than 64 rows and no map was made).
//   4. Halves 0 and 1 (warpgroup k: half k) by copy where one run, else gathered; halves 2 and 3
//      gathered now where not one run (copied at 6 otherwise).
//   5. Wait for Q; each warp reads Q's first kQRegSteps k-steps into registers.
//   6. __syncthreads (Q's first chunks become ring slot 4); halves 2 and 3 by copy.
//  Per own half h of a warpgroup (HalfStep)
//   7. Wait for the half's slot (an fp8 half: widen it); issue S(h).
//   8. Wait for the other's P(h-1) (its mbarrier), adopt its reference where higher, issue
//      P(h-1) V(h-1); wait for S.
//   9. Mask (a separate loop only for halves that reach the tree or col_end); move the reference
//      where a score passed it (rare: with O's rescale); make P(h).
//  10. Issue P(h) V(h), P from registers.
//  11. Wait until the other has read P(h-2); publish P(h) and its reference.
//  12. Wait for P(h-1) V(h-1); release P(h-1) to the other.
//  13. Refill: half h+4 into the slot of half h-1 (after the other's "done" on it), by copy or
//      gather, while P(h) V(h) runs; half h+4 thus has about one round of both warpgroups to land.
//  14. Wait for P(h) V(h); "done" on the slot of h.
//  After the loop: P V of the other's last half, if it has it.
//  Epilogue
//  15. Both warpgroups' row sums and references meet in shared memory; each row's LSE (one writer)
//      and 1/sum at the larger reference.
//  16. O / sum as bf16 (the output, or a split's partial) to shared memory (ring slots 0-1, free
//      now: 64 rows padded to 1056 B), then one bulk copy (cp.async.bulk) per row.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/kv_tile_map.h"
#include "kernels/mla_verify_flash_common.cuh"
#include "kernels/mla_verify_flash_sm90_fp8_load.cuh"
#include "kernels/mla_verify_flash_sm90_ops.cuh"
#include "kernels/mla_verify_flash_sm90_plan.cuh"
#include "kernels/mla_verify_kernels.h"
#include "kernels/mla_verify_mma.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/tma_sm90.cuh"
#include "kernels/wgmma_sm90.cuh"
#include "verify/mla_dims.h"

namespace verifyd::flash_sm90 {

using flash::kFullMask;
using flash::kLog2e;
using flash::kRows;
using mma::CpAsync16;
using mma::CpAsyncCommit;
using mma::CpAsyncWaitAll;
using wgmma::kChunkBytes;
using wgmma::SwizzledOffset;

// This thread's place in the CTA.
struct Place {
  int tid;
  int lane;
  int warp;
  // The warpgroup (halves wg, wg + 2, ...; O columns 256wg ..), broadcast from lane 0 so that the
  // compiler knows it is warp-uniform and keeps the wgmma descriptors built from it in uniform
  // registers (without it every wgmma of S paid seven instructions of 64-bit moves).
  int wg;
  int wrow;  // this warp's 16 rows of the 64
  int g;     // this thread's rows in every accumulator: wrow + g and wrow + g + 8
  int c;     // its column pair in them
};

__device__ __forceinline__ Place PlaceOf(int tid) {
  Place at;
  at.tid = tid;
  at.lane = tid & 31;
  at.warp = tid >> 5;
  at.wg = __shfl_sync(kFullMask, tid >> 7, 0);
  at.wrow = (at.warp & 3) * 16;
  at.g = at.lane >> 2;
  at.c = at.lane & 3;
  return at;
}

// SharedPlan's members as shared-window addresses, from the dynamic shared memory aligned to 1024.
struct Smem {
  uint32_t base;
  uint32_t q;
  uint32_t p;
  uint32_t published_ref;  // 2 x 64 fp32
  uint32_t sum_xchg;       // 2 x 64 fp32
  uint32_t final_ref;      // 2 x 64 fp32
  // The ring: half h waits on full_bar + 8 (h % 5); its owner arrives on done_bar + 8 (h % 5) once
  // its own products no longer read it.
  uint32_t full_bar;
  uint32_t done_bar;
  // P(w) and its reference published (p_full + 8w) / read by the other warpgroup (p_empty + 8w).
  uint32_t p_full;
  uint32_t p_empty;
  uint32_t q_bar;
  uint32_t widen_bar;  // + 8 wg: warpgroup wg's meetings while it widens an fp8 half
};

__device__ __forceinline__ Smem SmemOf(uint8_t* smem_raw) {
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  Smem sm;
  sm.base = mma::SmemAddr(smem);
  sm.q = sm.base + kQOffset;
  sm.p = sm.base + kPOffset;
  sm.published_ref = sm.base + offsetof(SharedPlan, published_ref);
  sm.sum_xchg = sm.base + offsetof(SharedPlan, sum_xchg);
  sm.final_ref = sm.base + offsetof(SharedPlan, final_ref);
  sm.full_bar = sm.base + offsetof(SharedPlan, full_bar);
  sm.done_bar = sm.full_bar + 8 * kRingHalves;
  sm.p_full = sm.base + offsetof(SharedPlan, p_full);
  sm.p_empty = sm.p_full + 16;
  sm.q_bar = sm.p_full + 32;
  sm.widen_bar = sm.base + offsetof(SharedPlan, widen_bar);
  return sm;
}

// The reference warpgroup w made its last P on, of this thread's row wrow + g + 8h.
__device__ __forceinline__ uint32_t PublishedRefAt(const Smem& sm, const Place& at, int w, int h) {
  return sm.published_ref + 4 * (w * kRows + at.wrow + at.g + 8 * h);
}

// What the loop reads of the work item.
struct Columns {
  int col_begin;
  int col_end;
  int num_halves;
  int prefix_len;
  const int32_t* slots;
  const uint64_t* mask_rows;
  int words_per_row;
  float scale_log2;
};

// This thread's two rows: their tree node (-1 past the sequence), the reference maximum (lazy:
// this warpgroup's own; a P goes out with the reference it was made on), the sum over this
// warpgroup's halves (this lane's quarter) and O over this warpgroup's 256 dims.
struct RowState {
  int my_node[2];
  float row_max[2];
  float row_sum[2];
  float o[128];
};

// S's A operand: Q's first kQRegSteps k-steps as this warp's fragments (rows wrow .. wrow+15), the
// rest from shared memory (K-major, 128-byte swizzle, rows 0..63).
struct QOperand {
  uint64_t desc;
  uint32_t frag[kQRegSteps][4];
};

// The loop's state of one warpgroup between its halves.
struct Ring {
  uint64_t p_desc;
  int refill_word;          // the slot word (column + lane) of the half it refills next (h + 4)
  uint32_t gathered_ahead;  // bit k: its own half h + 2k (h the current one) was gathered
};

// How a half's rows come, by the pool's maps: bf16 rows as they are (KvTileMap), fp8 rows
// (Fp8KvTileMaps) raw, widened by their owner once landed (mla_verify_flash_sm90_fp8_load.cuh).
template <class KvMaps>
inline constexpr bool kWidensRows = std::is_same_v<KvMaps, Fp8KvTileMaps>;

__device__ __forceinline__ void PrefetchKvMaps(const KvTileMap& maps) {
  tma::PrefetchTensorMap(&maps.map);
}
__device__ __forceinline__ void PrefetchKvMaps(const Fp8KvTileMaps& maps) {
  tma::PrefetchTensorMap(&maps.latent);
  tma::PrefetchTensorMap(&maps.scales);
  tma::PrefetchTensorMap(&maps.rope);
}

__device__ __forceinline__ void CopyKvHalf(const KvTileMap& maps, int run_base, uint32_t dst,
                                           uint32_t bar, int wg_tid) {
  CopyHalfByOwner(&maps.map, run_base, dst, bar, wg_tid);
}
__device__ __forceinline__ void CopyKvHalf(const Fp8KvTileMaps& maps, int run_base, uint32_t dst,
                                           uint32_t bar, int wg_tid) {
  fp8::CopyFp8HalfByOwner(maps, run_base, dst, bar, wg_tid);
}

__device__ __forceinline__ void GatherKvHalf(const KvTileMap&, const VerifyProblem& pr,
                                             int slot_word, int half_col, int col_end, uint32_t dst,
                                             uint32_t bar, int wg_warp, int lane) {
  GatherHalfByOwner(pr.kv, slot_word, half_col, col_end, dst, bar, wg_warp, lane);
}
__device__ __forceinline__ void GatherKvHalf(const Fp8KvTileMaps&, const VerifyProblem& pr,
                                             int slot_word, int half_col, int col_end, uint32_t dst,
                                             uint32_t bar, int wg_warp, int lane) {
  fp8::GatherFp8HalfByOwner(pr.kv_fp8, slot_word, half_col, col_end, dst, bar, wg_warp, lane);
}

// Schedule steps 2-6. Returns bit k: half k was gathered (its owner fences before a wgmma reads
// it).
template <class Probe, class KvMaps>
__device__ __forceinline__ uint32_t Prologue(const MlaVerifyParams& params, const KvMaps& kv_map,
                                             const KvTileMap& q_map, const Smem& sm,
                                             const Place& at, const FlashWorkItem& item,
                                             const flash::ItemRows& rows, Probe& probe,
                                             Columns& cols, RowState& st, QOperand& q) {
  const VerifyProblem& pr = params.problem;
  const int tid = at.tid;
  const int lane = at.lane;
  // 2. The slot words of the first four halves (column + lane), before anything that orders
  // memory: one dependent round trip for all four, not one each.
  int first_words[4];
#pragma unroll
  for (int half = 0; half < 4; ++half) {
    first_words[half] = SlotAt(rows.slots, item.col_begin + half * kHalfCols + lane, item.col_end);
  }

  // 3. The barriers, and Q.
  if (tid == 0) {
#pragma unroll
    for (int b = 0; b < kRingHalves; ++b) {
      tma::MbarrierInit(sm.full_bar + 8 * b, 128);
      tma::MbarrierInit(sm.done_bar + 8 * b, 1);
    }
#pragma unroll
    for (int b = 0; b < 4; ++b) tma::MbarrierInit(sm.p_full + 8 * b, 128);
    tma::MbarrierInit(sm.q_bar, 1);
    if constexpr (kWidensRows<KvMaps>) {
      tma::MbarrierInit(sm.widen_bar, 128);
      tma::MbarrierInit(sm.widen_bar + 8, 128);
    }
    tma::FenceMbarrierInit();
    if (kv_map.usable) PrefetchKvMaps(kv_map);
    // Q: one copy of the item's 64 rows into the 9 swizzled chunks (rows past the sequence come
    // as they are, the next sequence's or zero past the tensor, and are never written out).
    if (q_map.usable) {
      tma::MbarrierArriveExpectTx(sm.q_bar, kTileBytes);
      tma::TensorCopy3d(sm.q, &q_map.map, 0, static_cast<int>(rows.first_row), 0, sm.q_bar);
    }
  }
  if (!q_map.usable) {
    // Fewer than 64 rows in the batch (no map): 16-byte copies; rows past the sequence are zero.
    for (int idx = tid; idx < kRows * kUnitsPerRow; idx += kHopperFlashThreads) {
      const int r = idx / kUnitsPerRow;
      const int u = idx % kUnitsPerRow;
      const bool valid = r < rows.rows_here;
      CpAsync16(sm.q + (u >> 3) * kChunkBytes + SwizzledOffset(r, u & 7),
                valid ? pr.q + (rows.first_row + r) * kKvDim + u * 8 : pr.q, valid);
    }
    CpAsyncCommit();
  }
  probe.At(kQIssued);
  __syncthreads();  // the barriers initialised before any thread arrives on them

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = item.row_begin + at.wrow + at.g + 8 * h;
    st.my_node[h] = r < rows.seq_rows ? r / rows.heads : -1;
  }
  st.row_max[0] = st.row_max[1] = -INFINITY;
  st.row_sum[0] = st.row_sum[1] = 0.f;
  cols.scale_log2 = pr.scale * kLog2e;
#pragma unroll
  for (int i = 0; i < 128; ++i) st.o[i] = 0.f;
  cols.num_halves = (item.col_end - item.col_begin + kHalfCols - 1) / kHalfCols;

  // 4. Halves 0 and 1 by copy where each is one run of 32 slots, else gathered; halves 2 and 3
  // gathered here where they are not one run, else copied at 6.
  uint32_t prologue_gathered = 0;
  int copy_base = -1;  // warpgroup k: the run of half 2 + k, copied after the prologue's barrier
#pragma unroll
  for (int half = 0; half < 4; ++half) {
    if (half >= cols.num_halves) break;
    const int half_col = item.col_begin + half * kHalfCols;
    const int word = first_words[half];
    const int run_base = __shfl_sync(kFullMask, word, 0);
    const uint32_t bar = sm.full_bar + 8 * half;
    if (kv_map.usable && HalfIsOneRun(word, lane, run_base, half_col, item.col_end)) {
      if (at.wg == (half & 1)) {
        if (half >= 2) {
          copy_base = run_base;
        } else {
          CopyKvHalf(kv_map, run_base, RingSlot(sm.base, half), bar, tid & 127);
        }
      }
    } else {
      if (at.wg == (half & 1)) {
        GatherKvHalf(kv_map, pr, word, half_col, item.col_end, RingSlot(sm.base, half), bar,
                     at.warp & 3, lane);
      }
      prologue_gathered |= 1u << half;
    }
  }
  probe.At(kFirstHalvesIssued);

  // 5. Q in; its first k-steps into registers: lane l addresses row wrow + (l & 15), 16-byte unit
  // 2 (ks % 4) + (l >> 4) of chunk ks / 4.
  q.desc = wgmma::MakeDescriptor(sm.q, 16, 1024);
  if (q_map.usable) {
    tma::MbarrierWait(sm.q_bar, 0);
  } else {
    CpAsyncWaitAll();
    wgmma::FenceProxyAsyncShared();  // Q is also read by the wgmma (chunks from kQRegSteps / 4)
    __syncthreads();
  }
  probe.At(kQLanded);
#pragma unroll
  for (int ks = 0; ks < kQRegSteps; ++ks) {
    mma::LdMatrixX4(q.frag[ks],
                    sm.q + (ks / 4) * kChunkBytes +
                        SwizzledOffset(at.wrow + (lane & 15), 2 * (ks % 4) + (lane >> 4)));
  }

  // 6. Every warp's Q fragments read before half 4 overwrites Q's first chunks; halves 2 and 3 by
  // copy only now, so that they do not slow the landing of Q and tile 0 that every CTA waits for.
  __syncthreads();
  if (copy_base >= 0) {
    CopyKvHalf(kv_map, copy_base, RingSlot(sm.base, 2 + at.wg), sm.full_bar + 8 * (2 + at.wg),
               tid & 127);
  }
  return prologue_gathered;
}

// Step 8's product: O += P(hp) V(hp) over this warpgroup's dims, P(hp) being the other
// warpgroup's (in shared memory, made on the reference it published with it). That reference is
// never below this warpgroup's: the other made P(hp) after adding this one's P(hp-1) (adopting its
// reference where higher), and this one has not moved its own since publishing P(hp-1). So the
// rows where the two differ (rare: after the other moved) adopt the other's, and P adds in as is.
template <class Probe>
__device__ __forceinline__ void IssueOtherPv(int hp, const Smem& sm, const Place& at,
                                             const Ring& ring, RowState& st) {
  const int wg = at.wg;
  // The other's P number (hp - (1 - wg)) / 2 completes that phase of its barrier.
  tma::MbarrierWait(sm.p_full + 8 * (1 - wg), ((hp - (1 - wg)) / 2) & 1);
  float other[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) other[h] = LdSharedF32(PublishedRefAt(sm, at, 1 - wg, h));
  AdoptReference(other, st.row_max, st.row_sum, st.o);
  wgmma::PinRegisters(st.o);
  wgmma::Fence();
  const uint64_t v_desc = wgmma::MakeDescriptor(
      RingSlot(sm.base, hp % kRingHalves) + wg * 4 * kHalfChunkBytes, kHalfChunkBytes, 1024);
  if (Probe::kMath) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      wgmma::MmaM64N256K16TransB(st.o,
                                 wgmma::AdvanceDescriptor(ring.p_desc, (2 * (1 - wg) + k) * 32),
                                 wgmma::AdvanceDescriptor(v_desc, k * 16 * 128));
    }
  }
  wgmma::Commit();
}

// Schedule steps 7-14 for this warpgroup's half h.
template <class Probe, class KvMaps>
__device__ __forceinline__ void HalfStep(int h, const VerifyProblem& pr, const KvMaps& kv_map,
                                         const Smem& sm, const Place& at, const Columns& cols,
                                         const QOperand& q, Probe& probe, Ring& ring,
                                         RowState& st) {
  const int wg = at.wg;
  const int lane = at.lane;
  const int slot = h % kRingHalves;
  const uint32_t half_smem = RingSlot(sm.base, slot);
  const int half_col = cols.col_begin + h * kHalfCols;
  // The slot word of half h + 6 (the refill after next), loaded early to hide its latency; with
  // fp8 rows only after the widening, which needs the register.
  int next_refill_word = 0;
  if constexpr (!kWidensRows<KvMaps>) {
    next_refill_word = SlotAt(cols.slots, half_col + 6 * kHalfCols + lane, cols.col_end);
  }
  probe.Phase(h / 2, kTop);
  // 7. The half in; S(h).
  if (Probe::kGathers || h < 4) tma::MbarrierWait(sm.full_bar + 8 * slot, (h / kRingHalves) & 1);
  if constexpr (kWidensRows<KvMaps>) {
    // Raw fp8 rows, copied or gathered: bf16 once the owner has widened them (it fences).
    fp8::WidenHalf(half_smem, sm.widen_bar + 8 * wg, h >> 1, at.tid & 127);
    next_refill_word = SlotAt(cols.slots, half_col + 6 * kHalfCols + lane, cols.col_end);
  } else {
    // A gathered half came by cp.async (the generic proxy); this warpgroup gathered it itself
    // (in the prologue or as the refiller of half h, who is its owner), so it knows.
    if (ring.gathered_ahead & 1) wgmma::FenceProxyAsyncShared();
    ring.gathered_ahead >>= 1;
  }
  probe.TileIn(h / 2);
  probe.Phase(h / 2, kHalfIn);

  float s[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = 0.f;
  wgmma::PinRegisters(s);
  wgmma::Fence();
  const uint64_t k_desc = wgmma::MakeDescriptor(half_smem, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < kKvDim / 16; ++ks) {
    const uint32_t q_off = (ks / 4) * kChunkBytes + (ks % 4) * 32;
    const uint32_t k_off = (ks / 4) * kHalfChunkBytes + (ks % 4) * 32;
    if (Probe::kMath && ks < kQRegSteps) {
      wgmma::MmaM64N32K16RegA(s, q.frag[ks < kQRegSteps ? ks : 0],
                              wgmma::AdvanceDescriptor(k_desc, k_off));
    } else if (Probe::kMath) {
      wgmma::MmaM64N32K16(s, wgmma::AdvanceDescriptor(q.desc, q_off),
                          wgmma::AdvanceDescriptor(k_desc, k_off));
    }
  }
  wgmma::Commit();
  probe.Phase(h / 2, kSIssued);
  // 8. The other's P(h-1) V(h-1) under S.
  if (h >= 1) {
    IssueOtherPv<Probe>(h - 1, sm, at, ring, st);
    wgmma::WaitAllButNewest();  // S(h); the other's P V may still run
  } else {
    wgmma::WaitAll();
  }
  wgmma::PinRegisters(s);
  probe.Phase(h / 2, kSDone);

  // 9. Softmax.
  float tile_max[2];
  ScaleAndMask(s, tile_max, half_col, cols.prefix_len, cols.col_end, cols.scale_log2, st.my_node,
               cols.mask_rows, cols.words_per_row, at.c);
  if (MaxMustMove(tile_max, st.row_max)) {
    wgmma::WaitAll();  // the other's P V adds into O
    wgmma::PinRegisters(st.o);
    MoveReference(tile_max, st.row_max, st.row_sum, st.o);
  }
  probe.Phase(h / 2, kMaxChecked);

  uint32_t p_frag[2][4];
  MakeP(s, st.row_max, st.row_sum, p_frag);
  probe.Phase(h / 2, kPMade);
  // 10. The own P V first (P from registers), so that the tensor cores have it while P goes out.
  wgmma::PinRegisters(st.o);
  wgmma::Fence();
  const uint64_t v_desc =
      wgmma::MakeDescriptor(half_smem + wg * 4 * kHalfChunkBytes, kHalfChunkBytes, 1024);
  if (Probe::kMath) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      wgmma::MmaM64N256K16RegATransB(st.o, p_frag[k],
                                     wgmma::AdvanceDescriptor(v_desc, k * 16 * 128));
    }
  }
  wgmma::Commit();
  probe.Phase(h / 2, kOwnPvIssued);
  // 11. P(h-2) and its reference were read by the other warpgroup before it let this one reuse
  // them; P(h) out.
  if (h >= wg + 2) tma::MbarrierWait(sm.p_empty + 8 * wg, ((h - wg) / 2 - 1) & 1);
  probe.Phase(h / 2, kPBufferFree);
  StoreP(p_frag, sm.p, wg, at.wrow, at.g, at.c);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (at.c == 0) StSharedF32(PublishedRefAt(sm, at, wg, hh), st.row_max[hh]);
  }
  wgmma::FenceProxyAsyncShared();
  tma::MbarrierArrive(sm.p_full + 8 * wg);
  // 12. The other's P(h-1) V(h-1) done (the own P V may still run): its P is read, so it may write
  // its next one (if it has one), and this side is done with the slot of h-1.
  wgmma::WaitAllButNewest();
  probe.Phase(h / 2, kOtherPvDone);
  if (h >= 1 && h + 1 < cols.num_halves) tma::MbarrierArrive(sm.p_empty + 8 * (1 - wg));
  // 13. Refill: half h+4 into the slot of half h-1 (this warpgroup's P V of it is done; the
  // other's S and P V of it, done_bar).
  if (Probe::kGathers && h + 4 < cols.num_halves) {
    const int refill_slot = (h + 4) % kRingHalves;
    const uint32_t refill_smem = RingSlot(sm.base, refill_slot);
    const uint32_t refill_bar = sm.full_bar + 8 * refill_slot;
    if (h >= 1) tma::MbarrierWait(sm.done_bar + 8 * refill_slot, ((h - 1) / kRingHalves) & 1);
    probe.Phase(h / 2, kSlotFree);
    const int refill_col = half_col + 4 * kHalfCols;
    const int run_base = __shfl_sync(kFullMask, ring.refill_word, 0);
    if (kv_map.usable && HalfIsOneRun(ring.refill_word, lane, run_base, refill_col, cols.col_end)) {
      CopyKvHalf(kv_map, run_base, refill_smem, refill_bar, at.tid & 127);
    } else {
      // Not one run (the tree's columns, the range's end, a fragmented pool): gathered.
      GatherKvHalf(kv_map, pr, ring.refill_word, refill_col, cols.col_end, refill_smem, refill_bar,
                   at.warp & 3, lane);
      // Half h + 4: two own halves on (the shift is at the top). Raw fp8 rows are widened, and
      // fenced, whichever way they came.
      if constexpr (!kWidensRows<KvMaps>) ring.gathered_ahead |= 2u;
    }
  }
  probe.Phase(h / 2, kRefilled);
  // 14. The own P V: S(h) and P V(h) are done with the slot of h.
  wgmma::WaitAll();
  wgmma::PinRegisters(st.o);
  PinFragments(p_frag);
  if ((at.tid & 127) == 0) tma::MbarrierArrive(sm.done_bar + 8 * slot);
  ring.refill_word = next_refill_word;
}

// Schedule steps 15-16.
__device__ __forceinline__ void Epilogue(const MlaVerifyParams& params, const FlashWorkItem& item,
                                         const flash::ItemRows& rows, const Smem& sm,
                                         const Place& at, const RowState& st) {
  const int wg = at.wg;
  const int wrow = at.wrow;
  const int g = at.g;
  const int c = at.c;
  CpAsyncWaitAll();  // (each gathered half was waited for by its owner: a guard before the stage)
  // 15. Row sums (this lane's quarter, then the quad) and references of both warpgroups (the two
  // may differ); the sum adds warpgroup 0 first, so every run adds in the same order.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = st.row_sum[h];
    x += __shfl_xor_sync(kFullMask, x, 1);
    x += __shfl_xor_sync(kFullMask, x, 2);
    if (c == 0) {
      StSharedF32(sm.sum_xchg + 4 * (wg * kRows + wrow + g + 8 * h), x);
      StSharedF32(sm.final_ref + 4 * (wg * kRows + wrow + g + 8 * h), st.row_max[h]);
    }
  }
  __syncthreads();

  // The LSE of each row (one writer per row), and the row's 1/sum for the O scaling below.
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wrow + g + 8 * h;
    const float ref0 = LdSharedF32(sm.final_ref + 4 * r);
    const float ref1 = LdSharedF32(sm.final_ref + 4 * (kRows + r));
    const float common = fmaxf(ref0, ref1);
    const float total = LdSharedF32(sm.sum_xchg + 4 * r) * RebaseFactor(ref0, common) +
                        LdSharedF32(sm.sum_xchg + 4 * (kRows + r)) * RebaseFactor(ref1, common);
    inv[h] = total > 0.f ? RebaseFactor(st.row_max[h], common) / total : 0.f;
    if (r < rows.rows_here && wg == 0 && c == 0) {
      flash::WriteLse(params, item, rows.first_row, r, flash::RowLse(common, total));
    }
  }
  // 16. Staged: the rows go to shared memory (the KV stages are free: no gather is in flight and
  // every wgmma has completed), then leave as one bulk copy per row.
  const uint32_t stage = sm.base + kRingOffset;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wrow + g + 8 * h;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int col = wg * 256 + 8 * i + 2 * c;
      const float x0 = st.o[4 * i + 2 * h] * inv[h];
      const float x1 = st.o[4 * i + 2 * h + 1] * inv[h];
      StShared32(stage + r * flash::kStageStride + col * 2, mma::PackBf16x2(x0, x1));
    }
  }
  uint8_t* dst = flash::OutRows(params, item, rows.first_row);
  wgmma::FenceProxyAsyncShared();  // st.shared above, read by the async (bulk copy) proxy
  __syncthreads();
  if (at.tid < rows.rows_here) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                     dst + static_cast<int64_t>(at.tid) * flash::kOutRowBytes),
                 "r"(sm.base + kRingOffset + at.tid * flash::kStageStride), "r"(flash::kOutRowBytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    // Until the stage has been read, not until the rows have landed: the kernel's end makes them
    // visible to the combine.
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  }
}

// timeline: the probe's (a benchmark's clock stamps); nullptr for the product. KvMaps: KvTileMap
// for a bf16 pool, Fp8KvTileMaps for an fp8 one (problem.kv_fp8).
template <class Probe, class KvMaps = KvTileMap>
__global__ void __launch_bounds__(kHopperFlashThreads, 1)
    MlaVerifyFlashSm90Kernel(MlaVerifyParams params, const __grid_constant__ KvMaps kv_map,
                             const __grid_constant__ KvTileMap q_map, uint64_t* timeline) {
  pdl::AllowDependentLaunch();  // 1.
  Probe probe(timeline);
  extern __shared__ uint8_t smem_raw[];
  const Smem sm = SmemOf(smem_raw);
  const VerifyProblem& pr = params.problem;
  const FlashWorkItem item = params.work[blockIdx.x];
  const Place at = PlaceOf(threadIdx.x);
  const flash::ItemRows rows = flash::DecodeItem(pr, item);
  Columns cols;
  cols.col_begin = item.col_begin;
  cols.col_end = item.col_end;
  cols.prefix_len = rows.prefix_len;
  cols.slots = rows.slots;
  cols.mask_rows = rows.mask_rows;
  cols.words_per_row = rows.words_per_row;

  RowState st;
  QOperand q;
  const uint32_t prologue_gathered =
      Prologue(params, kv_map, q_map, sm, at, item, rows, probe, cols, st, q);
  Ring ring;
  ring.p_desc = wgmma::MakeDescriptor(sm.p, 16, 1024);
  ring.refill_word =
      SlotAt(rows.slots, item.col_begin + (at.wg + 4) * kHalfCols + at.lane, item.col_end);
  ring.gathered_ahead =
      ((prologue_gathered >> at.wg) & 1u) | ((prologue_gathered >> at.wg) & 4u) >> 1;
  for (int h = at.wg; h < cols.num_halves; h += 2) {
    HalfStep(h, pr, kv_map, sm, at, cols, q, probe, ring, st);
  }
  // The other warpgroup's last half, if it has the last one.
  if ((cols.num_halves - 1) % 2 != at.wg) {
    IssueOtherPv<Probe>(cols.num_halves - 1, sm, at, ring, st);
    wgmma::WaitAll();
    wgmma::PinRegisters(st.o);
  }
  probe.At(kLoopDone);
  Epilogue(params, item, rows, sm, at, st);
  probe.End();
}

}  // namespace verifyd::flash_sm90
