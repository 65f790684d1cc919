#include "client/client.h"

#include <algorithm>
#include <future>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/random.h"
#include "client/append_chunking.h"
#include "client/health_codec.h"
#include "client/tensor.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"

namespace verifyd {
namespace {

constexpr char kAdminTokenKey[] = "x-verifyd-admin-token";
constexpr char kClientKey[] = "x-verifyd-client";

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

// gRPC and Abseil share the canonical code numbering, so the code carries over unchanged.
absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

std::string SliceBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

const char* HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        ClientOptions options) {
  if (target.empty()) return absl::InvalidArgumentError("target must not be empty");
  if (options.max_message_bytes < 4096 ||
      options.max_message_bytes > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes = ", options.max_message_bytes, " must be in [4096, ",
                     std::numeric_limits<int32_t>::max(), "]"));
  }
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  return FromChannel(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args),
                     std::move(options));
}

absl::StatusOr<std::unique_ptr<Client>> Client::FromChannel(std::shared_ptr<grpc::Channel> channel,
                                                            ClientOptions options) {
  if (channel == nullptr) return absl::InvalidArgumentError("channel must not be null");
  if (options.default_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "default_deadline = ", absl::FormatDuration(options.default_deadline), " must be > 0"));
  }
  if (options.retries < 0 || options.retries > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("retries = ", options.retries, " must be in [0, 100]"));
  }
  if (options.max_message_bytes <= kAppendEnvelopeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes = ", options.max_message_bytes, " must be > ", kAppendEnvelopeBytes));
  }
  return std::unique_ptr<Client>(new Client(std::move(channel), std::move(options)));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Verifyd::NewStub(channel_)) {
  // 128 random bits: a client id no other process picks by accident.
  if (options_.client_id.empty()) options_.client_id = RandomHex();
}

Client::~Client() = default;

absl::Status Client::Call(const char* method, bool idempotent, const CallOptions& call,
                          const std::function<absl::Status(grpc::ClientContext&)>& attempt) {
  const absl::Time deadline = absl::Now() + call.deadline.value_or(options_.default_deadline);
  absl::Duration backoff = options_.retry_backoff;
  const int attempts = idempotent ? 1 + options_.retries : 1;
  absl::Status status;
  for (int a = 0; a < attempts; ++a) {
    if (a > 0) {
      // A retry that cannot finish before the deadline is not worth starting.
      if (absl::Now() + backoff >= deadline) break;
      absl::SleepFor(backoff);
      backoff *= 2;
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.AddMetadata(kClientKey, options_.client_id);
    // Over TCP the daemon gates every call that changes state on the token (plans/0015).
    if (!options_.admin_token.empty()) context.AddMetadata(kAdminTokenKey, options_.admin_token);
    status = attempt(context);
    if (status.code() != absl::StatusCode::kUnavailable) break;
  }
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(method, ": ", status.message()));
}

template <typename Request, typename Response>
absl::StatusOr<Response> Client::Unary(const char* method, bool idempotent, const CallOptions& call,
                                       grpc::Status (v1::Verifyd::Stub::*rpc)(grpc::ClientContext*,
                                                                              const Request&,
                                                                              Response*),
                                       const Request& request) {
  Response response;
  absl::Status status = Call(method, idempotent, call, [&](grpc::ClientContext& context) {
    return FromGrpc((stub_.get()->*rpc)(&context, request, &response));
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::AppendResponse> Client::Append(const v1::AppendRequest& request,
                                                  const CallOptions& call) {
  auto chunks = SplitAppend(request, options_.max_message_bytes);
  if (!chunks.ok()) {
    return absl::Status(chunks.status().code(),
                        absl::StrCat("Append: ", chunks.status().message()));
  }
  v1::AppendResponse response;
  int64_t tokens_done = 0;
  for (size_t i = 0; i < chunks->size(); ++i) {
    v1::AppendRequest& chunk = (*chunks)[i];
    // A request that did not say where it writes still gets every later chunk checked against
    // the fill the previous chunk left (when the range's layers agree), so an expiry or a Release
    // between chunks is FAILED_PRECONDITION, never a silent re-creation (SPEC §2).
    if (i > 0 && chunk.expected_position_case() == v1::AppendRequest::EXPECTED_POSITION_NOT_SET) {
      const int64_t begin = chunk.layer_begin();
      const int64_t end = begin + chunk.kv().shape(0);
      if (end <= response.layer_fill_size()) {
        bool equal = true;
        for (int64_t l = begin + 1; l < end; ++l) {
          equal = equal && response.layer_fill(static_cast<int>(l)) ==
                               response.layer_fill(static_cast<int>(begin));
        }
        if (equal) chunk.set_expected_fill(response.layer_fill(static_cast<int>(begin)));
      }
    }
    absl::Status status = Call("Append", false, call, [&](grpc::ClientContext& context) {
      return FromGrpc(stub_->Append(&context, chunk, &response));
    });
    if (!status.ok()) {
      if (chunks->size() == 1) return status;
      return absl::Status(status.code(),
                          absl::StrCat(status.message(), " (chunk ", i + 1, " of ", chunks->size(),
                                       "; the first ", tokens_done, " tokens stay appended)"));
    }
    tokens_done += chunk.kv().shape_size() > 1 ? chunk.kv().shape(1) : 0;
  }
  return response;
}

absl::StatusOr<v1::AppendResponse> Client::AppendKv(uint64_t sequence_id, uint32_t layer_begin,
                                                    int64_t layer_count, int64_t tokens,
                                                    absl::Span<const uint16_t> kv,
                                                    AppendPosition at, const CallOptions& call) {
  v1::AppendRequest request;
  request.set_sequence_id(sequence_id);
  request.set_layer_begin(layer_begin);
  SetExpectedPosition(at, &request);
  const int64_t shape[] = {layer_count, tokens, 576};
  auto tensor = tensor::MakeBf16(shape, kv);
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat("Append: kv ", tensor.status().message()));
  }
  *request.mutable_kv() = std::move(*tensor);
  return Append(request, call);
}

absl::StatusOr<v1::AppendResponse> Client::AppendKvFp8(uint64_t sequence_id, uint32_t layer_begin,
                                                       int64_t layer_count, int64_t tokens,
                                                       absl::Span<const uint8_t> rows,
                                                       AppendPosition at, const CallOptions& call) {
  constexpr int64_t kRowBytes = 656;
  if (layer_count < 1 || tokens < 1 ||
      static_cast<int64_t>(rows.size()) != layer_count * tokens * kRowBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AppendKvFp8: rows has ", rows.size(), " bytes, must be layer_count x tokens x 656 = ",
        layer_count, " x ", tokens, " x 656 (layer_count, tokens >= 1)"));
  }
  v1::AppendRequest request;
  request.set_sequence_id(sequence_id);
  request.set_layer_begin(layer_begin);
  SetExpectedPosition(at, &request);
  v1::Tensor* kv = request.mutable_kv();
  kv->set_dtype(v1::DTYPE_FP8_MLA);
  for (int64_t d : {layer_count, tokens, kRowBytes}) kv->add_shape(d);
  kv->set_inline_data(rows.data(), rows.size());
  return Append(request, call);
}

absl::StatusOr<v1::AppendResponse> Client::AppendKvRegistered(
    uint64_t sequence_id, uint32_t layer_begin, int64_t layer_count, int64_t tokens,
    v1::DType dtype, uint64_t region, uint64_t offset, AppendPosition at, const CallOptions& call) {
  int64_t row = 0;
  if (dtype == v1::DTYPE_BF16) row = 576;
  if (dtype == v1::DTYPE_FP8_MLA) row = 656;
  if (row == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AppendKvRegistered: dtype = ", v1::DType_Name(dtype),
                     " must be DTYPE_BF16 (576 values a row) or DTYPE_FP8_MLA (656 bytes a row)"));
  }
  if (layer_count < 1 || tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("AppendKvRegistered: layer_count = ", layer_count, " and tokens = ", tokens,
                     " must be >= 1"));
  }
  v1::AppendRequest request;
  request.set_sequence_id(sequence_id);
  request.set_layer_begin(layer_begin);
  SetExpectedPosition(at, &request);
  v1::Tensor* kv = request.mutable_kv();
  kv->set_dtype(dtype);
  for (int64_t d : {layer_count, tokens, row}) kv->add_shape(d);
  kv->mutable_external_memory()->set_region(region);
  kv->mutable_external_memory()->set_offset(offset);
  return Append(request, call);
}

absl::StatusOr<v1::VerifyResponse> Client::Verify(const v1::VerifyRequest& request,
                                                  const CallOptions& call) {
  v1::VerifyResponse response;
  absl::Status status = Call("Verify", false, call, [&](grpc::ClientContext& context) {
    if (!options_.spin_wait) return FromGrpc(stub_->Verify(&context, request, &response));
    // The call on a completion queue of its own, polled with a zero timeout until it finishes:
    // each poll reads whatever the socket holds, so no thread ever sleeps waiting for the reply.
    grpc::CompletionQueue cq;
    grpc::Status rpc;
    auto reader = stub_->AsyncVerify(&context, request, &cq);
    reader->Finish(&response, &rpc, &cq);
    void* tag = nullptr;
    bool ok = false;
    while (cq.AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) !=
           grpc::CompletionQueue::GOT_EVENT) {
    }
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return FromGrpc(rpc);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::CommitResponse> Client::Commit(uint64_t sequence_id,
                                                  absl::Span<const int32_t> accepted_path,
                                                  const CallOptions& call) {
  v1::CommitRequest request;
  request.set_sequence_id(sequence_id);
  request.mutable_commit()->set_commit_length(static_cast<uint32_t>(accepted_path.size()));
  request.mutable_commit()->mutable_accepted_path()->Add(accepted_path.begin(),
                                                         accepted_path.end());
  return Unary("Commit", false, call, &v1::Verifyd::Stub::Commit, request);
}

absl::StatusOr<v1::ReleaseResponse> Client::Release(uint64_t sequence_id, const CallOptions& call) {
  v1::ReleaseRequest request;
  request.set_sequence_id(sequence_id);
  return Unary("Release", false, call, &v1::Verifyd::Stub::Release, request);
}

absl::StatusOr<v1::ForkResponse> Client::Fork(uint64_t source_sequence_id, uint64_t new_sequence_id,
                                              uint64_t length, const CallOptions& call) {
  v1::ForkRequest request;
  request.set_source_sequence_id(source_sequence_id);
  request.set_new_sequence_id(new_sequence_id);
  request.set_length(length);
  v1::ForkResponse response;
  absl::Status status = Call("Fork", false, call, [&](grpc::ClientContext& context) {
    return FromGrpc(stub_->Fork(&context, request, &response));
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::CompactResponse> Client::Compact(uint64_t budget_bytes,
                                                    const CallOptions& call) {
  v1::CompactRequest request;
  request.set_budget_bytes(budget_bytes);
  return Unary("Compact", false, call, &v1::Verifyd::Stub::Compact, request);
}

absl::StatusOr<v1::CompactionStatus> Client::GetCompaction(const std::string& operation_id,
                                                           const CallOptions& call) {
  v1::GetCompactionRequest request;
  request.set_operation_id(operation_id);
  return Unary("GetCompaction", true, call, &v1::Verifyd::Stub::GetCompaction, request);
}

absl::StatusOr<v1::CompactionStatus> Client::WaitCompaction(
    const std::string& operation_id, absl::Duration poll_interval,
    const std::function<void(const v1::CompactionStatus&)>& on_progress, const CallOptions& call) {
  for (;;) {
    auto status = GetCompaction(operation_id, call);
    if (!status.ok()) return status.status();
    if (on_progress) on_progress(*status);
    if (status->state() == v1::CompactionStatus::DONE ||
        status->state() == v1::CompactionStatus::FAILED) {
      return status;
    }
    absl::SleepFor(poll_interval);
  }
}

absl::StatusOr<v1::StatsResponse> Client::Stats(const CallOptions& call) {
  return Unary("Stats", true, call, &v1::Verifyd::Stub::Stats, v1::StatsRequest());
}

absl::StatusOr<v1::ListSequencesResponse> Client::ListSequences(
    std::optional<uint64_t> after_sequence_id, uint32_t limit, const CallOptions& call) {
  v1::ListSequencesRequest request;
  if (after_sequence_id.has_value()) request.set_after_sequence_id(*after_sequence_id);
  request.set_limit(limit);
  return Unary("ListSequences", true, call, &v1::Verifyd::Stub::ListSequences, request);
}

absl::StatusOr<v1::ListSequencesResponse> Client::ListAllSequences(const CallOptions& call) {
  v1::ListSequencesResponse all;
  std::optional<uint64_t> after;
  for (;;) {
    absl::StatusOr<v1::ListSequencesResponse> page = ListSequences(after, 0, call);
    if (!page.ok()) return page.status();
    all.set_total_sequences(page->total_sequences());
    for (v1::SequenceInfo& info : *page->mutable_sequences()) {
      *all.add_sequences() = std::move(info);
    }
    // An empty truncated page cannot happen (the daemon lists at least one); stop rather than
    // ask the same page forever.
    if (!page->truncated() || page->sequences().empty()) return all;
    after = all.sequences(all.sequences_size() - 1).sequence_id();
  }
}

absl::StatusOr<SharedMemoryRegion> Client::CreateSharedMemory(uint64_t bytes,
                                                              const CallOptions& call) {
  v1::CreateSharedMemoryRequest request;
  request.set_bytes(bytes);
  absl::StatusOr<v1::SharedMemoryRegion> created =
      Unary("CreateSharedMemory", false, call, &v1::Verifyd::Stub::CreateSharedMemory, request);
  if (!created.ok()) return created.status();
  const v1::SharedMemoryRegion& info = *created;
  auto region = SharedMemoryRegion::Map(this, info);
  if (!region.ok()) {
    // Nobody else knows the name: drop it now rather than after its lease.
    (void)ReleaseSharedMemory(info.region(), call);
    return absl::Status(region.status().code(),
                        absl::StrCat("CreateSharedMemory: ", region.status().message()));
  }
  return region;
}

absl::StatusOr<v1::ReleaseSharedMemoryResponse> Client::ReleaseSharedMemory(
    const std::string& region, const CallOptions& call) {
  v1::ReleaseSharedMemoryRequest request;
  request.set_region(region);
  return Unary("ReleaseSharedMemory", false, call, &v1::Verifyd::Stub::ReleaseSharedMemory,
               request);
}

absl::StatusOr<HealthStatus> Client::Health(const std::string& service, const CallOptions& call) {
  const std::string request_bytes = EncodeHealthCheckRequest(service);
  int value = 0;
  absl::Status status = Call("Health", true, call, [&](grpc::ClientContext& context) {
    grpc::Slice slice(request_bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    // A blocking call, as the generated stubs make: the caller's thread polls for the reply
    // (a callback would add a hop to a gRPC thread and back; ping timings rely on its absence).
    const grpc::internal::RpcMethod method(kHealthCheckMethod,
                                           grpc::internal::RpcMethod::NORMAL_RPC, channel_);
    absl::Status rpc = FromGrpc(
        grpc::internal::BlockingUnaryCall(channel_.get(), method, &context, request, &response));
    if (!rpc.ok()) return rpc;
    auto decoded = DecodeHealthCheckResponse(SliceBytes(response));
    if (!decoded.ok()) return decoded.status();
    value = *decoded;
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  if (value < 0 || value > 3) return HealthStatus::kUnknown;
  return static_cast<HealthStatus>(value);
}

}  // namespace verifyd
