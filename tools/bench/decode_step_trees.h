// The decode-step bench's draft trees: the one every uncaptured way verifies at every step, the
// ones the captured way changes step by step (a captured graph must serve any tree within its
// bucket: SPEC §3.1), and the path a step's commit accepts. Plain std only: the captured way's
// engine process (decode_step_captured_engine.cc) includes it, and that process may not include
// the client library's headers (decode_step_captured.h says why).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace verifyd::decode_step {

// A random-looking tree of `nodes` nodes rooted at 0, the same every step (its shape does not
// change the kernel time).
inline std::vector<int32_t> TreeParents(int nodes) {
  std::vector<int32_t> parents(nodes);
  for (int i = 0; i < nodes; ++i) parents[i] = i == 0 ? -1 : (i * 7 + 3) % i;
  return parents;
}

// The captured way's tree of step `step`, always `nodes` nodes (the bucket's max_q, so the
// attention work equals the other ways'), its shape cycling through the ones a drafter makes:
// TreeParents's, a chain, a broom (a stem of `stem` nodes with the rest as leaves of its tip: a
// star on a stem) and a forest (two chains, two roots).
inline std::vector<int32_t> StepTreeParents(int step, int nodes, int stem) {
  if (step % 4 == 0) return TreeParents(nodes);
  std::vector<int32_t> parents(nodes);
  const int half = std::max(1, nodes / 2);
  stem = std::clamp(stem, 1, std::max(1, nodes));
  for (int i = 0; i < nodes; ++i) {
    if (step % 4 == 1) parents[i] = i - 1;
    if (step % 4 == 2) parents[i] = i == 0 ? -1 : std::min(i, stem) - 1;
    if (step % 4 == 3) parents[i] = i == 0 || i == half ? -1 : i - 1;
  }
  return parents;
}

// The path a commit accepts: the first root, then each node's first child, at most `accept` nodes.
inline std::vector<int32_t> AcceptedPath(const std::vector<int32_t>& parents, int accept) {
  std::vector<int32_t> path = {0};
  while (static_cast<int>(path.size()) < accept) {
    int32_t child = -1;
    for (int32_t j = path.back() + 1; j < static_cast<int32_t>(parents.size()); ++j) {
      if (parents[j] == path.back()) {
        child = j;
        break;
      }
    }
    if (child < 0) break;
    path.push_back(child);
  }
  return path;
}

}  // namespace verifyd::decode_step
