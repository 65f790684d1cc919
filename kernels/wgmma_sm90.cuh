// wgmma (warpgroup MMA, sm_90a only) building blocks for the Hopper flash kernel and its unit test:
// shared-memory matrix descriptors for the 128-byte swizzle, the 128-byte-swizzled address of a
// 16-byte unit, and the two products the kernel issues. Include only from files compiled for
// sm_90a (-gencode=arch=compute_90a,code=sm_90a).
//
// Layout used everywhere (one "chunk"): 64 rows x 64 bf16 (128 B per row, 8 KB), 16-byte unit u of
// row r stored at r * 128 + ((u ^ (r % 8)) * 16); chunks are 1024-byte aligned so the swizzle
// phase is the row index. The same chunk is
//   - a K-major operand (rows = M or N, 64 k values per row): Q and K for S = Q K^T, P for P V;
//   - an MN-major operand (rows = k, 64 n values per row): V for P V, read transposed.
#pragma once

#include <cstdint>

namespace verifyd::wgmma {

inline constexpr int kSwizzleRowBytes = 128;
inline constexpr int kChunkRows = 64;
inline constexpr int kChunkBytes = kChunkRows * kSwizzleRowBytes;

// Byte offset of 16-byte unit `unit` (0..7) of row `row` inside a chunk.
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int unit) {
  return row * kSwizzleRowBytes + ((unit ^ (row & 7)) << 4);
}

// The sm_90 shared-memory matrix descriptor: start address, leading and stride byte offsets (all
// in 16-byte units), layout type 1 = 128-byte swizzle in bits 62..63. Base offset 0: every chunk
// is 1024-byte aligned.
//   K-major, swizzled: LBO unused (1), SBO = 1024 (the next group of 8 rows).
//   MN-major, swizzled: LBO = the next 64-wide block of n (the next chunk), SBO = 1024 (the next
//   group of 8 k rows).
__device__ __forceinline__ uint64_t MakeDescriptor(uint32_t smem_addr, uint32_t lbo_bytes,
                                                   uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

// Adds `bytes` (a multiple of 16, staying inside the shared window) to a descriptor's start.
__device__ __forceinline__ uint64_t AdvanceDescriptor(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// Orders this warpgroup's register accesses before the wgmma that follow.
__device__ __forceinline__ void Fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void Commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WaitAll() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Waits until at most one committed group (the newest) is still in flight.
__device__ __forceinline__ void WaitAllButNewest() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
// Shared memory written by ordinary stores or cp.async, read next by wgmma (the async proxy).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accumulator reads/writes across an asynchronous wgmma.
template <int N>
__device__ __forceinline__ void PinRegisters(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 32 fp32) += A (64 x 16, K-major) * B (16 x 32, K-major: 32 rows of k), bf16 in.
__device__ __forceinline__ void MmaM64N32K16(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// d (64 x 32 fp32) += A (64 x 16 from registers: the mma.sync m16n8k16 A fragment of this warp's
// 16 rows, 4 x bf16x2) * B (16 x 32, K-major), bf16 in.
__device__ __forceinline__ void MmaM64N32K16RegA(float (&d)[16], const uint32_t (&a)[4],
                                                 uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// The 128 fp32 accumulators of an m64n256 product: their place-holder list (operands %0..%127)
// and the matching read-write operands, shared by both m64n256k16 forms below.
#define VERIFYD_WGMMA_D128_REGS                                                                    \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "     \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "     \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "     \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "     \
  "%124, %125, %126, %127"
#define VERIFYD_WGMMA_D128_OPERANDS(d)                                                            \
  "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3]), "+f"((d)[4]), "+f"((d)[5]),             \
      "+f"((d)[6]), "+f"((d)[7]), "+f"((d)[8]), "+f"((d)[9]), "+f"((d)[10]), "+f"((d)[11]),       \
      "+f"((d)[12]), "+f"((d)[13]), "+f"((d)[14]), "+f"((d)[15]), "+f"((d)[16]), "+f"((d)[17]),   \
      "+f"((d)[18]), "+f"((d)[19]), "+f"((d)[20]), "+f"((d)[21]), "+f"((d)[22]), "+f"((d)[23]),   \
      "+f"((d)[24]), "+f"((d)[25]), "+f"((d)[26]), "+f"((d)[27]), "+f"((d)[28]), "+f"((d)[29]),   \
      "+f"((d)[30]), "+f"((d)[31]), "+f"((d)[32]), "+f"((d)[33]), "+f"((d)[34]), "+f"((d)[35]),   \
      "+f"((d)[36]), "+f"((d)[37]), "+f"((d)[38]), "+f"((d)[39]), "+f"((d)[40]), "+f"((d)[41]),   \
      "+f"((d)[42]), "+f"((d)[43]), "+f"((d)[44]), "+f"((d)[45]), "+f"((d)[46]), "+f"((d)[47]),   \
      "+f"((d)[48]), "+f"((d)[49]), "+f"((d)[50]), "+f"((d)[51]), "+f"((d)[52]), "+f"((d)[53]),   \
      "+f"((d)[54]), "+f"((d)[55]), "+f"((d)[56]), "+f"((d)[57]), "+f"((d)[58]), "+f"((d)[59]),   \
      "+f"((d)[60]), "+f"((d)[61]), "+f"((d)[62]), "+f"((d)[63]), "+f"((d)[64]), "+f"((d)[65]),   \
      "+f"((d)[66]), "+f"((d)[67]), "+f"((d)[68]), "+f"((d)[69]), "+f"((d)[70]), "+f"((d)[71]),   \
      "+f"((d)[72]), "+f"((d)[73]), "+f"((d)[74]), "+f"((d)[75]), "+f"((d)[76]), "+f"((d)[77]),   \
      "+f"((d)[78]), "+f"((d)[79]), "+f"((d)[80]), "+f"((d)[81]), "+f"((d)[82]), "+f"((d)[83]),   \
      "+f"((d)[84]), "+f"((d)[85]), "+f"((d)[86]), "+f"((d)[87]), "+f"((d)[88]), "+f"((d)[89]),   \
      "+f"((d)[90]), "+f"((d)[91]), "+f"((d)[92]), "+f"((d)[93]), "+f"((d)[94]), "+f"((d)[95]),   \
      "+f"((d)[96]), "+f"((d)[97]), "+f"((d)[98]), "+f"((d)[99]), "+f"((d)[100]), "+f"((d)[101]), \
      "+f"((d)[102]), "+f"((d)[103]), "+f"((d)[104]), "+f"((d)[105]), "+f"((d)[106]),             \
      "+f"((d)[107]), "+f"((d)[108]), "+f"((d)[109]), "+f"((d)[110]), "+f"((d)[111]),             \
      "+f"((d)[112]), "+f"((d)[113]), "+f"((d)[114]), "+f"((d)[115]), "+f"((d)[116]),             \
      "+f"((d)[117]), "+f"((d)[118]), "+f"((d)[119]), "+f"((d)[120]), "+f"((d)[121]),             \
      "+f"((d)[122]), "+f"((d)[123]), "+f"((d)[124]), "+f"((d)[125]), "+f"((d)[126]),             \
      "+f"((d)[127])

// d (64 x 256 fp32) += A (64 x 16, K-major) * B (16 x 256, MN-major: rows of k, n contiguous).
__device__ __forceinline__ void MmaM64N256K16TransB(float (&d)[128], uint64_t desc_a,
                                                    uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" VERIFYD_WGMMA_D128_REGS
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : VERIFYD_WGMMA_D128_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// d (64 x 256 fp32) += A (64 x 16 from registers: the mma.sync m16n8k16 A fragment of this warp's
// 16 rows, 4 x bf16x2) * B (16 x 256, MN-major), bf16 in.
__device__ __forceinline__ void MmaM64N256K16RegATransB(float (&d)[128], const uint32_t (&a)[4],
                                                        uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" VERIFYD_WGMMA_D128_REGS
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : VERIFYD_WGMMA_D128_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

}  // namespace verifyd::wgmma
