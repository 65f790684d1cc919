// VerifyProblem: one batched verify-attention call, described by pointers (SPEC §1).
//
// The same layout is used by the CPU reference (host pointers) and the GPU launcher (device
// pointers), so a test can hand one set of arrays to both.
//
// For sequence b (0 <= b < batch):
//   Q_b = qo_indptr[b+1] - qo_indptr[b] tree nodes (>= 1),
//   L_b = prefix_len[b] committed tokens (>= 0);
//   slots[slot_indptr[b] .. slot_indptr[b+1]) holds L_b + Q_b slot indices: positions 0..L_b-1 of
//   the committed prefix, then tree nodes 0..Q_b-1;
//   mask_bits[mask_indptr[b] ..) holds Q_b rows of TreeMask::WordsPerRow(Q_b) words (TreeMask
//   layout).
// The indptr arrays start at 0; ValidateVerifyProblem (verify_reference.h) checks all of this.
// Node i of sequence b, head h, is query row r = qo_indptr[b] + i:
//   s(t) = scale * <q[r,h,:], kv[slot(t),:]> over the prefix t < L_b and visible tree nodes,
//   out[r,h,:] = sum_t softmax(s)(t) * kv[slot(t), 0:512], lse[r,h] = ln sum_t exp(s(t)).
#pragma once

#include <cstdint>

#include "verify/bf16.h"

namespace verifyd {

struct VerifyProblem {
  const bf16_bits* kv = nullptr;  // one layer of the pool: [num_slots][576]
  int64_t num_slots = 0;
  const bf16_bits* q = nullptr;  // [total_q][num_heads][576]
  bf16_bits* out = nullptr;      // [total_q][num_heads][512]
  float* lse = nullptr;          // [total_q][num_heads], natural log; may be null
  int num_heads = 0;
  float scale = 0.f;
  int batch = 0;
  int total_q = 0;                       // qo_indptr[batch]
  const int32_t* qo_indptr = nullptr;    // [batch+1]
  const int32_t* prefix_len = nullptr;   // [batch]
  const int32_t* slot_indptr = nullptr;  // [batch+1]
  const int32_t* slots = nullptr;        // [slot_indptr[batch]]
  const int32_t* mask_indptr = nullptr;  // [batch+1], in uint64 words
  const uint64_t* mask_bits = nullptr;   // [mask_indptr[batch]]
  // An fp8 pool's layer instead of kv ([num_slots][656], verify/kv_fp8_layout.h): when set, kv is
  // not read and attention runs over the dequantized rows (SPEC §1). Both backends set it (kv
  // null) over an fp8 pool: the CPU reference reads it, and so do the CUDA launches, which take
  // kv_fp8 != nullptr to mean fp8 rows (device pointers there, like kv's; the portable and naive
  // kernels read them, FlashPath::kHopper refuses them: plans/0032).
  // Last, so that positional initializers of the fields above keep their meaning.
  const uint8_t* kv_fp8 = nullptr;
};

}  // namespace verifyd
