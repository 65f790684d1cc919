// The flash test matrix (every H, Q and L value of the issues' shapes, every tree shape, mixed
// batches), shared by the bf16 and fp8 pools' flash tests and, without its 64K-prefix cases, the
// cpu backend's fp8 test.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/problem_builder.h"

namespace verifyd::test {

struct Case {
  std::string name;
  int heads;
  std::vector<SequenceSpec> seqs;
};

inline std::string ShapeName(TreeShape s) {
  switch (s) {
    case TreeShape::kChain:
      return "chain";
    case TreeShape::kStar:
      return "star";
    case TreeShape::kForest:
      return "forest";
    case TreeShape::kRandom:
      return "random";
  }
  return "?";
}

inline std::string Describe(const Case& c) {
  std::string s = c.name + " H=" + std::to_string(c.heads);
  for (const SequenceSpec& q : c.seqs) {
    s += " (L=" + std::to_string(q.prefix_len) + " Q=" + std::to_string(q.num_nodes) + " " +
         ShapeName(q.shape) + ")";
  }
  return s;
}

// Readable test names in ctest and failure output instead of the struct's bytes.
inline void PrintTo(const Case& c, std::ostream* os) { *os << Describe(c); }

// Every H, Q and L value of the issue appears at least once; the fp64 oracle stays a few seconds
// each.
inline std::vector<Case> OracleCases() {
  using enum TreeShape;
  return {
      {"single_node_no_prefix", 1, {{0, 1, kChain}}},
      {"one_prefix_token", 8, {{1, 9, kRandom}}},
      {"prefix_63_star", 16, {{63, 16, kStar}}},
      {"prefix_64_forest", 64, {{64, 33, kForest}}},
      {"heads_128", 128, {{1000, 64, kRandom}}},
      {"tree_257", 8, {{1000, 257, kRandom}}},
      {"tree_1024_chain_no_prefix", 1, {{0, 1024, kChain}}},
      {"tree_1024_forest", 16, {{63, 1024, kForest}}},
      {"long_prefix", 8, {{65536, 16, kRandom}}},
      {"long_prefix_heads_64", 64, {{65536, 9, kStar}}},
      {"mixed_batch",
       16,
       {{0, 1, kChain},
        {1, 9, kStar},
        {63, 16, kForest},
        {64, 33, kRandom},
        {1000, 257, kChain},
        {65536, 9, kRandom},
        {0, 64, kForest}}},
      {"mixed_batch_heads_1",
       1,
       {{5, 1024, kRandom}, {1000, 1, kChain}, {64, 257, kStar}, {63, 33, kForest}}},
  };
}

// The cases whose sequences all have prefixes of at most max_prefix (the CPU's float64 runs stay
// seconds each).
inline std::vector<Case> OracleCasesUpToPrefix(int max_prefix) {
  std::vector<Case> kept;
  for (Case& c : OracleCases()) {
    bool short_enough = true;
    for (const SequenceSpec& s : c.seqs) short_enough = short_enough && s.prefix_len <= max_prefix;
    if (short_enough) kept.push_back(std::move(c));
  }
  return kept;
}

}  // namespace verifyd::test
