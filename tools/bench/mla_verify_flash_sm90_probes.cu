// The sm_90a flash kernel's benchmark instruments (plans/0004: v10's timeline, session 4's "no
// gathers" / "no wgmma" split of the kernel's time): the same kernel template as the
// product, other instantiations, compiled for sm_90a into the benchmark alone.
#include "tools/bench/mla_verify_flash_sm90_probes.h"

#include "kernels/kv_tile_map.h"
#include "kernels/mla_verify_flash_sm90.cuh"

namespace verifyd::bench {

using flash_sm90::MlaVerifyFlashSm90Kernel;
using flash_sm90::Sm90Probe;

const int kSm90TimelineTiles = flash_sm90::kTimelineTiles;
const int kSm90TimelineStride = flash_sm90::kTimelineStride;
const int kSm90PhaseBase = flash_sm90::kPhaseBase;
const int kSm90PhaseFirstTile = flash_sm90::kPhaseFirstTile;
const int kSm90PhaseTiles = flash_sm90::kPhaseTiles;
const int kSm90PhasePoints = flash_sm90::kPhasePoints;

namespace {

template <Sm90Probe kProbe>
cudaError_t Launch(const MlaVerifyParams& params, uint64_t* timeline, cudaStream_t stream) {
  // Not a stream operation: legal while a stream is capturing.
  const cudaError_t set =
      cudaFuncSetAttribute(&MlaVerifyFlashSm90Kernel<kProbe>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, flash_sm90::kSmemBytes);
  if (set != cudaSuccess) return set;
  const KvTileMap kv_map = EncodeKvTileMap(params.problem.kv, params.problem.num_slots);
  const KvTileMap q_map = EncodeQTileMap(
      params.problem.q, static_cast<int64_t>(params.problem.total_q) * params.problem.num_heads);
  MlaVerifyFlashSm90Kernel<kProbe>
      <<<params.num_work, kHopperFlashThreads, flash_sm90::kSmemBytes, stream>>>(params, kv_map,
                                                                                 q_map, timeline);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSm90Instrumented(Sm90Instrument instrument, const MlaVerifyParams& params,
                                   uint64_t* timeline, cudaStream_t stream) {
  switch (instrument) {
    case Sm90Instrument::kTimeline:
      return Launch<Sm90Probe::kTimeline>(params, timeline, stream);
    case Sm90Instrument::kNoGathers:
      return Launch<Sm90Probe::kNoGathers>(params, nullptr, stream);
    case Sm90Instrument::kNoMath:
      return Launch<Sm90Probe::kNoMath>(params, nullptr, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace verifyd::bench
