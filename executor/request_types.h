// Validated requests as plain structs: what the executor acts on. Tensor pointers point into the
// gRPC request message, which lives until the call is finished.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "verify/bf16.h"
#include "kvstore/kv_store.h"

namespace verifyd {

struct AppendCall {
  SequenceId sequence = 0;
  int layer_begin = 0;
  int layer_count = 0;
  int num_tokens = 0;
  const bf16_bits* kv = nullptr;  // [layer_count][num_tokens][576]
};

struct VerifyCall {
  int layer = 0;
  std::vector<VerifyItem> items;   // request order
  std::vector<int32_t> qo_indptr;  // [items+1]: row offsets of each sequence's nodes
  int total_q = 0;
  int num_heads = 0;
  const bf16_bits* q = nullptr;        // [total_q][num_heads][576]
  const bf16_bits* tree_kv = nullptr;  // [total_q][576]
  bool return_lse = false;
  float scale = 0.f;
  // Where out and lse go when the client placed them in shared memory (the service layer has
  // mapped and checked the region); null: inline in the response.
  bf16_bits* out_destination = nullptr;  // [total_q][num_heads][512]
  float* lse_destination = nullptr;      // [total_q][num_heads], only with return_lse
};

struct CommitCall {
  SequenceId sequence = 0;
  CommitPath path;
};

struct ReleaseCall {
  SequenceId sequence = 0;
};

struct ForkCall {
  SequenceId source = 0;
  SequenceId fork = 0;
  int64_t length = 0;  // shared prefix, validated >= 1
};

// What a fork did (plain: the service layer encodes it).
struct ForkResult {
  int64_t committed_length = 0;
  int64_t shared_slots = 0;  // store-wide, after the fork
};

struct CompactCall {
  int64_t budget_bytes = 0;  // 0: until converged
};

struct GetCompactionCall {
  std::string operation_id;
};

}  // namespace verifyd
