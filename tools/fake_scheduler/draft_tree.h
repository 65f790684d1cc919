// Draft trees as a speculative decoder builds them, and the accepted paths a target model picks.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace verifyd::sched {

enum class TreeKind {
  kChain,      // one draft continuation: node i the child of node i - 1
  kBestFirst,  // DDTree-like: one root, expanded best-first by path probability (top-k branching)
  kForest,     // several roots (alternatives for the first token), each a best-first subtree
};
const char* TreeKindName(TreeKind kind);

// parents[Q]: -1 for a root, else an index < i. num_nodes >= 1.
std::vector<int32_t> MakeDraftTree(TreeKind kind, int num_nodes, std::mt19937_64& rng);

// A path a target model could accept: a root, then each node a child of the previous, of a random
// length in [0, depth of a random node + 1]. Empty rejects the tree.
std::vector<int32_t> PickAcceptedPath(const std::vector<int32_t>& parents, std::mt19937_64& rng);

}  // namespace verifyd::sched
