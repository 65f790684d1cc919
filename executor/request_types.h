// Validated requests and their results as plain structs: what the executor acts on and returns.
// Tensor pointers point into the caller's request (the gRPC message, or a shared-memory region),
// which lives until the call is finished. The service decodes the calls and encodes the results
// (service/request_validation.h, service/response_encoding.h); nothing here knows the wire format.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/external_tensors.h"
#include "kvstore/kv_store.h"
#include "verify/bf16.h"
#include "verify/kv_dtype.h"

namespace verifyd {

struct AppendCall {
  SequenceId sequence = 0;
  int layer_begin = 0;
  int layer_count = 0;
  int num_tokens = 0;
  // [layer_count][num_tokens][576] bf16, or [layer_count][num_tokens][656 bytes] in the fp8
  // layout (kv_dtype kFp8: an fp8 store only, checked by the store).
  const void* kv = nullptr;
  KvDtype kv_dtype = KvDtype::kBf16;
  AppendExpectation expect;                // expected_position (SPEC §2); kAny when unset
  RowMemory kv_memory = RowMemory::kHost;  // kDevice: kv lies in a registered device region
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
  // Where out and lse go when the caller has a place for them (the service: a shared-memory
  // region it mapped and checked); null: into VerifyResult's buffers.
  bf16_bits* out_destination = nullptr;  // [total_q][num_heads][512]
  float* lse_destination = nullptr;      // [total_q][num_heads], only with return_lse
  // q or tree_kv lies in memory the client may rewrite while the call runs (shared memory): the
  // executor copies both and checks SPEC §1's bound on the copies it computes from (issue 33 N8).
  bool inputs_shared = false;
  // SMs the caller keeps busy with a kernel of its own while this call runs (a captured graph's
  // WaitDone, resident on one SM under MPS): the attention's grid is planned on the others, so
  // none of its CTAs waits for that SM and doubles the call's time.
  int reserved_sms = 0;
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

// ListSequences: the live sequences with id > after (all when unset), at most `limit` (the service
// has bounded it by the answer's message size).
struct ListSequencesCall {
  std::optional<SequenceId> after;
  int64_t limit = 0;
};

struct CompactCall {
  int64_t budget_bytes = 0;  // 0: until converged
};

struct GetCompactionCall {
  std::string operation_id;
};

struct AppendResult {
  int64_t committed_length = 0;  // the minimum fill over layers
  std::vector<int64_t> layer_fill;
};

struct VerifyResult {
  std::vector<int64_t> committed_length;  // per sequence, request order: the prefix attended
  // out and lse when the call named no destination, as raw bytes ([total_q][num_heads][512] bf16,
  // [total_q][num_heads] fp32): std::string so that the service moves them into the response's
  // bytes fields without a copy. Empty where the call gave a destination (or without return_lse).
  std::string out_bytes;
  std::string lse_bytes;
  // A data-plane call whose inputs the device checks (SPEC §1) answers later, through this: its
  // completion waits for it (null: the call's answer is the returned status).
  std::shared_ptr<ExternalValueCheck> value_check;
};

struct CommitResult {
  int64_t committed_length = 0;
};

struct ReleaseResult {
  int64_t freed_slots = 0;
};

struct DeviceStats {
  std::string backend;      // "cpu" | "cuda"
  bool mps_active = false;  // the backend's device is shared through CUDA MPS
  int layers = 0;
  int max_tree_nodes = 0;
  StoreStats store;
};

}  // namespace verifyd
