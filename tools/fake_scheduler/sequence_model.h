// The scheduler's own model of one sequence's KV: what the daemon must hold if it is right.
//
// It mirrors the life cycle (prefill, pending tree, commit of an accepted path) with plain arrays
// in position order, and computes the expected Verify output with kernels' ComputeVerifyReference
// over that contiguous copy, never the daemon's slot layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "verify/bf16.h"

namespace verifyd::sched {

class SequenceModel {
 public:
  // fp8: the daemon stores rows in the fp8 layout (Stats kv_dtype), so the reference runs over
  // the rows quantized as the daemon quantizes them (verify/kv_fp8_layout.h).
  SequenceModel(uint64_t id, int num_layers, bool fp8 = false);

  uint64_t id() const { return id_; }
  int64_t committed() const { return committed_; }
  const std::vector<int32_t>& parents() const { return parents_; }

  // Appends tokens [committed, committed + T) to every layer: kv [layers][T][576].
  void Append(int64_t tokens, absl::Span<const bf16_bits> kv);
  // A new pending tree; its per-layer KV arrives with SetTreeKv.
  void StartTree(std::vector<int32_t> parents);
  // tree_kv [Q][576] of one layer.
  void SetTreeKv(int layer, absl::Span<const bf16_bits> tree_kv);
  // The accepted path's rows become positions committed..committed+k-1 of every layer.
  void Commit(absl::Span<const int32_t> accepted_path);

  // Expected out [Q][H][512] (bf16) and lse [Q][H] for q [Q][H][576] on one layer.
  absl::Status Reference(int layer, absl::Span<const bf16_bits> q, int num_heads, float scale,
                         std::vector<bf16_bits>* out, std::vector<float>* lse);

 private:
  uint64_t id_;
  bool fp8_;
  int64_t committed_ = 0;
  std::vector<std::vector<bf16_bits>> kv_;  // per layer: [committed][576]
  std::vector<int32_t> parents_;
  std::vector<std::vector<bf16_bits>> tree_kv_;  // per layer: [Q][576]
};

// ||got - want|| / ||want|| in double; +inf when got has NaN/Inf or sizes differ.
double RelativeError(absl::Span<const bf16_bits> got, absl::Span<const bf16_bits> want);

// The largest |got - want| element as "index i: got g, want w".
std::string WorstElement(absl::Span<const bf16_bits> got, absl::Span<const bf16_bits> want);

}  // namespace verifyd::sched
