// The sm_90a flash kernel's benchmark instruments (plans/0004: v10's timeline, session 4's "no
// gathers" / "no wgmma" split of the kernel's time): probe policies of the product's kernel
// template (kernels/mla_verify_flash_sm90.cuh, whose NoProbe is the product's), other
// instantiations, compiled for sm_90a into the benchmark alone.
#include "tools/bench/mla_verify_flash_sm90_probes.h"

#include "kernels/kv_tile_map.h"
#include "kernels/mla_verify_flash_sm90.cuh"

namespace verifyd::bench {
namespace {

using flash_sm90::KernelPoint;
using flash_sm90::MlaVerifyFlashSm90Kernel;
using flash_sm90::NoProbe;
using flash_sm90::SmPhase;

// The timeline's layout (the header's comment).
constexpr int kTimelineTiles = 64;
constexpr int kPhaseFirstTile = 4;
constexpr int kPhaseTiles = 8;
constexpr int kPhaseBase = kTimelineTiles + 10;
constexpr int kTimelineStride = kPhaseBase + kPhaseTiles * 2 * flash_sm90::kPhasePoints;

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Clock stamps per CTA; computes the same output as the product.
struct TimelineProbe : NoProbe {
  uint64_t* stamps;
  __device__ explicit TimelineProbe(uint64_t* timeline)
      : NoProbe(timeline), stamps(timeline + blockIdx.x * kTimelineStride) {
    if (threadIdx.x == 0) {
      stamps[0] = GlobalTimerNs();
      stamps[1] = clock64();
    }
  }
  __device__ void At(KernelPoint point) {
    if (threadIdx.x != 0) return;
    switch (point) {
      case flash_sm90::kQIssued:
        stamps[6 + kTimelineTiles] = clock64();
        break;
      case flash_sm90::kFirstHalvesIssued:
        stamps[7 + kTimelineTiles] = clock64();
        break;
      case flash_sm90::kQLanded:
        stamps[8 + kTimelineTiles] = clock64();
        break;
      case flash_sm90::kLoopDone:
        stamps[2 + kTimelineTiles] = clock64();
        break;
    }
  }
  __device__ void TileIn(int tile) {
    if (threadIdx.x == 0 && tile < kTimelineTiles) stamps[2 + tile] = clock64();
  }
  // This warpgroup's clock at `point` of `tile` (its first thread only).
  __device__ void Phase(int tile, SmPhase point) {
    if ((threadIdx.x & 127) == 0 && tile >= kPhaseFirstTile &&
        tile < kPhaseFirstTile + kPhaseTiles) {
      stamps[kPhaseBase +
             ((tile - kPhaseFirstTile) * 2 + (threadIdx.x >> 7)) * flash_sm90::kPhasePoints +
             point] = clock64();
    }
  }
  __device__ void End() {
    __syncthreads();
    if (threadIdx.x == 0) {
      stamps[3 + kTimelineTiles] = clock64();
      stamps[4 + kTimelineTiles] = GlobalTimerNs();
      uint32_t sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      stamps[5 + kTimelineTiles] = sm;
    }
  }
};

// The ring's refills dropped: halves after the first four are stale (the time of the math and the
// barriers alone). Garbage output.
struct NoGathersProbe : NoProbe {
  static constexpr bool kGathers = false;
  using NoProbe::NoProbe;
};

// The wgmma dropped: the time of the copies, the softmax and the barriers. Garbage output.
struct NoMathProbe : NoProbe {
  static constexpr bool kMath = false;
  using NoProbe::NoProbe;
};

template <class Probe>
cudaError_t Launch(const MlaVerifyParams& params, uint64_t* timeline, cudaStream_t stream) {
  // Not a stream operation: legal while a stream is capturing.
  const cudaError_t set =
      cudaFuncSetAttribute(&MlaVerifyFlashSm90Kernel<Probe>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, flash_sm90::kSmemBytes);
  if (set != cudaSuccess) return set;
  const KvTileMap kv_map = EncodeKvTileMap(params.problem.kv, params.problem.num_slots);
  const KvTileMap q_map = EncodeQTileMap(
      params.problem.q, static_cast<int64_t>(params.problem.total_q) * params.problem.num_heads);
  MlaVerifyFlashSm90Kernel<Probe>
      <<<params.num_work, kHopperFlashThreads, flash_sm90::kSmemBytes, stream>>>(params, kv_map,
                                                                                 q_map, timeline);
  return cudaGetLastError();
}

}  // namespace

const int kSm90TimelineTiles = kTimelineTiles;
const int kSm90TimelineStride = kTimelineStride;
const int kSm90PhaseBase = kPhaseBase;
const int kSm90PhaseFirstTile = kPhaseFirstTile;
const int kSm90PhaseTiles = kPhaseTiles;
const int kSm90PhasePoints = flash_sm90::kPhasePoints;

cudaError_t LaunchSm90Instrumented(Sm90Instrument instrument, const MlaVerifyParams& params,
                                   uint64_t* timeline, cudaStream_t stream) {
  switch (instrument) {
    case Sm90Instrument::kTimeline:
      return Launch<TimelineProbe>(params, timeline, stream);
    case Sm90Instrument::kNoGathers:
      return Launch<NoGathersProbe>(params, nullptr, stream);
    case Sm90Instrument::kNoMath:
      return Launch<NoMathProbe>(params, nullptr, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace verifyd::bench
