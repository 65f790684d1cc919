// The fixed geometry of an MLA latent KV row (SPEC §1).
#pragma once

namespace verifyd {

// One cached token: c = [c_latent(512) | k_rope(64)], bf16.
inline constexpr int kKvDim = 576;
// Keys use all 576 values; values use the first 512.
inline constexpr int kVDim = 512;
inline constexpr int kRopeDim = kKvDim - kVDim;
// Bytes of one KV row of one layer.
inline constexpr int kKvRowBytes = kKvDim * 2;
// Hard ceiling on tree nodes the kernels support (SPEC §1).
inline constexpr int kMaxTreeNodes = 1024;

}  // namespace verifyd
