#include "kernels/kv_tile_map.h"

#include <cuda_runtime_api.h>

#include <cstring>

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

}  // namespace

KvTileMap EncodeKvTileMap(const bf16_bits* kv, int64_t num_slots) {
  return EncodeRowsMap(kv, num_slots, 32);  // a half tile: 32 slots
}

KvTileMap EncodeQTileMap(const bf16_bits* q, int64_t rows) {
  // The driver takes a box no larger than the tensor (it refused a pool of 8 slots for box 32).
  if (rows < 64) return KvTileMap{};
  return EncodeRowsMap(q, rows, 64);
}

}  // namespace verifyd
