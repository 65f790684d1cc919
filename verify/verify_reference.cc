// Verify attention on the CPU: a flash-style pass over KV tiles with an fp32 online softmax.
//
// Work is split into blocks of query rows of one sequence (row r = node * H + head, the memory
// order of q). A block walks the sequence's visible columns (the prefix, then tree nodes up to its
// last node) in tiles: each tile's KV rows are converted to fp32 once and reused by every row of
// the block. Each row keeps a running max m, denominator l and numerator acc[512]; a tile's
// contribution is summed on its own and then merged (blocked summation keeps fp32 rounding at
// O(sqrt) of a tile, not of the whole prefix). plans/0002-cpu-reference.md gives the precision
// argument.
#include "verify/verify_reference.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/simd_clones.h"
#include "verify/tree_mask.h"

namespace verifyd {
namespace {

constexpr int kTileColumns = 64;  // 64 x 576 fp32 = 144 KiB: stays in L2 while a block reuses it
constexpr int kMaxBlockRows = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The hot loop is compiled twice (VERIFYD_SIMD_CLONES, verify/simd_clones.h). Both versions
// do the same roundings in the same order (explicit lanes, no FMA), so results are bit-identical.
#define VERIFYD_INLINE inline __attribute__((always_inline))

absl::Status Invalid(auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); }

// Independent lanes let the compiler vectorize without reassociating one long sum; the final fold
// is pairwise. n must be a multiple of kLanes (576 and 512 are).
VERIFYD_INLINE float Dot(const float* a, const float* b, int n) {
  constexpr int kLanes = 16;
  float lane[kLanes] = {};
  for (int d = 0; d < n; d += kLanes)
    for (int k = 0; k < kLanes; ++k) lane[k] += a[d + k] * b[d + k];
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int k = 0; k < width; ++k) lane[k] += lane[k + width];
  return lane[0];
}

VERIFYD_INLINE void ToFloat(const bf16_bits* in, int n, float* out) {
  for (int d = 0; d < n; ++d) out[d] = Bf16ToFloat(in[d]);
}

inline bool MaskBit(const uint64_t* row, int j) { return ((row[j / 64] >> (j % 64)) & 1u) != 0; }

struct Block {
  int seq;
  int row_begin;  // local rows of the sequence, r = node * num_heads + head
  int row_end;
};

// Where a finished fp32 output row goes: the bf16 result, or the fp32 test path.
struct OutputSink {
  bf16_bits* bf16 = nullptr;
  float* f32 = nullptr;

  void Write(int64_t row_head, const float* o) const {
    if (f32 != nullptr) {
      std::copy_n(o, kVDim, f32 + row_head * kVDim);
    } else {
      bf16_bits* dst = bf16 + row_head * kVDim;
      for (int d = 0; d < kVDim; ++d) dst[d] = FloatToBf16(o[d]);
    }
  }
};

// Per-thread scratch, sized once for the largest block.
class BlockComputer {
 public:
  BlockComputer(const VerifyProblem& p, const OutputSink& sink) : p_(p), sink_(sink) {
    tile_.resize(static_cast<size_t>(kTileColumns) * kKvDim);
    q_.resize(static_cast<size_t>(kMaxBlockRows) * kKvDim);
    acc_.resize(static_cast<size_t>(kMaxBlockRows) * kVDim);
    max_.resize(kMaxBlockRows);
    denom_.resize(kMaxBlockRows);
  }

  VERIFYD_SIMD_CLONES void Run(const Block& blk) {
    const int b = blk.seq;
    const int H = p_.num_heads;
    const int prefix = p_.prefix_len[b];
    const int nodes = p_.qo_indptr[b + 1] - p_.qo_indptr[b];
    const int words = TreeMask::WordsPerRow(nodes);
    const int32_t* slots = p_.slots + p_.slot_indptr[b];
    const uint64_t* mask = p_.mask_bits + p_.mask_indptr[b];
    const int64_t first_row_head = static_cast<int64_t>(p_.qo_indptr[b]) * H;
    const int rows = blk.row_end - blk.row_begin;

    for (int r = 0; r < rows; ++r) {
      ToFloat(p_.q + (first_row_head + blk.row_begin + r) * kKvDim, kKvDim, &q_[r * kKvDim]);
      max_[r] = kNegInf;
      denom_[r] = 0.f;
      std::fill_n(&acc_[r * kVDim], kVDim, 0.f);
    }

    // Ancestors precede their node, so no row of the block sees a tree node after its last node.
    const int last_node = (blk.row_end - 1) / H;
    const int columns = prefix + last_node + 1;
    for (int c0 = 0; c0 < columns; c0 += kTileColumns) {
      const int width = std::min(kTileColumns, columns - c0);
      for (int t = 0; t < width; ++t) {
        if (p_.kv_fp8 != nullptr) {
          DequantizeFp8Row(p_.kv_fp8 + static_cast<int64_t>(slots[c0 + t]) * kFp8RowBytes,
                           &tile_[t * kKvDim]);
        } else {
          ToFloat(p_.kv + static_cast<int64_t>(slots[c0 + t]) * kKvDim, kKvDim, &tile_[t * kKvDim]);
        }
      }
      for (int r = 0; r < rows; ++r) {
        const int node = (blk.row_begin + r) / H;
        AccumulateTile(r, c0, width, prefix, mask + static_cast<size_t>(node) * words);
      }
    }

    for (int r = 0; r < rows; ++r) {
      const int64_t row_head = first_row_head + blk.row_begin + r;
      float* acc = &acc_[r * kVDim];
      // denom >= 1: the row's own column is visible and exp(s_max - m) = 1 for its max.
      for (int d = 0; d < kVDim; ++d) acc[d] /= denom_[r];
      sink_.Write(row_head, acc);
      if (p_.lse != nullptr) p_.lse[row_head] = max_[r] + std::log(denom_[r]);
    }
  }

 private:
  // Folds columns [c0, c0 + width) into row r's running (max, denom, acc).
  VERIFYD_INLINE void AccumulateTile(int r, int c0, int width, int prefix,
                                     const uint64_t* mask_row) {
    const float* q = &q_[r * kKvDim];
    float tile_max = kNegInf;
    for (int t = 0; t < width; ++t) {
      const int col = c0 + t;
      const bool visible = col < prefix || MaskBit(mask_row, col - prefix);
      scores_[t] = visible ? p_.scale * Dot(q, &tile_[t * kKvDim], kKvDim) : kNegInf;
      tile_max = std::max(tile_max, scores_[t]);
    }
    if (tile_max == kNegInf) return;  // nothing in this tile is visible to this row

    const float new_max = std::max(max_[r], tile_max);
    float tile_denom = 0.f;
    std::fill_n(tile_acc_, kVDim, 0.f);
    for (int t = 0; t < width; ++t) {
      if (scores_[t] == kNegInf) continue;
      const float w = std::exp(scores_[t] - new_max);
      tile_denom += w;
      const float* v = &tile_[t * kKvDim];
      for (int d = 0; d < kVDim; ++d) tile_acc_[d] += w * v[d];
    }
    // exp(-inf) = 0 on the first visible tile, when the running state is still empty.
    const float rescale = std::exp(max_[r] - new_max);
    float* acc = &acc_[r * kVDim];
    for (int d = 0; d < kVDim; ++d) acc[d] = acc[d] * rescale + tile_acc_[d];
    denom_[r] = denom_[r] * rescale + tile_denom;
    max_[r] = new_max;
  }

  const VerifyProblem& p_;
  const OutputSink& sink_;
  std::vector<float> tile_;  // [kTileColumns][576]
  std::vector<float> q_;     // [rows][576]
  std::vector<float> acc_;   // [rows][512]
  std::vector<float> max_, denom_;
  float scores_[kTileColumns];
  float tile_acc_[kVDim];
};

absl::Status Compute(const VerifyProblem& p, int num_threads, const OutputSink& sink) {
  VERIFYD_RETURN_IF_ERROR(ValidateVerifyProblem(p));
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads = std::max(num_threads, 1);

  // About four blocks per thread balances uneven sequences; a block of a few rows already reuses
  // each converted KV tile enough that conversion stays a small share of the work.
  const int64_t total_rows = static_cast<int64_t>(p.total_q) * p.num_heads;
  const int64_t want_blocks = 4 * static_cast<int64_t>(num_threads);
  const int block_rows = static_cast<int>(
      std::clamp<int64_t>((total_rows + want_blocks - 1) / want_blocks, 1, kMaxBlockRows));
  std::vector<Block> blocks;
  double macs = 0;  // multiply-adds, to keep tiny problems on the calling thread
  for (int b = 0; b < p.batch; ++b) {
    const int rows = (p.qo_indptr[b + 1] - p.qo_indptr[b]) * p.num_heads;
    for (int r = 0; r < rows; r += block_rows)
      blocks.push_back({b, r, std::min(rows, r + block_rows)});
    macs += static_cast<double>(rows) * (p.prefix_len[b] + p.qo_indptr[b + 1] - p.qo_indptr[b]) *
            (kKvDim + kVDim);
  }
  constexpr double kMacsPerThread = 4e6;  // ~1 ms: well above the cost of starting a thread
  const int64_t useful = std::max<int64_t>(1, static_cast<int64_t>(macs / kMacsPerThread));
  num_threads = static_cast<int>(
      std::min<int64_t>({num_threads, static_cast<int64_t>(blocks.size()), useful}));
  num_threads = std::max(num_threads, 1);

  std::atomic<size_t> next{0};
  auto worker = [&] {
    BlockComputer computer(p, sink);
    for (size_t i; (i = next.fetch_add(1)) < blocks.size();) computer.Run(blocks[i]);
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  return absl::OkStatus();
}

absl::Status ValidateSequence(const VerifyProblem& p, int b) {
  const int64_t nodes = static_cast<int64_t>(p.qo_indptr[b + 1]) - p.qo_indptr[b];
  if (nodes < 1 || nodes > kMaxTreeNodes) {
    return Invalid("qo_indptr[", b + 1, "] - qo_indptr[", b, "] = ", nodes,
                   " tree nodes; must be in [1, ", kMaxTreeNodes, "]");
  }
  const int64_t prefix = p.prefix_len[b];
  if (prefix < 0) return Invalid("prefix_len[", b, "] = ", prefix, " must be >= 0");
  const int64_t num_slots = static_cast<int64_t>(p.slot_indptr[b + 1]) - p.slot_indptr[b];
  if (num_slots != prefix + nodes) {
    return Invalid("slot_indptr[", b + 1, "] - slot_indptr[", b, "] = ", num_slots,
                   " must equal prefix_len[", b, "] + tree nodes = ", prefix + nodes);
  }
  const int words = TreeMask::WordsPerRow(static_cast<int>(nodes));
  const int64_t mask_words = static_cast<int64_t>(p.mask_indptr[b + 1]) - p.mask_indptr[b];
  if (mask_words != nodes * words) {
    return Invalid("mask_indptr[", b + 1, "] - mask_indptr[", b, "] = ", mask_words,
                   " must equal tree nodes * words per row = ", nodes * words);
  }
  for (int64_t k = p.slot_indptr[b]; k < p.slot_indptr[b + 1]; ++k) {
    if (p.slots[k] < 0 || p.slots[k] >= p.num_slots) {
      return Invalid("slots[", k, "] = ", p.slots[k], " must be in [0, num_slots = ", p.num_slots,
                     ")");
    }
  }
  // A row must see its own node (so no row is fully masked) and nothing after it (ancestors
  // precede their node; the tile loop relies on it).
  for (int i = 0; i < nodes; ++i) {
    const uint64_t* row = p.mask_bits + p.mask_indptr[b] + static_cast<size_t>(i) * words;
    if (!MaskBit(row, i)) {
      return Invalid("mask_bits of sequence ", b, " row ", i, ": bit ", i,
                     " (the node itself) must be set");
    }
    for (int w = i / 64; w < words; ++w) {
      // Bits <= i are allowed in word i / 64; none in later words. (2 << 63 wraps to 0: all
      // allowed.)
      const uint64_t allowed = w == i / 64 ? (uint64_t{2} << (i % 64)) - 1 : 0;
      if (const uint64_t extra = row[w] & ~allowed; extra != 0) {
        const int j = w * 64 + std::countr_zero(extra);
        return Invalid("mask_bits of sequence ", b, " row ", i, ": bit ", j,
                       " is set; must be <= ", i, " (only the node and its ancestors)");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateVerifyProblem(const VerifyProblem& p) {
  if (p.num_heads < 1 || p.num_heads > kMaxVerifyHeads) {
    return Invalid("num_heads = ", p.num_heads, " must be in [1, ", kMaxVerifyHeads, "]");
  }
  if (!std::isfinite(p.scale)) return Invalid("scale = ", p.scale, " must be finite");
  if (p.batch < 0) return Invalid("batch = ", p.batch, " must be >= 0");
  if (p.num_slots < 0) return Invalid("num_slots = ", p.num_slots, " must be >= 0");
  if (p.qo_indptr == nullptr || p.slot_indptr == nullptr || p.mask_indptr == nullptr) {
    return Invalid("qo_indptr, slot_indptr and mask_indptr must be set");
  }
  if (p.qo_indptr[0] != 0) return Invalid("qo_indptr[0] = ", p.qo_indptr[0], " must be 0");
  if (p.slot_indptr[0] != 0) return Invalid("slot_indptr[0] = ", p.slot_indptr[0], " must be 0");
  if (p.mask_indptr[0] != 0) return Invalid("mask_indptr[0] = ", p.mask_indptr[0], " must be 0");
  if (p.qo_indptr[p.batch] != p.total_q) {
    return Invalid("qo_indptr[", p.batch, "] = ", p.qo_indptr[p.batch],
                   " must equal total_q = ", p.total_q);
  }
  if (p.batch == 0) return absl::OkStatus();
  if ((p.kv == nullptr && p.kv_fp8 == nullptr) || p.q == nullptr || p.prefix_len == nullptr ||
      p.slots == nullptr || p.mask_bits == nullptr) {
    return Invalid("kv (or kv_fp8), q, prefix_len, slots and mask_bits must be set for batch = ",
                   p.batch);
  }
  // Sequences are checked in order, so each indptr difference is taken from checked starts.
  for (int b = 0; b < p.batch; ++b) VERIFYD_RETURN_IF_ERROR(ValidateSequence(p, b));
  return absl::OkStatus();
}

absl::Status ComputeVerifyReference(const VerifyProblem& problem, int num_threads) {
  if (problem.out == nullptr) return Invalid("out must be set");
  return Compute(problem, num_threads, OutputSink{problem.out, nullptr});
}

absl::Status ComputeVerifyReferenceF32(const VerifyProblem& problem, float* out_f32,
                                       int num_threads) {
  if (out_f32 == nullptr) return Invalid("out_f32 must be set");
  return Compute(problem, num_threads, OutputSink{nullptr, out_f32});
}

}  // namespace verifyd
