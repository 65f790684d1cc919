#include "tools/fake_scheduler/input_generator.h"

namespace verifyd::sched {
namespace {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t HashKey(const RowKey& key) {
  uint64_t h = SplitMix64(key.kind);
  for (uint64_t part : {key.seed, key.sequence, key.layer, key.position, key.node, key.head}) {
    h = SplitMix64(h ^ part);
  }
  return h;
}

void FillRow(const RowKey& key, float amplitude, absl::Span<bf16_bits> row) {
  uint64_t state = HashKey(key);
  for (bf16_bits& v : row) {
    state = SplitMix64(state);
    // 24 random bits -> [-1, 1).
    const float unit = static_cast<float>(state >> 40) * (2.0f / 16777216.0f) - 1.0f;
    v = FloatToBf16(amplitude * unit);
  }
}

}  // namespace verifyd::sched
