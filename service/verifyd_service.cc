#include "service/verifyd_service.h"

#include <chrono>
#include <limits>
#include <optional>

#include "google/protobuf/descriptor.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "executor/channel_table.h"
#include "service/grpc_status.h"
#include "service/response_encoding.h"

namespace verifyd {
namespace {

absl::Status NotReady() { return absl::UnavailableError("verifyd is starting; retry"); }

// The client named by metadata "x-verifyd-client".
absl::StatusOr<std::string> ClientOf(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClientMetadata);
  if (it == metadata.end() || it->second.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata \"", kClientMetadata,
                     "\" is missing; external memory and channels belong to a named client"));
  }
  if (it->second.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat("metadata \"", kClientMetadata, "\" has ",
                                                   it->second.size(),
                                                   " characters, must be <= 128"));
  }
  return std::string(it->second.data(), it->second.size());
}

// Equal-time comparison: the token must not leak through response timing.
bool TokenEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

VerifydService::VerifydService(const ServiceOptions& options, ServiceMetrics* metrics,
                               SharedMemoryRegistry* regions)
    : limits_(LimitsFromOptions(options)),
      admin_token_(options.admin_token),
      run_idle_inline_(options.run_idle_inline),
      metrics_(metrics),
      regions_(regions) {
  // Handlers are indexed by the method's position in the service definition.
  verify_method_index_ = google::protobuf::DescriptorPool::generated_pool()
                             ->FindServiceByName("verifyd.v1.Verifyd")
                             ->FindMethodByName("Verify")
                             ->index();
  // What WithCallbackMethod_Verify / WithAsyncMethod_Verify do, chosen at run time.
  if (options.verify_handler == VerifyHandler::kCallback) {
    MarkMethodCallback(
        verify_method_index_,
        new grpc::internal::CallbackUnaryHandler<v1::VerifyRequest, v1::VerifyResponse>(
            [this](grpc::CallbackServerContext* context, const v1::VerifyRequest* request,
                   v1::VerifyResponse* response) {
              return VerifyCallback(context, request, response);
            }));
  } else if (options.verify_handler == VerifyHandler::kPolled) {
    MarkMethodAsync(verify_method_index_);
  }
}

void VerifydService::FinishCall(grpc::ServerUnaryReactor* reactor, const char* method,
                                absl::Time start, const absl::Status& status) {
  const grpc::Status grpc_status = ToGrpcStatus(status);
  metrics_->RecordRpc(method, GrpcCodeName(grpc_status.error_code()), absl::Now() - start);
  reactor->Finish(grpc_status);
}

grpc::ServerUnaryReactor* VerifydService::FinishNow(const char* method,
                                                    grpc::CallbackServerContext* context,
                                                    absl::Time start, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishCall(reactor, method, start, status);
  return reactor;
}

template <typename Op>
grpc::ServerUnaryReactor* VerifydService::Enqueue(const char* method,
                                                  grpc::CallbackServerContext* context,
                                                  absl::Time start, Op op) {
  Device* device = ReadyDevice();
  if (device == nullptr) return FinishNow(method, context, start, NotReady());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto task = [this, method, context, reactor, start,
               op = std::move(op)](DeviceOperations& ops) mutable {
    metrics_->RecordQueue(method, absl::Now() - start);
    // A call cancelled while queued (client gone, deadline passed, drain deadline) is not run,
    // so it changes nothing.
    if (context->IsCancelled()) {
      FinishCall(reactor, method, start, absl::CancelledError("cancelled before it ran"));
      return;
    }
    FinishCall(reactor, method, start, op(ops));
  };
  const absl::Status queued =
      run_idle_inline_ ? device->RunOrSubmit(std::move(task)) : device->Submit(std::move(task));
  if (!queued.ok()) FinishCall(reactor, method, start, queued);
  return reactor;
}

grpc::ServerUnaryReactor* VerifydService::Append(grpc::CallbackServerContext* context,
                                                 const v1::AppendRequest* request,
                                                 v1::AppendResponse* response) {
  const absl::Time start = absl::Now();
  RegionPins pins;
  // KV from a registered external region: the region must be this client's.
  ExternalPins external_pins;
  std::optional<ExternalAccess> external;
  if (request->kv().has_external_memory()) {
    Device* device = ReadyDevice();
    if (device == nullptr) return FinishNow("Append", context, start, NotReady());
    absl::StatusOr<std::string> owner = ClientOf(*context);
    if (!owner.ok()) return FinishNow("Append", context, start, owner.status());
    external = ExternalAccess{&device->external_regions(), *std::move(owner), &external_pins};
  }
  absl::StatusOr<AppendCall> call = ValidateAppend(*request, limits_, regions_, &pins,
                                                   external ? &*external : nullptr);
  if (!call.ok()) return FinishNow("Append", context, start, call.status());
  // The pins ride with the task: the kv pointer stays mapped until the executor is done with it.
  return Enqueue("Append", context, start,
                 [call = *std::move(call), pins = std::move(pins),
                  external_pins = std::move(external_pins), response](DeviceOperations& ops) {
                   return EncodeResult(ops.Append(call), response, EncodeAppend);
                 });
}

namespace {

// Verify's work on the device, shared by the polled and the callback handler.
absl::Status RunVerify(DeviceOperations& ops, const VerifyCall& call,
                       const v1::VerifyRequest& request, v1::VerifyResponse* response) {
  return EncodeResult(ops.Verify(call), response,
                      [&](VerifyResult result, v1::VerifyResponse* encoded) {
                        EncodeVerify(request, call, std::move(result), encoded);
                      });
}

}  // namespace

void VerifydService::RequestPolledVerify(
    grpc::ServerContext* context, v1::VerifyRequest* request,
    grpc::ServerAsyncResponseWriter<v1::VerifyResponse>* responder, grpc::ServerCompletionQueue* cq,
    void* tag) {
  RequestAsyncUnary(verify_method_index_, context, request, responder, cq, cq, tag);
}

void VerifydService::VerifyPolled(grpc::ServerContext* context, const v1::VerifyRequest* request,
                                  v1::VerifyResponse* response,
                                  std::function<void(const grpc::Status&)> finish) {
  const absl::Time start = absl::Now();
  auto done = [this, start, finish = std::move(finish)](const absl::Status& result) {
    const grpc::Status status = ToGrpcStatus(result);
    metrics_->RecordRpc("Verify", GrpcCodeName(status.error_code()), absl::Now() - start);
    finish(status);
  };
  RegionPins pins;
  absl::StatusOr<VerifyCall> call = ValidateVerify(*request, limits_, regions_, &pins);
  if (!call.ok()) return done(call.status());
  Device* device = ReadyDevice();
  if (device == nullptr) return done(NotReady());
  auto task = [this, context, start, call = *std::move(call), pins = std::move(pins), request,
               response, done](DeviceOperations& ops) {
    metrics_->RecordQueue("Verify", absl::Now() - start);
    // The completion-queue API cannot ask whether the client went away before the call ends
    // (IsCancelled needs AsyncNotifyWhenDone's tag first); a call whose deadline passed while
    // it was queued is not run, so it changes nothing.
    if (context->deadline() < std::chrono::system_clock::now()) {
      return done(absl::DeadlineExceededError("the deadline passed before the Verify ran"));
    }
    done(RunVerify(ops, call, *request, response));
  };
  const absl::Status queued =
      run_idle_inline_ ? device->RunOrSubmit(std::move(task)) : device->Submit(std::move(task));
  if (!queued.ok()) done(queued);
}

grpc::ServerUnaryReactor* VerifydService::VerifyCallback(grpc::CallbackServerContext* context,
                                                         const v1::VerifyRequest* request,
                                                         v1::VerifyResponse* response) {
  const absl::Time start = absl::Now();
  RegionPins pins;
  absl::StatusOr<VerifyCall> call = ValidateVerify(*request, limits_, regions_, &pins);
  if (!call.ok()) return FinishNow("Verify", context, start, call.status());
  return Enqueue("Verify", context, start,
                 [call = *std::move(call), pins = std::move(pins), request, response](
                     DeviceOperations& ops) { return RunVerify(ops, call, *request, response); });
}

grpc::ServerUnaryReactor* VerifydService::Commit(grpc::CallbackServerContext* context,
                                                 const v1::CommitRequest* request,
                                                 v1::CommitResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<CommitCall> call = ValidateCommit(*request, limits_);
  if (!call.ok()) return FinishNow("Commit", context, start, call.status());
  return Enqueue("Commit", context, start,
                 [call = *std::move(call), response](DeviceOperations& ops) {
                   return EncodeResult(ops.Commit(call), response, EncodeCommit);
                 });
}

grpc::ServerUnaryReactor* VerifydService::Release(grpc::CallbackServerContext* context,
                                                  const v1::ReleaseRequest* request,
                                                  v1::ReleaseResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<ReleaseCall> call = ValidateRelease(*request);
  if (!call.ok()) return FinishNow("Release", context, start, call.status());
  return Enqueue("Release", context, start,
                 [call = *std::move(call), response](DeviceOperations& ops) {
                   return EncodeResult(ops.Release(call), response, EncodeRelease);
                 });
}

grpc::ServerUnaryReactor* VerifydService::Stats(grpc::CallbackServerContext* context,
                                                const v1::StatsRequest* /*request*/,
                                                v1::StatsResponse* response) {
  const absl::Time start = absl::Now();
  Device* device = ReadyDevice();
  return Enqueue("Stats", context, start, [this, response, device](DeviceOperations& ops) {
    EncodeStats(ops.Stats(), limits_.heads, limits_.default_scale, response);
    // The data plane's tables are the device's, not the store's (plans/0017).
    response->set_external_regions(static_cast<uint32_t>(device->external_regions().regions()));
    response->set_external_region_bytes(device->external_regions().total_bytes());
    response->set_channels(static_cast<uint32_t>(device->channels().channels()));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* VerifydService::CreateSharedMemory(
    grpc::CallbackServerContext* context, const v1::CreateSharedMemoryRequest* request,
    v1::SharedMemoryRegion* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<SharedMemoryInfo> info = regions_->Create(request->bytes());
  if (info.ok()) {
    response->set_region(info->region);
    response->set_path(info->path);
    response->set_bytes(info->bytes);
  }
  return FinishNow("CreateSharedMemory", context, start, info.status());
}

grpc::ServerUnaryReactor* VerifydService::ReleaseSharedMemory(
    grpc::CallbackServerContext* context, const v1::ReleaseSharedMemoryRequest* request,
    v1::ReleaseSharedMemoryResponse* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> bytes = regions_->Release(request->region());
  if (bytes.ok()) response->set_bytes(*bytes);
  return FinishNow("ReleaseSharedMemory", context, start, bytes.status());
}

grpc::ServerUnaryReactor* VerifydService::RegisterExternalMemory(
    grpc::CallbackServerContext* context, const v1::RegisterExternalMemoryRequest* request,
    v1::RegisterExternalMemoryResponse* response) {
  const char* method = "RegisterExternalMemory";
  const absl::Time start = absl::Now();
  Device* device = ReadyDevice();
  if (device == nullptr) return FinishNow(method, context, start, NotReady());
  absl::StatusOr<std::string> owner = ClientOf(*context);
  if (!owner.ok()) return FinishNow(method, context, start, owner.status());
  if (request->device() > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
    return FinishNow(method, context, start,
                     absl::InvalidArgumentError(absl::StrCat(
                         "device = ", request->device(), " must be this daemon's device")));
  }
  ExternalMemoryHandle handle{request->handle(), request->bytes(),
                              static_cast<int>(request->device())};
  absl::StatusOr<uint64_t> region = device->external_regions().Register(*owner, handle);
  if (region.ok()) {
    response->set_region(*region);
    response->set_bytes(request->bytes());
  }
  return FinishNow(method, context, start, region.status());
}

grpc::ServerUnaryReactor* VerifydService::ReleaseExternalMemory(
    grpc::CallbackServerContext* context, const v1::ReleaseExternalMemoryRequest* request,
    v1::ReleaseExternalMemoryResponse* response) {
  const char* method = "ReleaseExternalMemory";
  const absl::Time start = absl::Now();
  Device* device = ReadyDevice();
  if (device == nullptr) return FinishNow(method, context, start, NotReady());
  absl::StatusOr<std::string> owner = ClientOf(*context);
  if (!owner.ok()) return FinishNow(method, context, start, owner.status());
  absl::StatusOr<uint64_t> bytes = device->external_regions().Release(*owner, request->region());
  if (bytes.ok()) response->set_bytes(*bytes);
  return FinishNow(method, context, start, bytes.status());
}

grpc::ServerUnaryReactor* VerifydService::OpenChannel(grpc::CallbackServerContext* context,
                                                      const v1::OpenChannelRequest* request,
                                                      v1::OpenChannelResponse* response) {
  const char* method = "OpenChannel";
  const absl::Time start = absl::Now();
  Device* device = ReadyDevice();
  if (device == nullptr) return FinishNow(method, context, start, NotReady());
  absl::StatusOr<std::string> owner = ClientOf(*context);
  if (!owner.ok()) return FinishNow(method, context, start, owner.status());
  const uint32_t entries = request->entries() == 0 ? 64 : request->entries();
  absl::StatusOr<ChannelInfo> info = device->channels().Open(*owner, entries);
  if (info.ok()) {
    response->set_channel(info->id);
    response->set_path(info->path);
    response->set_entries(info->entries);
    response->set_bytes(info->bytes);
  }
  return FinishNow(method, context, start, info.status());
}

grpc::ServerUnaryReactor* VerifydService::CloseChannel(grpc::CallbackServerContext* context,
                                                       const v1::CloseChannelRequest* request,
                                                       v1::CloseChannelResponse* /*response*/) {
  const char* method = "CloseChannel";
  const absl::Time start = absl::Now();
  Device* device = ReadyDevice();
  if (device == nullptr) return FinishNow(method, context, start, NotReady());
  absl::StatusOr<std::string> owner = ClientOf(*context);
  if (!owner.ok()) return FinishNow(method, context, start, owner.status());
  return FinishNow(method, context, start,
                   device->channels().Close(*owner, request->channel()));
}

absl::Status VerifydService::CheckAdmin(const grpc::CallbackServerContext& context) const {
  // The socket file is mode 0660: reaching it already proves local group membership.
  if (absl::StartsWith(context.peer(), "unix:")) return absl::OkStatus();
  if (admin_token_.empty()) {
    return absl::PermissionDeniedError(
        "Compact over TCP needs --admin-token on the daemon; use the Unix socket instead");
  }
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAdminTokenMetadata);
  if (it == metadata.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("Compact over TCP needs metadata \"", kAdminTokenMetadata, "\""));
  }
  if (!TokenEquals(std::string_view(it->second.data(), it->second.size()), admin_token_)) {
    return absl::PermissionDeniedError(
        absl::StrCat("metadata \"", kAdminTokenMetadata, "\" does not match --admin-token"));
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* VerifydService::Compact(grpc::CallbackServerContext* context,
                                                  const v1::CompactRequest* request,
                                                  v1::CompactResponse* response) {
  const absl::Time start = absl::Now();
  if (absl::Status admin = CheckAdmin(*context); !admin.ok()) {
    return FinishNow("Compact", context, start, admin);
  }
  absl::StatusOr<CompactCall> call = ValidateCompact(*request);
  if (!call.ok()) return FinishNow("Compact", context, start, call.status());
  Device* device = ReadyDevice();
  if (device == nullptr) return FinishNow("Compact", context, start, NotReady());
  response->set_operation_id(device->StartCompaction(call->budget_bytes));
  return FinishNow("Compact", context, start, absl::OkStatus());
}

grpc::ServerUnaryReactor* VerifydService::GetCompaction(grpc::CallbackServerContext* context,
                                                        const v1::GetCompactionRequest* request,
                                                        v1::CompactionStatus* response) {
  const absl::Time start = absl::Now();
  absl::StatusOr<GetCompactionCall> call = ValidateGetCompaction(*request);
  if (!call.ok()) return FinishNow("GetCompaction", context, start, call.status());
  Device* device = ReadyDevice();
  if (device == nullptr) return FinishNow("GetCompaction", context, start, NotReady());
  std::optional<CompactionOperation> op = device->GetCompaction(call->operation_id);
  if (!op.has_value()) {
    return FinishNow(
        "GetCompaction", context, start,
        absl::NotFoundError(absl::StrCat("operation_id = '", call->operation_id,
                                         "' is unknown (only recent operations are kept)")));
  }
  EncodeCompactionStatus(*op, response);
  return FinishNow("GetCompaction", context, start, absl::OkStatus());
}

}  // namespace verifyd
