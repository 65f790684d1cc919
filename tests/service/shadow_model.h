// ShadowModel: the tests' own copy of every sequence's KV and pending tree, which builds requests
// with random inputs and checks Verify answers against a float64 reference computed here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <vector>

#include "verify/bf16.h"
#include "verifyd/v1/verifyd.pb.h"

namespace verifyd::testing {

struct ShadowSequence {
  std::vector<std::vector<bf16_bits>> committed;  // per layer: [n][576]
  std::vector<int32_t> parents;                   // pending tree, empty when none
  std::vector<std::vector<bf16_bits>> tree;       // per layer: [Q][576]
};

// One sequence of a Verify being built: its new tree, and the commit riding on it.
struct VerifyPart {
  uint64_t sequence = 0;
  std::vector<int32_t> parents;
  std::optional<std::vector<int32_t>> commit_previous;
};

class ShadowModel {
 public:
  ShadowModel(int layers, int heads, float scale, uint32_t seed);

  // Random KV for all layers; the shadow records it (call Accept... only after the RPC succeeded).
  v1::AppendRequest MakeAppend(uint64_t sequence, int tokens, int layer_begin = 0,
                               int layer_count = -1);
  void AcceptAppend(const v1::AppendRequest& request);

  // A Verify for `layer`: a sequence without a pending tree (after its riding commit) gets a new
  // tree with random tree KV for every layer; otherwise the pending tree's parents and KV are
  // reused.
  v1::VerifyRequest MakeVerify(int layer, const std::vector<VerifyPart>& parts, bool return_lse);
  void AcceptVerify(const v1::VerifyRequest& request);
  // Compares every output element (and lse when asked) with the float64 reference of the state
  // after AcceptVerify. Returns a description of the first mismatch, or "" when all match.
  std::string CheckVerify(const v1::VerifyRequest& request,
                          const v1::VerifyResponse& response) const;

  void AcceptCommit(uint64_t sequence, const std::vector<int32_t>& path);
  void AcceptRelease(uint64_t sequence) { sequences_.erase(sequence); }
  // The fork's committed KV is the source's first `length` positions (plans/0019).
  void AcceptFork(uint64_t source, uint64_t fork, int64_t length);

  int64_t committed_length(uint64_t sequence) const;
  bool has_tree(uint64_t sequence) const;
  const std::map<uint64_t, ShadowSequence>& sequences() const { return sequences_; }
  std::mt19937& rng() { return rng_; }
  int layers() const { return layers_; }
  int heads() const { return heads_; }

  // Random trees: chains and bushes; a random root-to-node path for commits.
  std::vector<int32_t> RandomParents(int nodes);
  std::vector<int32_t> RandomPath(const std::vector<int32_t>& parents);
  // One step's parts for `sequences`: with `commit`, a new tree of `new_nodes` nodes riding a
  // commit of a random path of the pending one; else the pending tree (or a new one of
  // `first_nodes` when none is pending).
  std::vector<VerifyPart> StepParts(const std::vector<uint64_t>& sequences, bool commit,
                                    int new_nodes, int first_nodes);

 private:
  std::vector<bf16_bits> RandomRows(int64_t rows);

  int layers_;
  int heads_;
  float scale_;
  std::mt19937 rng_;
  std::map<uint64_t, ShadowSequence> sequences_;
};

// bf16 bytes of `rows` as a Tensor payload.
void SetBf16Tensor(const std::vector<bf16_bits>& values, std::vector<int64_t> shape,
                   v1::Tensor* tensor);

}  // namespace verifyd::testing
