#include "verify/value_bound.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "verify/simd_clones.h"

namespace verifyd {
namespace {

constexpr int64_t kBlock = 256;  // values per reduction: one early exit per 512 bytes

// Whether any of data[0, kBlock) is out of bound: a branch-free OR-reduction the compiler
// vectorizes (16 lanes with AVX2).
VERIFYD_SIMD_CLONES bool BlockHasBad(const bf16_bits* data) {
  uint16_t bad = 0;
  for (int64_t i = 0; i < kBlock; ++i) {
    bad |= static_cast<uint16_t>((data[i] & 0x7fffu) > kMaxInputMagnitudeBits);
  }
  return bad != 0;
}

}  // namespace

int64_t FirstOutOfBound(const bf16_bits* data, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    if (!BlockHasBad(data + i)) continue;
    for (int64_t k = i; k < i + kBlock; ++k) {
      if (OutOfBound(data[k])) return k;
    }
  }
  for (; i < n; ++i) {
    if (OutOfBound(data[i])) return i;
  }
  return -1;
}

int64_t CopyFirstOutOfBound(bf16_bits* dst, const bf16_bits* src, int64_t n) {
  constexpr int64_t kCopyBlock = 8192;  // 16 KiB: copied, then checked while still in cache
  for (int64_t i = 0; i < n; i += kCopyBlock) {
    const int64_t count = std::min(kCopyBlock, n - i);
    std::memcpy(dst + i, src + i, static_cast<size_t>(count) * sizeof(bf16_bits));
    const int64_t bad = FirstOutOfBound(dst + i, count);
    if (bad >= 0) return i + bad;
  }
  return -1;
}

absl::Status CopyCheckingValueBound(bf16_bits* dst, const bf16_bits* src,
                                    absl::Span<const int64_t> shape, const std::string& field) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  const int64_t bad = CopyFirstOutOfBound(dst, src, elements);
  if (bad < 0) return absl::OkStatus();
  return OutOfBoundError(shape, bad, dst[bad], field);
}

absl::Status CheckValueBound(const bf16_bits* data, absl::Span<const int64_t> shape,
                             const std::string& field) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  const int64_t bad = FirstOutOfBound(data, elements);
  if (bad < 0) return absl::OkStatus();
  return OutOfBoundError(shape, bad, data[bad], field);
}

absl::Status OutOfBoundError(absl::Span<const int64_t> shape, int64_t bad, bf16_bits bits,
                             const std::string& field) {
  std::vector<int64_t> index(shape.size());
  for (int64_t k = bad, d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    index[d] = k % shape[d];
    k /= shape[d];
  }
  std::string at;
  for (size_t d = 0; d < index.size(); ++d) absl::StrAppend(&at, d ? ", " : "", index[d]);
  const float value = Bf16ToFloat(bits);
  return absl::InvalidArgumentError(
      absl::StrCat(field, "[", at, "] = ", value,
                   std::isfinite(value) ? " is outside" : " is not finite; values must lie in",
                   " [-65536, 65536] (SPEC §1: NaN and Inf are rejected, and finite "
                   "values beyond 2^16 could overflow the scores); nothing was kept"));
}

}  // namespace verifyd
