// Fuzz target: request decoding + validation of every RPC. The first byte picks the RPC, the rest
// is parsed as its protobuf message (what the gRPC edge receives) and validated. A request that
// validates must satisfy what the executor relies on: every tensor pointer inside its payload,
// layer ranges and tree sizes inside the limits, parents a valid tree, no value beyond 2^16.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "google/protobuf/stubs/logging.h"
#include "service/request_validation.h"
#include "verify/mla_dims.h"
#include "verify/tree_mask.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

void Require(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "request_fuzz: a validated request breaks: %s\n", what);
  std::abort();
}

constexpr ValidationLimits kLimits{/*layers=*/3, /*heads=*/2, /*max_tree_nodes=*/16,
                                   /*default_scale=*/0.0625f, /*max_message_bytes=*/1 << 20};

bool Inside(const void* p, int64_t bytes, const std::string& payload) {
  const char* c = static_cast<const char*>(p);
  return c >= payload.data() && bytes >= 0 &&
         c + bytes <= payload.data() + static_cast<int64_t>(payload.size());
}

void CheckAppend(const v1::AppendRequest& r) {
  absl::StatusOr<AppendCall> call = ValidateAppend(r, kLimits);
  if (!call.ok()) {
    Require(!call.status().message().empty(), "an Append error without a message");
    return;
  }
  Require(call->layer_begin >= 0 && call->layer_count >= 1 &&
              call->layer_begin + call->layer_count <= kLimits.layers,
          "Append layer range");
  Require(call->num_tokens >= 1, "Append T >= 1");
  const int64_t n = int64_t{call->layer_count} * call->num_tokens * kKvDim;
  // The limits' store is bf16: fp8 rows are refused at the edge (ValidationLimits::kv_dtype).
  Require(call->kv_dtype == KvDtype::kBf16, "Append kv bf16 on a bf16 store");
  const auto* kv = static_cast<const bf16_bits*>(call->kv);
  Require(Inside(kv, n * 2, r.kv().inline_data()), "Append kv inside the payload");
  Require(FirstOutOfBound(kv, n) == -1, "Append kv within 2^16");
  Require((call->expect.kind == AppendExpectation::Kind::kAny) ==
              (r.expected_position_case() == v1::AppendRequest::EXPECTED_POSITION_NOT_SET),
          "Append expected_position decoded");
}

void CheckVerify(const v1::VerifyRequest& r) {
  absl::StatusOr<VerifyCall> call = ValidateVerify(r, kLimits);
  if (!call.ok()) {
    Require(!call.status().message().empty(), "a Verify error without a message");
    return;
  }
  Require(call->layer >= 0 && call->layer < kLimits.layers, "Verify layer");
  Require(call->num_heads == kLimits.heads, "Verify heads");
  Require(std::isfinite(call->scale) && call->scale > 0, "Verify scale");
  Require(call->qo_indptr.size() == call->items.size() + 1 && call->qo_indptr[0] == 0,
          "Verify qo_indptr");
  for (size_t b = 0; b < call->items.size(); ++b) {
    const auto& parents = call->items[b].parents;
    Require(call->qo_indptr[b + 1] - call->qo_indptr[b] == static_cast<int32_t>(parents.size()),
            "Verify qo_indptr matches parents");
    Require(TreeMask::FromParents(parents, kLimits.max_tree_nodes).ok(), "Verify parents");
  }
  Require(call->qo_indptr.back() == call->total_q, "Verify total_q");
  const int64_t q = int64_t{call->total_q} * call->num_heads * kKvDim;
  const int64_t kv = int64_t{call->total_q} * kKvDim;
  Require(Inside(call->q, q * 2, r.q().inline_data()), "Verify q inside the payload");
  Require(Inside(call->tree_kv, kv * 2, r.tree_kv().inline_data()), "Verify tree_kv inside");
  Require(FirstOutOfBound(call->q, q) == -1, "Verify q within 2^16");
  Require(FirstOutOfBound(call->tree_kv, kv) == -1, "Verify tree_kv within 2^16");
  Require(call->out_destination == nullptr && call->lse_destination == nullptr,
          "no shared memory without a registry");
}

}  // namespace
}  // namespace verifyd

// Protobuf logs every string field that is not UTF-8 while parsing; the fuzzer makes millions.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace verifyd;
  if (size < 1) return 0;
  const uint8_t rpc = data[0];
  ++data;
  --size;
  switch (rpc % 7) {
    case 0: {
      v1::AppendRequest r;
      if (r.ParseFromArray(data, static_cast<int>(size))) CheckAppend(r);
      break;
    }
    case 1: {
      v1::VerifyRequest r;
      if (r.ParseFromArray(data, static_cast<int>(size))) CheckVerify(r);
      break;
    }
    case 2: {
      v1::CommitRequest r;
      if (!r.ParseFromArray(data, static_cast<int>(size))) break;
      absl::StatusOr<CommitCall> call = ValidateCommit(r, kLimits);
      if (call.ok()) {
        Require(call->path.accepted_path.size() == r.commit().commit_length(), "Commit length");
        for (int32_t node : call->path.accepted_path) {
          Require(node >= 0 && node < kLimits.max_tree_nodes, "Commit node range");
        }
      }
      break;
    }
    case 3: {
      v1::ReleaseRequest r;
      if (r.ParseFromArray(data, static_cast<int>(size))) (void)ValidateRelease(r);
      break;
    }
    case 4: {
      v1::CompactRequest r;
      if (!r.ParseFromArray(data, static_cast<int>(size))) break;
      absl::StatusOr<CompactCall> call = ValidateCompact(r);
      if (call.ok()) Require(call->budget_bytes >= 0, "Compact budget");
      break;
    }
    case 6: {
      v1::ListSequencesRequest r;
      if (!r.ParseFromArray(data, static_cast<int>(size))) break;
      absl::StatusOr<ListSequencesCall> call = ValidateListSequences(r, kLimits);
      Require(call.ok(), "ListSequences takes every request");
      Require(call->limit >= 1 && call->limit <= MaxListedSequences(kLimits),
              "ListSequences limit");
      Require(call->after.has_value() == r.has_after_sequence_id(), "ListSequences cursor");
      break;
    }
    default: {
      v1::GetCompactionRequest r;
      if (!r.ParseFromArray(data, static_cast<int>(size))) break;
      absl::StatusOr<GetCompactionCall> call = ValidateGetCompaction(r);
      if (call.ok()) {
        Require(!call->operation_id.empty() && call->operation_id.size() <= 64, "operation id");
      }
      break;
    }
  }
  return 0;
}
