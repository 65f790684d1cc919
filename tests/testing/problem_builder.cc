#include "tests/testing/problem_builder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

// Scores s = scale * <q, k> with k ~ U[-1,1] and q ~ U[-a,a] have variance
// scale^2 * 576 * (a^2/3) * (1/3) = a^2/3 for scale = 1/sqrt(192); a = 3.5 gives std ~2.
constexpr float kQueryAmplitude = 3.5f;
constexpr bf16_bits kPoisonBf16 = 0xFFFF;  // a NaN: any element left unwritten fails RelativeError

void FillUniform(std::vector<bf16_bits>* v, float amplitude, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-amplitude, amplitude);
  for (bf16_bits& x : *v) x = FloatToBf16(dist(rng));
}

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "problem_builder: %s\n", what);
  std::abort();
}

}  // namespace

std::vector<int32_t> MakeParents(TreeShape shape, int num_nodes, std::mt19937_64& rng) {
  if (num_nodes < 1) Die("MakeParents needs num_nodes >= 1");
  std::vector<int32_t> parents(num_nodes, -1);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (int i = 1; i < num_nodes; ++i) {
    std::uniform_int_distribution<int32_t> earlier(0, i - 1);
    switch (shape) {
      case TreeShape::kChain:
        parents[i] = i - 1;
        break;
      case TreeShape::kStar:
        parents[i] = 0;
        break;
      case TreeShape::kForest:
        // Node 1 is always a second root so every forest has at least two trees.
        parents[i] = (i == 1 || coin(rng) < 0.25) ? -1 : earlier(rng);
        break;
      case TreeShape::kRandom:
        parents[i] = coin(rng) < 0.5 ? i - 1 : earlier(rng);
        break;
    }
  }
  return parents;
}

std::vector<uint64_t> NaiveAncestorMask(absl::Span<const int32_t> parents) {
  const int n = static_cast<int>(parents.size());
  const int words = (n + 63) / 64;
  std::vector<uint64_t> bits(static_cast<size_t>(n) * words, 0);
  for (int i = 0; i < n; ++i) {
    int steps = 0;
    for (int j = i; j != -1; j = parents[j]) {
      if (j < -1 || j >= n || ++steps > n) Die("NaiveAncestorMask: parents is not a forest");
      bits[static_cast<size_t>(i) * words + j / 64] |= uint64_t{1} << (j % 64);
    }
  }
  return bits;
}

VerifyProblem HostProblem::problem() {
  VerifyProblem p;
  p.kv = kv.data();
  p.num_slots = num_slots;
  p.q = q.data();
  p.out = out.data();
  p.lse = lse.data();
  p.num_heads = num_heads;
  p.scale = scale;
  p.batch = batch();
  p.total_q = total_q();
  p.qo_indptr = qo_indptr.data();
  p.prefix_len = prefix_len.data();
  p.slot_indptr = slot_indptr.data();
  p.slots = slots.data();
  p.mask_indptr = mask_indptr.data();
  p.mask_bits = mask_bits.data();
  return p;
}

void HostProblem::Poison() {
  out.assign(static_cast<size_t>(total_q()) * num_heads * kVDim, kPoisonBf16);
  lse.assign(static_cast<size_t>(total_q()) * num_heads, std::numeric_limits<float>::quiet_NaN());
}

HostProblem MakeRandomProblem(absl::Span<const SequenceSpec> seqs, int num_heads, uint64_t seed,
                              bool scattered, int64_t extra_slots) {
  if (num_heads < 1) Die("MakeRandomProblem needs num_heads >= 1");
  if (extra_slots < 0) Die("MakeRandomProblem needs extra_slots >= 0");
  std::mt19937_64 rng(seed);
  HostProblem hp;
  hp.num_heads = num_heads;
  hp.scale = static_cast<float>(1.0 / std::sqrt(192.0));
  hp.qo_indptr.push_back(0);
  hp.slot_indptr.push_back(0);
  hp.mask_indptr.push_back(0);
  for (const SequenceSpec& s : seqs) {
    if (s.prefix_len < 0 || s.num_nodes < 1)
      Die("SequenceSpec needs prefix_len >= 0, num_nodes >= 1");
    hp.parents.push_back(MakeParents(s.shape, s.num_nodes, rng));
    std::vector<uint64_t> mask = NaiveAncestorMask(hp.parents.back());
    hp.mask_bits.insert(hp.mask_bits.end(), mask.begin(), mask.end());
    hp.prefix_len.push_back(s.prefix_len);
    hp.qo_indptr.push_back(hp.qo_indptr.back() + s.num_nodes);
    hp.slot_indptr.push_back(hp.slot_indptr.back() + s.prefix_len + s.num_nodes);
    hp.mask_indptr.push_back(static_cast<int32_t>(hp.mask_bits.size()));
  }
  const int64_t needed = hp.slot_indptr.back();
  hp.num_slots = needed + extra_slots;

  // Slot order: a random permutation of the pool (scattered) or the identity (one run per
  // sequence, in batch order); either way sequence b takes the next L_b + Q_b entries.
  std::vector<int32_t> pool(hp.num_slots);
  std::iota(pool.begin(), pool.end(), 0);
  if (scattered) std::shuffle(pool.begin(), pool.end(), rng);
  hp.slots.assign(pool.begin(), pool.begin() + needed);

  hp.kv.resize(static_cast<size_t>(hp.num_slots) * kKvDim);
  FillUniform(&hp.kv, 1.0f, rng);
  hp.q.resize(static_cast<size_t>(hp.total_q()) * num_heads * kKvDim);
  FillUniform(&hp.q, kQueryAmplitude, rng);
  hp.Poison();
  return hp;
}

HostProblem WithContiguousSlots(const HostProblem& p) {
  HostProblem c = p;
  const int64_t used = static_cast<int64_t>(p.slots.size());
  c.num_slots = std::max(p.num_slots, used);
  c.kv.assign(static_cast<size_t>(c.num_slots) * kKvDim, 0);
  // Entry k of the slot table moves to slot k; pool rows nobody references fill the rest in order.
  std::vector<bool> referenced(p.num_slots, false);
  for (int64_t k = 0; k < used; ++k) {
    const int32_t old = p.slots[k];
    if (old < 0 || old >= p.num_slots) Die("WithContiguousSlots: slot out of range");
    referenced[old] = true;
    std::copy_n(p.kv.begin() + static_cast<size_t>(old) * kKvDim, kKvDim,
                c.kv.begin() + static_cast<size_t>(k) * kKvDim);
    c.slots[k] = static_cast<int32_t>(k);
  }
  int64_t next = used;
  for (int64_t old = 0; old < p.num_slots && next < c.num_slots; ++old) {
    if (referenced[old]) continue;
    std::copy_n(p.kv.begin() + static_cast<size_t>(old) * kKvDim, kKvDim,
                c.kv.begin() + static_cast<size_t>(next) * kKvDim);
    ++next;
  }
  c.Poison();
  return c;
}

HostProblem WithSlotRuns(const HostProblem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t used = static_cast<int64_t>(p.slots.size());
  struct Run {
    int64_t first_entry;
    int64_t length;
  };
  std::vector<Run> runs;
  for (int64_t k = 0; k < used;) {
    int64_t length = 0;
    switch (rng() % 3) {
      case 0:
        length = 1 + static_cast<int64_t>(rng() % 8);
        break;
      case 1:
        length = 56 + static_cast<int64_t>(rng() % 16);
        break;
      default:
        length = 100 + static_cast<int64_t>(rng() % 300);
        break;
    }
    length = std::min(length, used - k);
    runs.push_back({k, length});
    k += length;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  HostProblem c = p;
  // Pool rows: each run in its shuffled place, 0-3 unreferenced rows (copies of pool rows, so
  // finite values) before every run but the first.
  std::vector<int64_t> source_row;  // for each new pool row, the old row it copies
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i > 0) {
      for (int64_t gap = static_cast<int64_t>(rng() % 4); gap > 0; --gap) {
        source_row.push_back(static_cast<int64_t>(rng() % p.num_slots));
      }
    }
    for (int64_t e = 0; e < runs[i].length; ++e) {
      const int64_t entry = runs[i].first_entry + e;
      const int32_t old = p.slots[entry];
      if (old < 0 || old >= p.num_slots) Die("WithSlotRuns: slot out of range");
      c.slots[entry] = static_cast<int32_t>(source_row.size());
      source_row.push_back(old);
    }
  }
  c.num_slots = static_cast<int64_t>(source_row.size());
  c.kv.assign(static_cast<size_t>(c.num_slots) * kKvDim, 0);
  for (int64_t row = 0; row < c.num_slots; ++row) {
    std::copy_n(p.kv.begin() + static_cast<size_t>(source_row[row]) * kKvDim, kKvDim,
                c.kv.begin() + static_cast<size_t>(row) * kKvDim);
  }
  c.Poison();
  return c;
}

}  // namespace verifyd::test
