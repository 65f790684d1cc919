#include "tools/fake_scheduler/draft_tree.h"

#include <algorithm>
#include <queue>

namespace verifyd::sched {
namespace {

// Best-first expansion, as DDTree/EAGLE-style dynamic trees do: every node offers its children in
// decreasing draft probability; the next node added is the candidate with the highest path
// probability. Child probabilities are a random geometric-like split per node.
void GrowBestFirst(std::vector<int32_t>& parents, int num_nodes, int num_roots,
                   std::mt19937_64& rng) {
  struct Candidate {
    double score;
    int32_t parent;  // -1: another root
    int rank;        // which child of parent (0 = most likely)
    bool operator<(const Candidate& o) const { return score < o.score; }
  };
  std::uniform_real_distribution<double> u(0.3, 0.8);
  std::priority_queue<Candidate> frontier;
  std::vector<double> node_score, node_decay;
  auto add_node = [&](int32_t parent, double score) {
    parents.push_back(parent);
    node_score.push_back(score);
    node_decay.push_back(u(rng));  // share of probability the top child takes
    const int32_t id = static_cast<int32_t>(parents.size()) - 1;
    frontier.push({score * node_decay[id], id, 0});
  };
  for (int r = 0; r < num_roots && static_cast<int>(parents.size()) < num_nodes; ++r) {
    add_node(-1, 1.0 / (r + 1));
  }
  while (static_cast<int>(parents.size()) < num_nodes) {
    const Candidate c = frontier.top();
    frontier.pop();
    add_node(c.parent, c.score);
    // The parent's next child takes a share of what its previous children left.
    const double decay = node_decay[c.parent];
    frontier.push({c.score * (1.0 - decay), c.parent, c.rank + 1});
  }
}

}  // namespace

const char* TreeKindName(TreeKind kind) {
  switch (kind) {
    case TreeKind::kChain:
      return "chain";
    case TreeKind::kBestFirst:
      return "best-first";
    case TreeKind::kForest:
      return "forest";
  }
  return "?";
}

std::vector<int32_t> MakeDraftTree(TreeKind kind, int num_nodes, std::mt19937_64& rng) {
  std::vector<int32_t> parents;
  parents.reserve(num_nodes);
  if (kind == TreeKind::kChain) {
    for (int i = 0; i < num_nodes; ++i) parents.push_back(i - 1);
    return parents;
  }
  const int roots = kind == TreeKind::kForest ? 2 + static_cast<int>(rng() % 3) : 1;
  GrowBestFirst(parents, num_nodes, roots, rng);
  return parents;
}

std::vector<int32_t> PickAcceptedPath(const std::vector<int32_t>& parents, std::mt19937_64& rng) {
  std::vector<int32_t> chain;  // root ... leaf
  for (int32_t n = static_cast<int32_t>(rng() % parents.size()); n >= 0; n = parents[n]) {
    chain.push_back(n);
  }
  std::reverse(chain.begin(), chain.end());
  chain.resize(rng() % (chain.size() + 1));
  return chain;
}

}  // namespace verifyd::sched
