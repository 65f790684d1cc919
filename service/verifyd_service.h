// The gRPC edge: each handler validates its request into a plain struct (no state touched), then
// hands the work to the device executor and returns; the executor thread sends the reply. Every
// handler goes through one path (Dispatch): gate → validate → queue → skip if the client has gone
// → run → record the metrics and map the status.
//
// Verify is served on gRPC's completion-queue API (VerifyPoller), the other methods as callback
// handlers: plans/0012 measured the polled handler fastest, and plans/0015 settled on it alone.
// Verify is a raw method (bytes in, bytes out): it parses the request itself, so that bytes that
// do not parse get INVALID_ARGUMENT and are counted (gRPC's own answer was INTERNAL, uncounted).
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "executor/device.h"
#include "service/call_gate.h"
#include "service/request_validation.h"
#include "service/service_metrics.h"
#include "service/service_options.h"
#include "service/shared_memory_registry.h"
#include "verifyd/v1/verifyd.grpc.pb.h"

namespace verifyd {

// Who owns external regions and channels (plans/0017): 1-128 characters chosen by the client.
inline constexpr char kClientMetadata[] = "x-verifyd-client";

using VerifydServiceBase = v1::Verifyd::WithCallbackMethod_Append<
    v1::Verifyd::WithRawMethod_Verify<v1::Verifyd::WithCallbackMethod_Commit<
        v1::Verifyd::WithCallbackMethod_Release<v1::Verifyd::WithCallbackMethod_Compact<
            v1::Verifyd::WithCallbackMethod_GetCompaction<v1::Verifyd::WithCallbackMethod_Stats<
                v1::Verifyd::WithCallbackMethod_CreateSharedMemory<
                    v1::Verifyd::WithCallbackMethod_ReleaseSharedMemory<
                        v1::Verifyd::WithCallbackMethod_Fork<
                            v1::Verifyd::WithCallbackMethod_RegisterExternalMemory<
                                v1::Verifyd::WithCallbackMethod_ReleaseExternalMemory<
                                    v1::Verifyd::WithCallbackMethod_OpenChannel<
                                        v1::Verifyd::WithCallbackMethod_CloseChannel<
                                            v1::Verifyd::WithCallbackMethod_ListSequences<
                                                v1::Verifyd::WithCallbackMethod_PrepareCapture<
                                                    v1::Verifyd::Service>>>>>>>>>>>>>>>>;

class VerifydService final : public VerifydServiceBase {
 public:
  // `regions` holds the shared-memory regions for tensors; it must outlive the server's calls.
  // `client_of` names the client behind a peer (its process; Acceptor::ClientOf), for each
  // client's share of the shared memory; null: the peer itself. `is_owner` tells the owner's
  // transport (Acceptor::IsOwner) for the gate.
  VerifydService(const ServiceOptions& options, std::string admin_token, ServiceMetrics* metrics,
                 SharedMemoryRegistry* regions,
                 std::function<std::string(const std::string&)> client_of = nullptr,
                 OwnerCheck is_owner = nullptr);

  // Until a device is attached, every RPC answers UNAVAILABLE ("starting"). The device must
  // outlive the server's calls.
  void AttachDevice(Device* device) { device_.store(device); }

  // A Verify that VerifyPoller received; `cancelled` tells whether the call ended without us
  // (client gone, deadline, drain deadline: the poller's AsyncNotifyWhenDone); `finish` sends the
  // reply (called once, on any thread).
  // `bytes` is the request as received; it is parsed into `request`.
  void VerifyPolled(grpc::ServerContext* context, grpc::ByteBuffer* bytes,
                    v1::VerifyRequest* request, v1::VerifyResponse* response,
                    std::function<bool()> cancelled,
                    std::function<void(const grpc::Status&)> finish);

  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* context,
                                   const v1::AppendRequest* request,
                                   v1::AppendResponse* response) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const v1::CommitRequest* request,
                                   v1::CommitResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Compact(grpc::CallbackServerContext* context,
                                    const v1::CompactRequest* request,
                                    v1::CompactResponse* response) override;
  grpc::ServerUnaryReactor* GetCompaction(grpc::CallbackServerContext* context,
                                          const v1::GetCompactionRequest* request,
                                          v1::CompactionStatus* response) override;
  // Queued ahead of waiting requests (it runs after the one in progress): its latency is one
  // request's, not the queue's, so it can serve as a liveness signal of the device thread.
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;
  // Answered on the handler thread: regions are not device state.
  grpc::ServerUnaryReactor* CreateSharedMemory(grpc::CallbackServerContext* context,
                                               const v1::CreateSharedMemoryRequest* request,
                                               v1::SharedMemoryRegion* response) override;
  grpc::ServerUnaryReactor* ReleaseSharedMemory(grpc::CallbackServerContext* context,
                                                const v1::ReleaseSharedMemoryRequest* request,
                                                v1::ReleaseSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* Fork(grpc::CallbackServerContext* context,
                                 const v1::ForkRequest* request,
                                 v1::ForkResponse* response) override;
  // The data plane (plans/0017), answered on the handler thread: the tables are thread-safe.
  grpc::ServerUnaryReactor* RegisterExternalMemory(
      grpc::CallbackServerContext* context, const v1::RegisterExternalMemoryRequest* request,
      v1::RegisterExternalMemoryResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseExternalMemory(
      grpc::CallbackServerContext* context, const v1::ReleaseExternalMemoryRequest* request,
      v1::ReleaseExternalMemoryResponse* response) override;
  grpc::ServerUnaryReactor* OpenChannel(grpc::CallbackServerContext* context,
                                        const v1::OpenChannelRequest* request,
                                        v1::OpenChannelResponse* response) override;
  grpc::ServerUnaryReactor* CloseChannel(grpc::CallbackServerContext* context,
                                         const v1::CloseChannelRequest* request,
                                         v1::CloseChannelResponse* response) override;
  // Answered on the handler thread: the bucket and its memory are checked, the step area made.
  grpc::ServerUnaryReactor* PrepareCapture(grpc::CallbackServerContext* context,
                                           const v1::PrepareCaptureRequest* request,
                                           v1::PrepareCaptureResponse* response) override;
  // Read-only, queued like any call (it is no liveness probe, so it does not jump the queue).
  // Gated over TCP although it changes nothing: per-sequence lengths and idle times are per-request
  // traffic (prompt lengths, when each user last spoke), which Stats only gives in aggregate; and
  // the runbook's next step, Release, needs the owner's transport or the token anyway.
  grpc::ServerUnaryReactor* ListSequences(grpc::CallbackServerContext* context,
                                          const v1::ListSequencesRequest* request,
                                          v1::ListSequencesResponse* response) override;

 private:
  using Finish = std::function<void(const grpc::Status&)>;
  using Work = std::function<absl::Status(DeviceOperations&)>;
  enum class Where { kQueue, kFirstInQueue };

  // The one path of every queued call: `prepared` is the gate and validation's verdict (not OK:
  // answered at once, nothing queued); `work` runs on the executor thread, unless the client went
  // away or the deadline passed while it waited (then CANCELLED / DEADLINE_EXCEEDED, nothing
  // changed). Every end goes through `finish` after the metrics are recorded.
  void Dispatch(const char* method, const grpc::ServerContextBase* context,
                std::function<bool()> cancelled, absl::Time start, Finish finish,
                const absl::Status& prepared, Where where, Work work);
  // Dispatch for a callback method: the reply goes through the context's default reactor.
  grpc::ServerUnaryReactor* Serve(const char* method, grpc::CallbackServerContext* context,
                                  absl::Time start, const absl::Status& prepared, Where where,
                                  Work work);
  // For calls answered on the handler thread (no device state): `here` runs when `prepared` is
  // OK.
  grpc::ServerUnaryReactor* ServeHere(const char* method, grpc::CallbackServerContext* context,
                                      absl::Time start, const absl::Status& prepared,
                                      const std::function<absl::Status()>& here);
  // Records the call's metrics and maps its status: the end of every call.
  void End(const char* method, absl::Time start, const Finish& finish, const absl::Status& status);
  Device* ReadyDevice() const { return device_.load(); }
  // The admission of every call: the size bound (--max-message-bytes, service/message_size.h),
  // then, when `gated`, the gate (call_gate.h). `request_bytes` is the request's wire size.
  absl::Status Admit(const char* method, const grpc::ServerContextBase& context,
                     uint64_t request_bytes, bool gated = true) const;
  // A data-plane call's preconditions: Admit, a ready device, the owner named in metadata.
  absl::Status DataPlaneOwner(const char* method, const grpc::CallbackServerContext& context,
                              uint64_t request_bytes, Device** device, std::string* owner) const;

  const ValidationLimits limits_;
  const CallGate gate_;
  ServiceMetrics* metrics_;
  SharedMemoryRegistry* regions_;
  const std::function<std::string(const std::string&)> client_of_;
  std::atomic<Device*> device_{nullptr};
};

}  // namespace verifyd
