// Random bf16 KV rows that reach every corner of the fp8 quantizer (verify/kv_fp8_layout.h), for
// the tests of each of its implementations (the host's, the device's bit steps and kernels).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "verify/bf16.h"

namespace verifyd::test {

// 576 bf16 values; each group of 128 is one of several kinds, so that every kind meets every
// position: zeros of either sign (scale 1), values on e4m3 ties with a power-of-two scale and one
// value quantizing to exactly 448, bf16 subnormals and tiny values (amax / 448 near or below
// float32's reach), one large value among tiny ones (e4m3 subnormals and zeros), uniform values
// at a random magnitude in [2^-20, 2^16] (fl32(v / scale) passing 448 by an ulp: saturation).
// Rope values uniform in [-100, 100].
std::vector<bf16_bits> RandomFp8EdgeRow(std::mt19937_64& rng);
// `count` such rows back to back, [count][576].
std::vector<bf16_bits> RandomFp8EdgeRows(std::mt19937_64& rng, int64_t count);

// Plants one of SPEC §1's violations in `row` (656 bytes in the fp8 layout), at a random group,
// byte or rope element: each rule of verify/kv_fp8_check.h and the edges of its bounds, by
// `kind` % 9 (scale NaN, Inf, 0, negative, one ulp above kMaxFp8Scale; latent 0x7F, 0xFF; rope
// Inf or NaN; rope just past 2^16).
void PlantFp8Violation(std::mt19937_64& rng, uint8_t* row, int kind);

}  // namespace verifyd::test
