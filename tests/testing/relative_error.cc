#include <cmath>
#include <limits>

#include "tests/testing/problem_builder.h"

namespace verifyd::test {
namespace {

template <typename ToDouble>
double RelativeErrorOf(size_t n, ToDouble out_at, absl::Span<const double> ref) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (n != ref.size()) return kInf;
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double o = out_at(i);
    if (!std::isfinite(o)) return kInf;
    diff2 += (o - ref[i]) * (o - ref[i]);
    ref2 += ref[i] * ref[i];
  }
  if (ref2 == 0.0) return diff2 == 0.0 ? 0.0 : kInf;
  return std::sqrt(diff2 / ref2);
}

}  // namespace

double RelativeError(absl::Span<const bf16_bits> out, absl::Span<const double> ref) {
  return RelativeErrorOf(
      out.size(), [&](size_t i) { return double{Bf16ToFloat(out[i])}; }, ref);
}

double RelativeError(absl::Span<const float> out, absl::Span<const double> ref) {
  return RelativeErrorOf(
      out.size(), [&](size_t i) { return double{out[i]}; }, ref);
}

}  // namespace verifyd::test
