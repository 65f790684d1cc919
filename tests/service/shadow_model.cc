#include "tests/service/shadow_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "verify/mla_dims.h"

namespace verifyd::testing {

void SetBf16Tensor(const std::vector<bf16_bits>& values, std::vector<int64_t> shape,
                   v1::Tensor* tensor) {
  tensor->set_dtype(v1::DTYPE_BF16);
  tensor->clear_shape();
  for (int64_t d : shape) tensor->add_shape(d);
  tensor->set_inline_data(values.data(), values.size() * sizeof(bf16_bits));
}

ShadowModel::ShadowModel(int layers, int heads, float scale, uint32_t seed)
    : layers_(layers), heads_(heads), scale_(scale), rng_(seed) {}

std::vector<bf16_bits> ShadowModel::RandomRows(int64_t rows) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<bf16_bits> v(static_cast<size_t>(rows) * kKvDim);
  for (auto& x : v) x = FloatToBf16(dist(rng_));
  return v;
}

std::vector<int32_t> ShadowModel::RandomParents(int nodes) {
  std::vector<int32_t> parents(nodes);
  const bool chain = std::uniform_int_distribution<int>(0, 3)(rng_) == 0;
  for (int i = 0; i < nodes; ++i) {
    if (i == 0) {
      parents[i] = -1;
    } else if (chain) {
      parents[i] = i - 1;
    } else {
      // Mostly attached to a recent node, sometimes a second root.
      const int pick = std::uniform_int_distribution<int>(-1, i - 1)(rng_);
      parents[i] = pick;
    }
  }
  return parents;
}

std::vector<int32_t> ShadowModel::RandomPath(const std::vector<int32_t>& parents) {
  const int target =
      std::uniform_int_distribution<int>(0, static_cast<int>(parents.size()) - 1)(rng_);
  std::vector<int32_t> path;
  for (int n = target; n != -1; n = parents[n]) path.insert(path.begin(), n);
  // A random prefix of the root-to-node path; sometimes empty (the tree is rejected).
  const int length = std::uniform_int_distribution<int>(0, static_cast<int>(path.size()))(rng_);
  path.resize(length);
  return path;
}

v1::AppendRequest ShadowModel::MakeAppend(uint64_t sequence, int tokens, int layer_begin,
                                          int layer_count) {
  if (layer_count < 0) layer_count = layers_ - layer_begin;
  v1::AppendRequest request;
  request.set_sequence_id(sequence);
  request.set_layer_begin(layer_begin);
  SetBf16Tensor(RandomRows(int64_t{layer_count} * tokens), {layer_count, tokens, kKvDim},
                request.mutable_kv());
  return request;
}

void ShadowModel::AcceptAppend(const v1::AppendRequest& request) {
  ShadowSequence& seq = sequences_[request.sequence_id()];
  seq.committed.resize(layers_);
  const int64_t count = request.kv().shape(0);
  const int64_t tokens = request.kv().shape(1);
  const auto* data = reinterpret_cast<const bf16_bits*>(request.kv().inline_data().data());
  for (int64_t l = 0; l < count; ++l) {
    auto& rows = seq.committed[request.layer_begin() + l];
    rows.insert(rows.end(), data + l * tokens * kKvDim, data + (l + 1) * tokens * kKvDim);
  }
}

v1::VerifyRequest ShadowModel::MakeVerify(int layer, const std::vector<VerifyPart>& parts,
                                          bool return_lse) {
  v1::VerifyRequest request;
  request.set_layer(layer);
  request.set_return_lse(return_lse);
  std::vector<bf16_bits> tree_kv;
  int64_t total_q = 0;
  for (const VerifyPart& part : parts) {
    v1::VerifySequence* s = request.add_sequences();
    s->set_sequence_id(part.sequence);
    for (int32_t p : part.parents) s->add_parents(p);
    if (part.commit_previous.has_value()) {
      s->mutable_commit_previous()->set_commit_length(
          static_cast<uint32_t>(part.commit_previous->size()));
      for (int32_t n : *part.commit_previous) s->mutable_commit_previous()->add_accepted_path(n);
    }
    // The tree KV of a pending tree is fixed per layer; a new tree gets fresh rows.
    auto it = sequences_.find(part.sequence);
    const bool reuse = it != sequences_.end() && !it->second.parents.empty() &&
                       !part.commit_previous.has_value() && it->second.parents == part.parents;
    std::vector<bf16_bits> rows = reuse && !it->second.tree[layer].empty()
                                      ? it->second.tree[layer]
                                      : RandomRows(static_cast<int64_t>(part.parents.size()));
    tree_kv.insert(tree_kv.end(), rows.begin(), rows.end());
    total_q += static_cast<int64_t>(part.parents.size());
  }
  SetBf16Tensor(RandomRows(total_q * heads_), {total_q, heads_, kKvDim}, request.mutable_q());
  SetBf16Tensor(tree_kv, {total_q, kKvDim}, request.mutable_tree_kv());
  return request;
}

void ShadowModel::AcceptVerify(const v1::VerifyRequest& request) {
  const auto* tree_kv = reinterpret_cast<const bf16_bits*>(request.tree_kv().inline_data().data());
  int64_t row = 0;
  for (const v1::VerifySequence& s : request.sequences()) {
    ShadowSequence& seq = sequences_.at(s.sequence_id());
    if (s.has_commit_previous()) {
      AcceptCommit(s.sequence_id(),
                   std::vector<int32_t>(s.commit_previous().accepted_path().begin(),
                                        s.commit_previous().accepted_path().end()));
    }
    if (seq.parents.empty()) {
      seq.parents.assign(s.parents().begin(), s.parents().end());
      seq.tree.assign(layers_, {});
    }
    const int64_t q = s.parents_size();
    seq.tree[request.layer()].assign(tree_kv + row * kKvDim, tree_kv + (row + q) * kKvDim);
    row += q;
  }
}

void ShadowModel::AcceptCommit(uint64_t sequence, const std::vector<int32_t>& path) {
  ShadowSequence& seq = sequences_.at(sequence);
  for (int l = 0; l < layers_; ++l) {
    for (int32_t node : path) {
      const auto& t = seq.tree[l];
      seq.committed[l].insert(seq.committed[l].end(), t.begin() + int64_t{node} * kKvDim,
                              t.begin() + int64_t{node + 1} * kKvDim);
    }
  }
  seq.parents.clear();
  seq.tree.clear();
}

void ShadowModel::AcceptFork(uint64_t source, uint64_t fork, int64_t length) {
  const ShadowSequence& from = sequences_.at(source);
  ShadowSequence copy;
  for (const auto& rows : from.committed) {
    copy.committed.emplace_back(rows.begin(), rows.begin() + length * kKvDim);
  }
  sequences_[fork] = std::move(copy);
}

int64_t ShadowModel::committed_length(uint64_t sequence) const {
  const ShadowSequence& seq = sequences_.at(sequence);
  int64_t n = INT64_MAX;
  for (const auto& rows : seq.committed) n = std::min<int64_t>(n, rows.size() / kKvDim);
  return n;
}

bool ShadowModel::has_tree(uint64_t sequence) const {
  auto it = sequences_.find(sequence);
  return it != sequences_.end() && !it->second.parents.empty();
}

std::string ShadowModel::CheckVerify(const v1::VerifyRequest& request,
                                     const v1::VerifyResponse& response) const {
  const int layer = static_cast<int>(request.layer());
  const float scale = request.has_softmax_scale() ? request.softmax_scale() : scale_;
  int64_t total_q = 0;
  for (const auto& s : request.sequences()) total_q += s.parents_size();
  const v1::Tensor& out = response.out();
  if (out.dtype() != v1::DTYPE_BF16 || out.shape_size() != 3 || out.shape(0) != total_q ||
      out.shape(1) != heads_ || out.shape(2) != kVDim ||
      static_cast<int64_t>(out.inline_data().size()) != total_q * heads_ * kVDim * 2) {
    return absl::StrCat("out has the wrong form: ", out.ShortDebugString().substr(0, 200));
  }
  if (request.return_lse() != response.has_lse()) return "lse presence differs from return_lse";
  if (request.return_lse() &&
      (response.lse().dtype() != v1::DTYPE_FP32 ||
       static_cast<int64_t>(response.lse().inline_data().size()) != total_q * heads_ * 4)) {
    return "lse has the wrong form";
  }
  if (response.committed_length_size() != request.sequences_size()) {
    return "committed_length has the wrong size";
  }
  const auto* q = reinterpret_cast<const bf16_bits*>(request.q().inline_data().data());
  const auto* got = reinterpret_cast<const bf16_bits*>(out.inline_data().data());
  const float* got_lse = request.return_lse()
                             ? reinterpret_cast<const float*>(response.lse().inline_data().data())
                             : nullptr;
  int64_t row0 = 0;
  std::vector<double> scores, o(kVDim);
  for (int b = 0; b < request.sequences_size(); ++b) {
    const ShadowSequence& seq = sequences_.at(request.sequences(b).sequence_id());
    const auto& prefix = seq.committed[layer];
    const int64_t n = committed_length(request.sequences(b).sequence_id());
    if (static_cast<int64_t>(response.committed_length(b)) != n) {
      return absl::StrCat("committed_length[", b, "] = ", response.committed_length(b),
                          ", expected ", n);
    }
    const auto& tree = seq.tree[layer];
    const int q_nodes = static_cast<int>(seq.parents.size());
    for (int i = 0; i < q_nodes; ++i) {
      // Keys visible to node i: the committed prefix, then i and its ancestors.
      std::vector<const bf16_bits*> keys;
      for (int64_t t = 0; t < n; ++t) keys.push_back(prefix.data() + t * kKvDim);
      for (int j = i; j != -1; j = seq.parents[j])
        keys.push_back(tree.data() + int64_t{j} * kKvDim);
      for (int h = 0; h < heads_; ++h) {
        const int64_t r = (row0 + i) * heads_ + h;
        const bf16_bits* qv = q + r * kKvDim;
        scores.assign(keys.size(), 0.0);
        double max_s = -INFINITY;
        for (size_t t = 0; t < keys.size(); ++t) {
          double dot = 0;
          for (int d = 0; d < kKvDim; ++d)
            dot += double(Bf16ToFloat(qv[d])) * Bf16ToFloat(keys[t][d]);
          scores[t] = scale * dot;
          max_s = std::max(max_s, scores[t]);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - max_s));
        std::fill(o.begin(), o.end(), 0.0);
        for (size_t t = 0; t < keys.size(); ++t) {
          for (int d = 0; d < kVDim; ++d) o[d] += scores[t] / sum * Bf16ToFloat(keys[t][d]);
        }
        // SPEC §1's bound, per output row: ||o - ref|| / ||ref|| <= 1e-2; and no element off by
        // more than 2 % of the row's largest (a single wrong element hides in a row norm). The
        // element bound was 0.4 % of the row's largest + 0.8 % of the element, stricter than the
        // contract: one seed on the H200 put a small element 1.2e-3 off with the row well inside
        // SPEC's bound (plans/0026, session 19).
        double row_max = 0, ref_norm = 0, err_norm = 0;
        for (double v : o) row_max = std::max(row_max, std::abs(v));
        for (int d = 0; d < kVDim; ++d) {
          const double g = Bf16ToFloat(got[r * kVDim + d]);
          if (!std::isfinite(g) || std::abs(g - o[d]) > 2e-2 * row_max) {
            return absl::StrCat("out[", row0 + i, ",", h, ",", d, "] = ", g, ", reference ", o[d],
                                " (sequence ", request.sequences(b).sequence_id(), ")");
          }
          ref_norm += o[d] * o[d];
          err_norm += (g - o[d]) * (g - o[d]);
        }
        if (std::sqrt(err_norm) > 1e-2 * std::sqrt(ref_norm)) {
          return absl::StrCat("out[", row0 + i, ",", h, ",:] relative error ",
                              std::sqrt(err_norm / ref_norm), " > 1e-2 (sequence ",
                              request.sequences(b).sequence_id(), ")");
        }
        if (got_lse != nullptr) {
          const double lse = max_s + std::log(sum);
          if (std::abs(got_lse[r] - lse) > 1e-3 * std::max(1.0, std::abs(lse))) {
            return absl::StrCat("lse[", row0 + i, ",", h, "] = ", got_lse[r], ", reference ", lse);
          }
        }
      }
    }
    row0 += q_nodes;
  }
  return "";
}

std::vector<VerifyPart> ShadowModel::StepParts(const std::vector<uint64_t>& sequences, bool commit,
                                               int new_nodes, int first_nodes) {
  std::vector<VerifyPart> parts;
  for (uint64_t seq : sequences) {
    VerifyPart part{seq, {}, std::nullopt};
    if (commit) {
      part.commit_previous = RandomPath(sequences_.at(seq).parents);
      part.parents = RandomParents(new_nodes);
    } else {
      part.parents = has_tree(seq) ? sequences_.at(seq).parents : RandomParents(first_nodes);
    }
    parts.push_back(part);
  }
  return parts;
}

}  // namespace verifyd::testing
