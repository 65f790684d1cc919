#include "service/request_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "verify/kv_fp8_layout.h"
#include "verify/mla_dims.h"
#include "verify/value_bound.h"

namespace verifyd {
namespace {

using v1::Tensor;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// The enum's name, or its number when the sender used a value this build does not know (the
// generated DType_Name returns "" then, which made a message that named nothing).
std::string DTypeName(int dtype) {
  const std::string& name = v1::DType_Name(static_cast<v1::DType>(dtype));
  return name.empty() ? absl::StrCat(dtype, " (unknown)") : name;
}

// dtype and rank; dimension values and the payload are checked by the caller.
absl::Status CheckTensorForm(const Tensor& t, const std::string& field, int rank,
                             const char* layout) {
  if (t.dtype() != v1::DTYPE_BF16) {
    return Invalid(absl::StrCat(field, ".dtype = ", DTypeName(t.dtype()), " must be DTYPE_BF16"));
  }
  if (t.shape_size() != rank) {
    return Invalid(
        absl::StrCat(field, ".shape has ", t.shape_size(), " dims, must have ", rank, " ", layout));
  }
  return absl::OkStatus();
}

absl::Status CheckDimEquals(const Tensor& t, const std::string& field, int dim, int64_t expected,
                            const std::string& bound) {
  if (t.shape(dim) != expected) {
    return Invalid(absl::StrCat(field, ".shape[", dim, "] = ", t.shape(dim), " must equal ", bound,
                                " = ", expected));
  }
  return absl::OkStatus();
}

absl::Status CheckDimRange(const Tensor& t, const std::string& field, int dim, int64_t lo,
                           int64_t hi, const std::string& hi_name) {
  if (t.shape(dim) < lo || t.shape(dim) > hi) {
    return Invalid(absl::StrCat(field, ".shape[", dim, "] = ", t.shape(dim), " must be in [", lo,
                                ", ", hi_name, " = ", hi, "]"));
  }
  return absl::OkStatus();
}

std::string ShapeText(const std::vector<int64_t>& shape, const char* dtype) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&text, i ? ", " : "", shape[i]);
  return absl::StrCat(text, "] ", dtype);
}

// One shared-memory range a call uses; outputs must not overlap anything else of the call.
struct UsedRange {
  const MappedSharedMemory* region;
  uint64_t offset;
  uint64_t length;
  std::string field;
};

// Resolves the shared-memory ranges of one request, pinning each region it finds.
class SharedMemoryResolver {
 public:
  SharedMemoryResolver(SharedMemoryRegistry* regions, RegionPins* pins)
      : regions_(regions), pins_(pins) {}

  // `field` is the ref's own name ("q.shared_memory", "out_shared_memory"); `shape` and `dtype`
  // say what it must hold, `element_bytes` per element.
  absl::StatusOr<uint8_t*> Resolve(const v1::SharedMemoryRef& ref, const std::string& field,
                                   const std::vector<int64_t>& shape, const char* dtype,
                                   int64_t element_bytes) {
    if (regions_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(field, ": shared memory is not available here; send inline_data"));
    }
    VERIFYD_ASSIGN_OR_RETURN(std::shared_ptr<MappedSharedMemory> region,
                             regions_->Find(ref.region(), absl::StrCat(field, ".region")));
    if (ref.offset() % 64 != 0) {
      return Invalid(absl::StrCat(field, ".offset = ", ref.offset(), " must be a multiple of 64"));
    }
    if (ref.offset() > region->bytes() || ref.length() > region->bytes() - ref.offset()) {
      return Invalid(absl::StrCat(field, ".offset = ", ref.offset(), " + ", field,
                                  ".length = ", ref.length(), " must be <= the ", region->bytes(),
                                  " bytes of region '", ref.region(), "'"));
    }
    int64_t expected = element_bytes;
    for (int64_t d : shape) expected *= d;  // dimensions are bounded: no overflow
    if (ref.length() != static_cast<uint64_t>(expected)) {
      return Invalid(absl::StrCat(field, ".length = ", ref.length(), " must equal ", expected,
                                  " (shape ", ShapeText(shape, dtype), ")"));
    }
    ranges_.push_back(UsedRange{region.get(), ref.offset(), ref.length(), field});
    uint8_t* data = region->data() + ref.offset();
    if (pins_ != nullptr) pins_->push_back(std::move(region));
    return data;
  }

  // The output ranges (resolved after every input) against every other range of the call.
  absl::Status CheckOutputsDisjoint(size_t first_output) const {
    for (size_t o = first_output; o < ranges_.size(); ++o) {
      for (size_t k = 0; k < ranges_.size(); ++k) {
        if (k == o) continue;
        const UsedRange& a = ranges_[o];
        const UsedRange& b = ranges_[k];
        if (a.region == b.region && a.offset < b.offset + b.length &&
            b.offset < a.offset + a.length) {
          return Invalid(absl::StrCat(a.field, " [", a.offset, ", ", a.offset + a.length,
                                      ") overlaps ", b.field, " [", b.offset, ", ",
                                      b.offset + b.length, ") in region '", a.region->region(),
                                      "'; an output may not overlap another output or an input"));
        }
      }
    }
    return absl::OkStatus();
  }

  size_t ranges() const { return ranges_.size(); }

 private:
  SharedMemoryRegistry* regions_;
  RegionPins* pins_;
  std::vector<UsedRange> ranges_;
};

// The payload (bf16, or the fp8 layout's bytes: `element_bytes` 1, `dtype` "fp8 bytes"), inline
// or in shared memory. Dimensions are already bounded, so the product cannot overflow.
absl::StatusOr<const uint8_t*> CheckBytes(const Tensor& t, const std::string& field,
                                          SharedMemoryResolver& shm, const ExternalAccess* external,
                                          int64_t element_bytes, const char* dtype) {
  if (t.data_case() == Tensor::kExternalMemory) {
    if (external == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(field,
                       ".external_memory: external memory reaches Verify through a channel "
                       "(OpenChannel); send inline_data or shared_memory"));
    }
    int64_t bytes = element_bytes;
    for (int64_t d : t.shape()) bytes *= d;  // dimensions are bounded: no overflow
    VERIFYD_ASSIGN_OR_RETURN(
        uint8_t * data,
        external->table->Resolve(external->owner, t.external_memory().region(),
                                 t.external_memory().offset(), static_cast<uint64_t>(bytes), 64,
                                 absl::StrCat(field, ".external_memory"), external->pins));
    return data;
  }
  if (t.data_case() == Tensor::kSharedMemory) {
    VERIFYD_ASSIGN_OR_RETURN(
        uint8_t * data, shm.Resolve(t.shared_memory(), absl::StrCat(field, ".shared_memory"),
                                    std::vector<int64_t>(t.shape().begin(), t.shape().end()), dtype,
                                    element_bytes));
    return data;
  }
  int64_t elements = 1;
  for (int64_t d : t.shape()) elements *= d;
  const int64_t expected = elements * element_bytes;
  const int64_t got = static_cast<int64_t>(t.inline_data().size());
  if (got != expected) {
    return Invalid(absl::StrCat(field, ".inline_data has ", got, " bytes, must be ", expected,
                                " (shape product x ", element_bytes, " bytes of ", dtype, ")"));
  }
  return reinterpret_cast<const uint8_t*>(t.inline_data().data());
}

absl::StatusOr<const bf16_bits*> CheckPayload(const Tensor& t, const std::string& field,
                                              SharedMemoryResolver& shm,
                                              const ExternalAccess* external = nullptr) {
  VERIFYD_ASSIGN_OR_RETURN(const uint8_t* data, CheckBytes(t, field, shm, external, 2, "bf16"));
  return reinterpret_cast<const bf16_bits*>(data);
}

// SPEC §1: no value outside [-2^16, 2^16] (so no NaN, no Inf) enters the store or a computation.
// One vectorized pass over the payload, before any state is touched (verify/value_bound.h).
absl::Status CheckValues(const Tensor& t, const std::string& field, const bf16_bits* data) {
  return CheckValueBound(data, absl::MakeConstSpan(t.shape().data(), t.shape_size()), field);
}

CommitSpecView CommitView(const v1::CommitSpec& spec) {
  return CommitSpecView{spec.commit_length(), absl::MakeConstSpan(spec.accepted_path().data(),
                                                                  spec.accepted_path_size())};
}

}  // namespace

ValidationLimits LimitsFromOptions(const ServiceOptions& options) {
  return ValidationLimits{options.layers,
                          options.heads,
                          options.max_tree_nodes,
                          options.softmax_scale,
                          options.max_message_bytes,
                          options.kv_dtype};
}

KvFieldNames RequestFieldNames() {
  KvFieldNames names;
  names.sequence = "sequence_id";
  names.num_tokens = "kv.shape[1]";  // AppendRequest.kv is [layer_count][T][576]
  names.items = "sequences";
  names.item_sequence = "sequence_id";
  names.item_commit = "commit_previous";
  names.fork_source = "source_sequence_id";
  names.fork_sequence = "new_sequence_id";
  names.max_sequences = "--max-sequences";
  names.max_slot_table_entries = "--max-slot-table-entries";
  return names;
}

absl::StatusOr<AppendCall> ValidateAppend(const v1::AppendRequest& request,
                                          const ValidationLimits& limits,
                                          SharedMemoryRegistry* regions, RegionPins* pins,
                                          const ExternalAccess* external) {
  if (request.layer_begin() >= static_cast<uint32_t>(limits.layers)) {
    return Invalid(absl::StrCat("layer_begin = ", request.layer_begin(),
                                " must be < --layers = ", limits.layers));
  }
  if (!request.has_kv()) return Invalid("kv is missing");
  const Tensor& kv = request.kv();
  const bool fp8 = kv.dtype() == v1::DTYPE_FP8_MLA;
  if (fp8 && limits.kv_dtype != KvDtype::kFp8) {
    // Not dequantized into bf16: e4m3 x a float32 scale is not a bf16 value in general, so the
    // rows would not be stored as sent (plans/0030-fp8-store.md).
    return Invalid(absl::StrCat(
        "kv.dtype = DTYPE_FP8_MLA (rows in the 656-byte fp8 layout) but this daemon stores ",
        KvDtypeName(limits.kv_dtype), " rows (--kv_dtype=", KvDtypeName(limits.kv_dtype),
        "): send DTYPE_BF16 [layer_count, T, 576]; fp8 values times their scales are not bf16 "
        "values, so they would not be stored as sent"));
  }
  if (fp8) {
    if (kv.shape_size() != 3) {
      return Invalid(absl::StrCat("kv.shape has ", kv.shape_size(),
                                  " dims, must have 3 [layer_count, T, 656 bytes]"));
    }
  } else {
    VERIFYD_RETURN_IF_ERROR(CheckTensorForm(kv, "kv", 3, "[layer_count, T, 576]"));
  }
  const int64_t max_count = limits.layers - static_cast<int64_t>(request.layer_begin());
  VERIFYD_RETURN_IF_ERROR(CheckDimRange(kv, "kv", 0, 1, max_count, "--layers - layer_begin"));
  VERIFYD_RETURN_IF_ERROR(
      CheckDimRange(kv, "kv", 1, 1, std::numeric_limits<int32_t>::max(), "int32 max"));
  AppendCall call;
  SharedMemoryResolver shm(regions, pins);
  if (fp8) {
    VERIFYD_RETURN_IF_ERROR(
        CheckDimEquals(kv, "kv", 2, kFp8RowBytes, "the fp8 row's bytes (DTYPE_FP8_MLA)"));
    VERIFYD_ASSIGN_OR_RETURN(call.kv, CheckBytes(kv, "kv", shm, external, 1, "fp8 bytes"));
    call.kv_dtype = KvDtype::kFp8;
  } else {
    VERIFYD_RETURN_IF_ERROR(CheckDimEquals(kv, "kv", 2, kKvDim, "the KV row width"));
    VERIFYD_ASSIGN_OR_RETURN(call.kv, CheckPayload(kv, "kv", shm, external));
  }
  // Where the rows lie decides where the store checks them (SPEC §1), for either dtype (fp8 rows:
  // verify/kv_fp8_check.h).
  if (kv.data_case() == Tensor::kExternalMemory && !external->table->host_memory()) {
    // Device memory: the storage checks the values where they are (KvStorage::WriteDeviceRows,
    // WriteEncodedDeviceRows).
    call.kv_memory = RowMemory::kDevice;
  } else if (kv.data_case() != Tensor::kInlineData) {
    // Memory the client can rewrite until the executor is done with it: the store checks the copy
    // it makes, not these bytes now (issue 33 N8).
    call.kv_memory = RowMemory::kShared;
  } else if (!fp8) {
    VERIFYD_RETURN_IF_ERROR(CheckValues(kv, "kv", static_cast<const bf16_bits*>(call.kv)));
  }
  // Inline fp8 rows: the store checks every row before it keeps any (KvStore::Append).
  switch (request.expected_position_case()) {
    case v1::AppendRequest::kCreate:
      if (!request.create()) {
        return Invalid(
            "create = false: set create = true for a new sequence, expected_fill for an existing "
            "one, or neither for no check");
      }
      call.expect = AppendExpectation::Create();
      break;
    case v1::AppendRequest::kExpectedFill:
      if (request.expected_fill() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
        return Invalid(
            absl::StrCat("expected_fill = ", request.expected_fill(),
                         " must be <= int32 max = ", std::numeric_limits<int32_t>::max()));
      }
      call.expect = AppendExpectation::Fill(static_cast<int64_t>(request.expected_fill()));
      break;
    case v1::AppendRequest::EXPECTED_POSITION_NOT_SET:
      break;
  }
  call.sequence = request.sequence_id();
  call.layer_begin = static_cast<int>(request.layer_begin());
  call.layer_count = static_cast<int>(kv.shape(0));
  call.num_tokens = static_cast<int>(kv.shape(1));
  return call;
}

absl::StatusOr<VerifyCall> ValidateVerify(const v1::VerifyRequest& request,
                                          const ValidationLimits& limits,
                                          SharedMemoryRegistry* regions, RegionPins* pins) {
  // The header's rules are the channel's too (executor/verify_validation.h).
  VerifyHeaderView view;
  view.layer = request.layer();
  view.return_lse = request.return_lse();
  if (request.has_softmax_scale()) view.softmax_scale = request.softmax_scale();
  view.sequences.reserve(request.sequences_size());
  for (const v1::VerifySequence& seq : request.sequences()) {
    VerifySequenceView& v = view.sequences.emplace_back();
    v.sequence_id = seq.sequence_id();
    v.parents = absl::MakeConstSpan(seq.parents().data(), seq.parents_size());
    if (seq.has_commit_previous()) v.commit_previous = CommitView(seq.commit_previous());
  }
  VERIFYD_ASSIGN_OR_RETURN(VerifyCall call, ValidateVerifyHeader(view, limits));
  const int64_t total_q = call.total_q;
  const std::string sum_q = "the total number of parents over sequences";

  if (!request.has_q()) return Invalid("q is missing");
  VERIFYD_RETURN_IF_ERROR(CheckTensorForm(request.q(), "q", 3, "[sum Q, H, 576]"));
  VERIFYD_RETURN_IF_ERROR(CheckDimEquals(request.q(), "q", 0, total_q, sum_q));
  VERIFYD_RETURN_IF_ERROR(CheckDimEquals(request.q(), "q", 1, limits.heads, "--heads"));
  VERIFYD_RETURN_IF_ERROR(CheckDimEquals(request.q(), "q", 2, kKvDim, "the KV row width"));
  SharedMemoryResolver shm(regions, pins);
  VERIFYD_ASSIGN_OR_RETURN(call.q, CheckPayload(request.q(), "q", shm));
  // Bytes in shared memory are checked on the executor's private copy instead (issue 33 N8).
  call.inputs_shared = request.q().has_shared_memory() || request.tree_kv().has_shared_memory();
  if (!request.q().has_shared_memory()) {
    VERIFYD_RETURN_IF_ERROR(CheckValues(request.q(), "q", call.q));
  }

  if (!request.has_tree_kv()) return Invalid("tree_kv is missing");
  VERIFYD_RETURN_IF_ERROR(CheckTensorForm(request.tree_kv(), "tree_kv", 2, "[sum Q, 576]"));
  VERIFYD_RETURN_IF_ERROR(CheckDimEquals(request.tree_kv(), "tree_kv", 0, total_q, sum_q));
  VERIFYD_RETURN_IF_ERROR(
      CheckDimEquals(request.tree_kv(), "tree_kv", 1, kKvDim, "the KV row width"));
  VERIFYD_ASSIGN_OR_RETURN(call.tree_kv, CheckPayload(request.tree_kv(), "tree_kv", shm));
  if (!request.tree_kv().has_shared_memory()) {
    VERIFYD_RETURN_IF_ERROR(CheckValues(request.tree_kv(), "tree_kv", call.tree_kv));
  }

  const size_t first_output = shm.ranges();
  if (request.has_out_shared_memory()) {
    VERIFYD_ASSIGN_OR_RETURN(uint8_t * out,
                             shm.Resolve(request.out_shared_memory(), "out_shared_memory",
                                         {total_q, limits.heads, kVDim}, "bf16", 2));
    call.out_destination = reinterpret_cast<bf16_bits*>(out);
  }
  if (request.has_lse_shared_memory()) {
    if (!call.return_lse) {
      return Invalid("lse_shared_memory is set but return_lse is false; set both or neither");
    }
    VERIFYD_ASSIGN_OR_RETURN(uint8_t * lse,
                             shm.Resolve(request.lse_shared_memory(), "lse_shared_memory",
                                         {total_q, limits.heads}, "fp32", 4));
    call.lse_destination = reinterpret_cast<float*>(lse);
  }
  VERIFYD_RETURN_IF_ERROR(shm.CheckOutputsDisjoint(first_output));

  // The answer must fit the same message limit as the request; 4 KiB covers framing and the
  // per-sequence committed lengths of any batch that fits the request. Outputs in shared memory
  // add nothing.
  const int64_t rows = total_q * limits.heads;
  const int64_t inline_out = call.out_destination == nullptr ? rows * kVDim * 2 : 0;
  const int64_t inline_lse = call.return_lse && call.lse_destination == nullptr ? rows * 4 : 0;
  const int64_t response_bytes =
      inline_out + inline_lse + 4096 + int64_t{10} * request.sequences_size();
  if (response_bytes > limits.max_message_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response (out [", total_q, ", ", limits.heads, ", 512] bf16",
        call.return_lse ? " + lse" : "", ") needs ", response_bytes,
        " bytes, more than --max-message-bytes = ", limits.max_message_bytes, "; split the batch"));
  }
  return call;
}

absl::StatusOr<CommitCall> ValidateCommit(const v1::CommitRequest& request,
                                          const ValidationLimits& limits) {
  if (!request.has_commit()) {
    return Invalid(
        "commit is missing (commit_length = 0 with an empty accepted_path rejects the tree)");
  }
  CommitCall call;
  call.sequence = request.sequence_id();
  VERIFYD_ASSIGN_OR_RETURN(
      call.path, DecodeCommit(CommitView(request.commit()), "commit", limits.max_tree_nodes));
  return call;
}

absl::StatusOr<ReleaseCall> ValidateRelease(const v1::ReleaseRequest& request) {
  return ReleaseCall{request.sequence_id()};
}

absl::StatusOr<ForkCall> ValidateFork(const v1::ForkRequest& request) {
  if (request.new_sequence_id() == request.source_sequence_id()) {
    return Invalid(absl::StrCat("new_sequence_id = ", request.new_sequence_id(),
                                " must differ from source_sequence_id"));
  }
  // Positions index int32 slot tables; the store checks the source's committed length.
  constexpr uint64_t kMaxLength = (uint64_t{1} << 31) - 1;
  if (request.length() < 1 || request.length() > kMaxLength) {
    return Invalid(absl::StrCat("length = ", request.length(), " must be in [1, ", kMaxLength,
                                "] (and <= the source's committed length)"));
  }
  return ForkCall{request.source_sequence_id(), request.new_sequence_id(),
                  static_cast<int64_t>(request.length())};
}

int64_t MaxListedSequences(const ValidationLimits& limits) {
  // The response's own fields (truncated, total_sequences) take at most 13 bytes; 64 is kept.
  return std::max<int64_t>(1, (limits.max_message_bytes - 64) / kMaxSequenceInfoBytes);
}

absl::StatusOr<ListSequencesCall> ValidateListSequences(const v1::ListSequencesRequest& request,
                                                        const ValidationLimits& limits) {
  // A page larger than the message allows is not the caller's error (it cannot know our
  // --max-message-bytes): it gets a shorter page and truncated, and asks for the next.
  constexpr int64_t kDefaultLimit = 1000;
  const int64_t asked = request.limit() == 0 ? kDefaultLimit : int64_t{request.limit()};
  ListSequencesCall call;
  if (request.has_after_sequence_id()) call.after = request.after_sequence_id();
  call.limit = std::min(asked, MaxListedSequences(limits));
  return call;
}

absl::StatusOr<CompactCall> ValidateCompact(const v1::CompactRequest& request) {
  if (request.budget_bytes() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Invalid(absl::StrCat("budget_bytes = ", request.budget_bytes(),
                                " must be <= int64 max (0 means until converged)"));
  }
  return CompactCall{static_cast<int64_t>(request.budget_bytes())};
}

absl::StatusOr<GetCompactionCall> ValidateGetCompaction(const v1::GetCompactionRequest& request) {
  if (request.operation_id().empty()) return Invalid("operation_id must not be empty");
  if (request.operation_id().size() > 64) {
    return Invalid(absl::StrCat("operation_id has ", request.operation_id().size(),
                                " characters, must be <= 64"));
  }
  return GetCompactionCall{request.operation_id()};
}

CaptureSpec DecodeCapture(const v1::PrepareCaptureRequest& request) {
  auto tensor = [](const v1::ExternalMemoryRef& r) {
    return channel::TensorRef{r.region(), r.offset()};
  };
  auto flag = [](const v1::ExternalMemoryRef& r) {
    return channel::FlagRef{r.region(), r.offset(), 0, 0};
  };
  CaptureSpec spec;
  spec.layer_begin = request.layer_begin();
  spec.num_layers = request.num_layers();
  spec.max_batch = request.max_batch();
  spec.max_q = request.max_q();
  spec.q = tensor(request.q());
  spec.tree_kv = tensor(request.tree_kv());
  spec.out = tensor(request.out());
  spec.lse = tensor(request.lse());
  spec.ready = flag(request.ready());
  spec.done = flag(request.done());
  spec.return_lse = request.return_lse();
  if (request.has_softmax_scale()) spec.softmax_scale = request.softmax_scale();
  return spec;
}

}  // namespace verifyd
