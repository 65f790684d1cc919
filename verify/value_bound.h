// SPEC §1's input rule: every value verifyd takes in (kv, tree_kv, q) has magnitude <= 2^16, which
// also excludes NaN and Inf. Within that bound every score (scale * <q, k>, at most
// 576 * 2^32 * scale) and every accumulation stays finite in fp32, so every output is finite;
// beyond it a product overflows to Inf and the softmax's max subtraction turns it into NaN
// (plans/0016-integrity-and-test-infra.md).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

#include "verify/bf16.h"

namespace verifyd {

inline constexpr float kMaxInputMagnitude = 65536.f;  // 2^16
// 2^16 as bf16 bits: exponent 127 + 16, mantissa 0. A value's magnitude bits above it are either a
// finite value beyond the bound or Inf/NaN (exponent all ones).
inline constexpr bf16_bits kMaxInputMagnitudeBits = 0x4780;

// The largest softmax scale (flag or request): with inputs within 2^16 a score is at most
// 2^16 * 576 * 2^32 < 2^58, far inside fp32 (2^128), so every score, exp and lse stays finite.
inline constexpr float kMaxSoftmaxScale = 65536.f;

inline bool OutOfBound(bf16_bits v) { return (v & 0x7fffu) > kMaxInputMagnitudeBits; }

// The index of the first of data[0, n) outside the bound, or -1 when every value is inside.
// One pass over the bytes (vectorized); the exact index is searched only inside a block that has a
// bad value.
int64_t FirstOutOfBound(const bf16_bits* data, int64_t n);

// Copies src[0, n) to dst (private memory) and returns the index of the first copied value outside
// the bound, or -1. The check reads the copy, so for input another process may rewrite while the
// call runs (shared memory) the values judged are exactly the values used (issue 33 N8). One pass
// in cache-sized blocks; after a bad value dst is partly written.
int64_t CopyFirstOutOfBound(bf16_bits* dst, const bf16_bits* src, int64_t n);

// CheckValueBound on the copy CopyFirstOutOfBound makes: OK, or its INVALID_ARGUMENT.
absl::Status CopyCheckingValueBound(bf16_bits* dst, const bf16_bits* src,
                                    absl::Span<const int64_t> shape, const std::string& field);

// The check as every path answers it: OK, or INVALID_ARGUMENT naming `field`, the first bad
// element's index in every dimension of `shape` and its value. data: host, shape's product values.
absl::Status CheckValueBound(const bf16_bits* data, absl::Span<const int64_t> shape,
                             const std::string& field);

// CheckValueBound's answer for a bad element found elsewhere (the device's check of tensors the
// host cannot read): `bad` is its flat index into `shape`, `bits` its value.
absl::Status OutOfBoundError(absl::Span<const int64_t> shape, int64_t bad, bf16_bits bits,
                             const std::string& field);

}  // namespace verifyd
