// One layer of the KV pool ([num_slots][576] bf16), and the queries, as TMA tensor maps for the
// Hopper flash kernel: boxes of 64 dims x N rows x 9 chunks of 64 dims, with the 128-byte swizzle
// of the wgmma operand chunks (wgmma_sm90.cuh), so that a half tile of 32 consecutive slots, or a
// work item's 64 query rows, lands in shared memory as one bulk tensor copy instead of thousands
// of 16-byte gathers (a tensor of fewer rows than a box gets no map: usable = 0). Encoded on the
// host for each launch (they hold the addresses) and passed to the kernel by value, so a captured
// graph keeps its own.
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

// One layer of an fp8 pool ([num_slots][656] bytes, verify/kv_fp8_layout.h) as the three maps a
// half of 32 consecutive slots comes by (mla_verify_flash_sm90_fp8_load.cuh's byte plan): the
// codes as 8 chunks of 32 rows x 64 bytes (box 64 bytes x 32 slots x 8 chunks, no swizzle), the
// scales as 32 rows x 16 bytes, and the rope as bf16 chunk 8 (64 dims x 32 slots, the 128-byte
// swizzle of a bf16 pool's chunk). usable = 0 where any of the three could not be made.
struct Fp8KvTileMaps {
  CUtensorMap latent;
  CUtensorMap scales;
  CUtensorMap rope;
  int32_t usable = 0;
};

// Never fails: maps that cannot be made come back with usable = 0.
Fp8KvTileMaps EncodeFp8KvTileMaps(const uint8_t* kv_fp8, int64_t num_slots);

// The queries ([rows][576] bf16) as a tensor map of the same form, boxes of 64 dims x 64 rows x 9
// chunks: a work item's 64 rows of Q land as the kernel's nine swizzled Q chunks in one copy
// (rows past the tensor's end zero-filled). No map (usable = 0) for fewer than 64 rows.
KvTileMap EncodeQTileMap(const bf16_bits* q, int64_t rows);

}  // namespace verifyd
