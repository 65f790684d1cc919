// Deterministic scheduler inputs: every bf16 row is a pure function of its coordinates, so a run
// is reproducible from --seed and any Verify can be recomputed from scratch.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "verify/bf16.h"

namespace verifyd::sched {

// A row's identity. kind separates the streams (prefix KV, tree KV, queries).
struct RowKey {
  enum Kind : uint64_t { kPrefixKv = 1, kTreeKv = 2, kQuery = 3 } kind;
  uint64_t seed = 0;
  uint64_t sequence = 0;
  uint64_t layer = 0;
  uint64_t position = 0;  // prefix position, or the decode step for tree rows
  uint64_t node = 0;      // tree node (tree KV, queries)
  uint64_t head = 0;      // queries
};

uint64_t HashKey(const RowKey& key);

// Fills `row` with values uniform in [-amplitude, amplitude], rounded to bf16.
void FillRow(const RowKey& key, float amplitude, absl::Span<bf16_bits> row);

// KV values in [-1, 1]; queries in [-2, 2], so with scale 1/sqrt(192) scores have a standard
// deviation near 1: the softmax is neither flat nor one-hot.
inline constexpr float kKvAmplitude = 1.0f;
inline constexpr float kQueryAmplitude = 2.0f;

}  // namespace verifyd::sched
