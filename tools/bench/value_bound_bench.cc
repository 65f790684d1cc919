// What SPEC §1's value check costs (plans/0016-integrity-and-test-infra.md): FirstOutOfBound over
// the bytes of q + tree_kv of each SPEC §5 shape and of prefill Appends, against a memcpy of the
// same bytes (the copy the request decode already makes of every payload). Prints per size the
// median ns of each and the ratio check ÷ memcpy. Not a test: numbers, no assertions.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "verify/bf16.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double MedianNs(F&& f, int reps) {
  std::vector<double> ns;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  }
  std::nth_element(ns.begin(), ns.begin() + reps / 2, ns.end());
  return ns[reps / 2];
}

}  // namespace

int main() {
  using namespace verifyd;
  struct Size {
    const char* name;
    int64_t values;
  };
  // Verify: q [B*Q, H, 576] + tree_kv [B*Q, 576]; Append: [61 layers, T, 576].
  auto verify = [](int64_t b, int64_t h, int64_t q) { return b * q * (h + 1) * kKvDim; };
  const Size sizes[] = {
      {"S1 verify B=1 H=8 Q=16", verify(1, 8, 16)},
      {"S2 verify B=1 H=64 Q=9", verify(1, 64, 9)},
      {"S3 verify B=1 H=64 Q=33", verify(1, 64, 33)},
      {"S4 verify B=8 H=16 Q=16", verify(8, 16, 16)},
      {"S5 verify B=32 H=8 Q=8", verify(32, 8, 8)},
      {"S6 verify B=1 H=128 Q=64", verify(1, 128, 64)},
      {"S8 verify B=1 H=8 Q=128", verify(1, 8, 128)},
      {"append 61 layers x 64 tokens", 61 * 64 * kKvDim},
      {"append 61 layers x 1024 tokens", 61 * 1024 * kKvDim},
  };
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  std::printf("%-32s %10s %12s %12s %14s %16s\n", "payload", "bytes", "check ns", "memcpy ns",
              "check/memcpy", "copy+check/memcpy");
  for (const Size& s : sizes) {
    std::vector<bf16_bits> src(static_cast<size_t>(s.values));
    for (bf16_bits& v : src) v = FloatToBf16(dist(rng));
    std::vector<bf16_bits> dst(src.size());
    const int reps = s.values > (int64_t{1} << 24) ? 21 : 201;
    volatile int64_t sink = 0;
    const double check =
        MedianNs([&] { sink = sink + FirstOutOfBound(src.data(), s.values); }, reps);
    const double copy = MedianNs(
        [&] {
          std::memcpy(dst.data(), src.data(), src.size() * 2);
          sink = sink + dst[src.size() / 2];
        },
        reps);
    // What the executor does with bytes in shared memory (issue 33 N8): the check on its copy.
    const double copy_check = MedianNs(
        [&] { sink = sink + CopyFirstOutOfBound(dst.data(), src.data(), s.values); }, reps);
    std::printf("%-32s %10lld %12.0f %12.0f %14.2f %16.2f\n", s.name,
                static_cast<long long>(s.values * 2), check, copy, check / copy, copy_check / copy);
  }
  return 0;
}
