// Random verify-attention problems and a float64 oracle, shared by the CPU, GPU and service tests.
//
// Everything here is test-only: the oracle does every operation in double from the bf16 inputs and
// builds its own tree masks with a naive ancestor walk, so it shares no code with what it checks.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "tests/testing/test_seed.h"
#include "verify/bf16.h"
#include "verify/verify_problem.h"

namespace verifyd::test {

// kChain: each node the child of the previous. kStar: one root, every other node its child.
// kForest: several roots (node 0 and about a quarter of the others), the rest random parents.
// kRandom: one root; each node the child of the previous node or of a uniformly random earlier one.
enum class TreeShape { kChain, kStar, kForest, kRandom };

struct SequenceSpec {
  int prefix_len;
  int num_nodes;
  TreeShape shape;
};

// TestSeed: tests/testing/test_seed.h.

std::vector<int32_t> MakeParents(TreeShape shape, int num_nodes, std::mt19937_64& rng);

// Ancestor-or-self bitmask rows in the TreeMask layout, built by walking parent links one node at a
// time (deliberately naive: it is the independent check of TreeMask).
std::vector<uint64_t> NaiveAncestorMask(absl::Span<const int32_t> parents);

struct HostProblem {  // owns every array; problem() points at them (host pointers)
  int num_heads = 0;
  float scale = 0.f;
  int64_t num_slots = 0;
  std::vector<bf16_bits> kv;  // [num_slots][576]
  std::vector<bf16_bits> q;   // [total_q][H][576]
  std::vector<int32_t> qo_indptr, prefix_len, slot_indptr, slots, mask_indptr;
  std::vector<uint64_t> mask_bits;
  std::vector<std::vector<int32_t>> parents;  // per sequence
  std::vector<bf16_bits> out;  // [total_q][H][512], filled with a poison pattern (0xFFFF = NaN)
  std::vector<float> lse;      // [total_q][H], poisoned with NaN
  VerifyProblem problem();     // with lse pointer set

  int batch() const { return static_cast<int>(prefix_len.size()); }
  int total_q() const { return qo_indptr.empty() ? 0 : qo_indptr.back(); }
  // Refills out and lse with the poison pattern, so a second computation on the same problem
  // cannot pass by leaving the first one's results in place.
  void Poison();
};

// Fresh random bf16 inputs from `seed` (KV uniform in [-1,1], q scaled so scores have std ~2 so the
// softmax is neither flat nor one-hot); scale = 1/sqrt(192). scattered: every sequence's L+Q slots
// are a random sample of a pool of num_slots = total needed + extra_slots, in random order (page
// size 1); otherwise each sequence's slots are one consecutive run. Unused pool rows hold random
// values too.
HostProblem MakeRandomProblem(absl::Span<const SequenceSpec> seqs, int num_heads, uint64_t seed,
                              bool scattered, int64_t extra_slots = 0);

// Same logical KV and q, re-laid out so every sequence's slots are consecutive.
HostProblem WithContiguousSlots(const HostProblem& p);

// Same logical KV and q, re-laid out as runs of consecutive slots of random lengths (1-8, 56-71 or
// 100-399 entries of the slot table, so runs start and end inside KV tiles and some tiles are one
// whole run), placed in the pool in random order with 0-3 unreferenced rows between them; the
// last run placed ends at the pool's last row.
HostProblem WithSlotRuns(const HostProblem& p, uint64_t seed);

// float64 naive reference (every operation in double from the bf16 inputs), two-pass softmax.
// Multithreaded (hardware_concurrency) over (query row, group of 8 heads); converts one KV row at a
// time, so it holds no float64 copy of the pool.
// out: [total_q][H][512]; lse: [total_q][H] (natural log), may be null. Aborts on out-of-range
// indices.
void ComputeVerifyF64(const VerifyProblem& p, std::vector<double>* out, std::vector<double>* lse);

// ||out - ref|| / ||ref|| over all elements; NaN/Inf anywhere in out, or a size mismatch, gives
// +inf.
double RelativeError(absl::Span<const bf16_bits> out, absl::Span<const double> ref);
double RelativeError(absl::Span<const float> out, absl::Span<const double> ref);

}  // namespace verifyd::test
