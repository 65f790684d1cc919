#include "service/verifyd_service.h"

#include <chrono>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "executor/channel_table.h"
#include "service/event_log.h"
#include "service/grpc_status.h"
#include "service/message_size.h"
#include "service/response_encoding.h"

namespace verifyd {
namespace {

absl::Status NotReady() { return absl::UnavailableError("verifyd is starting; retry"); }

// The client named by metadata "x-verifyd-client": the owner of external regions and channels.
absl::StatusOr<std::string> ClientOf(const grpc::ServerContextBase& context) {
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

// The process behind a client name "pid:<n>" (Acceptor::ClientOf); 0 for any other.
int64_t ClientPid(const std::string& client) {
  int64_t pid = 0;
  if (!absl::StartsWith(client, "pid:") || !absl::SimpleAtoi(client.substr(4), &pid)) return 0;
  return pid;
}

// Verify's work on the device.
absl::Status RunVerify(DeviceOperations& ops, const VerifyCall& call,
                       const v1::VerifyRequest& request, v1::VerifyResponse* response) {
  return EncodeResult(ops.Verify(call), response,
                      [&](VerifyResult result, v1::VerifyResponse* encoded) {
                        EncodeVerify(request, call, std::move(result), encoded);
                      });
}

// The gate's verdict, then the validation's: the first failure answers the call.
template <typename Validated>
absl::Status Prepared(const absl::Status& gate, const absl::StatusOr<Validated>& validated) {
  if (!gate.ok()) return gate;
  return validated.status();
}

}  // namespace

VerifydService::VerifydService(const ServiceOptions& options, std::string admin_token,
                               ServiceMetrics* metrics, SharedMemoryRegistry* regions,
                               std::function<std::string(const std::string&)> client_of,
                               OwnerCheck is_owner)
    : limits_(LimitsFromOptions(options)),
      gate_(std::move(admin_token), std::move(is_owner)),
      metrics_(metrics),
      regions_(regions),
      client_of_(std::move(client_of)) {}

absl::Status VerifydService::Admit(const char* method, const grpc::ServerContextBase& context,
                                   uint64_t request_bytes, bool gated) const {
  VERIFYD_RETURN_IF_ERROR(CheckRequestSize(method, request_bytes, limits_.max_message_bytes));
  return gated ? gate_.CheckGated(method, context) : absl::OkStatus();
}

void VerifydService::End(const char* method, absl::Time start, const Finish& finish,
                         const absl::Status& status) {
  const grpc::Status grpc_status = ToGrpcStatus(status);
  if (!status.ok()) event_log::Refused(method, status);
  metrics_->RecordRpc(method, GrpcCodeName(grpc_status.error_code()), absl::Now() - start);
  finish(grpc_status);
}

void VerifydService::Dispatch(const char* method, const grpc::ServerContextBase* context,
                              std::function<bool()> cancelled, absl::Time start, Finish finish,
                              const absl::Status& prepared, Where where, Work work) {
  if (!prepared.ok()) return End(method, start, finish, prepared);
  Device* device = ReadyDevice();
  if (device == nullptr) return End(method, start, finish, NotReady());
  auto task = [this, method, context, cancelled = std::move(cancelled), start, finish,
               work = std::move(work)](DeviceOperations& ops) {
    metrics_->RecordQueue(method, absl::Now() - start);
    // A call whose client went away (or that the drain deadline cancelled) is not run: it would
    // hold the device for nobody, and it changes nothing. Both handler kinds see it: callback
    // contexts always, polled ones through AsyncNotifyWhenDone (VerifyPoller).
    if (cancelled()) {
      return End(method, start, finish,
                 absl::CancelledError("the call was cancelled before it ran"));
    }
    if (context->deadline() < std::chrono::system_clock::now()) {
      return End(method, start, finish,
                 absl::DeadlineExceededError("the deadline passed before the call ran"));
    }
    End(method, start, finish, work(ops));
  };
  const absl::Status queued = where == Where::kFirstInQueue ? device->SubmitFirst(std::move(task))
                                                            : device->Submit(std::move(task));
  if (!queued.ok()) End(method, start, finish, queued);
}

grpc::ServerUnaryReactor* VerifydService::Serve(const char* method,
                                                grpc::CallbackServerContext* context,
                                                absl::Time start, const absl::Status& prepared,
                                                Where where, Work work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Dispatch(
      method, context, [context] { return context->IsCancelled(); }, start,
      [reactor](const grpc::Status& s) { reactor->Finish(s); }, prepared, where, std::move(work));
  return reactor;
}

grpc::ServerUnaryReactor* VerifydService::ServeHere(const char* method,
                                                    grpc::CallbackServerContext* context,
                                                    absl::Time start, const absl::Status& prepared,
                                                    const std::function<absl::Status()>& here) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  End(
      method, start, [reactor](const grpc::Status& s) { reactor->Finish(s); },
      prepared.ok() ? here() : prepared);
  return reactor;
}

void VerifydService::VerifyPolled(grpc::ServerContext* context, grpc::ByteBuffer* bytes,
                                  v1::VerifyRequest* request, v1::VerifyResponse* response,
                                  std::function<bool()> cancelled, Finish finish) {
  const absl::Time start = absl::Now();
  absl::Status gate = Admit("Verify", *context, bytes->Length());
  if (gate.ok() &&
      !grpc::SerializationTraits<v1::VerifyRequest>::Deserialize(bytes, request).ok()) {
    gate = absl::InvalidArgumentError(
        "the request is not a valid verifyd.v1.VerifyRequest message (it does not parse)");
  }
  RegionPins pins;
  absl::StatusOr<VerifyCall> call =
      gate.ok() ? ValidateVerify(*request, limits_, regions_, &pins) : absl::StatusOr<VerifyCall>();
  Dispatch("Verify", context, std::move(cancelled), start, std::move(finish), Prepared(gate, call),
           Where::kQueue,
           [call = call.ok() ? *std::move(call) : VerifyCall(), pins = std::move(pins), request,
            response](DeviceOperations& ops) { return RunVerify(ops, call, *request, response); });
}

grpc::ServerUnaryReactor* VerifydService::Append(grpc::CallbackServerContext* context,
                                                 const v1::AppendRequest* request,
                                                 v1::AppendResponse* response) {
  const absl::Time start = absl::Now();
  absl::Status gate = Admit("Append", *context, request->ByteSizeLong());
  RegionPins pins;
  // KV from a registered external region: the region must be this client's.
  ExternalPins external_pins;
  std::optional<ExternalAccess> external;
  if (gate.ok() && request->kv().has_external_memory()) {
    Device* device = ReadyDevice();
    absl::StatusOr<std::string> owner = ClientOf(*context);
    if (device == nullptr) {
      gate = NotReady();
    } else if (!owner.ok()) {
      gate = owner.status();
    } else {
      external = ExternalAccess{&device->external_regions(), *std::move(owner), &external_pins};
    }
  }
  absl::StatusOr<AppendCall> call = gate.ok() ? ValidateAppend(*request, limits_, regions_, &pins,
                                                               external ? &*external : nullptr)
                                              : absl::StatusOr<AppendCall>();
  // The pins ride with the task: the kv pointer stays mapped until the executor is done with it.
  return Serve("Append", context, start, Prepared(gate, call), Where::kQueue,
               [call = call.ok() ? *std::move(call) : AppendCall(), pins = std::move(pins),
                external_pins = std::move(external_pins), response](DeviceOperations& ops) {
                 return EncodeResult(ops.Append(call), response, EncodeAppend);
               });
}

grpc::ServerUnaryReactor* VerifydService::Commit(grpc::CallbackServerContext* context,
                                                 const v1::CommitRequest* request,
                                                 v1::CommitResponse* response) {
  const absl::Time start = absl::Now();
  const absl::Status gate = Admit("Commit", *context, request->ByteSizeLong());
  absl::StatusOr<CommitCall> call = ValidateCommit(*request, limits_);
  return Serve(
      "Commit", context, start, Prepared(gate, call), Where::kQueue,
      [call = call.ok() ? *std::move(call) : CommitCall(), response](DeviceOperations& ops) {
        return EncodeResult(ops.Commit(call), response, EncodeCommit);
      });
}

grpc::ServerUnaryReactor* VerifydService::Release(grpc::CallbackServerContext* context,
                                                  const v1::ReleaseRequest* request,
                                                  v1::ReleaseResponse* response) {
  const absl::Time start = absl::Now();
  const absl::Status gate = Admit("Release", *context, request->ByteSizeLong());
  absl::StatusOr<ReleaseCall> call = ValidateRelease(*request);
  return Serve(
      "Release", context, start, Prepared(gate, call), Where::kQueue,
      [call = call.ok() ? *std::move(call) : ReleaseCall(), response](DeviceOperations& ops) {
        return EncodeResult(ops.Release(call), response, EncodeRelease);
      });
}

grpc::ServerUnaryReactor* VerifydService::Fork(grpc::CallbackServerContext* context,
                                               const v1::ForkRequest* request,
                                               v1::ForkResponse* response) {
  const absl::Time start = absl::Now();
  const absl::Status gate = Admit("Fork", *context, request->ByteSizeLong());
  absl::StatusOr<ForkCall> call = ValidateFork(*request);
  return Serve("Fork", context, start, Prepared(gate, call), Where::kQueue,
               [call = call.ok() ? *std::move(call) : ForkCall(), response](DeviceOperations& ops) {
                 return EncodeResult(ops.Fork(call), response, EncodeFork);
               });
}

grpc::ServerUnaryReactor* VerifydService::Stats(grpc::CallbackServerContext* context,
                                                const v1::StatsRequest* request,
                                                v1::StatsResponse* response) {
  const absl::Time start = absl::Now();
  return Serve(
      "Stats", context, start, Admit("Stats", *context, request->ByteSizeLong(), /*gated=*/false),
      Where::kFirstInQueue, [this, response](DeviceOperations& ops) {
        EncodeStats(ops.Stats(), limits_.heads, limits_.default_scale, response);
        // The data plane's tables are the device's, not the store's (plans/0017); the
        // task runs only on a ready device.
        Device* device = ReadyDevice();
        response->set_external_regions(static_cast<uint32_t>(device->external_regions().regions()));
        response->set_external_region_bytes(device->external_regions().total_bytes());
        response->set_channels(static_cast<uint32_t>(device->channels().channels()));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* VerifydService::ListSequences(grpc::CallbackServerContext* context,
                                                        const v1::ListSequencesRequest* request,
                                                        v1::ListSequencesResponse* response) {
  const absl::Time start = absl::Now();
  const absl::Status gate = Admit("ListSequences", *context, request->ByteSizeLong());
  absl::StatusOr<ListSequencesCall> call = ValidateListSequences(*request, limits_);
  return Serve(
      "ListSequences", context, start, Prepared(gate, call), Where::kQueue,
      [call = call.ok() ? *std::move(call) : ListSequencesCall(), response](DeviceOperations& ops) {
        EncodeSequences(ops.ListSequences(call), response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* VerifydService::CreateSharedMemory(
    grpc::CallbackServerContext* context, const v1::CreateSharedMemoryRequest* request,
    v1::SharedMemoryRegion* response) {
  const absl::Status admitted = Admit("CreateSharedMemory", *context, request->ByteSizeLong());
  return ServeHere("CreateSharedMemory", context, absl::Now(), admitted, [&]() -> absl::Status {
    const std::string peer = context->peer();
    VERIFYD_ASSIGN_OR_RETURN(
        SharedMemoryInfo info,
        regions_->Create(request->bytes(), client_of_ ? client_of_(peer) : peer));
    response->set_region(info.region);
    response->set_path(info.path);
    response->set_bytes(info.bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* VerifydService::ReleaseSharedMemory(
    grpc::CallbackServerContext* context, const v1::ReleaseSharedMemoryRequest* request,
    v1::ReleaseSharedMemoryResponse* response) {
  const absl::Status admitted = Admit("ReleaseSharedMemory", *context, request->ByteSizeLong());
  return ServeHere("ReleaseSharedMemory", context, absl::Now(), admitted, [&]() -> absl::Status {
    VERIFYD_ASSIGN_OR_RETURN(uint64_t bytes, regions_->Release(request->region()));
    response->set_bytes(bytes);
    return absl::OkStatus();
  });
}

// The data plane (plans/0017): answered on the handler thread (the tables are thread-safe), gated
// like every call that changes state, owned by the client named in metadata.
absl::Status VerifydService::DataPlaneOwner(const char* method,
                                            const grpc::CallbackServerContext& context,
                                            uint64_t request_bytes, Device** device,
                                            std::string* owner) const {
  VERIFYD_RETURN_IF_ERROR(Admit(method, context, request_bytes));
  *device = ReadyDevice();
  if (*device == nullptr) return NotReady();
  VERIFYD_ASSIGN_OR_RETURN(*owner, ClientOf(context));
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* VerifydService::RegisterExternalMemory(
    grpc::CallbackServerContext* context, const v1::RegisterExternalMemoryRequest* request,
    v1::RegisterExternalMemoryResponse* response) {
  const char* method = "RegisterExternalMemory";
  Device* device = nullptr;
  std::string owner;
  const absl::Status admitted =
      DataPlaneOwner(method, *context, request->ByteSizeLong(), &device, &owner);
  return ServeHere(method, context, absl::Now(), admitted, [&]() -> absl::Status {
    if (request->device() > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("device = ", request->device(), " must be this daemon's device"));
    }
    ExternalMemoryHandle handle{request->handle(), request->bytes(),
                                static_cast<int>(request->device())};
    // Host memory is opened as a descriptor of the calling process (the cpu backend).
    handle.client_pid = ClientPid(client_of_ ? client_of_(context->peer()) : "");
    VERIFYD_ASSIGN_OR_RETURN(uint64_t region, device->external_regions().Register(owner, handle));
    response->set_region(region);
    response->set_bytes(request->bytes());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* VerifydService::ReleaseExternalMemory(
    grpc::CallbackServerContext* context, const v1::ReleaseExternalMemoryRequest* request,
    v1::ReleaseExternalMemoryResponse* response) {
  const char* method = "ReleaseExternalMemory";
  Device* device = nullptr;
  std::string owner;
  const absl::Status admitted =
      DataPlaneOwner(method, *context, request->ByteSizeLong(), &device, &owner);
  return ServeHere(method, context, absl::Now(), admitted, [&]() -> absl::Status {
    VERIFYD_ASSIGN_OR_RETURN(uint64_t bytes,
                             device->external_regions().Release(owner, request->region()));
    response->set_bytes(bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* VerifydService::OpenChannel(grpc::CallbackServerContext* context,
                                                      const v1::OpenChannelRequest* request,
                                                      v1::OpenChannelResponse* response) {
  const char* method = "OpenChannel";
  Device* device = nullptr;
  std::string owner;
  const absl::Status admitted =
      DataPlaneOwner(method, *context, request->ByteSizeLong(), &device, &owner);
  return ServeHere(method, context, absl::Now(), admitted, [&]() -> absl::Status {
    const uint32_t entries = request->entries() == 0 ? 64 : request->entries();
    VERIFYD_ASSIGN_OR_RETURN(ChannelInfo info, device->channels().Open(owner, entries));
    if (std::string_view(device->backend_name()) == "cuda" && !device->mps_active()) {
      // The co-located way's cost without MPS (plans/0018): say it where the
      // operator looks, once per channel.
      event_log::Warning(
          "channel_without_mps",
          absl::StrCat("channel=", info.id, " owner=", event_log::Quote(owner),
                       " cost=\"a scheduler on this GPU pays ~290 us of context "
                       "switching per layer (2.4x a decode step)\" fix=\"run the "
                       "MPS control daemon (deploy/systemd/verifyd-mps@.service)\""));
    }
    response->set_channel(info.id);
    response->set_path(info.path);
    response->set_entries(info.entries);
    response->set_bytes(info.bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* VerifydService::CloseChannel(grpc::CallbackServerContext* context,
                                                       const v1::CloseChannelRequest* request,
                                                       v1::CloseChannelResponse* /*response*/) {
  const char* method = "CloseChannel";
  Device* device = nullptr;
  std::string owner;
  const absl::Status admitted =
      DataPlaneOwner(method, *context, request->ByteSizeLong(), &device, &owner);
  return ServeHere(method, context, absl::Now(), admitted,
                   [&]() { return device->channels().Close(owner, request->channel()); });
}

grpc::ServerUnaryReactor* VerifydService::PrepareCapture(grpc::CallbackServerContext* context,
                                                         const v1::PrepareCaptureRequest* request,
                                                         v1::PrepareCaptureResponse* response) {
  const char* method = "PrepareCapture";
  Device* device = nullptr;
  std::string owner;
  const absl::Status admitted =
      DataPlaneOwner(method, *context, request->ByteSizeLong(), &device, &owner);
  return ServeHere(method, context, absl::Now(), admitted, [&]() -> absl::Status {
    VERIFYD_ASSIGN_OR_RETURN(
        CaptureInfo info,
        device->channels().PrepareCapture(owner, request->channel(), DecodeCapture(*request)));
    response->set_epoch(info.epoch);
    response->set_step_area(info.path);
    response->set_step_area_bytes(info.bytes);
    response->set_layer_begin(info.layer_begin);
    response->set_num_layers(info.num_layers);
    response->set_heads(static_cast<uint32_t>(limits_.heads));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* VerifydService::Compact(grpc::CallbackServerContext* context,
                                                  const v1::CompactRequest* request,
                                                  v1::CompactResponse* response) {
  const absl::Status gate = Admit("Compact", *context, request->ByteSizeLong());
  absl::StatusOr<CompactCall> call = ValidateCompact(*request);
  return ServeHere("Compact", context, absl::Now(), Prepared(gate, call), [&]() -> absl::Status {
    Device* device = ReadyDevice();
    if (device == nullptr) return NotReady();
    response->set_operation_id(device->StartCompaction(call->budget_bytes));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* VerifydService::GetCompaction(grpc::CallbackServerContext* context,
                                                        const v1::GetCompactionRequest* request,
                                                        v1::CompactionStatus* response) {
  const absl::Status size =
      Admit("GetCompaction", *context, request->ByteSizeLong(), /*gated=*/false);
  absl::StatusOr<GetCompactionCall> call = ValidateGetCompaction(*request);
  return ServeHere(
      "GetCompaction", context, absl::Now(), Prepared(size, call), [&]() -> absl::Status {
        Device* device = ReadyDevice();
        if (device == nullptr) return NotReady();
        std::optional<CompactionOperation> op = device->GetCompaction(call->operation_id);
        if (!op.has_value()) {
          return absl::NotFoundError(
              absl::StrCat("operation_id = '", call->operation_id,
                           "' is unknown (only recent operations are kept)"));
        }
        EncodeCompactionStatus(*op, response);
        return absl::OkStatus();
      });
}

}  // namespace verifyd
