// The gRPC edge: each handler validates its request into a plain struct (no state touched), then
// hands the work to the device executor and returns; the executor finishes the reactor.
// Metrics of an RPC and the absl -> gRPC status mapping happen in FinishCall only.
#pragma once

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "executor/device.h"
#include "service/request_validation.h"
#include "service/service_metrics.h"
#include "service/service_options.h"
#include "service/shared_memory_registry.h"
#include "verifyd/v1/verifyd.grpc.pb.h"

namespace verifyd {

inline constexpr char kAdminTokenMetadata[] = "x-verifyd-admin-token";
// Who owns external regions and channels (plans/0017): 1-128 characters chosen by the client.
inline constexpr char kClientMetadata[] = "x-verifyd-client";

// Verify's gRPC handler is chosen at start (--verify-handler, plans/0012): polled (default; a
// thread of ours polls a completion queue, VerifyPoller, and the device thread writes the reply)
// or callback (the device thread finishes the reactor). Both stay so that each host can be
// measured both ways; the other methods are callback handlers. Verify is left out of the
// callback chain below and given its kind in the constructor.
using VerifydServiceBase =
    v1::Verifyd::WithCallbackMethod_Append<v1::Verifyd::WithCallbackMethod_Commit<
        v1::Verifyd::WithCallbackMethod_Release<v1::Verifyd::WithCallbackMethod_Compact<
            v1::Verifyd::WithCallbackMethod_GetCompaction<v1::Verifyd::WithCallbackMethod_Stats<
                v1::Verifyd::WithCallbackMethod_CreateSharedMemory<
                    v1::Verifyd::WithCallbackMethod_ReleaseSharedMemory<
                        v1::Verifyd::WithCallbackMethod_RegisterExternalMemory<
                            v1::Verifyd::WithCallbackMethod_ReleaseExternalMemory<
                                v1::Verifyd::WithCallbackMethod_OpenChannel<
                                    v1::Verifyd::WithCallbackMethod_CloseChannel<
                                        v1::Verifyd::Service>>>>>>>>>>>>;

class VerifydService final : public VerifydServiceBase {
 public:
  // `regions` holds the shared-memory regions for tensors; it must outlive the server's calls.
  VerifydService(const ServiceOptions& options, ServiceMetrics* metrics,
                 SharedMemoryRegistry* regions);

  // Until a device is attached, every RPC answers UNAVAILABLE ("starting"). The device must
  // outlive the server's calls.
  void AttachDevice(Device* device) { device_.store(device); }

  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* context,
                                   const v1::AppendRequest* request,
                                   v1::AppendResponse* response) override;
  // VerifyHandler::kPolled: posts a call slot for the next Verify on `cq` (its events carry
  // `tag`), and handles one that arrived; `finish` sends the reply (called once, on any thread).
  void RequestPolledVerify(grpc::ServerContext* context, v1::VerifyRequest* request,
                           grpc::ServerAsyncResponseWriter<v1::VerifyResponse>* responder,
                           grpc::ServerCompletionQueue* cq, void* tag);
  void VerifyPolled(grpc::ServerContext* context, const v1::VerifyRequest* request,
                    v1::VerifyResponse* response, std::function<void(const grpc::Status&)> finish);
  grpc::ServerUnaryReactor* VerifyCallback(grpc::CallbackServerContext* context,
                                           const v1::VerifyRequest* request,
                                           v1::VerifyResponse* response);
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

 private:
  // Runs `op` on the executor, then finishes the call with its status.
  template <typename Op>
  grpc::ServerUnaryReactor* Enqueue(const char* method, grpc::CallbackServerContext* context,
                                    absl::Time start, Op op);
  grpc::ServerUnaryReactor* FinishNow(const char* method, grpc::CallbackServerContext* context,
                                      absl::Time start, const absl::Status& status);
  void FinishCall(grpc::ServerUnaryReactor* reactor, const char* method, absl::Time start,
                  const absl::Status& status);
  // Compact is an operator action: Unix socket peers, or TCP peers with the admin token.
  absl::Status CheckAdmin(const grpc::CallbackServerContext& context) const;
  Device* ReadyDevice() const { return device_.load(); }

  const ValidationLimits limits_;
  const std::string admin_token_;
  const bool run_idle_inline_;
  int verify_method_index_ = 0;  // Verify's position in the service definition
  ServiceMetrics* metrics_;
  SharedMemoryRegistry* regions_;
  std::atomic<Device*> device_{nullptr};
};

}  // namespace verifyd
