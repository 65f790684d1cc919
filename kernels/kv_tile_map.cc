#include "kernels/kv_tile_map.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"

namespace verifyd {
namespace {

using EncodeTiledFn = decltype(&cuTensorMapEncodeTiled);

// The driver's encoder, looked up once through the runtime (no link against libcuda).
EncodeTiledFn DriverEncoder() {
  static const EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// Rows of 576 bf16 in three dimensions, so that one copy brings a box of `box_rows` whole rows:
// 64 dims of a chunk (contiguous), the row, the chunk (128 bytes apart in a row). A box lands as 9
// chunks of box_rows rows x 128 bytes with the 128-byte swizzle, the wgmma operand layout.
KvTileMap EncodeRowsMap(const bf16_bits* base, int64_t rows, uint32_t box_rows) {
  KvTileMap out;
  std::memset(&out.map, 0, sizeof(out.map));
  const EncodeTiledFn encode = DriverEncoder();
  // The map's base must be 16-byte aligned; its outer extent is a 32-bit count.
  if (encode == nullptr || base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0 ||
      rows < 1 || rows > (int64_t{1} << 31)) {
    return out;
  }
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(rows), kKvDim / 64};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(kKvDim) * sizeof(bf16_bits),
                                 64 * sizeof(bf16_bits)};
  const cuuint32_t box[3] = {64, box_rows, kKvDim / 64};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(&out.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                            const_cast<bf16_bits*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  out.usable = r == CUDA_SUCCESS ? 1 : 0;
  return out;
}

// An fp8 pool's rows (656 bytes apart) in `rank` dimensions of `dims` / `box` from byte `offset` of
// each row: one of EncodeFp8KvTileMaps' three maps. False where the driver refused it.
bool EncodeFp8RowsMap(CUtensorMap* map, const uint8_t* kv_fp8, int64_t num_slots, int offset,
                      CUtensorMapDataType type, int rank, const cuuint64_t* dims,
                      const cuuint64_t* strides, const cuuint32_t* box,
                      CUtensorMapSwizzle swizzle) {
  std::memset(map, 0, sizeof(*map));
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return DriverEncoder()(map, type, rank, const_cast<uint8_t*>(kv_fp8 + offset), dims, strides, box,
                         element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

Fp8KvTileMaps EncodeFp8KvTileMaps(const uint8_t* kv_fp8, int64_t num_slots) {
  Fp8KvTileMaps out;
  // As for bf16 rows: a 16-byte aligned base, a 32-bit row count, no box larger than the tensor.
  if (DriverEncoder() == nullptr || kv_fp8 == nullptr ||
      reinterpret_cast<uintptr_t>(kv_fp8) % 16 != 0 || num_slots < 32 ||
      num_slots > (int64_t{1} << 31)) {
    return out;
  }
  const cuuint64_t rows = static_cast<cuuint64_t>(num_slots);
  const cuuint64_t row_bytes = kFp8RowBytes;
  // Codes: 64 bytes of a chunk, the row, the chunk (64 bytes apart in a row).
  const cuuint64_t latent_dims[3] = {64, rows, kVDim / 64};
  const cuuint64_t latent_strides[2] = {row_bytes, 64};
  const cuuint32_t latent_box[3] = {64, 32, kVDim / 64};
  // Scales: a row's 16 bytes; rope: a row's 64 bf16.
  const cuuint64_t scales_dims[2] = {kFp8Groups * 4, rows};
  const cuuint32_t scales_box[2] = {kFp8Groups * 4, 32};
  const cuuint64_t rope_dims[2] = {kRopeDim, rows};
  const cuuint32_t rope_box[2] = {kRopeDim, 32};
  const bool made = EncodeFp8RowsMap(&out.latent, kv_fp8, num_slots, kFp8LatentOffset,
                                     CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, latent_dims, latent_strides,
                                     latent_box, CU_TENSOR_MAP_SWIZZLE_NONE) &&
                    EncodeFp8RowsMap(&out.scales, kv_fp8, num_slots, kFp8ScalesOffset,
                                     CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, scales_dims, &row_bytes,
                                     scales_box, CU_TENSOR_MAP_SWIZZLE_NONE) &&
                    EncodeFp8RowsMap(&out.rope, kv_fp8, num_slots, kFp8RopeOffset,
                                     CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rope_dims, &row_bytes,
                                     rope_box, CU_TENSOR_MAP_SWIZZLE_128B);
  out.usable = made ? 1 : 0;
  return out;
}

KvTileMap EncodeKvTileMap(const bf16_bits* kv, int64_t num_slots) {
  return EncodeRowsMap(kv, num_slots, 32);  // a half tile: 32 slots
}

KvTileMap EncodeQTileMap(const bf16_bits* q, int64_t rows) {
  // The driver takes a box no larger than the tensor (it refused a pool of 8 slots for box 32).
  if (rows < 64) return KvTileMap{};
  return EncodeRowsMap(q, rows, 64);
}

}  // namespace verifyd
