#include "tools/fake_scheduler/sequence_model.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/tree_mask.h"
#include "verify/verify_reference.h"

namespace verifyd::sched {

SequenceModel::SequenceModel(uint64_t id, int num_layers, bool fp8)
    : id_(id), fp8_(fp8), kv_(num_layers), tree_kv_(num_layers) {}

void SequenceModel::Append(int64_t tokens, absl::Span<const bf16_bits> kv) {
  const size_t per_layer = static_cast<size_t>(tokens) * kKvDim;
  for (size_t l = 0; l < kv_.size(); ++l) {
    kv_[l].insert(kv_[l].end(), kv.begin() + l * per_layer, kv.begin() + (l + 1) * per_layer);
  }
  committed_ += tokens;
}

void SequenceModel::StartTree(std::vector<int32_t> parents) {
  parents_ = std::move(parents);
  for (auto& t : tree_kv_) t.clear();
}

void SequenceModel::SetTreeKv(int layer, absl::Span<const bf16_bits> tree_kv) {
  tree_kv_[layer].assign(tree_kv.begin(), tree_kv.end());
}

void SequenceModel::Commit(absl::Span<const int32_t> accepted_path) {
  for (size_t l = 0; l < kv_.size(); ++l) {
    for (int32_t node : accepted_path) {
      const bf16_bits* row = tree_kv_[l].data() + static_cast<size_t>(node) * kKvDim;
      kv_[l].insert(kv_[l].end(), row, row + kKvDim);
    }
  }
  committed_ += static_cast<int64_t>(accepted_path.size());
  parents_.clear();
  for (auto& t : tree_kv_) t.clear();
}

absl::Status SequenceModel::Reference(int layer, absl::Span<const bf16_bits> q, int num_heads,
                                      float scale, std::vector<bf16_bits>* out,
                                      std::vector<float>* lse) {
  const int nodes = static_cast<int>(parents_.size());
  VERIFYD_ASSIGN_OR_RETURN(TreeMask mask, TreeMask::FromParents(parents_, kMaxTreeNodes));
  // Prefix then tree rows, contiguous: the tree rows ride at the end of the layer's array for the
  // duration of the computation.
  std::vector<bf16_bits>& kv = kv_[layer];
  kv.insert(kv.end(), tree_kv_[layer].begin(), tree_kv_[layer].end());
  const int32_t columns = static_cast<int32_t>(committed_) + nodes;
  std::vector<int32_t> slots(columns);
  std::iota(slots.begin(), slots.end(), 0);
  const int32_t qo_indptr[] = {0, nodes};
  const int32_t prefix_len[] = {static_cast<int32_t>(committed_)};
  const int32_t slot_indptr[] = {0, columns};
  const int32_t mask_indptr[] = {0, static_cast<int32_t>(mask.bits().size())};
  out->assign(static_cast<size_t>(nodes) * num_heads * kVDim, 0);
  lse->assign(static_cast<size_t>(nodes) * num_heads, 0.f);

  VerifyProblem p;
  p.kv = kv.data();
  std::vector<uint8_t> fp8_rows;
  if (fp8_) {
    fp8_rows.resize(static_cast<size_t>(columns) * kFp8RowBytes);
    for (int32_t c = 0; c < columns; ++c) {
      QuantizeFp8Row(kv.data() + static_cast<size_t>(c) * kKvDim,
                     fp8_rows.data() + static_cast<size_t>(c) * kFp8RowBytes);
    }
    p.kv = nullptr;
    p.kv_fp8 = fp8_rows.data();
  }
  p.num_slots = columns;
  p.q = q.data();
  p.out = out->data();
  p.lse = lse->data();
  p.num_heads = num_heads;
  p.scale = scale;
  p.batch = 1;
  p.total_q = nodes;
  p.qo_indptr = qo_indptr;
  p.prefix_len = prefix_len;
  p.slot_indptr = slot_indptr;
  p.slots = slots.data();
  p.mask_indptr = mask_indptr;
  p.mask_bits = mask.bits().data();
  // One thread: the scheduler's worker threads already run side by side.
  absl::Status status = ComputeVerifyReference(p, /*num_threads=*/1);
  kv.resize(static_cast<size_t>(committed_) * kKvDim);
  return status;
}

double RelativeError(absl::Span<const bf16_bits> got, absl::Span<const bf16_bits> want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = Bf16ToFloat(got[i]), w = Bf16ToFloat(want[i]);
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
    diff += (g - w) * (g - w);
    norm += w * w;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

std::string WorstElement(absl::Span<const bf16_bits> got, absl::Span<const bf16_bits> want) {
  size_t worst = 0;
  double worst_diff = -1;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::fabs(static_cast<double>(Bf16ToFloat(got[i])) - Bf16ToFloat(want[i]));
    if (!(d <= worst_diff)) {  // NaN wins
      worst_diff = d;
      worst = i;
      if (std::isnan(d)) break;
    }
  }
  if (worst_diff < 0) return "no elements";
  return absl::StrCat("index ", worst, ": got ", Bf16ToFloat(got[worst]), ", want ",
                      Bf16ToFloat(want[worst]));
}

}  // namespace verifyd::sched
