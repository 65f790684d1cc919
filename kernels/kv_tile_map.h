// One layer of the KV pool ([num_slots][576] bf16) as a TMA tensor map for the Hopper flash
// kernel: boxes of 64 dims x 32 slots x 9 chunks of 64 dims, with the 128-byte swizzle of the
// wgmma operand chunks (wgmma_sm90.cuh), so that a half tile of 32 consecutive slots lands in
// shared memory as one bulk tensor copy instead of 2304 16-byte gathers (a pool of fewer slots
// than a box may get no map: usable = 0). Encoded on the host for each launch (it holds the
// layer's address) and passed to the kernel by value, so a captured graph keeps its own.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "verify/bf16.h"

namespace verifyd {

struct KvTileMap {
  CUtensorMap map;
  // 0 where no map could be made (no driver entry point, an unaligned pool, an encoding error):
  // the kernel then gathers every tile.
  int32_t usable = 0;
};

// Never fails: a map that cannot be made comes back with usable = 0.
KvTileMap EncodeKvTileMap(const bf16_bits* kv, int64_t num_slots);

}  // namespace verifyd
