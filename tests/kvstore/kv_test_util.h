// Shared by the kvstore tests: seeds and KV rows derived from a hash (random, never zero, cheap).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/mla_dims.h"

namespace verifyd::testing_kv {

// VERIFYD_SEED reproduces a run; otherwise a fresh seed each run (tests print it on failure).
inline uint64_t TestSeed() {
  if (const char* env = std::getenv("VERIFYD_SEED")) return std::strtoull(env, nullptr, 10);
  return (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
}

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// `count` rows of 576 values; row r's content is a function of (tag, r) only. Bit patterns are
// arbitrary (the store moves bits, it never does arithmetic), and bit 0x4000 keeps each value != 0.
inline std::vector<bf16_bits> HashedRows(uint64_t tag, int64_t count) {
  std::vector<bf16_bits> rows(static_cast<size_t>(count) * kKvDim);
  for (int64_t r = 0; r < count; ++r) {
    uint64_t h = SplitMix64(tag * 0x100000001b3ull + static_cast<uint64_t>(r));
    for (int i = 0; i < kKvDim; i += 4) {
      h = SplitMix64(h);
      for (int k = 0; k < 4; ++k) {
        rows[r * kKvDim + i + k] = static_cast<bf16_bits>((h >> (16 * k)) | 0x4000u);
      }
    }
  }
  return rows;
}

}  // namespace verifyd::testing_kv
