// The float64 oracle: two-pass softmax per (query row, head), every operation in double from the
// bf16 inputs. Threads take (node, group of heads) units; nothing is cached across units, so memory
// stays at a few (L + Q)-long buffers per thread however large the pool is.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

#include "tests/testing/fp8_f64.h"
#include "tests/testing/problem_builder.h"
#include "verify/mla_dims.h"

namespace verifyd::test {
namespace {

[[noreturn]] void Die(const char* what, long long a, long long b) {
  std::fprintf(stderr, "ComputeVerifyF64: %s (%lld, %lld)\n", what, a, b);
  std::abort();
}

// The oracle trusts its callers less than it trusts itself: a malformed problem aborts here rather
// than reading out of bounds and producing a "reference" that means nothing.
void CheckIndices(const VerifyProblem& p) {
  if (p.num_heads < 1 || p.batch < 0) Die("num_heads/batch", p.num_heads, p.batch);
  if (p.qo_indptr[0] != 0 || p.qo_indptr[p.batch] != p.total_q)
    Die("qo_indptr ends", p.qo_indptr[0], p.total_q);
  for (int b = 0; b < p.batch; ++b) {
    const int nq = p.qo_indptr[b + 1] - p.qo_indptr[b];
    const int nl = p.prefix_len[b];
    if (nq < 1 || nl < 0) Die("sequence sizes", nq, nl);
    if (p.slot_indptr[b + 1] - p.slot_indptr[b] != nl + nq) Die("slot count", b, nl + nq);
    if (p.mask_indptr[b + 1] - p.mask_indptr[b] != nq * ((nq + 63) / 64)) Die("mask words", b, nq);
    for (int k = p.slot_indptr[b]; k < p.slot_indptr[b + 1]; ++k)
      if (p.slots[k] < 0 || p.slots[k] >= p.num_slots) Die("slot out of range", k, p.slots[k]);
  }
}

// One unit of work: node `node` of sequence `seq`, heads [head_begin, head_end). Heads of one node
// share the visible columns, so each KV row is converted to double once per unit, not per head.
struct Unit {
  int seq;
  int node;
  int head_begin;
  int head_end;
};
constexpr int kHeadsPerUnit = 8;  // bounds the score buffer to 8 x (L + Q) doubles per thread

// Eight independent partial sums (each still a plain double sum) keep the loop from being one long
// dependency chain; the oracle needs double precision, not a particular summation order.
double DotF64(const double* a, const double* b, int n) {
  double lane[8] = {};
  for (int d = 0; d < n; d += 8)
    for (int k = 0; k < 8; ++k) lane[k] += a[d + k] * b[d + k];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

struct Scratch {
  std::vector<double> q, kv, scores, acc;
};

void ComputeUnit(const VerifyProblem& p, const Unit& u, Scratch& s, double* out, double* lse) {
  const int b = u.seq;
  const int nl = p.prefix_len[b];
  const int nq = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const int words = (nq + 63) / 64;
  const uint64_t* mask_row = p.mask_bits + p.mask_indptr[b] + static_cast<size_t>(u.node) * words;
  const int32_t* seq_slots = p.slots + p.slot_indptr[b];
  const int64_t first =
      (static_cast<int64_t>(p.qo_indptr[b]) + u.node) * p.num_heads + u.head_begin;
  const int heads = u.head_end - u.head_begin;

  std::vector<int> cols;  // visible columns: the whole prefix, then the node's ancestors and itself
  cols.reserve(nl + nq);
  for (int t = 0; t < nl; ++t) cols.push_back(t);
  for (int j = 0; j < nq; ++j)
    if ((mask_row[j / 64] >> (j % 64)) & 1u) cols.push_back(nl + j);
  const size_t ncols = cols.size();

  s.q.resize(static_cast<size_t>(heads) * kKvDim);
  for (int h = 0; h < heads; ++h)
    for (int d = 0; d < kKvDim; ++d)
      s.q[h * kKvDim + d] = Bf16ToFloat(p.q[(first + h) * kKvDim + d]);
  s.kv.resize(kKvDim);
  auto load_kv = [&](int t) {
    if (p.kv_fp8 !=
        nullptr) {  // an fp8 pool: the exact dequantized values (tests/testing/fp8_f64.h)
      DequantizeFp8RowF64(p.kv_fp8 + int64_t{seq_slots[t]} * 656, s.kv.data());
      return;
    }
    const bf16_bits* row = p.kv + static_cast<int64_t>(seq_slots[t]) * kKvDim;
    for (int d = 0; d < kKvDim; ++d) s.kv[d] = Bf16ToFloat(row[d]);
  };

  // Pass 1: scores and their max per head. Pass 2: exp(s - max), denominators and numerators.
  s.scores.resize(static_cast<size_t>(heads) * ncols);
  std::vector<double> max_score(heads, -std::numeric_limits<double>::infinity());
  for (size_t c = 0; c < ncols; ++c) {
    load_kv(cols[c]);
    for (int h = 0; h < heads; ++h) {
      const double score =
          static_cast<double>(p.scale) * DotF64(&s.q[h * kKvDim], s.kv.data(), kKvDim);
      s.scores[h * ncols + c] = score;
      max_score[h] = std::max(max_score[h], score);
    }
  }
  s.acc.assign(static_cast<size_t>(heads) * kVDim, 0.0);
  std::vector<double> denom(heads, 0.0);
  for (size_t c = 0; c < ncols; ++c) {
    load_kv(cols[c]);
    for (int h = 0; h < heads; ++h) {
      const double w = std::exp(s.scores[h * ncols + c] - max_score[h]);
      denom[h] += w;
      double* acc = &s.acc[h * kVDim];
      for (int d = 0; d < kVDim; ++d) acc[d] += w * s.kv[d];
    }
  }
  for (int h = 0; h < heads; ++h) {
    for (int d = 0; d < kVDim; ++d) out[(first + h) * kVDim + d] = s.acc[h * kVDim + d] / denom[h];
    if (lse != nullptr) lse[first + h] = max_score[h] + std::log(denom[h]);
  }
}

}  // namespace

void ComputeVerifyF64(const VerifyProblem& p, std::vector<double>* out, std::vector<double>* lse) {
  CheckIndices(p);
  std::vector<Unit> units;
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < p.qo_indptr[b + 1] - p.qo_indptr[b]; ++i)
      for (int h = 0; h < p.num_heads; h += kHeadsPerUnit)
        units.push_back({b, i, h, std::min(p.num_heads, h + kHeadsPerUnit)});
  const size_t row_heads = static_cast<size_t>(p.total_q) * p.num_heads;
  out->assign(row_heads * kVDim, 0.0);
  if (lse != nullptr) lse->assign(row_heads, 0.0);

  std::atomic<size_t> next{0};
  auto worker = [&] {
    Scratch scratch;
    for (size_t k; (k = next.fetch_add(1)) < units.size();)
      ComputeUnit(p, units[k], scratch, out->data(), lse != nullptr ? lse->data() : nullptr);
  };
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t num_threads = std::min(hw, std::max<size_t>(1, units.size()));
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
}

}  // namespace verifyd::test
