// The benchmark's instruments of the sm_90a flash kernel, built from the product's own source
// (kernels/mla_verify_flash_sm90.cuh) in a bench-only translation unit: the product library holds
// only the shipped instantiation. Each needs the sm_90a image (the Hopper kernel runs here).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/mla_verify_params.h"

namespace verifyd::bench {

enum class Sm90Instrument {
  kTimeline,   // clock stamps per CTA, same output (layout below)
  kNoGathers,  // the main loop without its KV gathers: garbage output, the math path's time
  kNoMath,     // the main loop without its wgmma: garbage output, the gathers' and softmax's time
};

// kTimeline's stamps per CTA, at timeline[blockIdx.x * kSm90TimelineStride + ...]: [0] globaltimer
// ns at the start, [1] clock64 at the start, [2 + k] clock64 once tile k's data is in (k <
// kSm90TimelineTiles), [2 + T] before the epilogue, [3 + T] after it, [4 + T] globaltimer ns at
// the end, [5 + T] the SM id, [6 + T] Q's copies issued, [7 + T] the first halves issued, [8 + T]
// Q landed (T = kSm90TimelineTiles); then each warpgroup's clock at the kSm90PhasePoints points
// of tiles kSm90PhaseFirstTile .. + kSm90PhaseTiles - 1, at [kSm90PhaseBase + ((tile - first) * 2
// + warpgroup) * points + point] (flash_sm90::SmPhase names the points).
extern const int kSm90TimelineTiles;
extern const int kSm90TimelineStride;
extern const int kSm90PhaseBase;
extern const int kSm90PhaseFirstTile;
extern const int kSm90PhaseTiles;
extern const int kSm90PhasePoints;

// Launches the flash kernel of `params` (a planned launch: MakeMlaVerifyParams) with the
// instrument; timeline is read only by kTimeline (num_work * kSm90TimelineStride entries).
cudaError_t LaunchSm90Instrumented(Sm90Instrument instrument, const MlaVerifyParams& params,
                                   uint64_t* timeline, cudaStream_t stream);

}  // namespace verifyd::bench
